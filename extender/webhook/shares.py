"""Declared GPU shares written for other GPU-sharing schedulers, as tandem's own annotations.

Where the admin turns a source on, the admission webhook reads what users already
write for it and turns it into ``tandem.io/gpu`` and tandem's share annotations
(``tandem.io/gpu-mem-mib``, ``tandem.io/gpu-util``; ``contracts.annotations``):

- ``translate_gpushare``: Alibaba gpushare's ``aliyun.com/gpu-mem`` container
  resource (``gpushare_memory_unit``: GiB, its default, or MiB) -> one GPU with that
  memory;
- ``translate_hami``: HAMi's ``nvidia.com/gpumem`` (MiB per GPU) and
  ``nvidia.com/gpucores`` (percent of a GPU) container resources, beside
  ``nvidia.com/gpu`` (default 1) -> that many GPUs with that memory and utilisation;
- ``translate_gpu_milli``: the ``alibabacloud.com/gpu-milli`` pod annotation
  (thousandths of a GPU, 1..1000) -> one GPU (or the count the pod asks for) with
  ``milli/10`` percent utilisation and ``milli/1000`` of ``gpu_milli_memory_mib``.

A share is declared on one container; a pod that also asserts tandem's own share
annotations, or whose figures are out of range, is refused with the reason (the pod
is not created: nothing is lost, the owner fixes the spec). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contracts import annotations as ann
from contracts.pod import CONTAINER_KINDS, NVIDIA_GPU, PodView

GPUSHARE_MEM = "aliyun.com/gpu-mem"
HAMI_MEM = "nvidia.com/gpumem"
HAMI_CORES = "nvidia.com/gpucores"
GPU_MILLI = "alibabacloud.com/gpu-milli"
MEMORY_UNITS = {"GiB": 1024, "MiB": 1}
_GPUSHARE_RANGE = ann.IntRange(1, 4_000_000)
_HAMI_MEM_RANGE = ann.IntRange(1, 4_000_000)
_HAMI_CORES_RANGE = ann.IntRange(1, 100)
_MILLI_RANGE = ann.IntRange(1, 1000)


class ShareError(ValueError):
    """A declared share that cannot be translated; the webhook refuses the pod with it."""


@dataclass(frozen=True)
class ShareSources:
    """Which sources the webhook translates (each off unless the admin turns it on)."""

    gpushare: bool = False
    gpushare_unit: str = "GiB"
    hami: bool = False
    gpu_milli: bool = False
    gpu_milli_memory_mib: int | None = None
    """The GPU memory 1000 milli stand for (required with ``gpu_milli``)."""

    @property
    def any(self) -> bool:
        """Whether any source is on."""
        return self.gpushare or self.hami or self.gpu_milli


@dataclass(frozen=True)
class Translated:
    """What a pod's declared share becomes: per container path its new resources, and
    the annotations to add."""

    resources: dict[tuple[str, int], dict[str, Any]]
    annotations: dict[str, str]


def translate(pod: Mapping[str, Any] | PodView, sources: ShareSources) -> Translated:
    """The translation of ``pod``'s declared shares; ShareError if they are bad."""
    view = PodView.of(pod)
    present = view.annotations
    resources: dict[tuple[str, int], dict[str, Any]] = {}
    found: dict[str, str] = {}
    for c in view.containers:
        group = CONTAINER_KINDS[0] if c.init else CONTAINER_KINDS[1]
        if isinstance(c.resources, Mapping):
            new = _container(c.resources, sources, found, f"{group}[{c.index}]")
            if new is not None:
                resources[(group, c.index)] = new
    if sources.gpu_milli and GPU_MILLI in present:
        if found:
            raise ShareError(f"{GPU_MILLI} and a container's GPU share both declare one: "
                             "give one of them")
        found.update(_milli(present[GPU_MILLI], sources))
        first = next((c for c in view.containers if not c.init), None)
        if not resources and not view.asks_any_gpu and first is not None:
            res = dict(first.resources) if isinstance(first.resources, Mapping) else {}
            limits = res.get("limits")
            res["limits"] = {**(limits if isinstance(limits, Mapping) else {}),
                             ann.GPU_RESOURCE: "1"}
            resources[("containers", 0)] = res
    clash = [k for k in found if k in present]
    if clash:
        raise ShareError(f"the pod declares a GPU share and also sets {', '.join(clash)}: "
                         "give one of them")
    return Translated(resources, found)


def _container(res: Mapping[str, Any], sources: ShareSources, found: dict[str, str],
               where: str) -> dict[str, Any] | None:
    """``res`` with its declared share turned into ``tandem.io/gpu`` (None: none declared)."""
    keys = {k for part in res.values() if isinstance(part, Mapping) for k in part}
    gpushare = sources.gpushare and GPUSHARE_MEM in keys
    hami = sources.hami and bool(keys & {HAMI_MEM, HAMI_CORES})
    if not (gpushare or hami):
        return None
    if found:
        raise ShareError(f"{where}: a GPU share is declared on more than one container; "
                         "declare it on the one container that uses the GPU")
    figures: dict[str, int] = {}
    for part in ("limits", "requests"):
        values = res.get(part)
        if isinstance(values, Mapping):
            for key, valid in ((GPUSHARE_MEM, _GPUSHARE_RANGE), (HAMI_MEM, _HAMI_MEM_RANGE),
                               (HAMI_CORES, _HAMI_CORES_RANGE), (NVIDIA_GPU, ann.GPU_COUNT_RANGE)):
                if key in values and key not in figures:
                    figures[key] = ann.parse_integer(values[key], f"{where}.{part}.{key}", valid)
    count = figures.get(NVIDIA_GPU, 1) if hami else 1
    if gpushare:
        found[ann.GPU_MEM_MIB] = str(figures[GPUSHARE_MEM]
                                     * MEMORY_UNITS[sources.gpushare_unit])
    if hami and HAMI_MEM in figures:
        found[ann.GPU_MEM_MIB] = str(figures[HAMI_MEM])
    if hami and HAMI_CORES in figures:
        found[ann.GPU_UTIL] = str(figures[HAMI_CORES])
    drop = {GPUSHARE_MEM, HAMI_MEM, HAMI_CORES, NVIDIA_GPU, ann.GPU_RESOURCE}
    out: dict[str, Any] = {}
    for part, values in res.items():
        if isinstance(values, Mapping):
            values = {k: v for k, v in values.items() if k not in drop}
            if part == "limits":
                values[ann.GPU_RESOURCE] = str(count)
        out[part] = values
    out.setdefault("limits", {ann.GPU_RESOURCE: str(count)})
    return out


def _milli(raw: object, sources: ShareSources) -> dict[str, str]:
    milli = ann.parse_integer(raw, GPU_MILLI, _MILLI_RANGE)
    assert sources.gpu_milli_memory_mib is not None  # parse_settings requires it
    return {ann.GPU_UTIL: f"{milli / 10:g}",
            ann.GPU_MEM_MIB: str(milli * sources.gpu_milli_memory_mib // 1000)}
