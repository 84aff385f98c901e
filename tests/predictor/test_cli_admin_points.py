"""Small things an admin meets on the first day: ``tandem -h``, a URL without a scheme,
one exit code for one mistake, fit-curves' plain output, the fitted-curve plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tandem.cli import app

runner = CliRunner()


@pytest.mark.parametrize("args", [["-h"], ["predictor", "-h"], ["status", "-h"]])
def test_dash_h_is_help(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 0 and "Usage:" in result.output


def test_an_extender_address_without_a_scheme_gets_one_suggested() -> None:
    result = runner.invoke(app, ["status", "--extender", "localhost:8443"])
    assert result.exit_code == 2
    assert "https://localhost:8443" in result.output and "unknown url type" not in result.output


@pytest.mark.parametrize("args", [
    ["predictor", "predict", "/nonexistent/model.onnx"],
    ["predictor", "features", "/nonexistent/model.onnx"],
    ["plan", "/nonexistent/plan.yaml"],
    ["status", "--cluster", "sim:/nonexistent/cluster.yaml"],
    ["extender", "webhook", "--config", "/nonexistent/webhook.yaml"],
], ids=["predict", "features", "plan", "status", "webhook"])
def test_a_missing_input_file_exits_2_everywhere(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "nonexistent" in result.output


def _colocated(tmp_path: Path) -> Path:
    from test_interference_curves import write_dataset
    return write_dataset(tmp_path / "data")


def test_fit_curves_prints_json_only_with_json(tmp_path: Path) -> None:
    data = _colocated(tmp_path)
    out = tmp_path / "curves.yaml"
    plain = runner.invoke(app, ["predictor", "fit-curves", "--data", str(data), "--out", str(out)])
    assert plain.exit_code == 0, plain.output
    assert plain.output.startswith(f"wrote {out}") and "R^2" in plain.output
    with pytest.raises(json.JSONDecodeError):
        json.loads(plain.stdout)
    as_json = runner.invoke(app, ["predictor", "fit-curves", "--data", str(data), "--out",
                                  str(out), "--json"])
    assert json.loads(as_json.stdout)["curves"] == str(out)


def test_the_curve_plot_has_a_title_and_stops_where_the_data_stop(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from predictor.curves import fit_curves
    from predictor.plots import plot_curves

    rows = [{"status": "ok", "gpu_product": "G", "cumulative_isolated_util_percent": u,
             "slowdown": 1 + u / 200 + max(0.0, u - 100) / 80} for u in range(20, 170, 5)]
    fits = fit_curves(rows)
    captured = {}
    original = plt.Figure.savefig

    def keep(fig, *args, **kwargs):
        captured["fig"] = fig
        return original(fig, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt.Figure, "savefig", keep)
        assert plot_curves(tmp_path / "c.png", fits, rows) is not None
    (ax,) = captured["fig"].axes
    assert ax.get_title()
    (line,) = ax.get_lines()[:1]
    assert max(line.get_xdata()) <= max(r["cumulative_isolated_util_percent"] for r in rows)
