"""The offline tools: the simulator, offline planning, trace replay and the fakes tests and
benchmarks share. Above the deployables, in the distribution, not in the images.
"""
