"""Running a campaign: isolated runs first, then co-located combinations, within a budget.

Each finished run becomes rows appended at once (see :mod:`.store`); a resumed
campaign skips every configuration whose key is already in the files, and the
time budget is checked before each run against the mean duration of the runs so
far, so the campaign stops cleanly instead of being killed mid-run. What was not
run is listed in provenance.json with the reason.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypeVar

from predictor.profiling.backend import (
    Environment,
    JobSpec,
    Measurement,
    ProfilingBackend,
    config_key,
)
from predictor.profiling.plan import Combo, IsolatedBaseline, baselines_from_rows, choose_combos
from predictor.profiling.spec import CampaignSpec
from predictor.profiling.store import DataDir

Phase = Literal["isolated", "colocated"]
T = TypeVar("T")
# Process start, model build and transfers around the measured window (seconds):
# the first budget estimate before any run has been timed.
_FIRST_RUN_OVERHEAD_SECONDS = 5.0


class FeatureSource(Protocol):
    """Graph-feature columns (flops, params_bytes, ..., op_counts) of a job."""

    def features(self, job: JobSpec) -> dict[str, Any]:
        """Raises any exception when the graph cannot be built or read."""
        ...


class Progress(Protocol):
    """The part of tqdm the campaign uses."""

    def set_postfix_str(self, s: str) -> None: ...
    def update(self, n: int = 1) -> Any: ...
    def close(self) -> None: ...


ProgressFactory = Callable[[int, str], Progress]


class _NoProgress:
    def set_postfix_str(self, s: str) -> None:
        """Nothing to show."""

    def update(self, n: int = 1) -> None:
        """Nothing to count."""

    def close(self) -> None:
        """Nothing to close."""


def no_progress(_total: int, _desc: str) -> Progress:
    """A progress sink that shows nothing (tests, --no-progress)."""
    return _NoProgress()


@dataclass(frozen=True)
class Skipped:
    """A configuration that was planned but not run."""

    key: str
    reason: str


@dataclass
class CampaignSummary:
    """What one invocation did (JSON-ready with ``as_dict``)."""

    gpu_dir: str
    state: str = "running"
    isolated_run: int = 0
    isolated_existing: int = 0
    colocated_run: int = 0
    colocated_existing: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    skipped: list[Skipped] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        out = asdict(self)
        out["statuses"] = dict(sorted(self.statuses.items()))
        return out


def isolated_done(data: DataDir) -> set[str]:
    """Keys (``JobSpec.key``) of the isolated configurations ``data`` already holds."""
    return {config_key(r["model"], r["workload"], r["batch_size"]) for r in data.rows("isolated")}


def iso_timestamp(ts: float) -> str:
    """UTC ISO-8601 to the second: the time format of rows and provenance."""
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="seconds")


class Campaign:
    """One invocation of ``tandem profile run`` against one backend and one directory."""

    def __init__(
        self,
        spec: CampaignSpec,
        backend: ProfilingBackend,
        environment: Environment,
        data_dir: DataDir,
        features: FeatureSource,
        clock: Callable[[], float] = time.monotonic,
        wallclock: Callable[[], float] = time.time,
        progress: ProgressFactory = no_progress,
        catalogue: Collection[str] | None = None,
    ):
        """``catalogue``: the models the backend can run by name (None: trust every row)."""
        self.spec = spec
        self.catalogue = catalogue
        self.backend = backend
        self.env = environment
        self.data = data_dir
        self.features = features
        self.clock = clock
        self.wallclock = wallclock
        self.progress = progress
        self.summary = CampaignSummary(str(data_dir.path))
        self._started = clock()
        self._durations: list[float] = []
        self._on_run: Callable[[], None] = lambda: None
        self.unrunnable_models: list[str] = []

    def on_run(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after every appended run (the CLI refreshes provenance)."""
        self._on_run = callback

    # --- budget ---------------------------------------------------------------------------
    def _estimate_seconds(self) -> float:
        if self._durations:
            return sum(self._durations) / len(self._durations)
        m = self.spec.measure
        return m.warmup_seconds + m.measure_seconds + _FIRST_RUN_OVERHEAD_SECONDS

    def _within_budget(self) -> bool:
        if self.spec.budget_seconds is None:
            return True
        elapsed = self.clock() - self._started
        return elapsed + self._estimate_seconds() <= self.spec.budget_seconds

    def _measure(self, jobs: Sequence[JobSpec]) -> Measurement:
        t0 = self.clock()
        result = self.backend.measure(jobs)
        self._durations.append(self.clock() - t0)
        return result

    # --- phases ---------------------------------------------------------------------------
    def run(self, isolated: Sequence[JobSpec], phases: Iterable[Phase]) -> CampaignSummary:
        """Run the phases in order; stops cleanly when the budget would be exceeded."""
        phases = list(phases)
        try:
            if "isolated" in phases:
                self._run_isolated(isolated)
            if "colocated" in phases:
                self._run_colocated()
            if self.summary.state == "running":
                self.summary.state = "complete"
        except KeyboardInterrupt:
            self.summary.state = "interrupted"
            raise
        return self.summary

    def _run_isolated(self, jobs: Sequence[JobSpec]) -> None:
        done = isolated_done(self.data)
        pending = [j for j in jobs if j.key not in done]
        self.summary.isolated_existing = len(jobs) - len(pending)
        self._run_under_budget(
            "isolated",
            [(j.key, f"{j.model} {j.workload} b={j.batch_size}", j) for j in pending],
            self._run_one_isolated,
        )

    def _run_one_isolated(self, job: JobSpec) -> None:
        row: dict[str, Any] = self._isolated_base(job)
        try:
            row.update(self.features.features(job))
        except Exception as exc:  # any failure to build the graph: record, don't measure
            row.update(status="error", error=f"graph features: {type(exc).__name__}: {exc}")
            self._append_isolated(row, None)
            return
        m = self._measure([job])
        r = m.jobs[0]
        status, error = r.status, r.error
        if status == "ok" and (m.util_mean_percent is None or r.step_time_ms is None):
            status, error = "error", "no NVML utilisation samples or step times in the window"
        row.update(status=status, error=error)
        if status == "ok":
            assert r.step_time_ms is not None  # checked above; narrows the type
            row.update(
                util_mean_percent=m.util_mean_percent, util_p50_percent=m.util_p50_percent,
                util_p90_percent=m.util_p90_percent, mem_used_nvml_mib=r.mem_used_nvml_mib,
                process_util_mean_percent=r.process_util_mean_percent,
                mem_peak_framework_mib=r.mem_peak_framework_mib, step_time_ms=r.step_time_ms,
                throughput_per_s=job.batch_size * 1000.0 / r.step_time_ms, n_samples=m.n_samples,
            )  # fmt: skip
        batching = None
        if status == "ok" and job.workload == "inference":
            batching = {
                "model": job.model, "family": job.family, "gpu_product": self.env.gpu_product,
                "batch_size": job.batch_size, "latency_mean_ms": r.step_time_ms,
                "latency_std_ms": r.step_time_std_ms or 0.0,
                "mem_mib": r.mem_used_nvml_mib or r.mem_peak_framework_mib, "n_samples": r.n_steps,
            }  # fmt: skip
        self._append_isolated(row, batching)

    def _append_isolated(self, row: dict[str, Any], batching: dict[str, Any] | None) -> None:
        if batching is not None:
            # Batching first: repair drops a batching row whose isolated row never landed.
            self.data.append("batching", [batching])
        self.data.append("isolated", [row])
        self.summary.isolated_run += 1
        self.summary.statuses[row["status"]] += 1
        self._on_run()

    def _isolated_base(self, job: JobSpec) -> dict[str, Any]:
        e = self.env
        framework, version = e.framework, e.framework_version
        if job.onnx_path:
            # Memory overheads are fitted per framework: ONNX Runtime's rows must not
            # land among torch's.
            framework, version = "onnxruntime", e.software.get("onnxruntime", "")
        return {
            "run_id": uuid.uuid4().hex[:16], "timestamp": iso_timestamp(self.wallclock()),
            "gpu_product": e.gpu_product, "driver_version": e.driver_version,
            "cuda_version": e.cuda_version, "framework": framework,
            "framework_version": version, "model": job.model, "family": job.family,
            "workload": job.workload, "batch_size": job.batch_size,
        }  # fmt: skip

    def runnable(self, baselines: Iterable[IsolatedBaseline]) -> tuple[list[IsolatedBaseline],
                                                                       list[str]]:  # fmt: skip
        """Baselines with their jobs' user-model details restored, and the models left out.

        Rows keep only a model's name. A user model's ONNX path or torch factory
        comes back from the spec; a row of a model that neither the spec nor the
        catalogue knows (a user model of an earlier campaign) cannot be run again.
        """
        user = {m.name: m for m in self.spec.user_models()}
        out, unknown = [], []
        for b in baselines:
            entry = user.get(b.job.model)
            if entry is not None:
                job = replace(b.job, onnx_path=entry.onnx_path, torch_model=entry.torch_model)
                out.append(replace(b, job=job))
            elif self.catalogue is None or b.job.model in self.catalogue:
                out.append(b)
            else:
                unknown.append(b.job.model)
        return out, sorted(set(unknown))

    def planned_combos(self) -> tuple[list[Combo], int]:
        """New combinations to run now, and how many exist already."""
        baselines, self.unrunnable_models = self.runnable(
            baselines_from_rows(self.data.rows("isolated")))
        existing = self.data.rows("colocated")
        done_ids = {r["combo_id"] for r in existing}
        per_size = Counter(r["n_jobs"] for r in existing if r["job_index"] == 0)
        limit = self.env.gpu_memory_mib * self.spec.colocated_memory_fraction
        combos: list[Combo] = []
        for size, target in ((2, self.spec.pairs), (3, self.spec.triples)):
            need = target - per_size[size]
            util_range = self.spec.colocated_util_range_percent
            combos += choose_combos(baselines, size, need, self.spec.seed, util_range, limit,
                                    done_ids)  # fmt: skip
        return combos, len(done_ids)

    def _run_colocated(self) -> None:
        if self.summary.state != "running":
            self.summary.skipped.append(Skipped("colocated", "not started: budget exhausted"))
            return
        combos, existing = self.planned_combos()
        self.summary.colocated_existing = existing
        if self.unrunnable_models:
            self.summary.skipped.append(Skipped(
                ",".join(self.unrunnable_models),
                "isolated rows of models neither the spec nor the catalogue knows: "
                "not co-located"))  # fmt: skip
        labelled = [
            (c.combo_id, " + ".join(f"{j.model}/b{j.batch_size}" for j in c.jobs), c)
            for c in combos
        ]
        self._run_under_budget("colocated", labelled, self._run_one_combo)

    def _run_under_budget(
        self, phase: str, items: Sequence[tuple[str, str, T]], run_one: Callable[[T], None]
    ) -> None:
        """Run each ``(key, label, item)`` with a progress bar; skip the rest once over budget."""
        bar = self.progress(len(items), phase)
        try:
            for i, (_key, label, item) in enumerate(items):
                if not self._within_budget():
                    self._skip_rest([key for key, _label, _item in items[i:]])
                    return
                bar.set_postfix_str(label)
                run_one(item)
                bar.update(1)
        finally:
            bar.close()

    def _run_one_combo(self, combo: Combo) -> None:
        m = self._measure(combo.jobs)
        ts = iso_timestamp(self.wallclock())
        run_id = uuid.uuid4().hex[:16]
        rows = []
        for i, (base, r) in enumerate(zip(combo.members, m.jobs, strict=True)):
            status, error = r.status, r.error
            if status == "ok" and (m.util_mean_percent is None or r.step_time_ms is None
                                   or r.mem_used_nvml_mib is None):  # fmt: skip
                status, error = "error", "no NVML samples, step times or memory in the window"
            ok = status == "ok"
            rows.append({
                "run_id": run_id, "timestamp": ts, "gpu_product": self.env.gpu_product,
                "combo_id": combo.combo_id, "n_jobs": len(combo.members), "job_index": i,
                "model": base.job.model, "family": base.job.family,
                "workload": base.job.workload, "batch_size": base.job.batch_size,
                "status": status, "error": error,
                "isolated_util_percent": base.util_percent,
                "cumulative_isolated_util_percent": combo.cumulative_util_percent,
                "isolated_step_time_ms": base.step_time_ms,
                "step_time_ms": r.step_time_ms if ok else None,
                "slowdown": r.step_time_ms / base.step_time_ms if ok and r.step_time_ms else None,
                "util_mean_percent": m.util_mean_percent if ok else None,
                "process_util_mean_percent": r.process_util_mean_percent if ok else None,
                "mem_used_nvml_mib": r.mem_used_nvml_mib if ok else None,
            })  # fmt: skip
            self.summary.statuses[status] += 1
        self.data.append("colocated", rows)
        self.summary.colocated_run += 1
        self._on_run()

    def _skip_rest(self, keys: Sequence[str]) -> None:
        self.summary.state = "budget_exhausted"
        self.summary.skipped += [Skipped(k, "budget") for k in keys]
