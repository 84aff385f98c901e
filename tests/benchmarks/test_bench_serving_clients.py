"""benchmarks/serving_clients.py: what a client saw, per session, and when it was shed."""

from __future__ import annotations

from bench_modules import load

serving_clients = load("serving_clients")


def test_summary_counts_late_and_refused_answers_as_shed_and_says_when() -> None:
    # (session, status, latency ms, reason, seconds since the window began)
    records = [("a", 200, 10.0, "", 0.2), ("a", 200, 60.0, "", 0.4),
               ("a", 503, 5.0, "early_drop", 2.5), ("a", 200, 20.0, "", 3.1),
               ("a", 503, 5.0, "deadline_missed", 9.0)]
    row = serving_clients.summarise(records, [{"name": "a", "rate": 10.0, "slo_ms": 50.0}],
                                    3.0)["a"]
    assert row["on_time_200"] == 2 and row["late_200"] == 1
    assert row["shed_after_admission"] == 3 and row["attainment"] == 0.4
    assert row["not_200"] == {"503 early_drop": 1, "503 deadline_missed": 1}
    # The late 200 in the first second, the 503s in the third and beyond the window.
    assert row["shed_by_second"] == [1, 0, 1, 1]
