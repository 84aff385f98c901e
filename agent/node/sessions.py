"""Keep each GPU's inference server in step with the inference pods placed on it.

Desired state: pods on this node with ``tandem.io/workload: inference``, grouped
by the GPU the extender bound them to. Actual state: ``GET /v1/sessions`` on
that GPU's server. Sync adds what is missing (``POST /v1/sessions``), deletes
what is gone (``DELETE /v1/sessions/NAME``) and leaves the rest, so running it
every interval is idempotent. The agent is the servers' authoritative
administrative client, so a session no pod asks for is removed. With an
``AdminToken``, adds and deletes carry ``Authorization: Bearer <token>`` (the
servers answer 401 without it); the listing is open and sent without it.

Session name: ``<namespace>.<pod name>`` (namespaces have no dots, so it is
unambiguous and URL-safe). Body: ``{"name", "model", "slo_ms", "rate_rps"}`` (and
``"priority"`` where given) when the pod has ``tandem.io/slo-ms`` and
``tandem.io/rate-rps``, else the best-effort
``{"name", "model", "priority"}`` or ``{"name", "model", "weight"}`` (default 1).
The annotations are read by :func:`contracts.annotations.parse_inputs`, the
extender's validator: a pod it would reject (an SLO without a rate, a weight
out of range) is skipped with a logged reason, never registered as something else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from agent.inference.http.auth import AdminToken, AdminTokenError
from agent.node.extender_view import NodeView, PodPlacement
from contracts.annotations import (
    DEFAULT_WEIGHT,
    INFERENCE,
    WORKLOAD,
    AnnotationError,
    parse_inputs,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionSpec:
    """One session the agent wants on one GPU's server."""

    name: str
    gpu_index: int
    body: tuple[tuple[str, Any], ...]

    def json(self) -> dict[str, Any]:
        """The ``POST /v1/sessions`` body."""
        return dict(self.body)


@dataclass(frozen=True)
class SyncResult:
    """What one sync round did, per session name."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    skipped: tuple[str, ...] = field(default=())  # pods with unusable annotations


def session_name(pod: PodPlacement) -> str:
    """``<namespace>.<name>``, the session's name on the server."""
    return f"{pod.namespace}.{pod.name}"


def session_spec(pod: PodPlacement) -> SessionSpec:
    """The session an inference pod asks for; AnnotationError if its annotations are unusable.

    The annotations go through the extender's own validator, so a pod the
    extender would reject is skipped here too, never registered differently.
    """
    if not pod.name:
        raise AnnotationError("pod", pod.name, "has no name")
    inputs = parse_inputs(dict(pod.annotations))
    if inputs.workload != INFERENCE:
        raise AnnotationError(WORKLOAD, inputs.workload, "is not an inference pod")
    body: dict[str, Any] = {"name": session_name(pod), "model": inputs.model}
    if inputs.slo_ms is not None and inputs.rate_rps is not None:
        body.update(slo_ms=inputs.slo_ms, rate_rps=inputs.rate_rps)
        if inputs.priority is not None:  # the server's order of sacrifice reads it
            body["priority"] = inputs.priority
    elif inputs.priority is not None:
        body["priority"] = inputs.priority
    else:
        body["weight"] = inputs.weight if inputs.weight is not None else DEFAULT_WEIGHT
    return SessionSpec(body["name"], pod.gpu_index, tuple(body.items()))


def desired_sessions(
    view: NodeView,
) -> tuple[dict[int, dict[str, SessionSpec]], tuple[tuple[str, str], ...]]:
    """Per GPU index, the sessions its server should hold; plus ``(name, why)`` of unusable pods."""
    wanted: dict[int, dict[str, SessionSpec]] = {g.index: {} for g in view.gpus}
    skipped: dict[str, str] = {}
    for pod in view.pods():
        if pod.annotation(WORKLOAD) != INFERENCE or not pod.trusted:
            continue  # an untrusted pod holds its node's GPUs but gets no session
        try:
            spec = session_spec(pod)
        except AnnotationError as err:
            skipped[session_name(pod)] = str(err)
            continue
        wanted.setdefault(spec.gpu_index, {})[spec.name] = spec
    return wanted, tuple(sorted(skipped.items()))


def best_effort_gpu_time(document: Any) -> dict[str, float]:
    """Best-effort session name -> ``gpu_time_ms`` in a ``GET /v1/sessions`` list answer."""
    entries = document.get("sessions") if isinstance(document, Mapping) else document
    if not isinstance(entries, list):
        return {}
    return {str(e["name"]): float(e["gpu_time_ms"]) for e in entries
            if isinstance(e, Mapping) and e.get("kind") == "best_effort"
            and isinstance(e.get("gpu_time_ms"), (int, float)) and "name" in e}


def _session_names(document: Any) -> set[str]:
    """Names in a ``GET /v1/sessions`` answer: a list, or ``{"sessions": list|object}``."""
    entries = document.get("sessions") if isinstance(document, Mapping) else document
    if isinstance(entries, Mapping):
        return {str(k) for k in entries}
    if isinstance(entries, list):
        return {str(e["name"]) for e in entries if isinstance(e, Mapping) and "name" in e}
    raise ValueError("unexpected /v1/sessions shape")


class SessionSync:
    """Syncs sessions to per-GPU servers at ``server_url(gpu_index)``."""

    def __init__(self, server_url: Callable[[int], str], *,
                 transport: httpx.BaseTransport | None = None,
                 timeout_seconds: float = 5.0,
                 admin_token: AdminToken | None = None) -> None:
        self._url = server_url
        self._token = admin_token
        self._client = httpx.Client(transport=transport, timeout=timeout_seconds)
        self._refused: set[tuple[str, int]] = set()
        self._skip_logged: dict[str, str] = {}
        self.gpu_time_ms: dict[int, dict[str, float]] = {}
        """Per GPU index, each best-effort session's GPU time as its server last listed it
        (carried in the next report, so the extender learns the session's utilisation)."""

    def sync(self, view: NodeView) -> SyncResult:
        """One idempotent round over every GPU of the view."""
        wanted, skipped = desired_sessions(view)
        self._log_skipped(skipped)
        added: list[str] = []
        removed: list[str] = []
        kept: list[str] = []
        failed: list[str] = []
        for index, specs in sorted(wanted.items()):
            base = self._url(index)
            try:
                response = self._client.get(f"{base}/v1/sessions")
                response.raise_for_status()
                listing = response.json()
                present = _session_names(listing)
                self.gpu_time_ms[index] = best_effort_gpu_time(listing)
            except (httpx.HTTPError, ValueError) as err:
                self.gpu_time_ms.pop(index, None)
                if specs:  # a GPU with no server and no sessions to host is normal
                    log.warning("session server unreachable",
                                extra={"gpu": index, "error": type(err).__name__})
                    failed.extend(sorted(specs))
                continue
            for name in sorted(present - specs.keys()):
                (removed if self._delete(base, name) else failed).append(name)
            for name in sorted(specs.keys() - present):
                (added if self._post(base, index, specs[name]) else failed).append(name)
            kept.extend(sorted(present & specs.keys()))
        return SyncResult(tuple(added), tuple(removed), tuple(kept), tuple(failed),
                          tuple(name for name, _ in skipped))

    def _log_skipped(self, skipped: tuple[tuple[str, str], ...]) -> None:
        """Log each skipped pod once per reason (sync repeats every interval)."""
        for name, reason in skipped:
            if self._skip_logged.get(name) != reason:
                log.warning("session skipped: unusable annotations",
                            extra={"session": name, "reason": reason})
        self._skip_logged = dict(skipped)

    def _headers(self) -> dict[str, str]:
        """The admin header (re-reads a rotated token file); AdminTokenError if unreadable."""
        return self._token.headers() if self._token is not None else {}

    def _post(self, base: str, index: int, spec: SessionSpec) -> bool:
        try:
            response = self._client.post(f"{base}/v1/sessions", json=spec.json(),
                                         headers=self._headers())
        except (httpx.HTTPError, AdminTokenError) as err:
            log.warning("session add failed", extra={"session": spec.name, "gpu": index,
                                                     "error": type(err).__name__})
            return False
        if response.status_code < 300:
            self._refused.discard((spec.name, index))
            return True
        if (spec.name, index) not in self._refused:  # a refusal repeats each round: log once
            self._refused.add((spec.name, index))
            log.warning("session refused", extra={"session": spec.name, "gpu": index,
                                                  "status": response.status_code,
                                                  "reason": response.text[:200]})
        return False

    def _delete(self, base: str, name: str) -> bool:
        try:
            response = self._client.delete(f"{base}/v1/sessions/{quote(name, safe='')}",
                                           headers=self._headers())
        except (httpx.HTTPError, AdminTokenError) as err:
            log.warning("session delete failed", extra={"session": name,
                                                        "error": type(err).__name__})
            return False
        return response.status_code < 300 or response.status_code == 404

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()
