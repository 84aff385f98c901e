"""Best-effort inference sessions (no SLO): parsing, demand, slack filter, spread score, wire."""

from __future__ import annotations

from typing import Any

import pytest
from extender_builders import (
    A100,
    PROFILES,
    TOKEN,
    args,
    binding,
    make_app,
    node,
    placement,
    pod,
    rejection,
    training,
)

from extender.core import (
    CostPolicy,
    DecisionContext,
    DemandError,
    DemandUnavailable,
    GpuTable,
    InferenceContext,
    Placement,
    ProfileIndex,
    Reason,
    Rejection,
    SessionSpec,
    TypeDemand,
    Workload,
    choose,
    evaluate,
    parse_demand,
    resolve_demand,
)
from planner import plan_gpu

CTX = InferenceContext(plan_gpu, ProfileIndex(PROFILES))


def best_effort(name: str = "b", model: str = "resnet50", **annotations: str) -> dict[str, Any]:
    """A best-effort inference pod (no slo-ms / rate-rps)."""
    return pod(name, 1, workload="inference", model=model, **annotations)


def resolved(p: dict[str, Any], table: GpuTable, predict: Any = None, profiles: Any = PROFILES):
    return resolve_demand(parse_demand(p), table.type_names, predict, ProfileIndex(profiles),
                          session_name="default/" + p["metadata"]["name"])


# ---- parsing -------------------------------------------------------------------------------

@pytest.mark.parametrize(("annotations", "best", "weight"), [
    ({}, True, 1),
    ({"weight": "3"}, True, 3),
    ({"priority": "2"}, True, 1),
    ({"priority": "-1", "weight": "5"}, True, 1),
    ({"slo_ms": "100", "rate_rps": "10", "weight": "4"}, False, 4),
], ids=["default-weight", "weighted", "priority-counts-one", "priority-wins-over-weight",
        "slo-session"])
def test_best_effort_is_inference_without_slo(annotations, best, weight):
    job = parse_demand(best_effort(**annotations))
    assert (job.workload, job.best_effort, job.share_weight) == (Workload.INFERENCE, best, weight)


@pytest.mark.parametrize(("annotations", "field"), [
    ({"slo_ms": "100"}, "tandem.io/rate-rps"),
    ({"rate_rps": "100"}, "tandem.io/slo-ms"),
    ({"priority": "high"}, "tandem.io/priority"),
    ({"priority": "99999999999"}, "tandem.io/priority"),
    ({"weight": "0"}, "tandem.io/weight"),
], ids=["slo-without-rate", "rate-without-slo", "priority-not-integer", "priority-huge",
        "weight-zero"])
def test_bad_best_effort_annotations_name_the_field(annotations, field):
    with pytest.raises(DemandError) as info:
        parse_demand(best_effort(**annotations))
    assert info.value.field == field


def test_inference_pod_still_needs_a_model():
    with pytest.raises(DemandError) as info:
        parse_demand(pod("b", 1, workload="inference", weight="2"))
    assert info.value.field == "tandem.io/model"


# ---- demand --------------------------------------------------------------------------------

def _predict(util: float, mem: float):
    def predict(model, batch, gpu_type, workload):
        assert workload == "inference"
        return util, mem, "fake-predictor"
    return predict


def _failing(model, batch, gpu_type, workload):
    raise DemandUnavailable("NoTrainedModel", "no model")


@pytest.mark.parametrize(("annotations", "model", "predict", "expected"), [
    ({"gpu_util": "20", "gpu_mem_mib": "900"}, "resnet50", None, (20.0, 900.0, "asserted")),
    ({}, "resnet50", None, (100.0, 2500.0, "profile")),
    ({"gpu_mem_mib": "700"}, "unprofiled", None, (100.0, 700.0, "asserted")),
    ({}, "unprofiled", _predict(35.0, 1800.0), (35.0, 1800.0, "fake-predictor")),
    ({}, "resnet50", _predict(35.0, 1800.0), (35.0, 2500.0, "fake-predictor")),
    ({"gpu_util": "15"}, "resnet50", _predict(35.0, 1800.0), (15.0, 2500.0, "profile")),
    ({}, "resnet50", _failing, (100.0, 2500.0, "profile")),
], ids=["asserted-wins", "profile-memory-greedy-util", "asserted-memory-only",
        "predictor-only", "profile-memory-predicted-util", "asserted-util-profile-memory",
        "predictor-fails-profile-still-knows"])
def test_best_effort_demand_sources(annotations, model, predict, expected):
    t = GpuTable.build([node("n1", 1)])
    d = resolved(best_effort(model=model, **annotations), t, predict)
    assert d.for_type(A100) == TypeDemand(*expected)
    assert d.session is None  # no duty-cycle slot


@pytest.mark.parametrize("predict", [None, _failing], ids=["no-predictor", "predictor-fails"])
def test_best_effort_without_any_memory_source_is_demand_unknown(predict):
    t = GpuTable.build([node("n1", 1)])
    d = resolved(best_effort(model="unprofiled"), t, predict)
    assert A100 in d.gaps
    ev = evaluate(t, ["n1"], d, DecisionContext(CostPolicy(), 0.0, CTX))
    assert ev.rejections["n1"].reason is Reason.DEMAND_UNKNOWN


# ---- filter and score ----------------------------------------------------------------------

SLO = SessionSpec("default/s", "resnet50", 100.0, 300.0)
SLO_IDLE_PERCENT = 100.0 * (1.0 - plan_gpu([SLO], ProfileIndex(PROFILES), A100, 40960.0).occupancy)
"""Share of the duty cycle a GPU serving only ``SLO`` leaves idle."""


def slo_placement(uid: str, gpu: int, session: SessionSpec = SLO) -> Placement:
    return placement(uid, pod=session.name, gpus=(gpu,), util=20.0, mem=2500.0,
                     session=session)


def be_placement(uid: str, gpu: int, weight: int) -> Placement:
    return placement(uid, gpus=(gpu,), util=30.0, mem=1000.0, workload=Workload.INFERENCE,
                     weight=weight)


def train_placement(uid: str, gpu: int, mem: float = 1000.0) -> Placement:
    return placement(uid, gpus=(gpu,), util=30.0, mem=mem)


# (name, placements on n1's 3 GPUs, pod annotations, expected (GPU, util) or rejection reason);
# the util is the newcomer's weighted share of the GPU's slack (greedy: it asks for 100%).
CHOICES = [
    ("empty-gpus-tie-to-lowest-index", [], {}, (0, 100.0)),
    ("training-gpus-are-never-used", [train_placement("t0", 0), train_placement("t1", 1)], {},
     (2, 100.0)),
    ("empty-beats-slo-slack", [slo_placement("s0", 0)], {}, (1, 100.0)),
    ("spread-to-lighter-weight", [be_placement("a", 0, 3), be_placement("b", 1, 1),
                                  train_placement("t", 2)], {}, (1, 100.0 * 1 / 2)),
    ("heavy-newcomer-still-picks-most-slack-per-weight",
     [be_placement("a", 0, 1), be_placement("b", 1, 2), train_placement("t", 2)],
     {"weight": "10"}, (0, 100.0 * 10 / 11)),
    ("slack-beats-crowd", [slo_placement("s0", 0), be_placement("a", 1, 4),
                           train_placement("t", 2)], {}, (0, SLO_IDLE_PERCENT)),
    ("all-training", [train_placement(f"t{i}", i) for i in range(3)], {},
     Reason.WORKLOAD_CONFLICT),
    ("memory", [be_placement(f"b{i}", i, 1) for i in range(3)], {"gpu_mem_mib": "40000"},
     Reason.INSUFFICIENT_GPU_MEMORY),
]


@pytest.mark.parametrize(("placements", "annotations", "expected"),
                         [pytest.param(p, a, e, id=n) for n, p, a, e in CHOICES])
def test_best_effort_choice(placements, annotations, expected):
    t = GpuTable.build([node("n1", 3)], placements)
    ev = evaluate(t, ["n1"], resolved(best_effort(**annotations), t),
                  DecisionContext(CostPolicy(), 0.0, CTX))
    mem = float(annotations.get("gpu_mem_mib", 2500))  # else the resnet50 profile's
    if isinstance(expected, Reason):
        assert ev.feasible_names() == []
        assert ev.rejections == {"n1": rejection(  # every GPU already holds 1000 MiB
            "n1", expected, False, on_gpus=3, gpus_total=3, requested_mib=mem,
            best_free_mib=40960.0 - 1000)}
        return
    gpu, util = expected
    chosen = choose(ev, 0, "u-new", "default/b")
    assert chosen == placement("u-new", pod="default/b", gpus=(gpu,), util=pytest.approx(util),
                               mem=mem, workload=Workload.INFERENCE,
                               weight=parse_demand(best_effort(**annotations)).share_weight)
    assert chosen.best_effort


def test_colocation_limit_applies_to_best_effort():
    t = GpuTable.build([node("n1", 1)], [be_placement(f"b{i}", 0, 1) for i in range(2)])
    ev = evaluate(t, ["n1"], resolved(best_effort(), t),
                  DecisionContext(CostPolicy(max_pods_per_gpu=2), 0.0, CTX))
    assert ev.rejections == {"n1": rejection(
        "n1", Reason.COLOCATION_LIMIT, False, on_gpus=1, gpus_total=1, requested_mib=2500.0,
        best_free_mib=40960.0 - 2 * 1000)}


@pytest.mark.parametrize(("margin_percent", "fits"), [(-1.0, True), (1.0, False)],
                         ids=["slack-just-above-minimum", "slack-just-below-minimum"])
def test_slack_threshold_is_exact_and_explained(margin_percent, fits):
    t = GpuTable.build([node("n1", 1)], [slo_placement("s0", 0)])
    idle_percent = SLO_IDLE_PERCENT
    policy = CostPolicy(min_best_effort_slack_percent=idle_percent + margin_percent)
    ev = evaluate(t, ["n1"], resolved(best_effort(), t), DecisionContext(policy, 0.0, CTX))
    if fits:
        assert choose(ev, 0, "u", "default/b") == placement(  # greedy: all the slack
            "u", pod="default/b", util=pytest.approx(idle_percent), mem=2500.0,
            workload=Workload.INFERENCE)
        return
    rej = ev.rejections["n1"]
    assert rej == rejection(
        "n1", Reason.NO_BEST_EFFORT_SLACK, False, on_gpus=1, gpus_total=1, requested_mib=2500.0,
        best_free_mib=40960.0 - 2500,
        detail=f"{A100}: SLO sessions leave at most {idle_percent:.0f}% of the duty cycle idle; "
               f"best effort needs more than {idle_percent + margin_percent:.0f}%")
    assert f"leave at most {idle_percent:.0f}% of the duty cycle idle" in rej.message()
    assert "no slack left for best-effort sessions on 1/1 GPUs" in rej.message()


def test_best_effort_util_is_its_share_capped_by_its_demand():
    t = GpuTable.build([node("n1", 1)], [be_placement("a", 0, 1)])
    greedy = choose(evaluate(t, ["n1"], resolved(best_effort(weight="3"), t),
                             DecisionContext(CostPolicy(), 0.0, CTX)), 0, "u", "default/b")
    assert greedy == placement("u", pod="default/b", util=pytest.approx(75.0), mem=2500.0,
                               weight=3)  # 3 / (1 + 3) of an all-slack GPU
    light = choose(evaluate(t, ["n1"], resolved(best_effort(gpu_util="20"), t),
                            DecisionContext(CostPolicy(), 0.0, CTX)), 0, "u", "default/c")
    assert light == placement("u", pod="default/c", util=pytest.approx(20.0), mem=2500.0,
                              workload=Workload.INFERENCE)


def test_gpu_with_best_effort_is_a_serving_gpu():
    t = GpuTable.build([node("n1", 2)])
    ev = evaluate(t, ["n1"], resolved(best_effort(), t), DecisionContext(CostPolicy(), 0.0, CTX))
    t.place(choose(ev, 0, "u1", "default/b"))
    ev = evaluate(t, ["n1"], resolved(training(), t), DecisionContext(CostPolicy(), 0.0))
    trained = choose(ev, 0, "u2", "default/t")
    assert trained == placement("u2", pod="default/t", gpus=(1,), util=40,  # avoids GPU 0
                                mem=10000)
    t.place(trained)
    ev = evaluate(t, ["n1"], resolved(training(mem=35000), t), DecisionContext(CostPolicy(), 0.0))
    assert ev.rejections == {"n1": Rejection(
        node="n1", reason=Reason.WORKLOAD_CONFLICT, unresolvable=False,
        gpu_counts={Reason.WORKLOAD_CONFLICT: 1, Reason.INSUFFICIENT_GPU_MEMORY: 1},
        gpus_total=2, requested_mib=35000.0, best_free_mib=40960.0 - 2500)}
    slo = resolve_demand(parse_demand(pod("s", 1, workload="inference", model="resnet50",
                                          slo_ms="100", rate_rps="100")),
                         t.type_names, None, ProfileIndex(PROFILES), session_name="default/s")
    ev = evaluate(t, ["n1"], slo, DecisionContext(CostPolicy(), 0.0, CTX))
    assert choose(ev, 0, "u3", "default/s") == placement(  # SLO sessions may join it
        "u3", pod="default/s", gpus=(0,), util=pytest.approx(900 / 91), mem=2500.0,
        session=SessionSpec("default/s", "resnet50", 100.0, 100.0))  # batch 10: 9 of 91 ms


def test_table_place_remove_tracks_best_effort_weight():
    t = GpuTable.build([node("n1", 1)])
    p = be_placement("a", 0, 5)
    t.place(p)
    copy = t.copy()
    assert (t.best_effort_weight[0], t.serving_count[0], t.sessions) == (5.0, 1, {})
    t.remove(p)
    assert (t.best_effort_weight[0], t.serving_count[0]) == (0.0, 0)
    assert copy.best_effort_weight[0] == 5.0


# ---- wire: filter, prioritize, bind, restart ------------------------------------------------

def _bind(client: Any, p: dict[str, Any], names: list[str]) -> str:
    passed = client.post("/filter", json=args(p, names)).get_json()["NodeNames"]
    scores = {h["Host"]: h["Score"] for h in
              client.post("/prioritize", json=args(p, passed)).get_json()}
    best = max(passed, key=lambda n: (scores[n], -passed.index(n)))
    assert client.post("/bind", json=binding(p, best)).get_json() == {"Error": ""}
    return best


def _gpu_of(source: Any, p: dict[str, Any]) -> str:
    m = p["metadata"]
    return source.read_pod(m["namespace"], m["name"])["metadata"]["annotations"][
        "tandem.io/gpu-index"]


@pytest.mark.parametrize("restart", [False, True], ids=["live", "after-restart"])
def test_weighted_best_effort_spreads_over_http(restart):
    app, _, source, _ = make_app([node("n1", 2)])
    heavy, light, third = (best_effort("heavy", weight="3"), best_effort("light"),
                           best_effort("third"))
    for p in (heavy, light):
        source.create_pod(p)
        _bind(app.test_client(), p, ["n1"])
    assert (_gpu_of(source, heavy), _gpu_of(source, light)) == ("0", "1")
    if restart:  # weights come back from the annotations
        app, *_ = make_app(source=source)
    source.create_pod(third)
    _bind(app.test_client(), third, ["n1"])
    assert _gpu_of(source, third) == "1"  # 1 of weight there, not 3


def test_filter_reports_no_slack_over_http():
    app, _, source, _ = make_app([node("n1", 1)],
                                 raw_config={"limits": {"min_best_effort_slack_percent": 99}})
    client = app.test_client()
    slo = pod("s", 1, workload="inference", model="resnet50", slo_ms="100", rate_rps="200")
    source.create_pod(slo)
    _bind(client, slo, ["n1"])
    body = client.post("/filter", json=args(best_effort(), ["n1"])).get_json()
    assert body["NodeNames"] == []
    assert "no slack left for best-effort sessions" in body["FailedAndUnresolvableNodes"]["n1"]
    assert "best effort needs more than 99%" in body["FailedAndUnresolvableNodes"]["n1"]


def test_training_is_kept_off_a_best_effort_gpu_over_http():
    app, _, source, _ = make_app([node("n1", 1)])
    client = app.test_client()
    b = best_effort()
    source.create_pod(b)
    _bind(client, b, ["n1"])
    body = client.post("/filter", json=args(training(), ["n1"])).get_json()
    assert "GPU serves the other workload kind" in body["FailedAndUnresolvableNodes"]["n1"]


# ---- observations --------------------------------------------------------------------------

def _knowing(samples: int, workload: str = "inference"):
    """Learning knowledge with one estimate of resnet50/unprofiled at 42% on A100."""
    from extender.core import UtilKnowledge

    def observed(model, batch, gpu_type, wl):
        return (42.0, samples) if wl == workload and gpu_type == A100 else None
    return UtilKnowledge(observed, min_observations=5)


@pytest.mark.parametrize(("model", "predict", "samples", "workload", "expected"), [
    ("resnet50", None, 7, "inference", (42.0, 2500.0, "observed:7+mem:profile")),
    ("unprofiled", _predict(35.0, 1800.0), 7, "inference",
     (42.0, 1800.0, "observed:7+mem:fake-predictor")),
    ("resnet50", None, 4, "inference", (100.0, 2500.0, "profile")),
    ("resnet50", None, 7, "training", (100.0, 2500.0, "profile")),
], ids=["trusted-profile-memory", "trusted-predicted-memory", "too-few-samples",
        "training-estimate-is-not-the-sessions"])
def test_best_effort_uses_a_trustworthy_observed_utilisation(model, predict, samples,
                                                              workload, expected):
    t = GpuTable.build([node("n1", 1)])
    d = resolve_demand(parse_demand(best_effort(model=model)), t.type_names, predict,
                       ProfileIndex(PROFILES), knowledge=_knowing(samples, workload))
    assert d.for_type(A100) == TypeDemand(*expected)


def test_bound_best_effort_session_records_its_observed_source_over_http():
    app, ext, source, _ = make_app([node("n1", 1)])
    for _ in range(6):  # six minutes of samples (learning.min_observed_seconds: 120)
        ext.learner.store.add(("resnet50", 1, "inference", A100), 30.0, alone=True,
                              seconds=60.0)
    p = best_effort("batch-job")
    source.create_pod(p)
    c = app.test_client()
    assert c.post("/filter", json=args(p, ["n1"])).get_json()["NodeNames"] == ["n1"]
    assert c.post("/bind", json=binding(p, "n1")).get_json() == {"Error": ""}
    ann = source.read_pod("default", "batch-job")["metadata"]["annotations"]
    assert ann["tandem.io/prediction-source"] == "observed:6+mem:profile"


def test_a_best_effort_session_is_learned_from_its_servers_gpu_time():
    app, ext, source, _ = make_app([node("n1", 1)], {"learning": {
        "warmup_seconds": 0, "min_observed_seconds": 0, "spread_margin": 0}})
    now = [1000.0]
    ext.learner.use_wall_clock(lambda: now[0])
    c = app.test_client()
    p = best_effort("batch-job", model="resnet50")
    source.create_pod(p)
    assert c.post("/filter", json=args(p, ["n1"])).get_json()["NodeNames"] == ["n1"]
    assert c.post("/bind", json=binding(p, "n1")).get_json() == {"Error": ""}
    uid = p["metadata"]["uid"]
    headers = {"Authorization": f"Bearer {TOKEN}"}
    taken = []
    for i in range(7):  # the server counts 300 ms of GPU time per second for the session
        now[0] += 1.0
        doc = {"node": "n1", "timestamp": now[0], "interval_seconds": 1.0, "gpus": [
            {"index": 0, "uuid": "GPU-n1-0", "product": A100, "memory_total_mib": 40960,
             "memory_used_mib": 3000, "utilization_percent": 90.0, "processes": [],
             "sessions": [{"pod_uid": uid, "gpu_time_ms": 300.0 * i}]}]}
        r = c.post("/v1/agents/report", json=doc, headers=headers)
        assert r.status_code == 200, r.get_data(as_text=True)
        taken.append(r.get_json()["samples"])
    assert taken == [0, 1, 1, 1, 1, 1, 1]  # the first report is the counter's baseline
    q = best_effort("batch-job-2", model="resnet50")
    source.create_pod(q)
    assert c.post("/filter", json=args(q, ["n1"])).get_json()["NodeNames"] == ["n1"]
    assert c.post("/bind", json=binding(q, "n1")).get_json() == {"Error": ""}
    ann = source.read_pod("default", "batch-job-2")["metadata"]["annotations"]
    assert ann["tandem.io/prediction-source"] == "observed:6+mem:profile"
    assert float(ann["tandem.io/predicted-gpu-util"]) == pytest.approx(30.0)
