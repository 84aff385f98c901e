"""Per-GPU duty cycle: Nexus Table 2 (Section 2 example) and the refusal reasons."""

from __future__ import annotations

import pytest

from planner import (
    GpuPlan,
    Infeasible,
    InfeasibleReason,
    SessionError,
    SessionSpec,
    batch_for,
    max_duty_cycle_ms,
    plan_gpu,
    plan_shares,
    saturated_config,
)
from predictor.batching import BatchingProfile

GPU = "titanx"

# Nexus Table 2 (dissertation Table 3.2): batch -> latency ms.
TABLE2 = {
    "A": [[4, 50], [8, 75], [16, 100]],
    "B": [[4, 50], [8, 90], [16, 125]],
    "C": [[4, 60], [8, 95], [16, 125]],
}


def table2_profiles(memory_mib: float = 500.0) -> dict[tuple[str, str], BatchingProfile]:
    return {
        (m, GPU): BatchingProfile.from_table(m, GPU, rows, memory_mib=memory_mib)
        for m, rows in TABLE2.items()
    }


A = SessionSpec("a", "A", 200, 64)
B = SessionSpec("b", "B", 250, 32)
C = SessionSpec("c", "C", 250, 32)


def test_table2_a_and_b_share_a_gpu_with_a_125ms_duty_cycle() -> None:
    plan = plan_gpu([A, B], table2_profiles(), GPU, 12288)
    assert isinstance(plan, GpuPlan)
    assert plan.duty_cycle_ms == pytest.approx(125.0)
    assert plan.occupancy == pytest.approx(1.0)
    a, b = plan.allocations
    assert (a.batch, a.batch_latency_ms, a.latency_ms) == (8, 75.0, 200.0)
    assert (b.batch, b.batch_latency_ms, b.latency_ms) == (4, 50.0, 175.0)
    assert plan.memory_mib == 1000.0


@pytest.mark.parametrize("other", [A, B], ids=["with-A", "with-B"])
def test_table2_c_cannot_join(other: SessionSpec) -> None:
    # C at batch 4 costs 60 ms: 75+60 > 125 with A; with B the 250 ms SLOs
    # allow a longer cycle, so only A is a hard conflict.
    result = plan_gpu([other, C], table2_profiles(), GPU, 12288)
    if other is A:
        assert isinstance(result, Infeasible)
        assert result.reason is InfeasibleReason.OCCUPANCY_OVER_ONE
        assert result.required > 1.0
    else:
        assert isinstance(result, GpuPlan)
        for alloc in result.allocations:
            assert alloc.latency_ms <= alloc.session.slo_ms + 1e-9


def test_table2_abc_together_is_over_one() -> None:
    result = plan_gpu([A, B, C], table2_profiles(), GPU, 12288)
    assert isinstance(result, Infeasible)
    assert result.reason is InfeasibleReason.OCCUPANCY_OVER_ONE


@pytest.mark.parametrize(
    ("model", "slo_ms", "batch", "throughput"),
    [("A", 200, 16, 160.0), ("B", 250, 16, 128.0), ("C", 250, 16, 128.0)],
    ids=["A", "B", "C"],
)
def test_table2_high_load_saturated_batch(
    model: str, slo_ms: float, batch: int, throughput: float
) -> None:
    config = saturated_config(table2_profiles()[(model, GPU)], slo_ms)
    assert config is not None
    assert config.batch == batch
    assert config.throughput_rps == pytest.approx(throughput)


def test_alone_at_full_throughput_is_the_two_l_rule() -> None:
    plan = plan_gpu([SessionSpec("a", "A", 200, 160)], table2_profiles(), GPU, 12288)
    assert isinstance(plan, GpuPlan)
    (alloc,) = plan.allocations
    assert plan.duty_cycle_ms == 100.0
    assert alloc.batch == 16
    assert alloc.latency_ms == 2 * alloc.batch_latency_ms == 200.0


@pytest.mark.parametrize(
    ("sessions", "memory_mib", "reason", "required", "available", "who"),
    [
        ([SessionSpec("a", "A", 200, 161)], 12288, InfeasibleReason.RATE_TOO_HIGH, 161, 160, "a"),
        ([SessionSpec("a", "A", 99, 1)], 12288, InfeasibleReason.SLO_TOO_TIGHT, 100, 99, "a"),
        ([SessionSpec("z", "Z", 200, 1)], 12288, InfeasibleReason.NO_PROFILE, 0, 0, "z"),
        ([A, B], 999, InfeasibleReason.MEMORY, 1000, 999, None),
    ],
    ids=["rate", "slo", "no-profile", "memory"],
)
def test_refusals_carry_reason_and_numbers(
    sessions: list[SessionSpec],
    memory_mib: float,
    reason: InfeasibleReason,
    required: float,
    available: float,
    who: str | None,
) -> None:
    result = plan_gpu(sessions, table2_profiles(), GPU, memory_mib)
    assert isinstance(result, Infeasible)
    assert (result.reason, result.session) == (reason, who)
    assert result.required == pytest.approx(required)
    assert result.available == pytest.approx(available)
    assert reason.value in result.message()


def test_empty_gpu_plan() -> None:
    plan = plan_gpu([], table2_profiles(), GPU, 12288)
    assert plan == GpuPlan(GPU, 0.0, 0.0, (), 0.0)


def test_rate_shares_keep_the_session_and_use_the_share() -> None:
    heavy = SessionSpec("a", "A", 200, 240)
    plan = plan_shares([(heavy, 80.0)], table2_profiles(), GPU, 12288)
    assert isinstance(plan, GpuPlan)
    (alloc,) = plan.allocations
    assert alloc.session is heavy
    assert alloc.rate_rps == 80.0
    assert alloc.batch >= 80.0 * plan.duty_cycle_ms / 1000 - 1e-9


def test_shorter_cycle_below_the_slo_bound_can_be_feasible() -> None:
    # At the largest cycle the ceilings overflow it; one batch less fits.
    profiles = {("L", GPU): BatchingProfile.linear("L", GPU, alpha_ms=10.0, beta_ms=5.0)}
    a = SessionSpec("a", "L", 290, 18)
    b = SessionSpec("b", "L", 280, 73)
    plan = plan_gpu([a, b], profiles, GPU, 1)
    assert isinstance(plan, GpuPlan)
    # Largest cycle: b's bound 155 ms needs batches 3 and 12 = 155 ms + 10 ms.
    assert max_duty_cycle_ms(profiles[("L", GPU)], 280, 73) == pytest.approx(155.0)
    assert plan.duty_cycle_ms == pytest.approx(11 / 0.073)
    busy = sum(x.batch_latency_ms for x in plan.allocations)
    assert busy <= plan.duty_cycle_ms + 1e-9


def test_duplicate_names_are_an_input_error() -> None:
    with pytest.raises(SessionError):
        plan_gpu([A, A], table2_profiles(), GPU, 12288)


@pytest.mark.parametrize(
    ("kwargs"),
    [
        {"name": "", "model": "A", "slo_ms": 1, "rate_rps": 1},
        {"name": "a", "model": "A", "slo_ms": 0, "rate_rps": 1},
        {"name": "a", "model": "A", "slo_ms": 10, "rate_rps": -1},
        {"name": "a", "model": "A", "slo_ms": float("nan"), "rate_rps": 1},
    ],
    ids=["no-name", "zero-slo", "negative-rate", "nan-slo"],
)
def test_invalid_sessions_are_rejected(kwargs: dict) -> None:
    with pytest.raises(SessionError):
        SessionSpec(**kwargs)


@pytest.mark.parametrize(
    ("rate", "duty", "batch"),
    [(64, 125, 8), (32, 125, 4), (0.1, 100, 1), (160, 100, 16), (100, 10.01, 2)],
)
def test_batch_for(rate: float, duty: float, batch: int) -> None:
    assert batch_for(rate, duty) == batch
