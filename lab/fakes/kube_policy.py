"""The fake API server's pod status, PodDisruptionBudgets and Eviction API (``fake_kube_api``).

An eviction honours the UID precondition and every budget selecting the pod: 429
when one has no disruption left, else each budget's ``disruptionsAllowed`` drops
by one and the pod is deleted at once (there is no kubelet to wait for).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any


class ApiError(Exception):
    """An HTTP error answered as a ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def status(code: int, reason: str = "", message: str = "") -> dict[str, Any]:
    """A ``Status`` object (Success for 2xx)."""
    ok = 200 <= code < 300
    return {"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Success" if ok else "Failure", "reason": reason,
            "message": message, "code": code}


def _selector_matches(pod: Mapping[str, Any], selector: str) -> bool:
    # Only the selectors extenders use: spec.nodeName=X and spec.nodeName!=X.
    if not selector:
        return True
    node = (pod.get("spec") or {}).get("nodeName") or ""
    for term in selector.split(","):
        if term.startswith("spec.nodeName!="):
            if node == term[len("spec.nodeName!="):]:
                return False
        elif term.startswith("spec.nodeName="):
            if node != term[len("spec.nodeName="):]:
                return False
        else:
            raise ApiError(400, "BadRequest", f"unsupported field selector {term!r}")
    return True


class PolicyMixin:
    """Methods of ``FakeKubeApi`` over its store (``_cond``, ``pods``, ``pdbs``, ``_commit``)."""

    _cond: Any
    _rv: int
    pods: dict[tuple[str, str], dict[str, Any]]
    pdbs: dict[tuple[str, str], dict[str, Any]]

    def _commit(self, kind: str, event: str, obj: dict[str, Any]) -> None: ...
    def _stored_pod(self, namespace: str, name: str) -> dict[str, Any]: ...
    def _check_uid(self, pod: Mapping[str, Any], uid: str | None) -> None: ...

    def put_pdb(self, pdb: Mapping[str, Any]) -> None:
        """Create or replace a PodDisruptionBudget (``status.disruptionsAllowed`` as given)."""
        obj = copy.deepcopy(dict(pdb))
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        with self._cond:
            self.pdbs[(meta["namespace"], meta["name"])] = obj

    def patch_pod_status(self, namespace: str, name: str, body: Any) -> dict[str, Any]:
        """Merge ``status`` fields (None deletes one), as a merge patch of ``pods/status``."""
        if not isinstance(body, dict) or not isinstance(body.get("status"), dict):
            raise ApiError(400, "BadRequest", "status patch needs a status object")
        with self._cond:
            pod = copy.deepcopy(self._stored_pod(namespace, name))
            merged = pod.setdefault("status", {})
            for key, value in body["status"].items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
            self.pods[(namespace, name)] = pod
            self._commit("pods", "MODIFIED", pod)
            return copy.deepcopy(pod)

    def evict_pod(self, namespace: str, name: str, body: Any) -> dict[str, Any]:
        """The Eviction API: UID precondition, budgets honoured, then the pod is deleted."""
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "eviction body must be an object")
        uid = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
        with self._cond:
            pod = self._stored_pod(namespace, name)
            self._check_uid(pod, uid)
            labels = pod["metadata"].get("labels") or {}
            budgets = [b for (ns, _), b in self.pdbs.items()
                       if ns == namespace and _labels_match(
                           (b.get("spec") or {}).get("selector"), labels)]
            for budget in budgets:
                if int((budget.get("status") or {}).get("disruptionsAllowed", 0)) <= 0:
                    raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would "
                                   "violate the pod's disruption budget.")
            for budget in budgets:
                budget["status"]["disruptionsAllowed"] -= 1
            obj = self.pods.pop((namespace, name))
            self._commit("pods", "DELETED", copy.deepcopy(obj))
        return status(201)

    def list_pdbs(self, namespace: str | None) -> dict[str, Any]:
        """A PodDisruptionBudgetList (one namespace, or all)."""
        with self._cond:
            items = [b for (ns, _), b in self.pdbs.items() if namespace in (None, ns)]
            return json.loads(json.dumps({"kind": "PodDisruptionBudgetList",
                                          "apiVersion": "policy/v1",
                                          "metadata": {"resourceVersion": str(self._rv)},
                                          "items": items}))


def _labels_match(selector: Any, labels: Mapping[str, str]) -> bool:
    """A LabelSelector's ``matchLabels`` and ``In``/``Exists`` expressions (None: nothing)."""
    if not isinstance(selector, dict):
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op = expr.get("key"), expr.get("operator")
        if (op == "In" and labels.get(key) not in (expr.get("values") or [])) \
                or (op == "Exists" and key not in labels):
            return False
    return True
