"""Campaigns on the explicit ``sim:`` backend: schema, OOM, resume, budget, co-location."""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from predictor.dataset import load_gpu_dir
from predictor.dataset_schema import validate_rows
from predictor.profiling.campaign import Campaign
from predictor.profiling.errors import DataDirError
from predictor.profiling.runner import (
    BackendChoice,
    ProvenanceRecorder,
    open_backend,
    prepare_data_dir,
    run_campaign,
)
from predictor.profiling.spec import CampaignSpec, plan_isolated
from predictor.profiling.store import DataDir


def _curve(util: float, step: float, base: float, per: float) -> dict[str, float]:
    return {
        "util_percent_b1": util,
        "util_exponent": 0.35,
        "step_time_ms_b1": step,
        "time_exponent": 0.8,
        "memory_mib_base": base,
        "memory_mib_per_sample": per,
    }


SIM = {
    "gpu": {"product": "SIM GPU 16GB", "memory_mib": 16384},
    "seconds_per_run": 10,
    "colocation": {"linear": 0.3, "quadratic": 1.2},
    "models": {
        name: {
            "family": fam,
            "training": _curve(u, s, b, p),
            "inference": _curve(u / 2, s / 3, b / 2, p / 3),
            "features": {
                "flops_per_sample": 1e9,
                "params_bytes": 4e7,
                "activations_bytes_per_sample": 2e7,
                "op_counts": {"Conv": 3},
            },
        }
        for name, fam, u, s, b, p in [
            ("resnet18", "resnet", 20, 4, 600, 30),
            ("vgg19", "vgg", 40, 10, 2500, 120),  # b=128 training: OOM
            ("lstm", "lstm", 10, 6, 400, 8),
        ]
    },
}
SPEC = CampaignSpec(
    batch_sizes={"training": (8, 32, 128), "inference": (1, 16)}, pairs=6, triples=4, seed=3
)


class FakeClock:
    """Monotonic clock that the sim backend advances by its seconds_per_run."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def sim_file(tmp_path: Path) -> Path:
    path = tmp_path / "sim.yaml"
    path.write_text(yaml.safe_dump(SIM))
    return path


def _run(sim_file: Path, out: Path, spec: CampaignSpec = SPEC, **kw: Any) -> dict[str, Any]:
    clock = kw.pop("clock", None) or FakeClock()
    return run_campaign(
        BackendChoice("sim", sim_file),
        out,
        spec,
        clock=clock,
        wallclock=lambda: 1.8e9,
        sleep=clock.sleep,
        **kw,
    )


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_campaign_writes_files_that_validate_against_the_dataset_schema(sim_file, tmp_path):
    summary = _run(sim_file, tmp_path / "out")
    gpu_dir = tmp_path / "out" / "sim-gpu-16gb"
    data = load_gpu_dir(gpu_dir)  # raises on any schema problem
    n_iso = 3 * (3 + 2)
    assert (summary["state"], summary["isolated_run"], len(data.isolated)) == (
        "complete",
        n_iso,
        n_iso,
    )
    assert len({r["combo_id"] for r in data.colocated}) == summary["colocated_run"] == 10
    assert Counter(r["n_jobs"] for r in data.colocated) == {2: 12, 3: 12}
    for kind in ("isolated", "colocated", "batching"):
        assert validate_rows(kind, _csv(gpu_dir / f"{kind}.csv")) == []
    assert data.provenance["simulated"] is True
    assert data.provenance["hardware"]["gpu_product"] == "SIM GPU 16GB"
    ok_inference = [
        r for r in data.isolated if r["workload"] == "inference" and r["status"] == "ok"
    ]
    assert len(data.batching) == len(ok_inference) == 6


def test_oom_is_recorded_once_and_not_retried_on_resume(sim_file, tmp_path):
    _run(sim_file, tmp_path / "out")
    rows = load_gpu_dir(tmp_path / "out" / "sim-gpu-16gb").isolated
    oom = [r for r in rows if r["status"] == "oom"]
    assert [(r["model"], r["workload"], r["batch_size"]) for r in oom] == [
        ("vgg19", "training", 128)
    ]
    assert oom[0]["util_mean_percent"] is None and "MiB" in oom[0]["error"]
    again = _run(sim_file, tmp_path / "out", resume=True)
    assert (again["isolated_run"], again["isolated_existing"], again["colocated_run"]) == (0, 15, 0)
    assert not any(c["key"].startswith("vgg19|training|128") for c in again["skipped"])


def test_colocation_bookkeeping_uses_isolated_baselines(sim_file, tmp_path):
    _run(sim_file, tmp_path / "out")
    data = load_gpu_dir(tmp_path / "out" / "sim-gpu-16gb")
    iso = {(r["model"], r["workload"], r["batch_size"]): r for r in data.isolated}
    combos: dict[str, list[dict[str, Any]]] = {}
    for row in data.colocated:
        combos.setdefault(row["combo_id"], []).append(row)
    for rows in combos.values():
        assert sorted(r["job_index"] for r in rows) == list(range(rows[0]["n_jobs"]))
        cumulative = sum(
            iso[(r["model"], r["workload"], r["batch_size"])]["util_mean_percent"] for r in rows
        )
        for r in rows:
            base = iso[(r["model"], r["workload"], r["batch_size"])]
            assert r["isolated_step_time_ms"] == pytest.approx(base["step_time_ms"])
            assert r["slowdown"] == pytest.approx(r["step_time_ms"] / base["step_time_ms"])
            assert r["slowdown"] > 1.0
            assert r["cumulative_isolated_util_percent"] == pytest.approx(cumulative)
            assert 30.0 <= r["cumulative_isolated_util_percent"] <= 250.0


class CrashAfter:
    """Wraps a backend: the n-th measure call raises, as a killed process would stop."""

    def __init__(self, inner: Any, n: int, exc: BaseException):
        self.inner, self.left, self.exc = inner, n, exc

    def environment(self) -> Any:
        return self.inner.environment()

    def measure(self, jobs: Any) -> Any:
        self.left -= 1
        if self.left < 0:
            raise self.exc
        return self.inner.measure(jobs)


def _crashing_campaign(sim_file: Path, out: Path, n: int, exc: BaseException) -> None:
    clock = FakeClock()
    with open_backend(BackendChoice("sim", sim_file), SPEC.measure, sleep=clock.sleep) as ob:
        data = prepare_data_dir(out, ob.environment, resume=True)
        recorder = ProvenanceRecorder(data, ob.environment, "test", "sim", SPEC, lambda: 1.8e9)
        campaign = Campaign(
            SPEC, CrashAfter(ob.backend, n, exc), ob.environment, data, ob.features, clock
        )
        campaign.on_run(lambda: recorder.write(campaign.summary))
        try:
            campaign.run(plan_isolated(SPEC, ob.catalogue), ("isolated", "colocated"))
        finally:
            recorder.write(campaign.summary)  # as run_campaign does on the way out


@pytest.mark.parametrize(
    "crash_after", [4, 15, 21], ids=["mid-isolated", "at-phase-switch", "mid-colocated"]
)
def test_resume_after_crash_loses_nothing_and_duplicates_nothing(sim_file, tmp_path, crash_after):
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        _crashing_campaign(sim_file, out, crash_after, KeyboardInterrupt())
    gpu_dir = out / "sim-gpu-16gb"
    rows_before = load_gpu_dir(gpu_dir)
    assert len(rows_before.isolated) == min(crash_after, 15)
    # A kill mid-write leaves a torn line; repair must cut it, not keep or duplicate it.
    torn = "deadbeef,2026-01-01T00:00:00,SIM GPU 16GB,simul"
    with (gpu_dir / "isolated.csv").open("a") as fh:
        fh.write(torn)
    summary = _run(sim_file, out, resume=True)
    reference = _run(sim_file, tmp_path / "ref")
    got, want = load_gpu_dir(gpu_dir), load_gpu_dir(tmp_path / "ref" / "sim-gpu-16gb")
    key = ("model", "workload", "batch_size", "status")
    assert sorted(tuple(r[k] for k in key) for r in got.isolated) == sorted(
        tuple(r[k] for k in key) for r in want.isolated
    )
    assert sorted(r["combo_id"] for r in got.colocated) == sorted(
        r["combo_id"] for r in want.colocated
    )
    assert len(got.batching) == len(want.batching)
    assert summary["repairs"] == [f"isolated.csv: cut a torn last line ({len(torn)} bytes)"]
    assert reference["state"] == summary["state"] == "complete"
    assert [c["state"] for c in got.provenance["campaigns"]] == ["interrupted", "complete"]


def test_partial_combination_and_orphan_batching_rows_are_dropped_on_open(sim_file, tmp_path):
    _run(sim_file, tmp_path / "out")
    gpu_dir = tmp_path / "out" / "sim-gpu-16gb"
    colo = (gpu_dir / "colocated.csv").read_text().splitlines(keepends=True)
    (gpu_dir / "colocated.csv").write_text("".join(colo[:-1]))  # last combo lost its last row
    with (gpu_dir / "batching.csv").open("a") as fh:
        fh.write("lstm,lstm,SIM GPU 16GB,999,1.0,0.1,10.0,5\n")  # isolated row never landed
    data = DataDir(gpu_dir)
    assert [r.split(":")[0] for r in data.repair()] == ["colocated.csv", "batching.csv"]
    summary = _run(sim_file, tmp_path / "out", resume=True)
    assert summary["colocated_run"] == 1
    final = load_gpu_dir(gpu_dir)
    assert Counter(Counter(r["combo_id"] for r in final.colocated).values()) == {2: 6, 3: 4}


@pytest.mark.parametrize(
    ("budget_seconds", "isolated_run", "colocated_run"),
    [(35.0, 3, 0), (145.0, 14, 0), (205.0, 15, 5), (10_000.0, 15, 10)],
    ids=["first-estimate", "mid-isolated", "mid-colocated", "ample"],
)
def test_time_budget_is_respected_and_skips_are_recorded(
    sim_file, tmp_path, budget_seconds, isolated_run, colocated_run
):
    clock = FakeClock()
    start = clock.now
    spec = CampaignSpec(**{**SPEC.__dict__, "budget_seconds": budget_seconds})
    summary = _run(sim_file, tmp_path / "out", spec, clock=clock)
    # Each sim run costs 10 s; the first estimate is warm-up + measure + 5 s overhead = 11 s.
    assert (summary["isolated_run"], summary["colocated_run"]) == (isolated_run, colocated_run)
    assert clock.now - start <= budget_seconds
    complete = isolated_run == 15 and colocated_run == 10
    assert summary["state"] == ("complete" if complete else "budget_exhausted")
    assert all(
        s["reason"] in ("budget", "not started: budget exhausted") for s in summary["skipped"]
    )
    if isolated_run < 15:
        assert len(summary["skipped"]) == 15 - isolated_run + 1  # + the co-located phase
    prov = load_gpu_dir(tmp_path / "out" / "sim-gpu-16gb").provenance
    assert len(prov["campaigns"][-1]["skipped"]) == len(summary["skipped"])


@pytest.mark.parametrize(
    ("existing", "resume", "message"),
    [
        ({"simulated": False}, True, "holds real data"),
        ({"hardware": {"gpu_product": "NVIDIA H100"}}, True, "was measured on"),
        ({}, False, "pass --resume"),
    ],
    ids=["real-vs-simulated", "other-gpu", "no-resume"],
)
def test_directory_conflicts_are_refused(sim_file, tmp_path, existing, resume, message):
    _run(sim_file, tmp_path / "out")
    prov_path = tmp_path / "out" / "sim-gpu-16gb" / "provenance.json"
    import json

    prov = json.loads(prov_path.read_text())
    for k, v in existing.items():
        prov[k] = {**prov[k], **v} if isinstance(v, dict) else v
    prov_path.write_text(json.dumps(prov))
    with pytest.raises(DataDirError, match=message):
        _run(sim_file, tmp_path / "out", resume=resume)


def test_invalid_rows_are_never_written(tmp_path):
    data = DataDir(tmp_path)
    with pytest.raises(DataDirError, match="util_mean_percent"):
        data.append("isolated", [{"run_id": "x", "status": "ok", "util_mean_percent": 140}])
    assert not data.file("isolated").exists()


class OwnUtil:
    """Wraps a backend: each job's own utilisation, as NVML reports it per process."""

    def __init__(self, inner: Any):
        self.inner = inner

    def environment(self) -> Any:
        return self.inner.environment()

    def measure(self, jobs: Any) -> Any:
        m = self.inner.measure(jobs)
        own = [replace(r, process_util_mean_percent=10.0 * (i + 1) if r.status == "ok" else None)
               for i, r in enumerate(m.jobs)]  # fmt: skip
        return replace(m, jobs=tuple(own))


def test_each_jobs_own_utilisation_lands_in_its_row_and_an_old_file_keeps_its_header(
        sim_file, tmp_path):  # fmt: skip
    out = tmp_path / "out"
    gpu_dir = out / "sim-gpu-16gb"
    with open_backend(BackendChoice("sim", sim_file), SPEC.measure) as ob:
        data = prepare_data_dir(out, ob.environment, resume=True)
        campaign = Campaign(SPEC, OwnUtil(ob.backend), ob.environment, data, ob.features,
                            FakeClock())  # fmt: skip
        campaign.run(plan_isolated(SPEC, ob.catalogue)[:2], ("isolated",))
    rows = DataDir(gpu_dir).rows("isolated")
    assert [r["process_util_mean_percent"] for r in rows if r["status"] == "ok"] == [10.0, 10.0]
    # A file written before the column existed: appending keeps it readable.
    lines = (gpu_dir / "isolated.csv").read_text().splitlines()
    cut = lines[0].split(",").index("process_util_mean_percent")
    drop = lambda line: ",".join(c for i, c in enumerate(line.split(",")) if i != cut)  # noqa: E731
    (gpu_dir / "isolated.csv").write_text("\n".join(drop(line) for line in lines) + "\n")
    data = DataDir(gpu_dir)
    data.append("isolated", [rows[0] | {"run_id": "again"}])
    again = data.rows("isolated")
    assert len(again) == 3 and all(r["process_util_mean_percent"] is None for r in again)
