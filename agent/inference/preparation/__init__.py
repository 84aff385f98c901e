"""Model preparation: limits, checks, constant folding and cutting in a worker process,
batching profiles.
"""
