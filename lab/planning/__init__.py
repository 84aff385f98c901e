"""Offline planning: what only `tandem plan` and the benchmarks reach of the planner
(cluster packing, merge, bounds, exact solver, query split, incremental re-planning).
"""
