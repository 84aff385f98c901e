"""Campaign specs, planning, combination choice and the CLI (sim backend)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from predictor.profiling.backend import JobSpec, gpu_slug
from predictor.profiling.commands import profile_command
from predictor.profiling.errors import SpecError
from predictor.profiling.plan import IsolatedBaseline, choose_combos
from predictor.profiling.spec import CampaignSpec, CatalogueEntry, plan_isolated, spec_from_mapping

CATALOGUE = {
    n: CatalogueEntry(n, f)
    for n, f in [("resnet18", "resnet"), ("resnet50", "resnet"), ("vgg11", "vgg"), ("lstm", "lstm")]
}


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"pairs": -1}, "pairs: must be >= 0"),
        ({"batch_sizes": {"training": [0]}}, "batch_sizes.training[0]: must be >= 1"),
        ({"workloads": ["serving"]}, "workloads: 'serving'"),
        ({"measure": {"sample_interval_ms": 50}}, "measure.sample_interval_ms"),
        ({"measure": {"warmup": 1}}, "measure.warmup: unknown key"),
        ({"budget": 10}, "budget: unknown key"),
        ({"colocated_util_range_percent": [250, 30]}, "colocated_util_range_percent"),
        (
            {"onnx_models": [{"name": "m", "family": "f", "path": "missing.onnx"}]},
            "onnx_models[0].path",
        ),
    ],
    ids=[
        "negative-pairs",
        "zero-batch",
        "bad-workload",
        "fast-sampling",
        "unknown-measure-key",
        "unknown-key",
        "reversed-range",
        "missing-onnx",
    ],
)
def test_bad_specs_name_the_field(data, problem, tmp_path):
    with pytest.raises(SpecError) as info:
        spec_from_mapping(data, tmp_path)
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


def test_plan_filters_by_family_and_orders_deterministically():
    spec = spec_from_mapping(
        {"families": ["resnet"], "workloads": ["inference"], "batch_sizes": [4, 1]}
    )
    assert [j.key for j in plan_isolated(spec, CATALOGUE)] == [
        "resnet18|inference|1",
        "resnet18|inference|4",
        "resnet50|inference|1",
        "resnet50|inference|4",
    ]
    with pytest.raises(SpecError, match="'gan' is unknown"):
        plan_isolated(CampaignSpec(families=("gan",)), CATALOGUE)


def _baselines(utils: list[float]) -> list[IsolatedBaseline]:
    return [
        IsolatedBaseline(JobSpec(f"m{i}", "f", "training", 8), u, 10.0, 1000.0)
        for i, u in enumerate(utils)
    ]


def test_combos_span_the_utilisation_range_and_are_reproducible():
    base = _baselines([5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 95])
    pairs = choose_combos(
        base, 2, 20, seed=1, util_range_percent=(30, 250), memory_limit_mib=10_000
    )
    utils = [c.cumulative_util_percent for c in pairs]
    assert len(pairs) == 20 and all(30 <= u <= 250 for u in utils)
    assert min(utils) < 60 and max(utils) > 150  # both tails, not only the middle
    assert [c.combo_id for c in pairs] == [
        c.combo_id
        for c in choose_combos(
            base, 2, 20, seed=1, util_range_percent=(30, 250), memory_limit_mib=10_000
        )
    ]
    rest = choose_combos(
        base,
        2,
        5,
        seed=1,
        util_range_percent=(30, 250),
        memory_limit_mib=10_000,
        exclude=[c.combo_id for c in pairs],
    )
    assert not {c.combo_id for c in rest} & {c.combo_id for c in pairs}
    assert (
        choose_combos(base, 3, 5, seed=1, util_range_percent=(30, 250), memory_limit_mib=2500) == []
    )  # three jobs of 1000 MiB do not fit


@pytest.mark.parametrize(
    ("product", "slug"),
    [
        ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"),
        ("NVIDIA H200", "nvidia-h200"),
        ("Tesla V100-SXM2-16GB", "tesla-v100-sxm2-16gb"),
    ],
)
def test_gpu_slug(product, slug):
    assert gpu_slug(product) == slug


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(profile_command)
    return app


def test_cli_plan_then_run_then_plan_shows_progress(tmp_path: Path):
    sim = tmp_path / "sim.yaml"
    curve = {
        "util_percent_b1": 30,
        "util_exponent": 0.2,
        "step_time_ms_b1": 2,
        "time_exponent": 0.8,
        "memory_mib_base": 100,
        "memory_mib_per_sample": 1,
    }
    sim.write_text(
        yaml.safe_dump(
            {
                "gpu": {"product": "SIM X", "memory_mib": 8000},
                "models": {
                    m: {
                        "family": m,
                        "training": curve,
                        "inference": curve,
                        "features": {"flops_per_sample": 1, "op_counts": {}},
                    }
                    for m in ("a", "b", "c")
                },
            }
        )
    )
    common = [
        "--backend",
        f"sim:{sim}",
        "--out",
        str(tmp_path / "out"),
        "--batch-sizes",
        "1,8",
        "--pairs",
        "3",
        "--triples",
        "1",
        "--json",
    ]
    runner = CliRunner()
    before = json.loads(runner.invoke(_app(), ["plan", *common]).stdout)
    assert (before["isolated"]["remaining"], before["colocated"]["combos"]) == (12, [])
    ran = runner.invoke(_app(), ["run", *common, "--no-progress"])
    assert ran.exit_code == 0, ran.output
    assert json.loads(ran.stdout)["colocated_run"] == 4
    after = json.loads(runner.invoke(_app(), ["plan", *common]).stdout)
    assert (after["isolated"]["done"], after["colocated"]["done"]) == (12, 4)
    refused = runner.invoke(_app(), ["run", *common])
    assert refused.exit_code == 2 and "--resume" in refused.stderr
    bad = runner.invoke(_app(), ["plan", "--backend", "gpu"])
    assert bad.exit_code == 2 and "cuda or sim:FILE" in bad.stderr
