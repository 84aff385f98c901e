"""Campaign spec: what to profile, validated in full, and the isolated configurations it plans.

A spec comes from a YAML file (``--spec``) with CLI options overriding its keys::

    models: [resnet18, bert_tiny]        # default: every model of the catalogue
    families: [resnet, transformer]      # keep only these families
    workloads: [training, inference]
    batch_sizes: {training: [16, 32, 64], inference: [1, 8, 32]}   # or one list for both
    onnx_models: [{name: mine, family: custom, path: models/mine.onnx}]   # inference only
    pairs: 60                            # co-located combinations of two jobs
    triples: 40                          # ... of three jobs
    seed: 0
    budget_seconds: 480                  # stop cleanly before this much wall time
    colocated_util_range_percent: [30, 250]
    colocated_memory_fraction: 0.9       # skip combinations whose isolated memory exceeds this
    measure: {warmup_seconds: 2, measure_seconds: 4, sample_interval_ms: 200, optimizer: sgd}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from predictor.profiling.backend import JobSpec, MeasureSettings
from predictor.profiling.errors import SpecError

WORKLOADS: tuple[str, ...] = ("training", "inference")
DEFAULT_BATCH_SIZES: dict[str, tuple[int, ...]] = {
    "training": (8, 16, 32, 64, 128),
    "inference": (1, 4, 16, 64),
}


@dataclass(frozen=True)
class CatalogueEntry:
    """A model the backend can run: its name, family and the workloads it supports."""

    name: str
    family: str
    workloads: tuple[str, ...] = WORKLOADS
    onnx_path: str | None = None


@dataclass(frozen=True)
class CampaignSpec:
    """Everything a campaign needs to plan and run; see the module docstring for YAML keys."""

    models: tuple[str, ...] | None = None
    families: tuple[str, ...] | None = None
    workloads: tuple[str, ...] = WORKLOADS
    batch_sizes: Mapping[str, tuple[int, ...]] = field(
        default_factory=lambda: dict(DEFAULT_BATCH_SIZES)
    )
    onnx_models: tuple[CatalogueEntry, ...] = ()
    pairs: int = 60
    triples: int = 40
    seed: int = 0
    budget_seconds: float | None = None
    colocated_util_range_percent: tuple[float, float] = (30.0, 250.0)
    colocated_memory_fraction: float = 0.9
    measure: MeasureSettings = field(default_factory=MeasureSettings)

    def problems(self) -> list[str]:
        """Every invalid field as ``path: reason``."""
        out = [f"measure.{p}" for p in self.measure.problems()]
        for w in self.workloads:
            if w not in WORKLOADS:
                out.append(f"workloads: {w!r} is not one of {'|'.join(WORKLOADS)}")
        if not self.workloads:
            out.append("workloads: at least one is needed")
        for w, sizes in self.batch_sizes.items():
            if w not in WORKLOADS:
                out.append(f"batch_sizes.{w}: unknown workload")
            if not sizes:
                out.append(f"batch_sizes.{w}: at least one batch size is needed")
            out += [f"batch_sizes.{w}[{i}]: must be >= 1" for i, b in enumerate(sizes) if b < 1]
        for name, value in (("pairs", self.pairs), ("triples", self.triples)):
            if value < 0:
                out.append(f"{name}: must be >= 0")
        if self.budget_seconds is not None and self.budget_seconds <= 0:
            out.append("budget_seconds: must be > 0")
        lo, hi = self.colocated_util_range_percent
        if not 0 <= lo < hi:
            out.append("colocated_util_range_percent: need 0 <= low < high")
        if not 0 < self.colocated_memory_fraction <= 1:
            out.append("colocated_memory_fraction: must be within (0, 1]")
        for i, m in enumerate(self.onnx_models):
            if not m.onnx_path or not Path(m.onnx_path).is_file():
                out.append(f"onnx_models[{i}].path: no such file {m.onnx_path!r}")
        return out

    def validated(self) -> CampaignSpec:
        """Return self, or raise SpecError listing every problem."""
        problems = self.problems()
        if problems:
            raise SpecError(problems)
        return self


_TOP_KEYS = {f.name for f in dataclasses.fields(CampaignSpec)}
_MEASURE_KEYS = {f.name for f in dataclasses.fields(MeasureSettings)}


def _tuple_of(value: Any, kind: type, path: str, problems: list[str]) -> tuple[Any, ...]:
    items = value if isinstance(value, list | tuple) else [value]
    out = []
    for i, item in enumerate(items):
        if kind is int and isinstance(item, bool) or not isinstance(item, kind):
            problems.append(f"{path}[{i}]: expected {kind.__name__}, got {item!r}")
        else:
            out.append(item)
    return tuple(out)


def spec_from_mapping(data: Mapping[str, Any], base_dir: Path = Path(".")) -> CampaignSpec:
    """Build a spec from parsed YAML; raises SpecError with every problem at once."""
    if not isinstance(data, Mapping):
        raise SpecError(["spec: expected a mapping at the top level"])
    problems = [f"{k}: unknown key" for k in sorted(set(data) - _TOP_KEYS)]
    kw: dict[str, Any] = {}
    for key in ("models", "families", "workloads"):
        if key in data:
            kw[key] = _tuple_of(data[key], str, key, problems)
    if "batch_sizes" in data:
        raw = data["batch_sizes"]
        if isinstance(raw, Mapping):
            kw["batch_sizes"] = {
                str(w): _tuple_of(v, int, f"batch_sizes.{w}", problems) for w, v in raw.items()
            }
        else:
            sizes = _tuple_of(raw, int, "batch_sizes", problems)
            kw["batch_sizes"] = dict.fromkeys(WORKLOADS, sizes)
    for key, kind in (("pairs", int), ("triples", int), ("seed", int)):
        if key in data:
            if isinstance(data[key], bool) or not isinstance(data[key], kind):
                problems.append(f"{key}: expected an integer")
            else:
                kw[key] = data[key]
    for key in ("budget_seconds", "colocated_memory_fraction"):
        if key in data and data[key] is not None:
            if isinstance(data[key], bool) or not isinstance(data[key], int | float):
                problems.append(f"{key}: expected a number")
            else:
                kw[key] = float(data[key])
    if "colocated_util_range_percent" in data:
        rng = data["colocated_util_range_percent"]
        if (
            isinstance(rng, list | tuple)
            and len(rng) == 2
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in rng)
        ):
            kw["colocated_util_range_percent"] = (float(rng[0]), float(rng[1]))
        else:
            problems.append("colocated_util_range_percent: expected [low, high]")
    if "onnx_models" in data:
        entries = []
        for i, m in enumerate(data["onnx_models"] or []):
            if not isinstance(m, Mapping) or not {"name", "family", "path"} <= set(m):
                problems.append(f"onnx_models[{i}]: expected {{name, family, path}}")
                continue
            path = Path(str(m["path"]))
            path = path if path.is_absolute() else base_dir / path
            entries.append(CatalogueEntry(str(m["name"]), str(m["family"]), ("inference",),
                                          str(path)))  # fmt: skip
        kw["onnx_models"] = tuple(entries)
    if "measure" in data:
        raw = data["measure"]
        if not isinstance(raw, Mapping):
            problems.append("measure: expected a mapping")
        else:
            problems += [f"measure.{k}: unknown key" for k in sorted(set(raw) - _MEASURE_KEYS)]
            try:
                kw["measure"] = MeasureSettings(**{k: v for k, v in raw.items()
                                                   if k in _MEASURE_KEYS})  # fmt: skip
            except TypeError as exc:
                problems.append(f"measure: {exc}")
    if problems:
        raise SpecError(problems)
    return CampaignSpec(**kw).validated()


def load_spec(path: Path) -> CampaignSpec:
    """Read a campaign spec YAML file."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError([f"{path}: {exc}"]) from exc
    return spec_from_mapping(data, Path(path).parent)


def plan_isolated(spec: CampaignSpec, catalogue: Mapping[str, CatalogueEntry]) -> list[JobSpec]:
    """Isolated configurations in run order: model, then workload, then batch size."""
    entries = dict(catalogue)
    for m in spec.onnx_models:
        entries[m.name] = m
    problems = []
    if spec.models is not None:
        problems += [f"models: {m!r} is not in the catalogue (known: {', '.join(sorted(entries))})"
                     for m in spec.models if m not in entries]  # fmt: skip
    if spec.families is not None:
        known = {e.family for e in entries.values()}
        problems += [f"families: {f!r} is unknown (known: {', '.join(sorted(known))})"
                     for f in spec.families if f not in known]  # fmt: skip
    if problems:
        raise SpecError(problems)
    jobs = []
    for name in sorted(entries):
        entry = entries[name]
        onnx_name = any(m.name == name for m in spec.onnx_models)
        if spec.models is not None and name not in spec.models and not onnx_name:
            continue
        if spec.families is not None and entry.family not in spec.families:
            continue
        for workload in spec.workloads:
            if workload not in entry.workloads:
                continue
            for batch in sorted(set(spec.batch_sizes.get(workload, ()))):
                jobs.append(JobSpec(name, entry.family, workload, batch,  # type: ignore[arg-type]
                                    entry.onnx_path))  # fmt: skip
    return jobs


def with_overrides(spec: CampaignSpec, **overrides: Any) -> CampaignSpec:
    """A copy of ``spec`` with the non-None overrides applied, then validated."""
    measure_keys = {k: v for k, v in overrides.items() if k in _MEASURE_KEYS and v is not None}
    top = {k: v for k, v in overrides.items() if k in _TOP_KEYS and v is not None}
    if measure_keys:
        top["measure"] = dataclasses.replace(spec.measure, **measure_keys)
    return dataclasses.replace(spec, **top).validated()
