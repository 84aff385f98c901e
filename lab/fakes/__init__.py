"""Fakes at the library boundary (pynvml, the Kubernetes API server), shared by the tests
and the benchmarks; never shipped in the images.
"""
