"""One snapshot in, one decision out: frozen snapshots, the generation-checked assume, the
removal what-if, one door for what was learned, and the service and the simulator deciding
alike on one snapshot."""

from __future__ import annotations

import dataclasses
import inspect
import threading
import weakref

import numpy as np
import pytest
from extender_builders import (
    TTL,
    args,
    binding,
    make_app,
    node,
    placement,
    state_view,
    training,
)

from contracts.annotations import PodInputs
from extender.config.loader import ConfigHolder
from extender.config.schema import build_config
from extender.config.sections import LearningConfig
from extender.core import (
    CostPolicy,
    GpuObservation,
    GpuTable,
    InterferenceCurve,
    JobDemand,
    Snapshot,
    fits_without,
    place,
    resolve_demand,
    without,
)
from extender.errors import BindConflict
from extender.learning.knowledge import Beliefs, FixedBeliefs, Knowledge
from extender.learning.learner import Learner
from extender.preemption.executor import Preemptor
from extender.queue.fair import QueueConfig
from extender.service.agents import AgentService
from extender.service.demand_cache import DemandCache
from extender.service.verbs import Extender
from extender.state.ledger import ClusterState
from extender.state.view import document
from lab.simulator.baselines import node_of_rows
from lab.simulator.engine import JobRun
from lab.simulator.horus import FreeView, HorusSettings, place_with_core
from lab.simulator.jobs import SimJob

A100 = "NVIDIA-A100-SXM4-40GB"


def demand(util: float, mem: float, types: list[str]):
    return resolve_demand(JobDemand(1, PodInputs(util_percent=util, mem_mib=mem)), types, None)


def state_with(nodes, clock=lambda: 100.0) -> ClusterState:
    state = ClusterState(FixedBeliefs(CostPolicy()), clock, TTL)
    state.set_nodes(nodes)
    return state


def test_a_snapshot_never_changes_under_later_writes():
    state = state_with([node("n1", 2)])
    state.confirm(placement("a", gpus=(0,), mem=5000.0))
    before = state.snapshot()
    reserved = before.table.reserved_mib.copy()
    state.confirm(placement("b", gpus=(1,), mem=7000.0))
    state.report("n1", before.table.gpus, [50.0, 50.0], [9000.0, 9000.0])
    state.forget("a")
    assert np.array_equal(before.table.reserved_mib, reserved)
    assert np.isnan(before.table.observed_mib).all()
    assert before.placement_of("a") is not None and before.placement_of("b") is None
    after = state.snapshot()
    assert after.placement_of("a") is None and after.table.reserved_mib.tolist() == [0, 7000]
    state.report("n1", before.table.gpus, [60.0, 60.0], [9500.0, 9500.0])
    latest = state.snapshot()  # a report copied the observations only
    assert latest.table.reserved_mib is after.table.reserved_mib
    assert latest.table.observed_mib is not after.table.observed_mib
    gpus = latest.table.gpus
    table, observed = weakref.ref(latest.table), weakref.ref(latest.table.observed_mib)
    del before, after, latest  # no snapshot alive: the next writes copy nothing
    state.report("n1", gpus, [70.0, 70.0], [9900.0, 9900.0])
    state.confirm(placement("c", gpus=(0,), mem=100.0))
    now = state.snapshot()
    assert now.table is table() and now.table.observed_mib is observed()
    assert now.table.observed_mib[0] == 9900 and now.placement_of("c") is not None


def test_assume_refuses_a_decision_taken_on_a_node_that_changed_since():
    state = state_with([node("n1", 1), node("n2", 1)])
    snap = state.snapshot()
    d = demand(10, 30000, list(snap.table.type_names))
    first = place(snap, "n1", d, None, "u1", "ns/one").placement
    second = place(snap, "n1", d, None, "u2", "ns/two").placement
    other = place(snap, "n2", d, None, "u3", "ns/three").placement
    assert state.assume(snap.stamp("n1"), first)
    assert not state.assume(snap.stamp("n1"), second)  # n1 changed: both saw its free memory
    assert state.assume(snap.stamp("n2"), other)  # n2 did not change
    with pytest.raises(BindConflict):
        state.assume(state.snapshot().stamp("n1"), first)  # already assumed
    state.report("n2", snap.table.gpus[1:], [0.0], [0.0])
    fresh = state.snapshot()
    state.report("n2", snap.table.gpus[1:], [1.0], [10.0])  # an agent report bumps it too
    small = demand(10, 1000, list(snap.table.type_names))
    late = place(fresh, "n2", small, None, "u4", "ns/four").placement
    assert not state.assume(fresh.stamp("n2"), late)


def test_bind_decides_again_on_a_fresh_snapshot_when_the_node_changed():
    app, ext, source, _ = make_app([node("n1", 2)])
    pod = training("p", mem=10000)
    source.create_pod(pod)
    real = ext.state.assume
    calls = []

    def racing(stamp, placement, replacing=None):  # another bind lands first, once
        if not calls:
            ext.state.confirm(type(placement)(**{**placement.__dict__, "pod_uid": "other",
                                                 "pod": "ns/other"}))
        calls.append(stamp)
        return real(stamp, placement, replacing)

    ext.state.assume = racing
    assert app.test_client().post("/bind", json=binding(pod, "n1")).get_json() == {"Error": ""}
    assert len(calls) == 2 and calls[0] != calls[1]
    gpus = state_view(ext.state)["nodes"]["n1"]["gpus"]
    assert sorted(len(g["pods"]) for g in gpus) == [1, 1]  # not both on one GPU's view


def test_without_takes_off_reservations_and_the_observed_use_that_shows_them():
    table = GpuTable.build([node("n1", 1)])
    victim = placement("v", mem=30000.0, util=40.0)
    table.place(victim, 1.0)
    table.observe("n1", [GpuObservation(0, 45.0, 31000.0, 2.0)])  # the agent sees the victim
    late = placement("l", mem=2000.0, util=5.0)
    table.place(late, 3.0)  # after the observation: in ``since``, not observed
    snap = Snapshot(table, CostPolicy(), 3.0, _Lookup({"v": victim, "l": late}))
    d = demand(10, 30000, list(table.type_names))
    assert not fits_without(snap, "n1", [], d)
    gone = without(snap, [victim])
    assert gone.table.reserved_mib[0] == 2000 and gone.table.observed_mib[0] == 1000
    assert gone.table.observed_util[0] == 5.0 and gone.table.since_mib[0] == 2000
    assert fits_without(snap, "n1", ["v"], d)
    assert not fits_without(snap, "n1", ["v"], d, observed=False)  # the reservation only
    unseen = without(snap, [late])
    assert unseen.table.observed_mib[0] == 31000 and unseen.table.since_mib[0] == 0
    assert snap.table.reserved_mib[0] == 32000  # the snapshot itself is untouched


class _Lookup(dict):
    def get(self, uid, default=None):
        return super().get(uid, default)


def test_knowledge_is_one_frozen_value_rebuilt_only_when_something_changed():
    learner = Learner(LearningConfig(curve_min_points=5, curve_refit_interval_seconds=0))
    config = ConfigHolder(build_config({}))
    beliefs = Beliefs(config, learner)
    policy, knowledge = beliefs.current()
    assert beliefs.current()[1] is knowledge and policy is config.policy()  # nothing learned
    with pytest.raises(AttributeError):
        knowledge.curves = {}  # frozen
    for u in range(20, 100, 16):
        learner.curves.add_point(A100, u, 1.0 + 0.6 * u / 100)
    assert learner.curves.maybe_refit(A100, learner.prior(A100))
    learned, again = beliefs.current()
    assert again is not knowledge and isinstance(again, Knowledge)
    assert learned.curve_for(A100) == again.curves[A100] != InterferenceCurve()
    assert beliefs.current()[0] is learned  # merged once per refit, not per call


def test_the_prior_is_handed_to_the_learner_by_the_door():
    learner = Learner(LearningConfig())
    steep = InterferenceCurve(slope=0.9)
    config = ConfigHolder(build_config({"cost": {"curves": {A100: {"slope": 0.9}}}}))
    assert learner.prior(A100) == InterferenceCurve()
    Beliefs(config, learner).current()
    assert learner.prior(A100).slope == steep.slope


def test_no_class_on_the_request_path_has_more_than_15_public_methods():
    for cls in (ClusterState, Extender, AgentService, DemandCache, Preemptor, Beliefs):
        public = [n for n, v in vars(cls).items() if not n.startswith("_")
                  and (inspect.isfunction(v) or isinstance(v, property | staticmethod))]
        assert len(public) <= 15, (cls.__name__, public)
    writers = {"mark_synced", "set_nodes", "upsert_node", "delete_node", "confirm", "forget",
               "retain_placed", "finish_binding", "expire", "report"}
    reads = {"placement_of", "is_known", "node_gpus"}  # what the cluster source reads
    assert {n for n in vars(ClusterState) if not n.startswith("_")} == \
        writers | reads | {"snapshot", "assume"}


def test_the_service_and_the_simulator_decide_alike_on_one_snapshot():
    nodes = [node(f"n{i}", 4) for i in range(4)]
    app, ext, source, clock = make_app(nodes)
    state = ext.state
    rng = np.random.default_rng(7)
    for i in range(10):  # a busy cluster: pods of all sizes and agents' observations
        state.confirm(placement(f"u{i}", node=f"n{rng.integers(4)}",
                                gpus=(int(rng.integers(4)),), util=float(rng.integers(5, 60)),
                                mem=float(rng.integers(1000, 20000))))
    for n in nodes[:2]:
        state.report(n.name, n.gpus, [float(u) for u in rng.integers(0, 90, 4)],
                     [float(m) for m in rng.integers(0, 30000, 4)])
    snap = state.snapshot()
    names = [n.name for n in nodes]
    for k, (util, mem) in enumerate([(30, 8000), (70, 15000), (5, 1000), (50, 25000)]):
        pod = training(f"job{k}", util=util, mem=mem)
        scores = app.test_client().post("/prioritize", json=args(pod, names)).get_json()
        best = max(scores, key=lambda s: s["Score"])["Host"]  # first max: node order
        run = JobRun(k, SimJob(f"job{k}", 0.0, 60.0, util_percent=util, mem_mib=mem))
        settings = HorusSettings(snap.policy, QueueConfig(), node_pick="score")
        view = FreeView(snap.table, node_of_rows(snap.table), snap.policy, snap.now)
        (simulated,) = place_with_core(view, run, settings)
        served = place(snap, best, demand(util, mem, list(snap.table.type_names)), None,
                       simulated.pod_uid, simulated.pod).placement
        assert (simulated.node, simulated.gpu_indices) == (best, served.gpu_indices)
        assert state.snapshot().table is snap.table  # nothing written: no copy was made


def test_a_snapshot_takes_no_lock_until_a_writer_ran_and_drops_what_expired():
    clock = [100.0]
    state = state_with([node("n1", 2)], clock=lambda: clock[0])
    p = placement("a", gpus=(0,), mem=5000.0)
    assert state.assume(state.snapshot().stamp("n1"), p)
    state.finish_binding("a")  # expires TTL seconds from now
    first = state.snapshot()
    held, release = threading.Event(), threading.Event()

    def writer_stalled():  # a thread holding the lock (as a slow writer would)
        with state._lock:
            held.set()
            release.wait(10)
    t = threading.Thread(target=writer_stalled)
    t.start()
    held.wait(10)
    got: list[Snapshot] = []
    reader = threading.Thread(target=lambda: got.append(state.snapshot()))
    reader.start()
    reader.join(2)
    release.set()
    t.join()
    assert got and got[0].table is first.table  # nothing changed: answered without the lock
    clock[0] += TTL - 1
    assert state.snapshot().placement_of("a") is not None
    clock[0] += 2  # past the deadline: the next snapshot drops it
    after = state.snapshot()
    assert after.placement_of("a") is None and after.table.reserved_mib.tolist() == [0, 0]
    assert first.placement_of("a") is not None  # the old snapshot is untouched


def test_one_node_state_lists_what_the_full_document_lists_for_it():
    state = state_with([node("n1", 2), node("n2", 2), node("n3", 1)])
    state.confirm(placement("a", node="n1", gpus=(0,), mem=1000.0))
    state.confirm(placement("b", node="n2", gpus=(1,), mem=2000.0))
    state.confirm(placement("c", node="n2", gpus=(0,), mem=3000.0))
    assert state.assume(state.snapshot().stamp("n2"), placement("d", node="n2", gpus=(0,),
                                                                mem=500.0))
    state.confirm(dataclasses.replace(placement("e", node="n3", gpus=(0,), mem=100.0),
                                      trusted=False))  # bound without a record
    state.forget("b")
    full = document(state.snapshot())
    for name in ("n1", "n2", "n3"):
        one = document(state.snapshot(), node=name)
        assert one.nodes == tuple(n for n in full.nodes if n.name == name)
    assert (full.placed, full.assumed, full.untrusted) == (2, 1, 1)
    assert document(state.snapshot(), node="n2").nodes[0].gpus[0].pods[0].pod is not None
    assert document(state.snapshot(), node="n9").nodes == ()


def test_confirming_what_bind_assumed_changes_only_the_ledger():
    state = state_with([node("n1", 2)])
    snap = state.snapshot()
    p = place(snap, "n1", demand(10, 5000, list(snap.table.type_names)), None, "u1",
              "ns/one").placement
    placed = state.snapshot().placements._placed  # type: ignore[attr-defined]
    assert state.assume(snap.stamp("n1"), p)  # beside a live snapshot: ...
    assert state.snapshot().placements._placed is placed  # ... the placed entries not copied
    state.finish_binding("u1")
    held = state.snapshot()  # a live snapshot (a filter's): a table write would copy
    state.confirm(dataclasses.replace(p, annotations=(("tandem.io/gpu-index", "0"),)))
    after = state.snapshot()
    assert after.table is held.table and after.stamp("n1") == held.stamp("n1")
    assert after.placement_of("u1").annotations == (("tandem.io/gpu-index", "0"),)
    assert held.placement_of("u1").annotations == p.annotations  # the old one unchanged
    state.expire()
    assert state.snapshot().placement_of("u1") is not None  # placed: no deadline any more
    q = dataclasses.replace(p, pod_uid="u2", pod="ns/two")
    assert state.assume(state.snapshot().stamp("n1"), q)
    other = 1 - q.gpu_indices[0]
    state.confirm(dataclasses.replace(q, gpu_indices=(other,), gpu_uuids=()))  # not as assumed
    assert state.snapshot().table.reserved_mib[other] == 5000
    assert state.snapshot().table.reserved_mib.sum() == 10000
    assert state.snapshot().stamp("n1") != held.stamp("n1")
