"""The pure decision core: demand parsing, reasons, Horus cost, evaluation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from extender_builders import (
    A100,
    H100,
    TTL,
    assume_best,
    inference,
    node,
    placement,
    pod,
    rejection,
    training,
)

from contracts.annotations import PodInputs
from extender.core import (
    CostPolicy,
    DecisionContext,
    DemandError,
    GpuObservation,
    GpuTable,
    InterferenceCurve,
    JobDemand,
    Placement,
    Purpose,
    Reason,
    ResolvedDemand,
    SessionSpec,
    TypeDemand,
    Workload,
    choose,
    evaluate,
    is_unresolvable,
    parse_demand,
    resolve_demand,
    score_nodes,
)
from extender.core.cost import curve_costs, effective_load, scores_from_costs
from extender.core.session_rules import InferenceContext
from extender.learning.knowledge import FixedBeliefs
from planner import plan_gpu


def resolved(p, table, predict=None, profiles=None):
    return resolve_demand(parse_demand(p), table.type_names, predict, profiles,
                          session_name="default/" + p["metadata"]["name"])


@pytest.mark.parametrize(("annotations", "field"), [
    ({"gpu_util": "lots", "gpu_mem_mib": "10"}, "tandem.io/gpu-util"),
    ({"gpu_util": "150", "gpu_mem_mib": "10"}, "tandem.io/gpu-util"),
    ({"gpu_util": "nan", "gpu_mem_mib": "10"}, "tandem.io/gpu-util"),
    ({"gpu_util": "10", "gpu_mem_mib": "-5"}, "tandem.io/gpu-mem-mib"),
    ({"workload": "batch", "gpu_util": "10", "gpu_mem_mib": "1"}, "tandem.io/workload"),
    ({"workload": "inference", "model": "m", "slo_ms": "10"}, "tandem.io/rate-rps"),
    ({"model": "m", "batch_size": "0"}, "tandem.io/batch-size"),
    ({"model": "m", "batch_size": "3.5"}, "tandem.io/batch-size"),
    ({"model": "", "gpu_util": "10"}, "tandem.io/model"),
], ids=["util-text", "util-over-100", "util-nan", "mem-negative",
        "unknown-workload", "inference-no-rate", "batch-zero", "batch-fraction", "model-empty"])
def test_bad_annotations_name_the_field(annotations, field):
    with pytest.raises(DemandError) as info:
        parse_demand(pod("p", 1, **annotations))
    assert info.value.field == field


CONTAINER_GPU = "Pod.spec.containers[0].resources.tandem.io/gpu"


@pytest.mark.parametrize(("gpus", "field"), [("0", "resources[tandem.io/gpu]"),
                                             ("two", CONTAINER_GPU), ("-1", CONTAINER_GPU)],
                         ids=["zero", "text", "negative"])
def test_bad_gpu_count(gpus, field):
    with pytest.raises(DemandError) as info:
        parse_demand(pod("p", gpus, gpu_util="1", gpu_mem_mib="1"))
    assert info.value.field == field


def test_defaults_and_values():
    assert parse_demand(pod("p", 2, model="m.onnx")) == JobDemand(
        2, PodInputs(workload="training", model="m.onnx", batch_size=32))
    assert parse_demand(inference()) == JobDemand(
        1, PodInputs(workload="inference", model="resnet50", batch_size=1, slo_ms=100.0,
                     rate_rps=200.0))


@pytest.mark.parametrize("reason", list(Reason), ids=lambda r: r.name)
def test_every_reason_has_code_event_and_mapping(reason):
    assert reason.event_reason.isalnum() and reason.event_reason[0].isupper()
    assert isinstance(is_unresolvable(reason), bool)
    resolvable = {Reason.INSUFFICIENT_GPU_MEMORY, Reason.COLOCATION_LIMIT,
                  Reason.COLOCATION_SLOWDOWN, Reason.WORKLOAD_CONFLICT, Reason.SLO_INFEASIBLE,
                  Reason.NO_BEST_EFFORT_SLACK, Reason.HANDOFF_PENDING}
    assert is_unresolvable(reason) == (reason not in resolvable)


@pytest.mark.parametrize(("util", "expected"), [(0, 0.0), (50, 0.25), (100, 0.5),
                                                (150, 0.5 + 0.25 + 0.25), (200, 2.0)],
                         ids=["idle", "half", "full", "150pct", "200pct"])
def test_curve_linear_below_quadratic_above(util, expected):
    curve = InterferenceCurve(0.5, 0.5, 1.0)
    assert curve(util) == pytest.approx(expected)
    vector = curve_costs(np.array([float(util)]), np.array([[0.5, 0.5, 1.0]]))
    assert vector[0] == pytest.approx(curve(util))


def test_scores_are_ints_in_range_lowest_cost_best():
    scores = scores_from_costs(np.array([0.2, 0.7, 0.45]))
    assert scores == [10, 0, 5] and all(type(s) is int for s in scores)
    assert scores_from_costs(np.array([0.3, 0.3])) == [10, 10]


def table_with(*placements, nodes=None):
    return GpuTable.build(nodes or [node("n1", 2), node("n2", 2)], placements)


def test_horus_cost_prefers_the_less_loaded_gpu():
    busy = placement("u0", pod="x", node="n1", gpus=(0,), util=80, mem=20000)
    busy2 = placement("u1", pod="y", node="n1", gpus=(1,), util=80, mem=20000)
    t = table_with(busy, busy2)
    ev = evaluate(t, ["n1", "n2"], resolved(training(util=40, mem=5000), t),
                  DecisionContext(CostPolicy(), 0.0))
    assert ev.feasible_names() == ["n1", "n2"]
    assert ev.scores() == [0, 10]
    assert choose(ev, 1, "u", "default/t") == placement(
        "u", pod="default/t", node="n2", gpus=(0,), util=40, mem=5000)


def test_multi_gpu_job_takes_best_n_gpus_and_needs_n():
    t = table_with(placement("u0", pod="x", node="n1", gpus=(0,), util=90, mem=1000))
    ev = evaluate(t, ["n1"], resolved(training(gpus=1), t), DecisionContext(CostPolicy(), 0.0))
    assert choose(ev, 0, "u", "p") == placement("u", pod="p", node="n1", gpus=(1,), util=40,
                                                 mem=10000)
    ev = evaluate(t, ["n1", "n2"], resolved(training(gpus=3), t),
                  DecisionContext(CostPolicy(), 0.0))
    assert ev.feasible_names() == []
    too_few = {"gpus_total": 2, "requested_gpus": 3, "requested_mib": 10000.0}
    assert ev.rejections == {n: rejection(n, Reason.TOO_FEW_GPUS, True, **too_few)
                             for n in ("n1", "n2")}


@pytest.mark.parametrize(("placements", "demand", "reason", "unresolvable", "best_free_mib"), [
    ([], training(mem=50000), Reason.GPU_MEMORY_TOO_SMALL, True, 40960.0),
    ([placement("a", pod="a", gpus=(0, 1), util=10, mem=35000)], training(mem=10000),
     Reason.INSUFFICIENT_GPU_MEMORY, False, 40960.0 - 35000),
    ([placement("a", pod="a", gpus=(0, 1), util=10, mem=100, workload=Workload.INFERENCE)],
     training(), Reason.WORKLOAD_CONFLICT, False, 40960.0 - 100),
], ids=["too-small", "insufficient-free", "serving-gpu"])
def test_rejection_reasons(placements, demand, reason, unresolvable, best_free_mib):
    t = table_with(*placements)
    ev = evaluate(t, ["n1"], resolved(demand, t), DecisionContext(CostPolicy(), 0.0))
    rej = ev.rejections["n1"]
    requested_mib = float(demand["metadata"]["annotations"]["tandem.io/gpu-mem-mib"])
    assert rej == rejection("n1", reason, unresolvable, on_gpus=2, gpus_total=2,
                            requested_mib=requested_mib, best_free_mib=best_free_mib)
    assert rej.message().startswith("tandem: ")


def test_colocation_limit_and_unknown_and_empty_nodes():
    t = GpuTable.build([node("n1", 1), node("empty", 0)],
                       [placement(f"u{i}", pod="x", util=1, mem=1) for i in range(2)])
    ev = evaluate(t, ["n1", "ghost", "empty"], resolved(training(mem=1), t),
                  DecisionContext(CostPolicy(max_pods_per_gpu=2), 0.0))
    assert ev.rejections == {
        "n1": rejection("n1", Reason.COLOCATION_LIMIT, False, on_gpus=1, gpus_total=1,
                        requested_mib=1.0, best_free_mib=40960.0 - 2),
        "ghost": rejection("ghost", Reason.UNKNOWN_NODE, True, requested_mib=1.0),
        "empty": rejection("empty", Reason.NO_GPU_INVENTORY, True, requested_mib=1.0),
    }


def _load_steps(steps: str) -> GpuTable:
    """One GPU; ``steps`` is a space-separated script: ``+X`` places pod X (30%, 1000 MiB),
    ``-X`` removes it, ``oT`` records an observation of 90% / 3000 MiB taken at time T,
    ``+X@T`` places X stamped at time T (as a ledger rebuild does)."""
    a = placement("a", pod="a", node="n1", gpus=(0,), util=50, mem=2000)
    t = table_with(a, nodes=[node("n1", 1)])
    pods: dict[str, Placement] = {"a": a}
    for step in steps.split():
        if step[0] == "o":
            t.observe("n1", [GpuObservation(0, 90.0, 3000.0, float(step[1:]))])
            continue
        name, _, at = step[1:].partition("@")
        p = pods.setdefault(name, placement(name, pod=name, util=30, mem=1000))
        if step[0] == "+":
            t.place(p, float(at) if at else None)
        else:
            t.remove(p)
    return t


# Reserved: a = 50% / 2000 MiB, each other pod 30% / 1000 MiB; observation 90% / 3000 MiB.
@pytest.mark.parametrize(("steps", "now", "util", "mib"), [
    ("o100", 101, 90, 3000),
    ("o100 +b", 101, 120, 4000),
    ("o100 +b +c", 101, 150, 5000),
    ("+b o100", 101, 90, 3000),
    ("o100 +b -b", 101, 90, 3000),
    ("+b o100 -b", 101, 90, 3000),
    ("o100 +b o102", 103, 90, 3000),
    ("o100 +b@99", 101, 90, 3000),
    ("o100 +b@101", 101, 120, 4000),
    ("o100 +b +c -b", 101, 120, 4000),
    ("+b +c +d", 101, 140, 5000),
    ("o100 +b", 200, 80, 3000),
    ("o100 +b +c +d", 101, 180, 6000),
], ids=["fresh-observation-above-reservations", "pod-bound-after-sample-adds-to-it",
        "two-pods-after-sample", "pod-bound-before-sample-is-in-it", "newer-pod-removed-again",
        "older-pod-removed-observation-still-shows-it", "next-sample-resets-the-newer-sum",
        "rebuild-stamp-before-sample", "rebuild-stamp-after-sample",
        "one-of-two-newer-pods-removed", "no-observation-reservations-only",
        "stale-observation-reservations-only", "reservations-below-observation-plus-newer"])
def test_load_rule_adds_reservations_newer_than_the_observation(steps, now, util, mib):
    # The old rule max(reserved, observed) gives 90% / 3000 MiB for every fresh case
    # with pods bound after the sample: each such pod was absorbed for free.
    t = _load_steps(steps)
    got_util = effective_load(t.reserved_util, t.observed_util, t.observed_at, now, 10.0,
                              t.since_util)
    got_mib = effective_load(t.reserved_mib, t.observed_mib, t.observed_at, now, 10.0,
                             t.since_mib)
    assert (got_util[0], got_mib[0]) == (pytest.approx(util), pytest.approx(mib))
    copy = t.copy()
    assert np.array_equal(copy.since_mib, t.since_mib) and copy.newer == t.newer


def test_second_pod_after_a_sample_sees_the_first_one_in_free_memory():
    # 40 GiB GPU: reserved 20 GiB, observed 30 GiB (prediction too low). A 6 GiB pod fits
    # (34 GiB), a second one does not (40 GiB + 6): max(R + r, O) said 32 GiB, room for it.
    t = table_with(placement("a", pod="a", util=50, mem=20480), nodes=[node("n1", 1)])
    t.observe("n1", [GpuObservation(0, 60.0, 30720.0, 100.0)])
    demand = resolved(training(util=10, mem=6144), t)
    first = choose(evaluate(t, ["n1"], demand, DecisionContext(CostPolicy(), 101.0)), 0, "b", "b")
    assert first == placement("b", pod="b", util=10, mem=6144)
    t.place(first)
    ev = evaluate(t, ["n1"], demand, DecisionContext(CostPolicy(), 101.0))
    assert ev.rejections == {"n1": rejection(  # free: 40 GiB - (30 GiB observed + 6 GiB newer)
        "n1", Reason.INSUFFICIENT_GPU_MEMORY, False, on_gpus=1, gpus_total=1,
        requested_mib=6144.0, best_free_mib=40960.0 - 30720 - 6144)}


@pytest.mark.parametrize(("observed", "age", "expected_util"), [
    (90.0, 1.0, 90.0), (10.0, 1.0, 50.0), (90.0, 60.0, 50.0)],
    ids=["fresh-higher-wins", "reservation-higher-wins", "stale-ignored"])
def test_observed_load_rule_is_max_of_fresh(observed, age, expected_util):
    t = table_with(placement("a", pod="a", util=50, mem=1000), nodes=[node("n1", 1)])
    t.observe("n1", [GpuObservation(0, observed, 0.0, 100.0)])
    demand = resolved(training(util=0.001, mem=1), t)
    policy = CostPolicy(w_mem=0.0, curves={}, default_curve=InterferenceCurve(1.0, 1.0, 0.0))
    ev = evaluate(t, ["n1"], demand, DecisionContext(policy, 100.0 + age))
    assert ev.node_cost[0] == pytest.approx(expected_util / 100.0, abs=1e-4)


# Curve 0.5 / 0.5 / 1.0: predicted slowdown 1.5 at 100%, 2.0 at 150%, 3.0 at 200%.
@pytest.mark.parametrize(("on_gpu", "job_util", "gain", "fits"), [
    ([], 100, 0.0, True),
    ([50], 40, 0.0, True),
    ([100], 100, 0.0, False),
    ([75], 75, 0.0, False),
    ([74], 75, 0.0, True),
    ([60], 60, 20.0, True),
    ([60], 60, 25.0, False),
    ([100], 100, None, True),
    ([40, 40], 40, 0.0, True),
    ([40, 40], 80, 0.0, False),
], ids=["idle-gpu-always", "pair-below-break-even", "pair-at-200pct",
        "pair-exactly-at-break-even", "pair-just-below-break-even", "gain-22pct-over-margin-20",
        "gain-22pct-under-margin-25", "rule-off-horus", "third-light-job-raises-the-rate",
        "third-job-lowers-the-rate-though-above-serial"])
def test_colocation_throughput_rule(on_gpu, job_util, gain, fits):
    t = table_with(*(placement(f"u{i}", pod="x", util=u, mem=100) for i, u in enumerate(on_gpu)),
                   nodes=[node("n1", 1)])
    policy = CostPolicy(default_curve=InterferenceCurve(0.5, 0.5, 1.0),
                        min_colocation_gain_percent=gain)
    demand = resolved(training(util=job_util, mem=100), t)
    for purpose in (Purpose.SCORE, Purpose.FILTER):  # filter and prioritize/bind agree
        ev = evaluate(t, ["n1"], demand, DecisionContext(policy, 0.0), purpose)
        assert ev.feasible_names() == (["n1"] if fits else [])
    if not fits:
        rej = ev.rejections["n1"]
        assert rej == rejection("n1", Reason.COLOCATION_SLOWDOWN, False, on_gpus=1, gpus_total=1,
                                requested_mib=100.0, best_free_mib=40960.0 - 100 * len(on_gpu))
        assert rej.reason.event_reason == "ColocationSlowdown"


def test_colocation_rule_sends_the_job_to_the_gpu_where_it_pays():
    # GPU 0 runs a 100% job (a second heavy job there is a loss), GPU 1 a 20% one.
    t = table_with(placement("a", pod="a", gpus=(0,), util=100, mem=100),
                   placement("b", pod="b", gpus=(1,), util=20, mem=100), nodes=[node("n1", 2)])
    policy = CostPolicy(min_colocation_gain_percent=0.0)
    demand = resolved(training(util=90, mem=100), t)
    ev = evaluate(t, ["n1"], demand, DecisionContext(policy, 0.0))
    assert choose(ev, 0, "c", "c") == placement("c", pod="c", gpus=(1,), util=90, mem=100)
    both = evaluate(t, ["n1"], resolved(training(util=90, mem=100, gpus=2), t),
                    DecisionContext(policy, 0.0))
    rej = both.rejections["n1"]  # GPU 0: rate 1 -> 2 / 2.76 at 190%; GPU 1: 1 -> 2 / 1.56
    assert rej == rejection("n1", Reason.COLOCATION_SLOWDOWN, False, on_gpus=1, gpus_total=2,
                            requested_gpus=2, requested_mib=100.0, best_free_mib=40960.0 - 100)
    assert "co-location would slow" in rej.message()


@pytest.mark.parametrize(("co_runners", "fits"), [
    ([placement("a", pod="a", gpus=(0,), util=50, mem=100),
      placement("b", pod="b", gpus=(1,), util=50, mem=100)], True),
    ([placement("a", pod="a", gpus=(0, 1), util=50, mem=100)], False),
], ids=["single-gpu-co-runners", "two-gpu-gang"])
def test_colocation_rule_weighs_a_gang_by_its_gpus(co_runners, fits):
    # Both GPUs run 50%; a 40% newcomer is predicted at 1.45x (90%). Next to a single-GPU
    # pod the GPU's rate goes 1 -> 2/1.45 (+38%); next to a 2-GPU gang, which moves at the
    # pace of its slowest GPU, 2 -> 3/1.45 (+3%): below a 10% margin.
    t = table_with(*co_runners, nodes=[node("n1", 2)])
    policy = CostPolicy(default_curve=InterferenceCurve(0.5, 0.5, 1.0),
                        min_colocation_gain_percent=10.0)
    ev = evaluate(t, ["n1"], resolved(training(util=40, mem=100), t), DecisionContext(policy, 0.0))
    assert ev.feasible_names() == (["n1"] if fits else [])


def test_inference_best_fit_and_separation():
    t = GpuTable.build([node("n1", 2)])
    ctx = InferenceContext(plan_gpu, _profiles())
    first = resolved(inference("s1", rate=200), t, profiles=_profiles())
    ev = evaluate(t, ["n1"], first, DecisionContext(CostPolicy(), 0.0, ctx))
    s1 = choose(ev, 0, "u1", "default/s1")
    # A100 resnet50 latency 0.6 ms x batch + 3 ms; 100 ms SLO: s1 alone runs batches of 18
    # (13.8 ms) in an 86.2 ms duty cycle; s2 joins that cycle with batches of 9 (8.4 ms).
    assert s1 == placement("u1", pod="default/s1", gpus=(0,), util=pytest.approx(1380 / 86.2),
                           mem=2500.0,
                           session=SessionSpec("default/s1", "resnet50", 100.0, 200.0))
    t.place(s1)
    second = resolved(inference("s2", rate=100), t, profiles=_profiles())
    ev = evaluate(t, ["n1"], second, DecisionContext(CostPolicy(), 0.0, ctx))
    assert choose(ev, 0, "u2", "default/s2") == placement(  # best fit: s1's GPU
        "u2", pod="default/s2", gpus=s1.gpu_indices, util=pytest.approx(840 / 86.2), mem=2500.0,
        session=SessionSpec("default/s2", "resnet50", 100.0, 100.0))
    ev = evaluate(t, ["n1"], resolved(training(), t), DecisionContext(CostPolicy(), 0.0))
    assert choose(ev, 0, "u3", "t") == placement(  # training elsewhere
        "u3", pod="t", gpus=(1,), util=40, mem=10000)


def test_inference_without_profile_or_with_impossible_slo():
    t = GpuTable.build([node("n1", 1, product=H100, memory_mib=81559)])
    ctx = InferenceContext(plan_gpu, _profiles())
    ev = evaluate(t, ["n1"], resolved(inference(model="nope"), t, profiles=_profiles()),
                  DecisionContext(CostPolicy(), 0.0, ctx))
    h100 = {"gpus_total": 1, "best_free_mib": 81559.0}
    assert ev.rejections == {"n1": rejection(
        "n1", Reason.DEMAND_UNKNOWN, True, on_gpus=1, requested_mib=0.0, **h100,
        detail=f"{H100}: demand unknown: no-profile: no batching profile for nope and no "
                   "tandem.io/gpu-mem-mib to place it under the cold-start rule")}
    ev = evaluate(t, ["n1"], resolved(inference(slo=1), t, profiles=_profiles()),
                  DecisionContext(CostPolicy(), 0.0, ctx))
    assert ev.rejections == {"n1": rejection(  # H100: one request takes 0.35 + 2 ms
        "n1", Reason.SLO_UNREACHABLE, True, on_gpus=1, requested_mib=2500.0, **h100,
        detail=f"{H100}: session default/s: SloTooTight (needs 4.7 ms, available 1 ms)")}


def test_predictor_gaps_become_demand_unknown():
    from extender.core import DemandUnavailable

    def predict(model, batch, gpu_type, workload):
        if gpu_type == A100:
            raise DemandUnavailable("NoTrainedModel", "no model for A100")
        return 30.0, 4000.0, "fake"

    t = GpuTable.build([node("a", 1), node("h", 1, product=H100, memory_mib=81559)])
    d = resolved(pod("p", 1, model="m.onnx"), t, predict=predict)
    assert d == ResolvedDemand(job=JobDemand(1, PodInputs(model="m.onnx", batch_size=32)),
                               by_type={H100: TypeDemand(30.0, 4000.0, "fake")},
                               gaps={A100: "NoTrainedModel: no model for A100"})
    ev = evaluate(t, ["a", "h"], d, DecisionContext(CostPolicy(), 0.0))
    assert ev.feasible_names() == ["h"]
    assert ev.rejections == {"a": rejection(
        "a", Reason.DEMAND_UNKNOWN, True, on_gpus=1, gpus_total=1, requested_mib=4000.0,
        best_free_mib=40960.0, detail=f"{A100}: demand unknown: NoTrainedModel: no model for A100")}


def test_asserted_values_override_prediction():
    t = GpuTable.build([node("a", 1)])
    d = resolved(pod("p", 1, model="m", gpu_util="12"), t,
                 predict=lambda *a: (99.0, 2048.0, "fake"))
    job = JobDemand(1, PodInputs(model="m", batch_size=32, util_percent=12.0))
    assert d == ResolvedDemand(job=job,
                               by_type={A100: TypeDemand(12.0, 2048.0, "asserted+mem:fake")})


def test_table_place_remove_roundtrip_and_copy_is_independent():
    t = table_with()
    p = placement("a", pod="a", gpus=(1,), util=30, mem=1000)
    snapshot = t.copy()
    t.place(p)
    assert t.reserved_mib.sum() == 1000 and snapshot.reserved_mib.sum() == 0
    t.remove(p)
    assert t.reserved_mib.sum() == 0 and t.pod_count.sum() == 0
    assert math.isinf(t.observed_at[0])


def _profiles():
    from extender_builders import PROFILES

    from extender.core import ProfileIndex

    return ProfileIndex(PROFILES)


def test_ledger_rebuild_and_confirm_keep_pods_newer_than_the_sample():
    # extender.state.ledger feeds the table bind and report times on one clock; a rebuild
    # (inventory change) and the watch's confirm must not fold a newer pod into the sample.
    from extender.state.ledger import ClusterState

    clock = [10.0]
    state = ClusterState(FixedBeliefs(CostPolicy()), lambda: clock[0], TTL)
    state.set_nodes([node("n1", 1)])
    gpus = state.snapshot().table.gpus
    state.report("n1", gpus, [60.0], [30000.0])
    clock[0] = 11.0
    demand = resolved(training(util=10, mem=4000), state.snapshot().table)
    assumed, *_ = assume_best(state, "n1", demand, None, "u1", "default/p1")
    assert assumed == placement("u1", pod="default/p1", util=10, mem=4000)

    def since() -> float:
        return float(state.snapshot().table.since_mib[state.snapshot().table.row_of("n1", 0)])

    assert since() == 4000.0
    state.upsert_node(node("n2", 1))  # rebuild
    assert since() == 4000.0
    state.confirm(assumed)
    assert since() == 4000.0
    clock[0] = 12.0
    state.report("n1", gpus, [70.0], [34000.0])  # the sample now shows the pod
    assert since() == 0.0
    state.upsert_node(node("n3", 1))
    assert since() == 0.0
    snap = state.snapshot()
    ev = score_nodes(snap, ["n1"], resolved(training(util=10, mem=7000), snap.table))
    assert ev.feasible_names() == []
    assert ev.rejections == {"n1": rejection(
        "n1", Reason.INSUFFICIENT_GPU_MEMORY, False, on_gpus=1, gpus_total=1,
        requested_mib=7000.0, best_free_mib=40960.0 - 34000)}
