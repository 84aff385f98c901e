"""Kubernetes resource quantities, and what a pod requests of CPU and memory (kube-scheduler's sum).

One reader for every quantity tandem reads from a Kubernetes object: a node's
``status.allocatable`` (the ``kube`` cluster source), a simulated node's ``cpu`` and
``memory`` (``contracts.clusterfile``), a pod's container requests (the packing
score's host terms, the shapes learned at bind). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

_QUANTITY = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))"
                       r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]{1,3})?")
_SUFFIX = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
           "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
           "P": Decimal("1e15"), "E": Decimal("1e18"), "Ki": Decimal(2**10),
           "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
           "Pi": Decimal(2**50), "Ei": Decimal(2**60)}
_MAX_TEXT = 64
MIB = Decimal(2**20)


class QuantityError(ValueError):
    """Not a Kubernetes quantity (``500m``, ``2``, ``1.5Gi``, ``1e3``)."""


def parse_quantity(raw: object) -> Decimal:
    """A quantity as a Decimal in its base unit (cores, bytes); QuantityError if malformed
    or negative."""
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise QuantityError(f"{raw!r} is not a quantity")
    text = str(raw).strip()
    found = _QUANTITY.fullmatch(text) if len(text) <= _MAX_TEXT else None
    if found is None:
        raise QuantityError(f"{text[:_MAX_TEXT]!r} is not a quantity (e.g. 500m, 2, 1.5Gi)")
    number, suffix = found.group(1), found.group(2) or ""
    try:
        value = Decimal(number)
        value *= _SUFFIX[suffix] if suffix in _SUFFIX else Decimal(f"1{suffix}")  # 1e3
    except InvalidOperation as exc:
        raise QuantityError(f"{text!r} is not a quantity") from exc
    if value < 0:
        raise QuantityError(f"{text!r} is negative")
    return value


def cpu_milli(raw: object) -> float:
    """CPU in millicores."""
    return float(parse_quantity(raw) * 1000)


def memory_mib(raw: object) -> float:
    """Memory in MiB."""
    return float(parse_quantity(raw) / MIB)


def _requests(resources: Any) -> tuple[float, float]:
    """(CPU millicores, memory MiB) of one container: its requests, else its limits (the API
    server defaults a missing request to the limit). Malformed figures count as 0."""
    res = resources if isinstance(resources, Mapping) else {}
    out = []
    for key, read in (("cpu", cpu_milli), ("memory", memory_mib)):
        for part in ("requests", "limits"):
            values = res.get(part)
            if isinstance(values, Mapping) and key in values:
                try:
                    out.append(read(values[key]))
                except QuantityError:
                    out.append(0.0)
                break
        else:
            out.append(0.0)
    return out[0], out[1]


def pod_requests(spec: Any) -> tuple[float, float]:
    """(CPU millicores, memory MiB) a pod ``spec`` requests (:func:`containers_requests`,
    plus the pod overhead)."""
    spec = spec if isinstance(spec, Mapping) else {}
    items = [(group == "initContainers", c.get("resources"))
             for group in ("initContainers", "containers")
             for c in (spec.get(group) if isinstance(spec.get(group), list) else [])
             if isinstance(c, Mapping)]
    cpu, mem = containers_requests(items)
    overhead = _requests({"requests": spec.get("overhead")})
    return cpu + overhead[0], mem + overhead[1]


def containers_requests(items: Iterable[tuple[bool, Any]]) -> tuple[float, float]:
    """(CPU millicores, memory MiB) of ``(init?, resources)`` per container, as
    kube-scheduler's NodeResourcesFit counts them: the containers' sum or the largest init
    container, whichever is more."""
    main: list[tuple[float, float]] = []
    init: list[tuple[float, float]] = []
    for is_init, resources in items:
        (init if is_init else main).append(_requests(resources))
    cpu = max(sum(c for c, _ in main), max((c for c, _ in init), default=0.0))
    mem = max(sum(m for _, m in main), max((m for _, m in init), default=0.0))
    return cpu, mem
