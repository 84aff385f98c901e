"""benchmarks/bind_processes.py: the bound on serving binds from several processes (#40)
spreads the load generator's connections over the processes in turn."""

from __future__ import annotations

from bench_modules import load

bind_processes = load("bind_processes")


def test_connections_go_to_each_process_in_turn():
    connect = bind_processes.spread([7001, 7002], make=lambda port: port)
    assert [connect() for _ in range(5)] == [7001, 7002, 7001, 7002, 7001]
    assert [bind_processes.spread([7001], make=lambda p: p)() for _ in range(2)] == [7001, 7001]


def test_ratio_is_burst_p50_over_single_p50():
    measured = {"single": {"bind_ms": {"p50": 8.0}}, "burst": {"bind_ms": {"p50": 30.0}}}
    assert bind_processes.ratio(measured) == 3.75
