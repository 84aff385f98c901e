"""Campaign spec: what to profile, validated in full, and the isolated configurations it plans.

A spec comes from a YAML file (``--spec``) with CLI options overriding its keys::

    models: [resnet18, bert_tiny]        # default: every model of the catalogue
    families: [resnet, transformer]      # keep only these families
    workloads: [training, inference]
    batch_sizes: {training: [16, 32, 64], inference: [1, 8, 32]}   # or one list for both
    onnx_models: [{name: mine, family: custom, path: models/mine.onnx}]   # inference only
    torch_models:                        # training and inference
      - {name: mynet, family: custom, factory: "mypkg.nets:build",   # or "nets.py:build"
         input_shape: [3, 224, 224], input_dtype: float32}   # int64 token ids: input_high
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

from predictor.profiling.backend import JobSpec, MeasureSettings, TorchModelSpec
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
    torch_model: TorchModelSpec | None = None


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
    torch_models: tuple[CatalogueEntry, ...] = ()
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
        for i, m in enumerate(self.torch_models):
            assert m.torch_model is not None
            out += [f"torch_models[{i}].{p}" for p in m.torch_model.problems()]
            out += [f"torch_models[{i}].workloads: {w!r} is not one of {'|'.join(WORKLOADS)}"
                    for w in m.workloads if w not in WORKLOADS]  # fmt: skip
        names = [m.name for m in self.user_models()]
        out += [f"user models: the name {n!r} is used twice"
                for n in sorted({n for n in names if names.count(n) > 1})]  # fmt: skip
        return out

    def user_models(self) -> tuple[CatalogueEntry, ...]:
        """The user's own models (ONNX files and torch factories), in spec order."""
        return (*self.onnx_models, *self.torch_models)

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
    if "torch_models" in data:
        kw["torch_models"] = tuple(_torch_entries(data["torch_models"], base_dir, problems))
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


_TORCH_KEYS = {"name", "family", "factory", "input_shape", "input_dtype", "input_high",
               "workloads"}  # fmt: skip


def _torch_entries(raw: Any, base_dir: Path, problems: list[str]) -> list[CatalogueEntry]:
    """Catalogue entries of the ``torch_models`` list (field values checked by ``problems``)."""
    entries = []
    for i, m in enumerate(raw or []):
        where = f"torch_models[{i}]"
        if not isinstance(m, Mapping) or not {"name", "family", "factory", "input_shape"} <= set(m):
            problems.append(f"{where}: expected {{name, family, factory, input_shape}}")
            continue
        problems += [f"{where}.{k}: unknown key" for k in sorted(set(m) - _TORCH_KEYS)]
        shape = m["input_shape"]
        if not isinstance(shape, list | tuple) or not all(
                isinstance(d, int) and not isinstance(d, bool) for d in shape):  # fmt: skip
            problems.append(f"{where}.input_shape: expected a list of integers")
            continue
        high = m.get("input_high", 2)
        if isinstance(high, bool) or not isinstance(high, int):
            problems.append(f"{where}.input_high: expected an integer")
            continue
        factory = str(m["factory"])
        module, sep, attr = factory.rpartition(":")
        if sep and module.endswith(".py") and not Path(module).is_absolute():
            factory = f"{base_dir / module}:{attr}"  # files are relative to the spec
        workloads = _tuple_of(m.get("workloads", list(WORKLOADS)), str, f"{where}.workloads",
                              problems)  # fmt: skip
        spec = TorchModelSpec(factory, tuple(shape), str(m.get("input_dtype", "float32")), high)
        entries.append(CatalogueEntry(str(m["name"]), str(m["family"]), workloads,
                                      torch_model=spec))  # fmt: skip
    return entries


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
    problems = [f"user models: {m.name!r} is also a catalogue model; choose another name"
                for m in spec.user_models() if m.name in entries]  # fmt: skip
    user_names = {m.name for m in spec.user_models()}
    for m in spec.user_models():
        entries[m.name] = m
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
        # The user's own models always run: naming them in the spec is the choice.
        if spec.models is not None and name not in spec.models and name not in user_names:
            continue
        if spec.families is not None and entry.family not in spec.families:
            continue
        for workload in spec.workloads:
            if workload not in entry.workloads:
                continue
            for batch in sorted(set(spec.batch_sizes.get(workload, ()))):
                jobs.append(JobSpec(name, entry.family, workload, batch,  # type: ignore[arg-type]
                                    entry.onnx_path, entry.torch_model))  # fmt: skip
    return jobs


def with_overrides(spec: CampaignSpec, **overrides: Any) -> CampaignSpec:
    """A copy of ``spec`` with the non-None overrides applied, then validated."""
    measure_keys = {k: v for k, v in overrides.items() if k in _MEASURE_KEYS and v is not None}
    top = {k: v for k, v in overrides.items() if k in _TOP_KEYS and v is not None}
    if measure_keys:
        top["measure"] = dataclasses.replace(spec.measure, **measure_keys)
    return dataclasses.replace(spec, **top).validated()
