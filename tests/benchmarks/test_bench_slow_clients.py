"""benchmarks/slow_clients.py at a tiny size: every target answers while slow clients
hold connections, and the result file carries the machine details."""

from __future__ import annotations

import json

from bench_modules import load

load("_common")  # the benchmark's own first import, found beside it when run as a script
slow_clients = load("slow_clients")


def test_tiny_run_measures_every_target_and_misses_nothing(tmp_path):
    out = tmp_path / "sc.json"
    result = slow_clients.main(["--slow", "4", "--interval", "0.2", "--requests", "5",
                                "--threads", "2", "--keep-alive", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert set(result["targets"]) == {"extender", "inference", "session"}
    for target, endpoints in result["targets"].items():
        calls = {k: v for k, v in endpoints.items() if isinstance(v, dict)}
        assert len(calls) == 2, target
        assert all(v["answered"] == 5 and v["missed"] == 0 for v in calls.values()), target
    assert result["machine"]["cores"] >= 1 and "command" in result
