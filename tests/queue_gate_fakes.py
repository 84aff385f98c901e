"""Fakes shared by the queue-gate tests (no tests here): pending pods and a CoreV1Api."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

from extender.queue.gate import GATE_NAME, RELEASED_ANNOTATION

NOW = 1_763_700_000.0


def pod(name: str, *, age_s: float = 10.0, gated: bool = True, gpus: int = 1,
        util: float | None = 40.0, mem: float | None = 2000.0, owner: str | None = None,
        released: bool = False, node: str | None = None,
        other_gates: tuple[str, ...] = ()) -> dict[str, Any]:
    """A pending pod as the API returns it (decoded JSON)."""
    from datetime import datetime

    ann: dict[str, str] = {}
    if util is not None:
        ann["tandem.io/gpu-util"] = str(util)
    if mem is not None:
        ann["tandem.io/gpu-mem-mib"] = str(mem)
    if released:
        ann[RELEASED_ANNOTATION] = "2025-11-21T00:00:00+00:00"
    created = datetime.fromtimestamp(NOW - age_s, tz=UTC).isoformat()
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                            "creationTimestamp": created.replace("+00:00", "Z"),
                            "annotations": ann}
    if owner:
        meta["ownerReferences"] = [{"controller": True, "uid": owner, "kind": "Job"}]
    gates = [{"name": g} for g in other_gates] + ([{"name": GATE_NAME}] if gated else [])
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {
        "limits": {"tandem.io/gpu": str(gpus)} if gpus else {}}}]}
    if gates:
        spec["schedulingGates"] = gates
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


@dataclass
class _Response:
    data: bytes


@dataclass
class FakeCoreV1:
    """Answers list with the given pods; records patches; can fail on demand."""

    pods: list[dict[str, Any]]
    fail_list: bool = False
    conflict_on: set[str] = field(default_factory=set)
    patches: list[tuple[str, str, Any, Mapping[str, Any]]] = field(default_factory=list)
    lists: list[str | None] = field(default_factory=list)
    """Namespace of each list call (None = all namespaces)."""

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> _Response:
        return self._list(None, kwargs)

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> _Response:
        return self._list(namespace, kwargs)

    def _list(self, namespace: str | None, kwargs: Mapping[str, Any]) -> _Response:
        assert kwargs["field_selector"] == "status.phase=Pending"
        assert kwargs["_preload_content"] is False
        self.lists.append(namespace)
        if self.fail_list:
            raise ConnectionError("apiserver unreachable")
        items = [p for p in self.pods
                 if namespace is None or p["metadata"]["namespace"] == namespace]
        return _Response(json.dumps({"items": items}).encode())

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **kwargs: Any) -> None:
        if name in self.conflict_on:
            error = RuntimeError("test failed")
            error.status = 422  # type: ignore[attr-defined]
            raise error
        self.patches.append((name, namespace, body, kwargs))
