"""Wiring for ``tandem profile``: choose the backend, open the GPU's directory, keep provenance.

``--backend`` is explicit: ``cuda`` measures a real GPU, ``sim:FILE`` produces
synthetic rows for tests and dry runs. A directory never mixes the two: its
provenance.json says ``"simulated": true|false`` and a campaign of the other
kind is refused, so ``predictor train`` can always tell what it is reading.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from contracts.version import version
from predictor.profiling.backend import (
    Environment,
    JobSpec,
    Measurement,
    MeasureSettings,
    ProfilingBackend,
    gpu_slug,
)
from predictor.profiling.campaign import (
    _FIRST_RUN_OVERHEAD_SECONDS,
    Campaign,
    CampaignSummary,
    FeatureSource,
    ProgressFactory,
    iso_timestamp,
    isolated_done,
    no_progress,
)
from predictor.profiling.errors import DataDirError, ProfilingError, SpecError
from predictor.profiling.plan import Combo
from predictor.profiling.spec import CampaignSpec, CatalogueEntry, plan_isolated
from predictor.profiling.store import DataDir


@dataclass(frozen=True)
class BackendChoice:
    """``cuda`` or ``sim`` with its file."""

    kind: str
    path: Path | None = None

    def __str__(self) -> str:
        return "cuda" if self.kind == "cuda" else f"sim:{self.path}"


def parse_backend(text: str) -> BackendChoice:
    """Parse ``cuda`` or ``sim:FILE``; SpecError otherwise."""
    if text == "cuda":
        return BackendChoice("cuda")
    if text.startswith("sim:") and len(text) > 4:
        return BackendChoice("sim", Path(text[4:]))
    raise SpecError([f"backend: {text!r} is not cuda or sim:FILE"])


def zoo_catalogue() -> dict[str, CatalogueEntry]:
    """Every zoo model, runnable for training and inference."""
    from predictor.zoo import ZOO

    return {name: CatalogueEntry(name, e.family) for name, e in ZOO.items()}


@dataclass
class OpenBackend:
    """A started backend with what planning and rows need from it."""

    backend: ProfilingBackend
    environment: Environment
    catalogue: Mapping[str, CatalogueEntry]
    features: FeatureSource


@contextlib.contextmanager
def open_backend(
    choice: BackendChoice,
    settings: MeasureSettings,
    gpu_index: int = 0,
    sleep: Callable[[float], None] = lambda _s: None,
) -> Iterator[OpenBackend]:
    """Start the chosen backend; stops its workers and NVML on exit."""
    if choice.kind == "sim":
        from predictor.profiling.sim_backend import SimBackend

        assert choice.path is not None
        sim = SimBackend(choice.path, settings, sleep)
        yield OpenBackend(sim, sim.environment(), sim.catalogue(), sim)
        return
    from predictor.profiling.cuda import CudaBackend
    from predictor.profiling.graph import GraphFeatureSource

    cuda = CudaBackend(settings, gpu_index)
    graph = GraphFeatureSource()
    try:
        yield OpenBackend(cuda, cuda.environment(), zoo_catalogue(), graph)
    finally:
        cuda.close()
        graph.close()


def prepare_data_dir(root: Path, env: Environment, resume: bool) -> DataDir:
    """Open ``root/<gpu-slug>/`` for this campaign, refusing to mix data; repairs it."""
    data = DataDir(Path(root) / gpu_slug(env.gpu_product))
    prov = data.read_provenance()
    has_data = data.has_data()
    if prov is not None:
        if bool(prov.get("simulated")) != env.simulated:
            kind = "simulated" if prov.get("simulated") else "real"
            raise DataDirError(
                f"{data.path} holds {kind} data; this campaign is "
                f"{'simulated' if env.simulated else 'real'}: use another --out"
            )
        product = (prov.get("hardware") or {}).get("gpu_product")
        if product != env.gpu_product:
            raise DataDirError(f"{data.path} was measured on {product!r}, not {env.gpu_product!r}")
    if has_data and prov is None:
        raise DataDirError(f"{data.path} holds rows but no provenance.json: move it away")
    if has_data and not resume:
        raise DataDirError(f"{data.path} already holds data: pass --resume to add to it "
                           "(configurations already present are skipped)")  # fmt: skip
    data.repair()
    return data


def tandem_version() -> str:
    """The installed tandem version, or the source tree's when not installed."""
    return version()


class ProvenanceRecorder:
    """Keeps provenance.json current: rewritten after every run, so a crash leaves it valid."""

    def __init__(
        self,
        data: DataDir,
        env: Environment,
        command: str,
        backend_name: str,
        spec: CampaignSpec,
        wallclock: Callable[[], float] = time.time,
    ):
        self.data = data
        self.env = env
        self.command = command
        self.backend_name = backend_name
        self.spec = spec
        self.wallclock = wallclock
        self.previous = data.read_provenance() or {}
        self.started_at = iso_timestamp(wallclock())

    def write(self, summary: CampaignSummary, extra: Mapping[str, Any] | None = None) -> None:
        """Write provenance with this invocation's record appended to ``campaigns``."""
        e = self.env
        now = iso_timestamp(self.wallclock())
        record = {
            "command": self.command, "backend": self.backend_name, "started_at": self.started_at,
            "finished_at": now, "spec": _spec_record(self.spec), **summary.as_dict(),
            **(extra or {}),
        }  # fmt: skip
        record["skipped"] = [asdict(s) for s in summary.skipped]
        self.data.write_provenance({
            "command": self.command, "tandem_version": tandem_version(),
            "started_at": self.previous.get("started_at", self.started_at), "finished_at": now,
            "hardware": {"gpu_product": e.gpu_product, "gpu_memory_mib": e.gpu_memory_mib,
                         "driver_version": e.driver_version, "cuda_version": e.cuda_version,
                         "cpu": e.cpu},
            "software": {**e.software, e.framework: e.framework_version},
            "notes": e.notes, "simulated": e.simulated, "backend": self.backend_name,
            "campaigns": [*self.previous.get("campaigns", []), record],
        })  # fmt: skip


def _spec_record(spec: CampaignSpec) -> dict[str, Any]:
    out = asdict(spec)
    out["batch_sizes"] = {k: list(v) for k, v in spec.batch_sizes.items()}
    out["onnx_models"] = [asdict(m) for m in spec.onnx_models]
    out["torch_models"] = [asdict(m) for m in spec.torch_models]
    return out


def tqdm_progress(total: int, desc: str) -> Any:
    """A tqdm bar on stderr showing which configuration runs."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="run", file=sys.stderr, dynamic_ncols=True)


def run_campaign(
    choice: BackendChoice,
    out: Path,
    spec: CampaignSpec,
    phases: Sequence[str] = ("isolated", "colocated"),
    *,
    resume: bool = False,
    command: str = "tandem profile run",
    gpu_index: int = 0,
    progress: ProgressFactory = no_progress,
    clock: Callable[[], float] = time.monotonic,
    wallclock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = lambda _s: None,
) -> dict[str, Any]:
    """Run a campaign end to end; returns the summary as a JSON-ready dict."""
    check_user_models(spec)
    with open_backend(choice, spec.measure, gpu_index, sleep) as ob:
        isolated = plan_isolated(spec, ob.catalogue)
        data = prepare_data_dir(out, ob.environment, resume)
        recorder = ProvenanceRecorder(data, ob.environment, command, str(choice), spec, wallclock)
        campaign = Campaign(spec, ob.backend, ob.environment, data, ob.features, clock, wallclock,
                            progress, catalogue=set(ob.catalogue))  # fmt: skip
        campaign.summary.repairs = list(data.repairs)

        def refresh() -> None:
            recorder.write(campaign.summary, _backend_counters(ob.backend))

        campaign.on_run(refresh)
        try:
            campaign.run(isolated, phases)  # type: ignore[arg-type]
        finally:
            # Written on success, budget stop, Ctrl-C and crash alike.
            refresh()
        return campaign.summary.as_dict()


def check_user_models(spec: CampaignSpec) -> None:
    """Resolve every user torch factory here, before any run: SpecError naming each failure."""
    if not spec.torch_models:
        return
    from predictor.profiling.usermodels import factory_problems

    problems = factory_problems((m.name, m.torch_model) for m in spec.torch_models
                                if m.torch_model is not None)  # fmt: skip
    if problems:
        raise SpecError(problems)


def _backend_counters(backend: Any) -> dict[str, Any]:
    return {name: dict(getattr(backend, name)) for name in ("memory_sources", "sampler_sources")
            if hasattr(backend, name)}  # fmt: skip


def _estimate(spec: CampaignSpec, runs: int) -> float:
    m = spec.measure
    return runs * (m.warmup_seconds + m.measure_seconds + _FIRST_RUN_OVERHEAD_SECONDS)


def plan_report(
    choice: BackendChoice, out: Path, spec: CampaignSpec, gpu_index: int = 0
) -> dict[str, Any]:
    """What ``run`` would do now, without running anything (JSON-ready).

    Co-located combinations are chosen from measured isolated rows, so they are
    listed only once ``OUT/<gpu>/isolated.csv`` exists. For ``cuda`` without a
    usable GPU here, the GPU directory is unknown and only the isolated plan shows.
    """
    check_user_models(spec)
    env: Environment | None = None
    if choice.kind == "sim":
        with open_backend(choice, spec.measure) as ob:
            env, catalogue = ob.environment, ob.catalogue
    else:
        catalogue = zoo_catalogue()
        with contextlib.suppress(ProfilingError, ImportError):
            import pynvml

            from predictor.profiling.nvml import open_device

            device = open_device(pynvml, gpu_index)
            env = Environment(device.product, device.memory_total_mib, device.driver_version,
                              device.cuda_driver_version, "pytorch", "", False)  # fmt: skip
    isolated = plan_isolated(spec, catalogue)
    data = DataDir(Path(out) / gpu_slug(env.gpu_product)) if env else None
    done: set[str] = set()
    combos: list[Combo] = []
    colo_done = 0
    if data is not None and env is not None:
        done = isolated_done(data)
        planner = Campaign(spec, _NoBackend(), env, data, _NoFeatures(),
                           catalogue=set(catalogue))  # fmt: skip
        combos, colo_done = planner.planned_combos()
    remaining = [j for j in isolated if j.key not in done]
    return {
        "backend": str(choice), "gpu_dir": str(data.path) if data else None,
        "gpu_product": env.gpu_product if env else None,
        "isolated": {"planned": len(isolated), "done": len(isolated) - len(remaining),
                     "remaining": len(remaining), "families": sorted({j.family for j in isolated}),
                     "configs": [{**asdict(j), "key": j.key, "done": j.key in done}
                                 for j in isolated]},
        "colocated": {"pairs": spec.pairs, "triples": spec.triples, "done": colo_done,
                      "combos": [{"combo_id": c.combo_id, "jobs": [j.key for j in c.jobs],
                                  "cumulative_isolated_util_percent": c.cumulative_util_percent}
                                 for c in combos],
                      "note": "" if data and data.file("isolated").is_file() else
                      "chosen from measured isolated rows: run the isolated phase first"},
        "estimated_seconds": _estimate(spec, len(remaining) + len(combos)),
    }  # fmt: skip


class _NoBackend:
    """Planning never measures."""

    def environment(self) -> Environment:
        raise ProfilingError("planning has no backend")

    def measure(self, jobs: Sequence[JobSpec]) -> Measurement:
        raise ProfilingError("planning does not measure")


class _NoFeatures:
    def features(self, job: JobSpec) -> dict[str, Any]:
        raise ProfilingError("planning reads no graphs")
