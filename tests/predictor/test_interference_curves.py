"""One interference curve from fit to score: fit-curves' file loads into the extender as is.

The round trip goes through the real pieces: ``tandem predictor fit-curves`` on a
small synthetic dataset, the extender's config loader (``cost.curves_file`` and
the pasted ``cost.curves`` form), and the extender's cost function. Before the
curve had one form, the documented copy step made interference 100x (slopes) to
10,000x (quadratic term) too small, which these checks would catch.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from predictor_fixtures import GPU, write_dataset
from typer.testing import CliRunner

from extender.config.loader import ConfigHolder, load_config
from extender.config.schema import ConfigError, build_config
from extender.core import CostPolicy, gpu_type_of
from extender.core.cost import curve_coefficients, horus_cost
from lab.simulator.interference import PAPER_COEFFICIENTS, SlowdownModel
from predictor.commands import app as predictor_app
from predictor.curves import InterferenceCurve, curve_costs, fit_curves, save_curves

runner = CliRunner()
UTILS = [10.0, 40.0, 80.0, 100.0, 130.0, 180.0, 250.0]


def true_slowdown(u: float) -> float:
    """The synthetic rows' slowdown (``test_predictor_training.synthetic_colocated``)."""
    return 1 + 0.004 * u if u <= 100 else 1.4 + 0.01 * (u - 100) + 5e-5 * (u - 100) ** 2


def extender_interference(policy: CostPolicy, gpu_type: str, util: list[float]) -> np.ndarray:
    """The extender's Horus cost with only the interference term, for an empty GPU."""
    coeffs = curve_coefficients(policy, [gpu_type])
    zeros = np.zeros(len(util))
    only_util = CostPolicy(w_mem=0.0, w_util=1.0)
    return horus_cost(only_util, zeros, zeros, np.ones(len(util)), zeros,
                      np.array(util), np.repeat(coeffs, len(util), axis=0))


def _fit_with_cli(tmp_path: Path) -> Path:
    data = write_dataset(tmp_path / "data")
    out = tmp_path / "art" / "curves.yaml"
    result = runner.invoke(predictor_app, ["fit-curves", "--data", str(data), "--out", str(out),
                                           "--json"])
    assert result.exit_code == 0, result.output
    return out


def test_fitted_curves_file_gives_the_extender_the_measured_interference(
        tmp_path: Path) -> None:
    curves = _fit_with_cli(tmp_path)
    config = tmp_path / "tandem.yaml"
    config.write_text("cost:\n  curves_file: art/curves.yaml\n")  # relative to the config
    policy = load_config(config, environ={}).policy
    got = extender_interference(policy, gpu_type_of(GPU), UTILS)
    want = [true_slowdown(u) - 1 for u in UTILS]
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)
    # the same entries pasted into cost.curves load to the same curve, bit for bit
    pasted = yaml.safe_load(curves.read_text())["curves"]
    inline = build_config({"cost": {"curves": pasted}}).policy
    assert inline.curves.items() <= policy.curves.items()  # beside the packaged curves


def test_fit_with_an_offset_round_trips_exactly_through_the_config(tmp_path: Path) -> None:
    us = [20, 40, 60, 80, 100, 120, 150, 200, 260]
    slow = [1.03 + 0.0035 * u if u <= 100 else 1.38 + 0.006 * (u - 100) + 4e-5 * (u - 100) ** 2
            for u in us]
    [fit] = fit_curves([{"status": "ok", "gpu_product": "NVIDIA H100 80GB HBM3", "slowdown": s,
                         "cumulative_isolated_util_percent": u}
                        for u, s in zip(us, slow, strict=True)]).values()
    assert fit.curve.intercept == pytest.approx(0.03)
    save_curves(tmp_path / "c.yaml", {fit.gpu_type: fit}, "digest")
    policy = build_config({"cost": {"curves_file": "c.yaml"}},
                          str(tmp_path / "tandem.yaml")).policy
    loaded = policy.curve_for("NVIDIA-H100-80GB-HBM3")
    assert loaded == fit.curve  # the file's floats read back bit for bit
    got = extender_interference(policy, "NVIDIA-H100-80GB-HBM3", UTILS)
    assert got == pytest.approx([fit.slowdown(u) - 1 for u in UTILS], rel=1e-12)
    assert [loaded.slowdown(u) for u in (50.0, 200.0)] == pytest.approx(
        [1.03 + 0.0035 * 50, 1.38 + 0.006 * 100 + 4e-5 * 100**2])


def test_config_entries_win_over_the_curves_file(tmp_path: Path) -> None:
    _fit_with_cli(tmp_path)
    override = {"slope": 0.1, "over_slope": 0.2, "over_quadratic": 0.3}
    policy = build_config({"cost": {"curves_file": "art/curves.yaml",
                                    "curves": {GPU: override}}}, str(tmp_path / "t.yaml")).policy
    assert policy.curve_for(gpu_type_of(GPU)) == InterferenceCurve(**override)


def test_shipped_curves_load_into_the_one_type_with_unchanged_costs() -> None:
    policy = load_config(None, environ={}).policy
    assert all(type(c) is InterferenceCurve for c in [*policy.curves.values(),
                                                       policy.default_curve])
    utils = np.linspace(0.0, 400.0, 161)
    for curve in [*policy.curves.values(), policy.default_curve]:
        # the form the extender scored with before the curve types were merged
        s, o, q = curve.slope, curve.over_slope, curve.over_quadratic
        old = [s * x if x <= 1 else s + o * (x - 1) + q * (x - 1) * (x - 1)
               for x in utils / 100.0]
        assert [curve(u) for u in utils] == old
        three = curve_costs(utils, np.array([[s, o, q]]))
        assert np.array_equal(curve_costs(utils, curve_coefficients(
            CostPolicy(default_curve=curve), [])), three)


@pytest.mark.parametrize("gpu", sorted(PAPER_COEFFICIENTS))
def test_shipped_paper_curves_match_the_simulated_truth(gpu: str) -> None:
    curve = load_config(None, environ={}).policy.curve_for(gpu)
    model = SlowdownModel.for_types("curve", [gpu])
    cap = PAPER_COEFFICIENTS[gpu][3]
    utils = np.array([20.0, 60.0, 100.0, 110.0, 130.0])
    truth = model.slowdown(utils, np.full(utils.size, 2), np.zeros(utils.size, dtype=int))
    assert np.all(truth < cap)
    assert truth == pytest.approx([curve.slowdown(u) for u in utils], rel=1e-4)


@pytest.mark.parametrize(
    ("cost", "problem"),
    [
        ({"curves": {"A100": {"slope": -0.1}}}, "cost.curves.A100.slope: must be >= 0"),
        ({"curves": {"A100": {"over_quadratic": "0.9"}}},
         "cost.curves.A100.over_quadratic: must be a number"),
        ({"curves": {"A100": {"over_slope": float("inf")}}},
         "cost.curves.A100.over_slope: must be finite"),
        ({"curves": {"A100": {"intercept": -1.0}}}, "cost.curves.A100.intercept: must be > -1"),
        ({"curves": {"A100": {"linear": 0.01}}}, "cost.curves.A100.linear: unknown key"),
        ({"curves": {"A100": [0.4, 0.5]}}, "cost.curves.A100: must be a mapping"),
        ({"curves": [1, 2]}, "cost.curves: must be a mapping of GPU type to curve"),
        ({"default_curve": {"slope": True}}, "cost.default_curve.slope: must be a number"),
        ({"curves_file": 3}, "cost.curves_file: must be a path string"),
        ({"curves_file": "missing.yaml"}, "cost.curves_file: "),
    ],
)
def test_bad_curves_are_reported_with_their_path(cost: dict, problem: str,
                                                 tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        build_config({"cost": cost}, str(tmp_path / "t.yaml"))
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


def test_every_problem_in_a_curves_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "old.json").write_text('{"curves": {}}')
    bad = {"format": "tandem.interference-curves/v2", "simulated": "no",
           "curves": {"G": {"slope": -1, "over_slope": -2}}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad, sort_keys=False))
    with pytest.raises(ConfigError) as info:
        build_config({"cost": {"curves_file": "old.json"}}, str(tmp_path / "t.yaml"))
    [problem] = info.value.problems
    assert "old.json: not a tandem.interference-curves/v2 file" in problem
    with pytest.raises(ConfigError) as info:
        build_config({"cost": {"curves_file": "bad.yaml", "curves": {"H": {"slope": -3}}}},
                     str(tmp_path / "t.yaml"))
    where = str(tmp_path / "bad.yaml")
    assert info.value.problems == [
        f"cost.curves_file: {where}: simulated: must be true or false",
        f"cost.curves_file: {where}: curves.G.slope: must be >= 0 (got -1)",
        f"cost.curves_file: {where}: curves.G.over_slope: must be >= 0 (got -2)",
        "cost.curves.H.slope: must be >= 0 (got -3)",
    ]


def test_curves_fitted_on_simulated_data_need_the_dry_run_switch(tmp_path: Path) -> None:
    [fit] = fit_curves([{"status": "ok", "gpu_product": "SIM", "slowdown": 1 + u / 200,
                         "cumulative_isolated_util_percent": u} for u in (20, 60, 150)]).values()
    save_curves(tmp_path / "c.yaml", {"SIM": fit}, "digest", simulated=True)
    with pytest.raises(ConfigError, match="simulated data"):
        build_config({"cost": {"curves_file": "c.yaml"}}, str(tmp_path / "t.yaml"))
    ok = build_config({"cost": {"curves_file": "c.yaml"}, "predictor": {"allow_simulated": True}},
                      str(tmp_path / "t.yaml"))
    assert ok.policy.curve_for("SIM") == fit.curve


def test_a_changed_curves_file_reloads_the_config(tmp_path: Path) -> None:
    curves = _fit_with_cli(tmp_path)
    config = tmp_path / "tandem.yaml"
    config.write_text("cost:\n  curves_file: art/curves.yaml\n")
    holder = ConfigHolder(load_config(config, environ={}),
                          lambda: load_config(config, environ={}))
    assert holder.reload_if_changed() is None
    raw = yaml.safe_load(curves.read_text())
    raw["curves"][GPU]["slope"] = 0.9
    curves.write_text(yaml.safe_dump(raw))
    os.utime(curves, ns=(1, 1))  # an mtime surely different from the first write's
    assert holder.reload_if_changed() == []
    assert holder.policy().curve_for(gpu_type_of(GPU)).slope == 0.9


def test_fit_curves_refuses_a_json_output_name(tmp_path: Path) -> None:
    result = runner.invoke(predictor_app, ["fit-curves", "--data", str(tmp_path), "--out",
                                           str(tmp_path / "curves.json"), "--json"])
    assert result.exit_code == 2 and "YAML" in result.stderr
