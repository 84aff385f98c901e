"""The per-GPU inference server's HTTP API, its auth and metrics, and the process that
serves it.
"""
