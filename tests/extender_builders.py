"""Builders for extender tests: pods, placements, nodes and GPUs, apps.

Chainable builders in the style of kueue's ``pkg/util/testing/wrappers.go``: start
from a valid default, change only what the test is about, end with ``.obj()``.
Shared by tests/test_extender_*.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from extender.cluster.sim import SimSource
from extender.config.loader import ConfigHolder
from extender.config.schema import build_config
from extender.core import (
    GpuSpec,
    NodeSpec,
    Placement,
    ProfileIndex,
    Reason,
    Rejection,
    ResolvedDemand,
    SessionSpec,
    Workload,
    parse_demand,
    resolve_demand,
)
from extender.inference_profiles import parse_profiles
from extender.ops.metrics import Metrics
from extender.wiring import create_app, default_planner

TTL = build_config({}).state.assume_ttl_seconds
"""The configured default of ``state.assume_ttl_seconds``."""
TOKEN = "s3cret-token"
AGENT_AUTH = {"Authorization": f"Bearer {TOKEN}"}
"""What agents send: the full ``/v1/state`` (pod names, annotations, learning)."""
_uids = itertools.count()

A100 = "NVIDIA-A100-SXM4-40GB"
H100 = "NVIDIA-H100-80GB-HBM3"
A100_MIB = 40960  # int, as GFD labels and the sim file give it

PROFILES = parse_profiles({"profiles": [
    {"model": "resnet50", "gpu_type": A100, "linear": {"alpha_ms": 0.6, "beta_ms": 3.0},
     "memory_mib": 2500},
    {"model": "resnet50", "gpu_type": H100, "linear": {"alpha_ms": 0.35, "beta_ms": 2.0},
     "memory_mib": 2500},
]}, "test")


# ---- pods ----------------------------------------------------------------------------------

class PodBuilder:
    """A Pod object (decoded JSON): ``PodBuilder("p").gpus(2).util(40).mem(9000).obj()``."""

    def __init__(self, name: str = "p", namespace: str = "default"):
        self._name = name
        self._namespace = namespace
        self._uid: str | None = None
        self._gpus = "1"
        self._annotations: dict[str, str] = {}
        self._node: str | None = None
        self._phase: str | None = None

    def uid(self, uid: str) -> PodBuilder:
        """Set ``metadata.uid`` (default: unique per built pod)."""
        self._uid = uid
        return self

    def gpus(self, count: int | str) -> PodBuilder:
        """The ``tandem.io/gpu`` limit; a string is written as is (to test bad values)."""
        self._gpus = str(count)
        return self

    def annotation(self, key: str, value: Any) -> PodBuilder:
        """Any ``tandem.io/<key>`` annotation."""
        self._annotations[f"tandem.io/{key}"] = str(value)
        return self

    def workload(self, kind: str) -> PodBuilder:
        """``training`` or ``inference`` (or anything, to test validation)."""
        return self.annotation("workload", kind)

    def model(self, ref: str) -> PodBuilder:
        """The model the predictor or the batching profiles look up."""
        return self.annotation("model", ref)

    def batch(self, size: int | str) -> PodBuilder:
        """Batch size (``tandem.io/batch-size``)."""
        return self.annotation("batch-size", size)

    def util(self, percent: float | str) -> PodBuilder:
        """Asserted per-GPU utilisation (``tandem.io/gpu-util``)."""
        return self.annotation("gpu-util", percent)

    def mem(self, mib: float | str) -> PodBuilder:
        """Asserted per-GPU memory (``tandem.io/gpu-mem-mib``)."""
        return self.annotation("gpu-mem-mib", mib)

    def slo(self, ms: float | str, rate_rps: float | str | None = None) -> PodBuilder:
        """An inference SLO; with ``rate_rps`` a complete SLO session."""
        self.annotation("slo-ms", ms)
        return self if rate_rps is None else self.rate(rate_rps)

    def rate(self, rps: float | str) -> PodBuilder:
        """Request rate of an SLO session (``tandem.io/rate-rps``)."""
        return self.annotation("rate-rps", rps)

    def inference(self, model: str = "resnet50") -> PodBuilder:
        """An inference pod for ``model`` (best effort until :meth:`slo` gives an SLO)."""
        return self.workload("inference").model(model)

    def weight(self, weight: int | str) -> PodBuilder:
        """Best-effort share weight."""
        return self.annotation("weight", weight)

    def priority(self, priority: int | str) -> PodBuilder:
        """Best-effort priority (a priority session counts weight 1)."""
        return self.annotation("priority", priority)

    def bound(self, node: str, *gpu_indices: int, util: float = 0.0,
              mem: float = 0.0) -> PodBuilder:
        """Bound to ``node`` with the annotations bind writes (GPU indices, predicted load)."""
        self._node = node
        self.annotation("gpu-index", ",".join(str(i) for i in gpu_indices))
        self.annotation("predicted-gpu-util", f"{util:.2f}")
        return self.annotation("predicted-gpu-mem-mib", f"{mem:.0f}")

    def phase(self, phase: str) -> PodBuilder:
        """``status.phase`` (``Running``, ``Succeeded``...)."""
        self._phase = phase
        return self

    def obj(self) -> dict[str, Any]:
        """The Pod object."""
        uid = self._uid if self._uid is not None else f"uid-{self._name}-{next(_uids)}"
        spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {
            "limits": {"tandem.io/gpu": self._gpus}}}]}
        if self._node is not None:
            spec["nodeName"] = self._node
        out: dict[str, Any] = {"metadata": {"name": self._name, "namespace": self._namespace,
                                            "uid": uid, "annotations": dict(self._annotations)},
                               "spec": spec}
        if self._phase is not None:
            out["status"] = {"phase": self._phase}
        return out


def pod(name: str = "p", gpus: int | str = 1, uid: str | None = None, namespace: str = "default",
        **annotations: str) -> dict[str, Any]:
    """A Pod object; annotation kwargs use underscores for dashes (gpu_util -> gpu-util)."""
    b = PodBuilder(name, namespace).gpus(gpus)
    if uid is not None:
        b.uid(uid)
    for key, value in annotations.items():
        b.annotation(key.replace("_", "-"), value)
    return b.obj()


def training(name: str = "t", util: float = 40, mem: float = 10000, gpus: int = 1,
             uid: str | None = None) -> dict[str, Any]:
    """A training pod with asserted demand."""
    b = PodBuilder(name).gpus(gpus).util(util).mem(mem)
    return (b if uid is None else b.uid(uid)).obj()


def inference(name: str = "s", model: str = "resnet50", slo: float = 100, rate: float = 200,
              uid: str | None = None) -> dict[str, Any]:
    """An inference session pod."""
    b = PodBuilder(name).inference(model).slo(slo, rate)
    return (b if uid is None else b.uid(uid)).obj()


def demand(p: dict[str, Any], gpu_types: Sequence[str], predict: Any = None,
           profiles: ProfileIndex | None = None) -> ResolvedDemand:
    """The pod's demand resolved for ``gpu_types``, as the extender resolves it."""
    m = p["metadata"]
    return resolve_demand(parse_demand(p), gpu_types, predict, profiles,
                          session_name=f"{m.get('namespace', 'default')}/{m['name']}")


# ---- placements ----------------------------------------------------------------------------

MEASURED = ("tandem.io/progress", "port=9400,steps=steps_total")
"""A progress counter: learned pair figures place only pods that name one."""


def measured(model: str) -> tuple[tuple[str, str], ...]:
    """The annotations of a training pod of ``model`` whose progress is measured."""
    return (("tandem.io/model", model), MEASURED)


def placement(uid: str = "u", *, pod: str | None = None, node: str = "n1",
              gpus: Iterable[int] = (0,), util: float = 10.0, mem: float = 1000.0,
              workload: Workload | None = None, session: SessionSpec | None = None,
              weight: int = 1, annotations: tuple[tuple[str, str], ...] = ()) -> Placement:
    """A placement; ``gpus`` are GPU indices, ``pod`` defaults to ``default/<uid>``, and a
    ``session`` (or ``weight`` other than 1) makes it an inference placement."""
    if workload is None:
        inferred = session is not None or weight != 1
        workload = Workload.INFERENCE if inferred else Workload.TRAINING
    return Placement(pod_uid=uid, pod=pod if pod is not None else f"default/{uid}", node=node,
                     gpu_indices=tuple(gpus), util_percent=util, mem_mib=mem,
                     workload=workload, session=session, annotations=annotations,
                     weight=weight)


def rejection(node: str, reason: Reason, unresolvable: bool, on_gpus: int = 0,
              **numbers: Any) -> Rejection:
    """An expected rejection; ``on_gpus`` is how many GPUs failed for ``reason`` (the
    other fields, requested and free numbers and detail, by keyword)."""
    counts = {reason: on_gpus} if on_gpus else {}
    return Rejection(node=node, reason=reason, unresolvable=unresolvable, gpu_counts=counts,
                     **numbers)


# ---- nodes and GPUs ------------------------------------------------------------------------

def gpu(index: int = 0, node: str = "n1", product: str = A100,
        memory_mib: float = A100_MIB) -> GpuSpec:
    """One GPU; its uuid is ``GPU-<node>-<index>``."""
    return GpuSpec(index=index, uuid=f"GPU-{node}-{index}", product=product,
                   memory_mib=memory_mib)


class NodeBuilder:
    """A node: ``NodeBuilder("n1").gpus(2).gpus(1, product=H100, memory_mib=81559).obj()``."""

    def __init__(self, name: str = "n1"):
        self._name = name
        self._gpus: list[GpuSpec] = []

    def gpus(self, count: int, product: str = A100, memory_mib: float = A100_MIB) -> NodeBuilder:
        """Add ``count`` identical GPUs, indexed after the ones already added."""
        start = len(self._gpus)
        self._gpus += [gpu(start + i, self._name, product, memory_mib) for i in range(count)]
        return self

    def obj(self) -> NodeSpec:
        """The node spec."""
        return NodeSpec(self._name, tuple(self._gpus))


def node(name: str, count: int = 4, product: str = A100, memory_mib: float = A100_MIB) -> NodeSpec:
    """A node with ``count`` identical GPUs."""
    return NodeBuilder(name).gpus(count, product, memory_mib).obj()


# ---- models -------------------------------------------------------------------------------

def tiny_model(path: Path) -> Path:
    """A one-MatMul ONNX model (IR 10, which ONNX Runtime 1.31 reads)."""
    import onnx  # here: most extender tests never need it
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], [0.0] * 32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, path)
    return path


# ---- apps and wire arguments ---------------------------------------------------------------

class FakeClock:
    """A settable clock."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_app(nodes: list[NodeSpec] | None = None, raw_config: dict[str, Any] | None = None,
             source: SimSource | None = None, clock: FakeClock | None = None, **kwargs: Any):
    """(flask app, extender, sim source, clock) over a sim cluster."""
    source = source or SimSource(nodes if nodes is not None else [node("n1"), node("n2")])
    clock = clock or FakeClock()
    holder = ConfigHolder(build_config(raw_config or {}))
    kwargs.setdefault("profiles", PROFILES)
    kwargs.setdefault("planner", default_planner())
    kwargs.setdefault("environ", {"TANDEM_AGENT_TOKEN": TOKEN})
    kwargs.setdefault("metrics", Metrics())
    app = create_app(holder, source, clock, **kwargs)
    return app, app.extensions["tandem"], source, clock


def args(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """ExtenderArgs with NodeNames (nodeCacheCapable: true)."""
    return {"Pod": p, "NodeNames": names}


def args_nodes(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """ExtenderArgs with a full NodeList (nodeCacheCapable: false)."""
    return {"Pod": p, "Nodes": {"metadata": {}, "items": [
        {"metadata": {"name": n}, "spec": {}, "status": {}} for n in names]}}


def binding(p: dict[str, Any], node_name: str) -> dict[str, Any]:
    """ExtenderBindingArgs for ``p``."""
    m = p["metadata"]
    return {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"],
            "Node": node_name}


class MemoryOnlyPredictor:
    """The facade without a trained model: memory from the graph, utilisation unknown."""

    def predict(self, model_ref: str, batch_size: int, gpu_type: str | None, workload: str):
        return SimpleNamespace(gpu_util_percent=None, gpu_mem_mib=1000.0,
                               source="unknown+mem:no-overhead")

    def known_digest(self, model_ref: str) -> str | None:
        return None


# ---- ClusterState through its snapshot (the state itself only writes) -----------------------

def state_view(state: Any) -> dict[str, Any]:
    """The encoded ``/v1/state`` document of ``state`` now (without ``learning``)."""
    from extender.state.view import encoded

    return encoded(state.snapshot())


def gpu_types(state: Any) -> list[str]:
    """The GPU types of ``state``'s table now."""
    return list(state.snapshot().table.type_names)


def assume_best(state: Any, node: str, resolved: ResolvedDemand, inference: Any, uid: str,
                pod_key: str) -> tuple[Placement, Any, float, list[str], str]:
    """What bind does: decide on ``node`` on a fresh snapshot and assume it (BindConflict when
    it does not fit); (placement, plan, cost, GPU UUIDs, interference source)."""
    from extender.core import place
    from extender.errors import BindConflict

    snap = state.snapshot()
    decided = place(snap, node, resolved, inference, uid, pod_key)
    if decided.placement is None:
        raise BindConflict(f"node {node} no longer fits pod {pod_key}", decided.rejection)
    assert state.assume(snap.stamp(node), decided.placement)
    return (decided.placement, decided.plan, decided.cost, list(decided.gpu_uuids),
            decided.interference)
