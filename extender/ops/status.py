"""``tandem status``: what the extender believes, per node and GPU, plus pending pods.

Where the numbers come from:

- ``--extender URL``: the running extender's ``GET /v1/state`` (its ledger and the
  agents' latest fresh reports);
- ``--cluster kube``: the ledger rebuilt from the API server the way the extender
  rebuilds it on start (GPU Feature Discovery labels and bound pods' ``tandem.io/*``
  annotations), plus pods waiting for the ``tandem`` scheduler with the last
  ``FailedScheduling`` event of each; agents report to the extender only, so
  observed utilisation needs ``--extender``;
- ``--cluster sim:FILE``: the same rebuild from a simulated cluster file.

:func:`collect` returns one JSON-able document (the ``--json`` output, keys in
``docs/troubleshooting.md``); :mod:`extender.ops.status_render` turns it into text.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import typer

from contracts.annotations import (
    DECIDED_BY,
    GPU_UTIL,
    INTERFERENCE_SOURCE,
    MODEL,
    PREDICTION_SOURCE,
)
from contracts.jsonbody import parse_json
from contracts.state import STATE_PATH, StateDocument, decode_state
from extender.cluster.source import ClusterSource
from extender.ops.coexist import doubly_advertised

MAX_STATE_BYTES = 256 << 20
"""Largest ``/v1/state`` answer read (the whole cluster's)."""
TOKEN_ENV = "TANDEM_AGENT_TOKEN"

SCHEDULING_GATE_REASON = "held by the queue's scheduling gate"


class StatusError(RuntimeError):
    """The state could not be read; the message says what to check. ``usage``: the
    command line itself is wrong (exit 2), else reading failed (exit 1)."""

    def __init__(self, message: str, usage: bool = False):
        super().__init__(message)
        self.usage = usage


def fetch_state(url: str, ca_cert: Path | None = None, timeout_s: float = 10.0,
                token: str | None = None) -> StateDocument:
    """``GET URL/v1/state`` from a running extender (with the agent token: pod names too)."""
    if "://" not in url:  # urllib would say "unknown url type" of the host name
        raise StatusError(f"--extender {url}: give the scheme, e.g. --extender "
                          f"https://{url} (the extender serves HTTPS)", usage=True)
    target = url.rstrip("/") + STATE_PATH
    context = ssl.create_default_context(cafile=str(ca_cert)) if ca_cert else None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        request = urllib.request.Request(target, headers=headers)
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as resp:
            body = resp.read(MAX_STATE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise StatusError(f"{target} answered HTTP {exc.code}; is this the tandem extender?") \
            from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise StatusError(f"{target}: the extender's certificate is not trusted "
                              f"({reason.verify_message}); pass the CA that signed it: "
                              "--ca-cert ca.crt (ConfigMap tandem-extender-ca)") from None
        raise StatusError(f"cannot reach {target} ({reason}); port-forward the extender first: "
                          "kubectl -n tandem-system port-forward svc/tandem-extender 8443")\
            from None
    if len(body) > MAX_STATE_BYTES:
        raise StatusError(f"{target} answered more than {MAX_STATE_BYTES} bytes")
    try:
        return decode_state(parse_json(body))
    except ValueError:  # not JSON, or not a /v1/state document
        raise StatusError(f"{target} did not answer a /v1/state document; is this the tandem "
                          "extender?") from None


def read_token(token_file: Path | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The agent token for a full document: ``--token-file``, else ``TANDEM_AGENT_TOKEN``;
    read by the extender's own reader (``extender.state.reports.expected_token``)."""
    from extender.config.sections import ReportsConfig
    from extender.state.reports import expected_token

    token = expected_token(ReportsConfig(token_file=str(token_file) if token_file else None,
                                         token_env=TOKEN_ENV), environ)
    if token is None and token_file is not None:
        raise StatusError(f"--token-file {token_file}: cannot read it, or it is empty",
                          usage=True)
    return token


def rebuilt_state(source: ClusterSource) -> StateDocument:
    """The ``/v1/state`` document of a fresh ledger synced from ``source`` (kube or sim)."""
    from extender.config.schema import build_config
    from extender.learning.knowledge import FixedBeliefs
    from extender.state.ledger import ClusterState
    from extender.state.view import document

    config = build_config({})
    state = ClusterState(FixedBeliefs(config.policy), time.time,
                         config.state.assume_ttl_seconds)
    source.sync(state)  # one list, no watches
    return document(state.snapshot())


def pending_pods(api: Any, scheduler_name: str = "tandem",
                 now: Callable[[], float] = time.time) -> list[dict[str, Any]]:
    """Unbound pods for ``scheduler_name`` with their last FailedScheduling message."""
    pods = api.list_pod_for_all_namespaces(
        field_selector=f"spec.schedulerName={scheduler_name},spec.nodeName=").items
    if not pods:
        return []
    events = api.list_event_for_all_namespaces(field_selector="reason=FailedScheduling").items
    last: dict[str, Any] = {}
    for ev in events:
        uid = getattr(ev.involved_object, "uid", None)
        when = ev.last_timestamp or ev.event_time or ev.first_timestamp
        if uid and (uid not in last or _ts(when) >= _ts(last[uid][0])):
            last[uid] = (when, ev.message or "")
    out = []
    for p in pods:
        if p.status is not None and p.status.phase in ("Succeeded", "Failed"):
            continue
        meta = p.metadata
        gates = [g.name for g in (p.spec.scheduling_gates or [])] if p.spec else []
        when, message = last.get(meta.uid, (None, ""))
        reason = (f"{SCHEDULING_GATE_REASON} ({', '.join(gates)})" if gates
                  else message or "not tried yet")
        age = now() - _ts(when) if when is not None else None
        out.append({"pod": f"{meta.namespace}/{meta.name}", "reason": reason,
                    "age_s": round(age) if age is not None else None})
    return sorted(out, key=lambda d: d["pod"])


def _ts(when: Any) -> float:
    return when.timestamp() if hasattr(when, "timestamp") else float("-inf")


def pod_source(annotations: Mapping[str, str]) -> str:
    """Where a pod's figures came from: what bind recorded in ``tandem.io/prediction-source``.

    (``asserted``, ``xgboost:<digest>``, ``observed:<n>``, ``cold-start``, ``profile``,
    each with its ``+mem:`` part). A pod bound without that annotation (by an older
    extender, or written into a simulated cluster file) is described from its inputs.
    """
    recorded = annotations.get(PREDICTION_SOURCE)
    if isinstance(recorded, str) and recorded:
        return recorded
    if GPU_UTIL in annotations:
        return "asserted"
    if MODEL in annotations:
        return f"model {annotations[MODEL]}"
    return "unknown"


def _role(pods: list[dict[str, Any]]) -> str:
    # Same rule as extender.core.table.Role: any session makes it a serving GPU.
    kinds = {p.get("workload") for p in pods}
    return "serving" if "inference" in kinds else "training" if "training" in kinds else "idle"


HIDDEN = "(hidden)"
"""A pod's name in a redacted document (read without the agent token)."""


def summarize(state: StateDocument, origin: str,
              pending: list[dict[str, Any]] | None,
              both_plugins: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``tandem status --json`` document from a ``/v1/state`` document."""
    nodes = []
    for node in sorted(state.nodes, key=lambda n: n.name):
        gpus = []
        for g in node.gpus:
            pods = [{"pod": p.pod or HIDDEN, "state": p.state, "workload": p.workload,
                     "util_percent": p.util_percent, "mem_mib": p.mem_mib,
                     "source": pod_source(dict(p.annotations)) if p.pod else "unknown",
                     **_interference(dict(p.annotations)), **_decided(dict(p.annotations))}
                    for p in g.pods]
            fresh = g.observed_util is not None
            gpus.append({
                "index": g.index, "uuid": g.uuid, "product": g.product,
                "role": _role(pods), "memory_mib": g.memory_mib,
                "reserved_mib": g.reserved_mib,
                "predicted_util": g.predicted_util,
                "predicted_source": sorted({p["source"] for p in pods}),
                "observed_util": g.observed_util, "observed_mib": g.observed_mib,
                # /v1/state shows only reports younger than the staleness limit; its
                # timestamps are on the extender's monotonic clock, so no age is derived.
                "observed_source": ("agent report" if fresh else
                                    "none: no fresh agent report" if origin.startswith("http")
                                    else "none: agents report to the extender (use --extender)"),
                "pods": pods,
            })
        nodes.append({"name": node.name, "gpus": gpus})
    doc = {"source": origin, "synced": state.synced, "placed": state.placed,
           "assumed": state.assumed, "untrusted": state.untrusted, "nodes": nodes,
           "pending": pending, "redacted": state.redacted, "both_plugins": both_plugins}
    learned = (state.learning or {}).get("pairs") or []
    if learned:  # pairwise interference (docs/interference.md); absent while nothing is learned
        doc["interference"] = [{"gpu_type": t["gpu_type"], "pairs": len(t["pairs"]),
                                "profiled_models": len(t["profiles"]),
                                "cannot_share": len(t["cannot_share"]),
                                "prior_pairs": (t.get("prior") or {}).get("pairs", 0),
                                "inferred_pairs": len(t.get("inferred") or []),
                                "progress_pairs": len((t.get("progress") or {}).get("measured")
                                                      or []),
                                "refused_losing": len((t.get("progress") or {}).get(
                                    "refused_losing") or [])}
                               for t in learned]
    return doc


def _interference(annotations: Mapping[str, str]) -> dict[str, str]:
    """``{"interference": <tandem.io/interference-source>}`` where bind recorded one."""
    recorded = annotations.get(INTERFERENCE_SOURCE)
    return {"interference": recorded} if isinstance(recorded, str) and recorded else {}


def _decided(annotations: Mapping[str, str]) -> dict[str, str]:
    """``{"decided_by": <tandem.io/decided-by>}`` where bind recorded one."""
    recorded = annotations.get(DECIDED_BY)
    return {"decided_by": recorded} if isinstance(recorded, str) and recorded else {}


def collect(extender: str | None, cluster: str | None, scheduler_name: str = "tandem",
            ca_cert: Path | None = None, token: str | None = None) -> dict[str, Any]:
    """Read the state from the extender or the cluster, and pending pods from kube."""
    if extender is None and cluster is None:
        raise StatusError("say where to look: --extender URL (a port-forwarded extender) "
                          "or --cluster kube|sim:FILE", usage=True)
    from extender.cluster.spec import build_source

    source = build_source(cluster) if cluster is not None else None
    if extender is not None:
        state, origin = fetch_state(extender, ca_cert, token=token), extender
    else:
        state, origin = rebuilt_state(source), str(cluster)
    pending = pending_pods(source.api, scheduler_name) if cluster == "kube" else None
    both = doubly_advertised(source.api) if cluster == "kube" else None
    return summarize(state, origin, pending, both)


def status_command(
    extender: str | None = typer.Option(
        None, "--extender", help="Extender base URL, e.g. https://localhost:8443 after "
        "`kubectl -n tandem-system port-forward svc/tandem-extender 8443`."),
    cluster: str | None = typer.Option(
        None, "--cluster", help="kube (list pending pods; without --extender also rebuild the "
        "state from the API server) | sim:FILE"),
    ca_cert: Path | None = typer.Option(
        None, "--ca-cert", help="CA bundle that signed the extender's TLS certificate."),
    token_file: Path | None = typer.Option(
        None, "--token-file", help="The agent token (the tandem-agent-token Secret), for pod "
        f"names with --extender; default: ${TOKEN_ENV}. Without it names are hidden."),
    scheduler_name: str = typer.Option(
        "tandem", "--scheduler-name", help="schedulerName of the pods tandem schedules."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Per node and GPU: role, pods, reserved memory, predicted and observed load; pending pods."""
    from contracts.clusterfile import ClusterFileError
    from extender.cluster.spec import SourceSpecError
    from extender.ops.status_render import render

    try:
        token = read_token(token_file) if extender is not None else None
        doc = collect(extender, cluster, scheduler_name, ca_cert, token)
    except StatusError as exc:  # given where to look, it could not read there
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2 if exc.usage else 1) from None
    except SourceSpecError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except ClusterFileError as exc:
        typer.echo(f"error: {cluster}: {'; '.join(exc.problems)}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps(doc, sort_keys=True) if json_out else render(doc))
