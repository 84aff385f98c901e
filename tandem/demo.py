"""``tandem demo``: the real extender over HTTP on an embedded simulated cluster.

It starts cheroot on loopback (port 0), then plays kube-scheduler with
``nodeCacheCapable: true`` for a packaged stream of training jobs, SLO inference
sessions and best-effort inference pods: filter -> prioritize (skipped when one
node is left, as the scheduler does) -> pick the best score -> bind. When the
agent package's simulated GPUs and report builder are installed, simulated agents
(seeded noise) post reports after every bind so the observed load shows beside
the predictions. Given the seed, everything but the timings is deterministic;
the text rendering lives in :mod:`tandem.demo_render`.
"""

from __future__ import annotations

import json
import re
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import typer

from contracts import annotations as keys
from contracts.state import STATE_PATH, StateDocument, decode_state
from extender.core.reasons import is_unresolvable, reason_of_message
from tandem.demo_render import render

HERE = Path(__file__).parent
PODS = HERE / "demo_pods.yaml"
PROFILES = HERE / "demo_profiles.yaml"


DEFAULT_SEED = 7


def demo_command(
    json_out: bool = typer.Option(False, "--json", help="print one JSON object instead"),
    seed: int = typer.Option(DEFAULT_SEED, "--seed", help="seed of the simulated agents' noise"),
) -> None:
    """Place a stream of pods on a simulated cluster through the real extender."""
    result = run_demo(seed=seed)
    if json_out:
        typer.echo(json.dumps(result, indent=2))
    else:
        typer.echo(render(result))


def _pods() -> list[dict[str, Any]]:
    import yaml

    raw = yaml.safe_load(PODS.read_text())
    pods = []
    for i, entry in enumerate(raw["pods"]):
        pods.append({
            "metadata": {"name": entry["name"], "namespace": "demo", "uid": f"demo-uid-{i:03d}",
                         "resourceVersion": "1", "annotations": dict(entry["annotations"])},
            "spec": {"containers": [{"name": "main", "resources": {
                "limits": {keys.GPU_RESOURCE: str(entry["gpus"])}}}]},
        })
    return pods


DEMO_MODEL = "mlp.onnx"
"""The model the demo's model-only pod names; written into a temporary model store."""


def write_demo_model(path: Path, hidden: int = 1024) -> Path:
    """A three-layer MLP classifier (784 -> hidden -> hidden -> 10) as ONNX (IR 10)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    dims = [784, hidden, hidden, 10]
    nodes, inits, prev = [], [], "input"
    for i, (fan_in, fan_out) in enumerate(zip(dims, dims[1:], strict=False)):
        w = numpy_helper.from_array(np.zeros((fan_in, fan_out), np.float32), f"w{i}")
        b = numpy_helper.from_array(np.zeros(fan_out, np.float32), f"b{i}")
        inits += [w, b]
        out = "output" if i == len(dims) - 2 else f"h{i}"
        gemm = f"g{i}" if out != "output" else out
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [gemm]))
        if out != "output":
            nodes.append(helper.make_node("Relu", [gemm], [out]))
        prev = out
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 784])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10  # ONNX Runtime 1.31 reads up to 13
    onnx.save(model, str(path))
    return path


def run_demo(seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """Run the whole demo and return its result document (the ``--json`` output)."""
    with tempfile.TemporaryDirectory(prefix="tandem-demo-") as store:
        return _run_demo(seed, Path(store))


def _run_demo(seed: int, store: Path) -> dict[str, Any]:
    import httpx

    from contracts.clusterfile import load_cluster_file
    from extender.cluster.sim import DEFAULT_CLUSTER, SimSource
    from extender.config.loader import ConfigHolder, load_config
    from extender.inference_profiles import load_profiles
    from extender.transport.server import start_background
    from extender.wiring import create_app, default_planner
    from predictor.api import Predictor

    started = time.perf_counter()
    token = secrets.token_urlsafe(24)
    cfg = load_config(None, environ={"TANDEM__LOGGING__LEVEL": "warning"})
    cluster = load_cluster_file(DEFAULT_CLUSTER)  # parsed once: the extender and the agents
    sim = SimSource.from_cluster(cluster)
    # No trained utilisation model ships: the model-only pod gets its memory from the
    # graph and the cold-start utilisation, as in a freshly installed cluster.
    write_demo_model(store / DEMO_MODEL)
    predictor = Predictor.from_dirs(None, store)
    profiles, planner = load_profiles([str(PROFILES)]), default_planner()
    app = create_app(ConfigHolder(cfg), sim, predictor=predictor,
                     profiles=profiles, planner=planner,
                     environ={cfg.reports.token_env: token})
    server = start_background(app, cfg.server, port=0)
    server_start = time.perf_counter() - started
    agents = SimAgents.create(sim, cluster, token, seed)
    placements: list[dict[str, Any]] = []
    cycles_ms: list[float] = []
    try:
        with httpx.Client(base_url=server.url, timeout=10.0) as http:
            agents.post(http)
            names = [n.name for n in sim.nodes]
            for pod in _pods():
                sim.create_pod(pod)
                cycle = time.perf_counter()
                placements.append(schedule_one(http, pod, names, sim))
                cycles_ms.append(1000.0 * (time.perf_counter() - cycle))
                agents.post(http)
            state = decode_state(http.get(STATE_PATH, headers=agents.headers).json())
    finally:
        server.stop()
    summary = summarise(placements, state)
    if planner is not None:
        for row, pod in zip(placements, _pods(), strict=True):
            if row["outcome"] == "rejected" and row["kind"] == "slo":
                row["cause"] = slo_cause(pod, planner, profiles, summary["gpus"])
    summary["seed"] = seed
    summary["timings"] = {"server_start_seconds": round(server_start, 3),
                          "cycle_ms_mean": round(sum(cycles_ms) / max(len(cycles_ms), 1), 2),
                          "cycle_ms_max": round(max(cycles_ms, default=0.0), 2)}
    return {"placements": placements, "summary": summary,
            "agents": agents.enabled, "elapsed_seconds": round(time.perf_counter() - started, 3)}


def kind_of(annotations: dict[str, str]) -> str:
    """``training``, ``slo`` (an SLO inference session) or ``best-effort`` (inference, no SLO)."""
    if annotations.get(keys.WORKLOAD, keys.TRAINING) != keys.INFERENCE:
        return "training"
    return "slo" if keys.SLO_MS in annotations else "best-effort"


def schedule_one(http: Any, pod: dict[str, Any], names: list[str], sim: Any) -> dict[str, Any]:
    """One scheduling cycle as kube-scheduler runs it; returns the placement row."""
    meta = pod["metadata"]
    ann = meta["annotations"]
    row: dict[str, Any] = {"pod": meta["name"],
                           "workload": ann.get(keys.WORKLOAD, keys.TRAINING),
                           "kind": kind_of(ann),
                           "weight": ann.get(keys.WEIGHT),
                           "priority": ann.get(keys.PRIORITY),
                           "gpus_requested": int(pod["spec"]["containers"][0]["resources"]
                                                 ["limits"][keys.GPU_RESOURCE])}
    args = {"Pod": pod, "NodeNames": names}
    filtered = http.post("/filter", json=args).json()
    passed = filtered.get("NodeNames") or []
    if filtered.get("Error") or not passed:
        failed = filtered.get("FailedNodes") or {}
        unresolvable = filtered.get("FailedAndUnresolvableNodes") or {}
        return {**row, "outcome": "rejected", "node": None,
                "reason": filtered.get("Error") or _main_reason(failed, unresolvable),
                "node_reasons": {**failed, **unresolvable}}
    scores = {passed[0]: None}
    if len(passed) > 1:
        ranked = http.post("/prioritize", json={"Pod": pod, "NodeNames": passed}).json()
        scores = {h["Host"]: h["Score"] for h in ranked}
    node = max(passed, key=lambda n: (scores.get(n) or 0, -passed.index(n)))
    bound = http.post("/bind", json={"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                     "PodUID": meta["uid"], "Node": node}).json()
    if bound.get("Error"):
        return {**row, "outcome": "bind-failed", "node": node, "reason": bound["Error"]}
    out = (sim.read_pod(meta["namespace"], meta["name"]) or {})["metadata"]["annotations"]
    return {**row, "outcome": "placed", "node": node, "score": scores.get(node),
            "gpu_index": out.get(keys.GPU_INDEX),
            "predicted_util_percent": float(out.get(keys.PREDICTED_UTIL, 0)),
            "predicted_mem_mib": float(out.get(keys.PREDICTED_MEM_MIB, 0)),
            "cost": float(out.get(keys.COST, 0)),
            "batch": out.get(keys.BATCH),
            "duty_cycle_ms": out.get(keys.DUTY_CYCLE_MS), "candidates": len(passed),
            "source": out.get(keys.PREDICTION_SOURCE)}


def slo_cause(pod: dict[str, Any], planner: Any, profiles: Any,
              gpus: list[dict[str, Any]]) -> str | None:
    """Why a refused SLO session can never run here: the planner's verdict for it alone
    on an idle GPU of each type (None when some type could take it; then what holds it
    back is the GPUs' occupancy, which the extender's reasons say). The extender checks
    the GPUs in order and reports the first rule a busy GPU fails, which for a session
    that no GPU type can serve is not the cause."""
    from extender.core import ProfileIndex
    from extender.core.session_rules import checked_plan
    from extender.core.snapshot import SessionSpec
    from planner.types import GpuPlan, Infeasible, InfeasibleReason

    ann = pod["metadata"]["annotations"]
    session = SessionSpec(pod["metadata"]["name"], ann[keys.MODEL], float(ann[keys.SLO_MS]),
                          float(ann[keys.RATE_RPS]))
    memory: dict[str, float] = {}
    for g in gpus:
        memory[g["product"]] = min(memory.get(g["product"], g["memory_mib"]), g["memory_mib"])
    verdicts = {product: checked_plan(planner, (session,), ProfileIndex(profiles),
                                      product, mib) for product, mib in sorted(memory.items())}
    if any(isinstance(v, GpuPlan) for v in verdicts.values()):
        return None
    why = "; ".join(f"{product.removeprefix('NVIDIA-')}: " + (
        "no profile" if v.reason is InfeasibleReason.NO_PROFILE
        else v.message().removeprefix(f"session {session.name}: "))
        for product, v in verdicts.items() if isinstance(v, Infeasible))
    return (f"SLO unreachable: {session.model} cannot meet {session.slo_ms:g} ms at "
            f"{session.rate_rps:g} rps on any GPU type here, even alone ({why})")


def _main_reason(failed: dict[str, str], unresolvable: dict[str, str]) -> str:
    """Node reasons grouped by their text (numbers left out). Reasons of nodes that could
    take the pod later (resolvable) come first, since they say what holds it back; then
    the most common, then the one that blocks the most GPUs. The wire lists every node
    as unresolvable (kube-scheduler's preemption cannot help), so resolvability comes
    from the reason itself."""
    groups: dict[tuple[bool, str], list[str]] = {}
    for node, text in sorted({**failed, **unresolvable}.items()):
        reason = reason_of_message(text)
        kind = reason is None or is_unresolvable(reason)
        short = text.removeprefix("tandem: ").split(" (need", 1)[0]
        groups.setdefault((kind, short), []).append(node)

    def blocked(text: str) -> int:
        return sum(int(n) for n in re.findall(r" on (\d+)/\d+ GPUs", text))

    ordered = sorted(groups.items(),
                     key=lambda kv: (kv[0][0], -len(kv[1]), -blocked(kv[0][1]), kv[0][1]))
    return " | ".join(f"{len(nodes)} node(s): {text}" for (_, text), nodes in ordered)


def summarise(placements: list[dict[str, Any]], state: StateDocument) -> dict[str, Any]:
    """GPUs used, per-GPU predicted and observed utilisation, rejected pods and why."""
    gpus = []
    for node in sorted(state.nodes, key=lambda n: n.name):
        for g in node.gpus:
            gpus.append({"node": node.name, "index": g.index, "product": g.product,
                         "role": _role([p.workload for p in g.pods]),
                         "predicted_util_percent": round(g.predicted_util, 1),
                         "observed_util_percent": None if g.observed_util is None
                         else round(g.observed_util, 1),
                         "reserved_mib": round(g.reserved_mib),
                         "memory_mib": g.memory_mib,
                         "pods": [p.name for p in g.pods]})
    used = [g for g in gpus if g["pods"]]
    rejected = [{"pod": p["pod"], "reason": p["reason"]} for p in placements
                if p["outcome"] != "placed"]
    return {"nodes_total": len(state.nodes), "gpus_total": len(gpus), "gpus_used": len(used),
            "pods_placed": sum(p["outcome"] == "placed" for p in placements),
            "pods_rejected": len(rejected), "gpus": gpus, "rejected": rejected}


def _role(workloads: list[str]) -> str:
    """``serving`` (hosts inference sessions), ``training`` or ``idle``."""
    kinds = set(workloads)
    return "serving" if "inference" in kinds else "training" if kinds else "idle"


class SimAgents:
    """Simulated node agents (``agent.node.sim_gpus`` + ``agent.node.reporter``) when installed."""

    def __init__(self, sources: dict[str, Any], build_report: Any, token: str):
        self.sources = sources
        self.build_report = build_report
        self.token = token

    @property
    def enabled(self) -> bool:
        """True when reports are being posted."""
        return bool(self.sources)

    @classmethod
    def create(cls, sim: Any, cluster: Any, token: str, seed: int = DEFAULT_SEED) -> SimAgents:
        """One simulated GPU source per GPU node of ``cluster``; load follows its bound pods."""
        try:
            from agent.node.reporter import build_report
            from agent.node.sim_gpus import SimGpuSource, SimJob, sim_gpu_specs
        except ImportError:
            return cls({}, None, token)

        def jobs_for(node: str) -> Any:
            def provider() -> list[Any]:
                jobs = []
                for pod in sim.pods():
                    out = keys.decode_outputs(pod["metadata"].get("annotations", {}))
                    if pod.get("spec", {}).get("nodeName") != node or out is None:
                        continue
                    for idx in out.gpu_indices:
                        jobs.append(SimJob(idx, pod["metadata"]["uid"], out.util_percent,
                                           int(out.mem_mib)))
                return jobs
            return provider

        sources = {}
        for node in cluster.nodes:
            if node.gpus:
                sources[node.name] = SimGpuSource(sim_gpu_specs(node), jobs_for(node.name),
                                                  seed=seed)
        return cls(sources, build_report, token)

    @property
    def headers(self) -> dict[str, str]:
        """The agent token, as agents send it (reports, the full ``/v1/state``)."""
        return {"Authorization": f"Bearer {self.token}"}

    def post(self, http: Any) -> None:
        """Post one report per node."""
        for node, source in self.sources.items():
            report = self.build_report(node, source.sample(1.0))
            http.post("/v1/agents/report", json=report,
                      headers=self.headers)
