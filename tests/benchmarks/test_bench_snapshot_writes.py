"""benchmarks/snapshot_writes.py at a tiny size: both cases measured in a child process
over this checkout, and the result file carries the machine details."""

from __future__ import annotations

import json

from bench_modules import load

load("_common")  # the benchmark's own first import, found beside it when run as a script
snapshot_writes = load("snapshot_writes")


def test_tiny_run_measures_both_cases(tmp_path):
    out = tmp_path / "sw.json"
    result = snapshot_writes.main(["--nodes", "3", "--writes", "4", "--repeats", "1",
                                   "--out", str(out)])
    assert json.loads(out.read_text())["runs"] == result["runs"]  # the file: paths scrubbed
    (run,) = result["runs"]["branch"]
    assert {case: run[case]["writes"] for case in run} == {"alone": 4, "beside": 4}
    assert all(run[case]["cpu_p50_us"] > 0 for case in run)
    assert result["machine"]["cores"] >= 1 and "command" in result
