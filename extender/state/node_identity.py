"""Which node an agent may speak for: its pod's ServiceAccount token, reviewed.

With ``reports.identity: service-account`` each agent sends the projected
ServiceAccount token of its own pod (audience ``reports.audience``) instead of a
token every agent shares. The extender asks the API server to review it
(``TokenReview``, authentication.k8s.io/v1): the token must be valid for that
audience, belong to the agents' ServiceAccount (``reports.service_account``,
``namespace/name``) and be bound to a pod; the node is the one the API server
names for that pod (``authentication.kubernetes.io/node-name`` in the review's
extra fields, else the bound pod's ``spec.nodeName``, its UID checked). A report
may then only be about that node, so a leaked token speaks for one node at most,
and only while its pod exists. Reviews are cached per token for
:data:`CACHE_SECONDS` (agents report every second). ``shared-token`` (the default,
for the simulated cluster and demos) keeps one bearer token for every agent.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from contracts.bounded import BoundedMap
from extender.errors import ExtenderError, Forbidden, Unauthorized
from extender.state.reports import check_token

NODE_NAME = "authentication.kubernetes.io/node-name"
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"
CACHE_SECONDS = 60.0
MAX_CACHED = 10_000
MAX_TOKEN_CHARS = 16_384


class ReviewUnavailable(ExtenderError):
    """The API server could not review the token now (the agent retries)."""

    http_status = 503


class NodeIdentity:
    """Reviews agent tokens against the API server and caches the node each speaks for."""

    def __init__(self, core_api: Any, audience: str, service_account: str,
                 clock: Callable[[], float] = time.monotonic):
        from kubernetes import client
        self._auth = client.AuthenticationV1Api(core_api.api_client)
        self._core = core_api
        self.audience = audience
        namespace, _, name = service_account.partition("/")
        self.username = f"system:serviceaccount:{namespace}:{name}"
        self._clock = clock
        self._cache: BoundedMap[str, tuple[str, float]] = BoundedMap(MAX_CACHED)
        """sha256 of a token -> (its node, when the review expires)."""
        self.reviews = 0

    def node_of(self, header: str | None) -> str:
        """The node the bearer token in ``header`` may report for; Unauthorized when the
        token is not a valid agent token, Forbidden when it is not bound to a pod's node."""
        token = header[7:].strip() if header and header.startswith("Bearer ") else ""
        if not token or len(token) > MAX_TOKEN_CHARS:
            raise Unauthorized("missing bearer token")
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        node = self._review(token)
        self._cache.put(key, (node, now + CACHE_SECONDS))
        return node

    def _review(self, token: str) -> str:
        from kubernetes.client.exceptions import ApiException
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": [self.audience]}}
        try:
            response = self._auth.create_token_review(body, _preload_content=False)
            status = (json.loads(response.data).get("status") or {})
        except (ApiException, ValueError) as exc:
            raise ReviewUnavailable(f"token review failed: {exc}") from None
        self.reviews += 1
        user = status.get("user") or {}
        if not status.get("authenticated") or self.audience not in (status.get("audiences")
                                                                     or [self.audience]):
            raise Unauthorized("the agent token is not valid for this extender")
        if user.get("username") != self.username:
            raise Forbidden(f"{user.get('username')!r} is not the agents' service account")
        extra = user.get("extra") or {}
        node = _first(extra, NODE_NAME)
        return node or self._node_of_pod(self.username.split(":")[2], _first(extra, POD_NAME),
                                         _first(extra, POD_UID))

    def _node_of_pod(self, namespace: str, pod: str | None, uid: str | None) -> str:
        from kubernetes.client.exceptions import ApiException
        if not pod or not uid:
            raise Forbidden("the agent token is not bound to a pod (use a projected token)")
        try:
            found = json.loads(self._core.read_namespaced_pod(pod, namespace,
                                                              _preload_content=False).data)
        except ApiException as exc:
            if exc.status == 404:
                raise Forbidden(f"the agent token's pod {namespace}/{pod} is gone") from None
            raise ReviewUnavailable(f"reading the agent's pod failed: {exc}") from None
        if (found.get("metadata") or {}).get("uid") != uid:
            raise Forbidden(f"the agent token's pod {namespace}/{pod} was replaced")
        node = (found.get("spec") or {}).get("nodeName")
        if not node:
            raise Forbidden(f"the agent token's pod {namespace}/{pod} has no node")
        return str(node)


def _first(extra: Any, key: str) -> str | None:
    values = extra.get(key) if isinstance(extra, dict) else None
    return str(values[0]) if isinstance(values, list) and values else None


def check_node(identity_node: str | None, report_node: str) -> None:
    """A report must be about the node its token speaks for (None: shared token)."""
    if identity_node is not None and identity_node != report_node:
        raise Forbidden(f"this agent reports for node {identity_node!r}, not {report_node!r}")


def agent_identity(source: Any) -> Callable[[Any], NodeIdentity]:
    """The reviewer for the current ``reports`` config (rebuilt when its audience or
    service account changes); Unauthorized for every report when ``source`` is not a
    Kubernetes cluster (there is no API server to review tokens)."""
    built: dict[tuple[str, str], NodeIdentity] = {}
    lock = threading.Lock()

    def current(cfg: Any) -> NodeIdentity:
        api = getattr(source, "api", None)
        if api is None or not hasattr(api, "api_client"):
            raise Unauthorized("reports.identity service-account needs a Kubernetes cluster")
        key = (cfg.audience, cfg.service_account)
        with lock:
            if key not in built:
                built.clear()
                built[key] = NodeIdentity(api, *key)
            return built[key]
    return current


def speaks_for(authorization: str | None, cfg: Any, environ: Mapping[str, str] | None,
               identity: Callable[[Any], NodeIdentity]) -> str | None:
    """The node an agent's report may be about: with ``reports.identity: service-account``
    the node its reviewed pod token is bound to; else None (the shared agent token, any
    node). Unauthorized or Forbidden otherwise."""
    if cfg.identity == "service-account":
        return identity(cfg).node_of(authorization)
    check_token(authorization, cfg, environ)
    return None


def may_read_full(authorization: str | None, node: str | None, cfg: Any,
                  environ: Mapping[str, str] | None,
                  identity: Callable[[Any], NodeIdentity]) -> bool:
    """Whether ``GET /v1/state`` answers in full: the shared agent token (agents, device
    plugins, operators), or with ``service-account`` identity an agent's reviewed token
    for its own node (``?node=``)."""
    try:
        check_token(authorization, cfg, environ)
        return True
    except Unauthorized:
        pass
    if cfg.identity != "service-account" or node is None:
        return False
    try:
        return identity(cfg).node_of(authorization) == node
    except ExtenderError:
        return False
