"""Interference curves refitted online: guards, the way into the cost, persistence."""

from __future__ import annotations

from typing import Any

import pytest
from extender_builders import AGENT_AUTH, TOKEN, args, binding, make_app, node, pod

from extender.config.sections import LearningConfig
from extender.core.cost import CostPolicy
from extender.learning.curves import CurveGuards, CurveLearner, colocation_point
from extender.learning.learner import ConfigMapPersistence, Learner
from predictor.curves import InterferenceCurve, bounded_step, fit_partial

A100 = "NVIDIA-A100-SXM4-40GB"
PRIOR = InterferenceCurve()  # slope 0.5, over_slope 0.5, over_quadratic 1.0, intercept 0


def line_points(slope: float, xs: range = range(20, 100, 5)) -> list[tuple[float, float]]:
    return [(float(x), 1.0 + slope * x / 100.0) for x in xs]


def learner_with(points: list[tuple[float, float]], clock: list[float],
                 **guards: Any) -> CurveLearner:
    learner = CurveLearner(CurveGuards(**guards), lambda: clock[0])
    for u, s in points:
        learner.add_point(A100, u, s)
    return learner


def test_too_few_points_no_refit_and_the_prior_stays() -> None:
    clock = [0.0]
    spread = line_points(1.0, range(20, 100, 8))  # 10 points over the linear regime
    learner = learner_with(spread[:9], clock, min_points=10, refit_interval_seconds=0)
    assert not learner.maybe_refit(A100, PRIOR)
    assert learner.curves() == {}
    assert learner.view()[0]["curve"] is None and learner.view()[0]["points_held"] == 9
    learner.add_point(A100, *spread[9])
    assert learner.maybe_refit(A100, PRIOR)
    assert A100 in learner.curves()


def test_an_outlier_is_ignored() -> None:
    clock = [0.0]
    points = line_points(0.8) + [(50.0, 9.0)]  # one sample from a stalled job
    learner = learner_with(points, clock, min_points=10, max_step=10.0,
                           refit_interval_seconds=0)
    assert learner.maybe_refit(A100, PRIOR)
    row = learner.view()[0]
    held = -(-len(points) // 5)  # every fifth point judges the refit instead
    assert row["outliers"] == 1 and row["points"] == len(points) - held - 1
    assert learner.curves()[A100].slope == pytest.approx(0.8, abs=1e-6)
    assert row["r2"] == pytest.approx(1.0)
    # Without the guard the outlier would have dragged the fit well away from the truth.
    naive = fit_partial([u for u, _ in points], [s for _, s in points], PRIOR)
    assert abs(naive.intercept) > 0.1


def test_each_refit_moves_a_coefficient_by_a_bounded_step_at_most_every_interval() -> None:
    clock = [1000.0]
    learner = learner_with(line_points(1.0), clock, min_points=10, max_step=0.2,
                           refit_interval_seconds=300)
    assert learner.maybe_refit(A100, PRIOR)
    assert learner.curves()[A100].slope == pytest.approx(0.6)  # 0.5 * 1.2, not 1.0
    assert learner.curves()[A100].over_slope == PRIOR.over_slope  # no point above 100%
    clock[0] += 100
    assert not learner.maybe_refit(A100, PRIOR)  # within the refit interval
    clock[0] += 201
    assert learner.maybe_refit(A100, PRIOR)
    assert learner.curves()[A100].slope == pytest.approx(0.72)
    row = learner.view()[0]
    assert row["refits"] == 2 and row["refitted_at"] == 1301.0
    for _ in range(10):
        clock[0] += 301
        learner.maybe_refit(A100, PRIOR)
    assert learner.curves()[A100].slope == pytest.approx(1.0, abs=1e-6)  # it gets there


def test_bounded_step_lets_a_zero_coefficient_move_and_keeps_ranges() -> None:
    target = InterferenceCurve(slope=0.0, over_slope=3.0, over_quadratic=1.0, intercept=-5.0)
    moved = bounded_step(PRIOR, target, max_step=0.5)
    assert moved.slope == 0.25 and moved.over_slope == 0.75
    assert moved.intercept == pytest.approx(-0.025)  # 0.5 of the 0.05 floor


def test_a_colocation_point_is_a_ratio_of_sums_at_cumulative_isolated_util() -> None:
    assert colocation_point([(40.0, 20.0), (30.0, 30.0)]) == (70.0, 1.4)  # 70 / 50
    assert colocation_point([(40.0, 20.0)]) is None  # alone: no interference to learn
    assert colocation_point([(40.0, 20.0), (30.0, 0.2)]) is None  # a pod not computing
    # a mean of ratios would be (45 + 1) / 2 = 23, clipped to 10: the small pod's noise rules
    assert colocation_point([(90.0, 2.0), (10.0, 10.0)]) == (100.0, pytest.approx(100 / 12))


# ---- through the extender -----------------------------------------------------------

def gpu_report(node_name: str, product: str, processes: list[dict[str, Any]]) -> dict[str, Any]:
    util = min(100.0, sum(p.get("utilization_percent", 0) for p in processes))
    return {"node": node_name, "timestamp": 1.0, "interval_seconds": 1.0,
            "gpus": [{"index": 0, "uuid": f"GPU-{node_name}", "product": product,
                      "memory_total_mib": 40960, "memory_used_mib": 1000,
                      "utilization_percent": util, "processes": processes}]}


def post(c: Any, doc: dict[str, Any]) -> None:
    r = c.post("/v1/agents/report", json=doc, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.get_data(as_text=True)


def place(c: Any, source: Any, p: dict[str, Any], node_name: str) -> None:
    source.create_pod(p)
    assert c.post("/filter", json=args(p, [node_name])).get_json()["NodeNames"] == [node_name]
    assert c.post("/bind", json=binding(p, node_name)).get_json() == {"Error": ""}


def teach(curves: bool) -> tuple[Any, Any, list[int], list[int]]:
    """Two same-model pods that halve each other on n1's A100; n2 (H100) holds one busy pod.

    Returns (client, extender, scores of a new pod on [n1, n2] before, after the reports).
    """
    h100 = "NVIDIA H100 80GB HBM3"
    app, ext, source, _ = make_app(
        [node("n1", 1), node("n2", 1, product=h100, memory_mib=81559.0)],
        raw_config={"limits": {"min_colocation_gain_percent": None},
                    "learning": {"curves": curves, "curve_min_points": 5,
                                 "curve_max_step": 10, "curve_refit_interval_seconds": 0,
                                 "min_observed_seconds": 0, "warmup_seconds": 0,
                                 "spread_margin": 0}})
    ticks = iter(range(0, 10**6, 61))  # reports a minute apart: one curve point each
    ext.learner.use_wall_clock(lambda: float(next(ticks)))
    c = app.test_client()
    asserted = {"model": "m.onnx", "gpu_util": "40", "gpu_mem_mib": "1000"}
    place(c, source, pod("a", uid="uid-a", **asserted), "n1")
    place(c, source, pod("c", uid="uid-c", model="c.onnx", gpu_util="95",
                         gpu_mem_mib="1000"), "n2")
    for _ in range(6):  # a alone (after its first report): its estimate becomes trustworthy
        post(c, gpu_report("n1", "NVIDIA A100-SXM4-40GB",
                           [{"pid": 1, "pod_uid": "uid-a", "utilization_percent": 40}]))
    place(c, source, pod("b", uid="uid-b", **asserted), "n1")
    newcomer = pod("d", uid="uid-d", model="z.onnx", gpu_util="10", gpu_mem_mib="1000")
    source.create_pod(newcomer)
    before = c.post("/prioritize", json=args(newcomer, ["n1", "n2"])).get_json()
    shared = [{"pid": 1, "pod_uid": "uid-a", "utilization_percent": 20},
              {"pid": 2, "pod_uid": "uid-b", "utilization_percent": 20}]
    for _ in range(8):  # co-located, each runs at half its alone utilisation: slowdown 2
        post(c, gpu_report("n1", "NVIDIA A100-SXM4-40GB", shared))
    after = c.post("/prioritize", json=args(newcomer, ["n1", "n2"])).get_json()
    return c, ext, [h["Score"] for h in before], [h["Score"] for h in after]


def test_a_learned_curve_reaches_the_extenders_cost() -> None:
    c, ext, before, after = teach(curves=True)
    # The prior (1.5x at 100%) makes n1's A100 at 90% the better place; the learned
    # curve (2x at 80%) makes it the worse one.
    assert before == [10, 0] and after == [0, 10]
    rows = c.get("/v1/state", headers=AGENT_AUTH).get_json()["learning"]["curves"]
    assert [r["gpu_type"] for r in rows] == [A100] and rows[0]["refits"] >= 1
    # cost 1.0 at 80% observed (the prior says 0.4); the prior still holds at low
    # utilisation, where nothing was observed, so the line moves toward the points only
    learned = InterferenceCurve(**rows[0]["curve"])
    assert abs(learned(80.0) - 1.0) < abs(PRIOR(80.0) - 1.0)
    assert learned.slope > PRIOR.slope
    text = c.get("/metrics").get_data(as_text=True)
    assert f'tandem_learning_curve_r2{{gpu_type="{A100}"}}' in text
    assert f'tandem_learning_curve_points{{gpu_type="{A100}"}} {rows[0]["points"]}.0' in text
    assert "tandem_learning_curve_last_refit_timestamp_seconds" in text


def test_learning_curves_off_keeps_the_configured_curve() -> None:
    c, ext, before, after = teach(curves=False)
    assert before == after == [10, 0]
    assert c.get("/v1/state", headers=AGENT_AUTH).get_json()["learning"]["curves"] == []


def test_policy_overlay_is_cached_and_replaces_only_learned_types() -> None:
    learner = Learner(LearningConfig(curve_min_points=5, curve_refit_interval_seconds=0))
    base = CostPolicy(curves={"OTHER": InterferenceCurve(slope=0.1)})
    cfg = learner.cfg
    assert learner.knowledge(cfg).policy(base) is base  # nothing learned yet
    for u, s in line_points(1.0, range(20, 100, 16)):  # five points over the linear regime
        learner.curves.add_point(A100, u, s)
    assert learner.curves.maybe_refit(A100, base.curve_for(A100))
    policy = learner.knowledge(cfg).policy(base)
    assert learner.knowledge(cfg) is learner.knowledge(cfg)  # the hot path does not rebuild it
    assert policy.curve_for("OTHER") == InterferenceCurve(slope=0.1)
    assert policy.curve_for(A100).slope == pytest.approx(0.6)


# ---- persistence ----------------------------------------------------------------------

def test_learned_curves_survive_a_restart_through_the_api_server(kube_api) -> None:
    server, api = kube_api
    cfg = LearningConfig(curve_min_points=5, curve_refit_interval_seconds=0)
    first = Learner(cfg, ConfigMapPersistence(api, "tandem", "tandem-learning"),
                    wall_clock=lambda: 1234.5)
    first.start()
    for u, s in line_points(1.0, range(20, 100, 10)):
        first.curves.add_point(A100, u, s)
    first.curves.add_point("NVIDIA-H100-80GB-HBM3", 60.0, 1.3)  # too few to refit
    assert first.curves.maybe_refit(A100, PRIOR)
    assert first.maybe_persist()

    restarted = Learner(cfg, ConfigMapPersistence(api, "tandem", "tandem-learning"))
    restarted.start()
    assert restarted.curves.view() == first.curves.view()
    assert restarted.curves.to_document() == first.curves.to_document()  # points too
    learned = restarted.knowledge(cfg).policy(CostPolicy())
    assert learned.curve_for(A100) == first.curves.curves()[A100]
    assert restarted.view()["curves"][0]["refitted_at"] == 1234.5
    # An older document without curves still loads its estimates.
    doc = dict(first.document())
    del doc["curves"]
    older = Learner(cfg)
    assert older.store.load_document(doc) == 0 and older.curves.view() == []
