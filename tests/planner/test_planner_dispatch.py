"""Plans promise only what the deployed dispatch delivers (round robin over session pods).

The example: one session, SLO 1000 ms at 198 rps, ``l(b) = 20 b + 160`` ms up to
b = 32. With batch-aware dispatch Harpagon puts it on dedicated GPUs at b = 32,
promising ``l(32) + 32/198 s = 961.6 ms``; a Service spreading requests round robin
over the session's pods gives ``2 l(32) = 1600 ms``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner.dispatch import (
    DEPLOYED_DISPATCH,
    Dispatch,
    dedicated_worst_case_ms,
    deployed_worst_case_ms,
)
from planner.duty_cycle import plan_gpu
from planner.types import SessionSpec
from predictor.batching import BatchingProfile
from tandem.cli import app

PLAN = {
    "gpu_types": {"gpu": {"memory_mib": 16000}},
    "profiles": [{"model": "m", "gpu_type": "gpu", "max_batch": 32,
                  "linear": {"alpha_ms": 20.0, "beta_ms": 160.0}, "memory_mib": 1000}],
    "sessions": [{"name": "s", "model": "m", "slo_ms": 1000, "rate_rps": 198}],
}


def plan_json(tmp_path: Path, *flags: str) -> tuple[int, dict]:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(PLAN), encoding="utf-8")
    result = CliRunner().invoke(app, ["plan", str(path), "--json", *flags])
    return result.exit_code, json.loads(result.stdout)


def dedicated(out: dict) -> list[dict]:
    return [s for g in out["gpus"] for s in g["sessions"] if s["batch"] == 32]


def test_batch_aware_plan_is_marked_and_its_deployed_latency_is_round_robin(tmp_path) -> None:
    code, out = plan_json(tmp_path, "--batch-aware-dispatch")
    tiers = dedicated(out)
    assert len(tiers) == 4
    for s in tiers:
        assert s["worst_case_ms"] == pytest.approx(961.616162, abs=1e-3)
        assert s["deployed_worst_case_ms"] == pytest.approx(1600.0)
    assert out["dispatch"]["requires_dispatcher"] is True
    assert out["dispatch"]["deployed"] == "round-robin"
    assert sorted(m["gpu_id"] for m in out["dispatch"]["deployed_slo_misses"]) == sorted(
        g["gpu_id"] for g in out["gpus"] if any(s["batch"] == 32 for s in g["sessions"]))
    assert code == 1  # the deployed path cannot keep this plan


def test_round_robin_plan_promises_what_the_deployed_path_gives(tmp_path) -> None:
    code, out = plan_json(tmp_path)
    assert code == 0
    assert out["dispatch"] == {"planned": "round-robin", "deployed": "round-robin",
                               "requires_dispatcher": False, "deployed_slo_misses": []}
    for g in out["gpus"]:
        for s in g["sessions"]:
            assert s["worst_case_ms"] == pytest.approx(s["deployed_worst_case_ms"])
            assert s["deployed_worst_case_ms"] <= s["slo_ms"] + 1e-6


def round_robin_worst_ms(pods: int, rate_rps: float, batch: int, latency_ms: float,
                         seconds: float = 40.0) -> float:
    """Worst latency of a request path that spreads a steady stream round robin over
    ``pods`` servers, each running back-to-back batches of up to ``batch`` (Nexus)."""
    gap = 1000.0 / rate_rps
    arrivals = [[] for _ in range(pods)]
    for i in range(int(seconds * rate_rps)):
        arrivals[i % pods].append(i * gap + 0.5)
    worst = 0.0
    for queue in arrivals:
        now, k = 0.0, 0
        while k < len(queue):
            now = max(now, queue[k])  # idle until a request waits
            taken = [t for t in queue[k:k + batch] if t <= now]
            k += len(taken)
            now += latency_ms
            worst = max(worst, max(now - t for t in taken))
    return worst


def test_the_round_robin_request_path_needs_two_batch_latencies_not_the_planned_961() -> None:
    # Four dedicated pods, each receiving 32 requests per 800 ms batch (40 rps).
    observed = round_robin_worst_ms(pods=4, rate_rps=160.0, batch=32, latency_ms=800.0)
    planned = dedicated_worst_case_ms(Dispatch.BATCH_AWARE, 800.0, 32, 198.0)
    deployed = dedicated_worst_case_ms(DEPLOYED_DISPATCH, 800.0, 32, 198.0)
    assert planned == pytest.approx(961.616, abs=1e-3) and deployed == 1600.0
    assert planned < observed <= deployed
    assert observed > 0.95 * deployed  # the bound is tight, not a loose safety margin


def test_admission_and_the_plan_share_the_deployed_rule() -> None:
    profile = BatchingProfile.linear("m", "gpu", 20.0, 160.0, 1000, max_batch=32)
    plan = plan_gpu([SessionSpec("s", "m", 2000, 40)], {("m", "gpu"): profile}, "gpu", 16000)
    (alloc,) = plan.allocations
    assert alloc.latency_ms == deployed_worst_case_ms(plan, alloc)
