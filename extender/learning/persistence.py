"""The learning document in a ConfigMap: conditional writes, bounded in bytes.

Only the leader writes. Every write names the ``resourceVersion`` this replica last
read or wrote; a 409 Conflict (another replica wrote in between: a failover, a
split second of two leaders) re-reads the ConfigMap, merges it into what this
replica knows (:meth:`extender.learning.learner.Learner.merge`) and tries again.
So a standby that becomes leader never replaces what the old leader persisted
with its own older state. The document is kept under :data:`MAX_BYTES` by evicting
the least recently used estimates before it is written (``Learner.document``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

DOCUMENT_KEY = "observations.json"
MAX_BYTES = 900_000
"""A ConfigMap holds at most 1 MiB; keep headroom for metadata."""


class WriteConflict(Exception):
    """The ConfigMap changed since this replica read it (HTTP 409)."""


class ConfigMapPersistence:
    """The learning document in one ConfigMap (``data[observations.json]``), via a CoreV1Api."""

    MAX_BYTES = MAX_BYTES

    def __init__(self, api: Any, namespace: str, name: str):
        self.api, self.namespace, self.name = api, namespace, name
        self.resource_version: str | None = None
        """Of the ConfigMap as last read or written; None before (or when it does not exist)."""

    def load(self) -> Any | None:
        """The persisted document, or None when the ConfigMap does not exist."""
        from kubernetes.client.exceptions import ApiException
        try:
            response = self.api.read_namespaced_config_map(self.name, self.namespace,
                                                           _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                self.resource_version = None
                return None
            raise
        body = json.loads(response.data)
        self.resource_version = str((body.get("metadata") or {}).get("resourceVersion") or "") \
            or None
        text = (body.get("data") or {}).get(DOCUMENT_KEY)
        return None if text is None else json.loads(text)

    def save(self, doc: Mapping[str, Any]) -> None:
        """Write the document if the ConfigMap is still the one last read or written.

        WriteConflict when another replica wrote since (or created it first);
        ValueError when the document is over :data:`MAX_BYTES`.
        """
        from kubernetes.client.exceptions import ApiException
        text = encode(doc)
        if len(text) > self.MAX_BYTES:
            raise ValueError(f"learning document is {len(text)} bytes (limit {self.MAX_BYTES})")
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace,
                                "labels": {"app.kubernetes.io/managed-by": "tandem"}}
        if self.resource_version:
            meta["resourceVersion"] = self.resource_version
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                "data": {DOCUMENT_KEY: text}}
        try:
            if self.resource_version:
                stored = _read(self.api.replace_namespaced_config_map(
                    self.name, self.namespace, body, _preload_content=False))
            else:
                stored = _read(self.api.create_namespaced_config_map(
                    self.namespace, body, _preload_content=False))
        except ApiException as exc:
            if exc.status in (404, 409):  # deleted, changed, or created by another replica
                raise WriteConflict(f"configmap {self.name}: HTTP {exc.status}") from None
            raise
        self.resource_version = str((stored.get("metadata") or {}).get("resourceVersion")
                                    or "") or None


def encode(doc: Mapping[str, Any]) -> str:
    """The document's stored text (compact, sorted: its size is what the budget counts)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _read(response: Any) -> dict[str, Any]:
    """The stored ConfigMap of an unparsed response; the connection goes back to the pool."""
    data = response.data
    release = getattr(response, "release_conn", None)
    if release is not None:
        release()
    try:
        body = json.loads(data)
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}
