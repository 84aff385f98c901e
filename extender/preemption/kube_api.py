"""What preemption asks of the API server: bound pods, budgets, evictions, the nomination.

Evictions go through the Eviction API (``pods/{name}/eviction``, policy/v1) with
the victim's UID as a precondition, so the API server enforces every
PodDisruptionBudget (it answers 429 when an eviction would break one) and a
recreated pod of the same name is never evicted by mistake. The preemptor's
``status.nominatedNodeName`` is a merge patch of ``pods/{name}/status``, as
kube-scheduler writes it. Reads are plain JSON (``_preload_content=False``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from contracts.pod import PodView
from extender.cluster.kube_http import api_error

SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget as preemption needs it."""

    key: str
    """``namespace/name``."""
    namespace: str
    selector: Mapping[str, Any] | None
    """``spec.selector`` (None selects nothing, ``{}`` every pod of the namespace)."""
    disruptions_allowed: int

    def selects(self, pod: PodView | Mapping[str, Any]) -> bool:
        """Whether this budget covers ``pod`` (same namespace, selector matches its labels)."""
        view = PodView.of(pod)
        if view.namespace != self.namespace or self.selector is None:
            return False
        return selector_matches(self.selector, view.labels)


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector (``matchLabels`` and ``matchExpressions``) against a pod's labels."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op = expr.get("key"), expr.get("operator")
        values = expr.get("values") or []
        present = key in labels
        if op not in SELECTOR_OPERATORS:
            return False  # an operator we do not know selects nothing (never a wrong victim)
        if (op == "In" and (not present or labels[key] not in values)) \
                or (op == "NotIn" and present and labels[key] in values) \
                or (op == "Exists" and not present) or (op == "DoesNotExist" and present):
            return False
    return True


class EvictionRefused(Exception):
    """The API server refused an eviction (429: a PodDisruptionBudget; other errors too)."""


class KubePreemptionApi:
    """The official client's calls preemption makes, on the extender's own credentials."""

    def __init__(self, core: client.CoreV1Api):
        self.core = core
        self.policy = client.PolicyV1Api(core.api_client)

    def bound_pods(self) -> list[Mapping[str, Any]]:
        """Every pod with a node (one list, as the ledger's relist)."""
        answer = self.core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=",
                                                       _preload_content=False)
        return list(_json(answer).get("items") or [])

    def budgets(self) -> list[Budget]:
        """Every PodDisruptionBudget with the disruptions its status allows now."""
        answer = self.policy.list_pod_disruption_budget_for_all_namespaces(
            _preload_content=False)
        out = []
        for pdb in _json(answer).get("items") or []:
            meta = pdb.get("metadata") or {}
            ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
            allowed = (pdb.get("status") or {}).get("disruptionsAllowed")
            out.append(Budget(f"{ns}/{name}", ns, (pdb.get("spec") or {}).get("selector"),
                              allowed if isinstance(allowed, int) else 0))
        return out

    def evict(self, namespace: str, name: str, uid: str) -> bool:
        """Evict one pod (UID precondition); False when it is already gone, EvictionRefused
        when the API server says no."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
                "deleteOptions": {"preconditions": {"uid": uid}}}
        try:
            answer = self.core.create_namespaced_pod_eviction(name, namespace, body,
                                                              _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise EvictionRefused(api_error(exc)) from None
        answer.drain_conn()
        answer.release_conn()
        return True

    def nominate(self, namespace: str, name: str, node: str) -> None:
        """Set the preemptor's ``status.nominatedNodeName``."""
        answer = self.core.patch_namespaced_pod_status(
            name, namespace, {"status": {"nominatedNodeName": node}}, _preload_content=False)
        answer.drain_conn()
        answer.release_conn()


def _json(response: Any) -> Any:
    try:
        return json.loads(response.data)
    finally:
        response.release_conn()
