"""``tandem simulate``: trace-driven, discrete-event replay of the extender's decisions.

Modules: ``jobs`` (job records, trace files), ``workloads`` (W-Small, W-Large,
production-like generators with sourced parameters), ``cluster`` (sim cluster
files and built-ins), ``interference`` (the simulated world's slowdown),
``engine`` (event heap, virtual clock, lifecycle), ``baselines`` (FIFO, OBP,
PAB), ``horus`` (weighted-fair queue + :mod:`extender.core` decisions),
``policies`` (the registry), ``metrics``, ``runner``, ``sweep``, ``plots`` and
``commands`` (the CLI). The simulator never re-implements a decision: Horus and
tandem policies call :func:`extender.core.evaluate` and
:func:`extender.core.choose`, and the queue is :mod:`extender.queue.fair`.
"""
