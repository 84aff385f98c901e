"""One rule for every config key: what a file leaves out takes its packaged default.
``cost.curves`` is merged per GPU type, so a config file without it keeps the packaged
per-GPU curves instead of scoring every type by ``default_curve``."""

from __future__ import annotations

from pathlib import Path

import yaml

from extender.config.loader import DEFAULT_CONFIG, load_config, packaged_curves
from predictor.curves import CURVES_FORMAT

A100 = "NVIDIA-A100-SXM4-40GB"
H100 = "NVIDIA-H100-80GB-HBM3"


def _write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "tandem.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_file_without_curves_keeps_the_packaged_ones(tmp_path: Path) -> None:
    packaged = packaged_curves()
    assert len(packaged) == 4 and A100 in packaged
    config = load_config(_write(tmp_path, {"limits": {"max_pods_per_gpu": 4}}), environ={})
    assert dict(config.policy.curves) == packaged
    assert config.policy.curve_for(A100) != config.policy.default_curve


def test_the_files_own_curve_wins_for_its_type_only(tmp_path: Path) -> None:
    own = {"slope": 0.9, "over_slope": 0.9, "over_quadratic": 0.9}
    config = load_config(_write(tmp_path, {"cost": {"curves": {A100: own}}}), environ={})
    assert config.policy.curves[A100].slope == 0.9
    assert config.policy.curves[H100] == packaged_curves()[H100]


def test_a_curves_file_wins_over_the_packaged_curve(tmp_path: Path) -> None:
    fitted = tmp_path / "curves.yaml"
    fitted.write_text(yaml.safe_dump({
        "format": CURVES_FORMAT, "data_digest": "0" * 64, "simulated": False,
        "curves": {H100: {"intercept": 0.0, "slope": 0.11, "over_slope": 0.2,
                          "over_quadratic": 0.3}}}))
    config = load_config(_write(tmp_path, {"cost": {"curves_file": "curves.yaml"}}), environ={})
    assert config.policy.curves[H100].slope == 0.11
    assert config.policy.curves[A100] == packaged_curves()[A100]


def test_the_packaged_file_loads_as_it_is() -> None:
    assert dict(load_config(None, environ={}).policy.curves) == packaged_curves()
    assert load_config(DEFAULT_CONFIG, environ={}).policy == load_config(None, environ={}).policy
