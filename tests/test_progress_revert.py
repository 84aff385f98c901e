"""The newest pod of a GPU shared by a pair measured to lose, within its first minutes."""

from __future__ import annotations

from extender_builders import A100

from extender.core.snapshot import GpuSpec
from extender.learning.revert import newest_of_losing
from extender.state.reports import DecodedReport, ReportedProcess

REPORT = DecodedReport(
    node="n1", gpus=(GpuSpec(0, "GPU-0", A100, 40960), GpuSpec(1, "GPU-1", A100, 40960)),
    util_percent=(90.0, 90.0), memory_used_mib=(1.0, 1.0),
    processes=((ReportedProcess("old", 1.0, None), ReportedProcess("new", 1.0, None)),
               (ReportedProcess("x", 1.0, None), ReportedProcess("y", 1.0, None))))
MODELS = {"old": "bert", "new": "gpt", "x": "lm", "y": "resnet"}
FIRST = {"old": 0.0, "new": 500.0, "x": 0.0, "y": 550.0}


def _moves(losing: set, now: float, window_s: float = 300.0) -> list[str]:
    return newest_of_losing(REPORT, lambda u, i: MODELS.get(u), losing,
                            lambda u, i: FIRST[u], now, window_s)


def test_the_newest_pod_of_a_losing_pair_is_moved_within_its_window() -> None:
    losing = {(A100, frozenset(("bert", "gpt")))}
    assert _moves(losing, 600.0) == ["new"]  # gpt arrived last, 100 s ago
    assert _moves(losing, 900.0) == []  # past its first five minutes: it stays
    assert _moves(set(), 600.0) == []  # a pair not refused is never moved
