"""``tandem predictor profiles convert``: batching.csv -> profiles.files the extender loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from extender.config.loader import load_config
from extender.core import ProfileIndex
from extender.inference_profiles import load_profiles
from predictor.dataset import write_csv
from predictor.profile_convert import ConvertError, profile_entries
from predictor.profiles import NO_MARGIN
from tandem.cli import app

H100 = "NVIDIA H100 80GB HBM3"


def rows(model: str = "resnet50", product: str = H100) -> list[dict[str, object]]:
    """Rows as ``tandem profile`` writes them: l(b) = 2 + 0.5 b ms, std 0.1 ms."""
    return [{"model": model, "family": "resnet", "gpu_product": product, "batch_size": b,
             "latency_mean_ms": 2.0 + 0.5 * b, "latency_std_ms": 0.1, "mem_mib": 900 + b,
             "n_samples": 20} for b in (1, 2, 4, 8)]


def test_converted_file_passes_the_config_validator_and_the_extender_loads_it(
        tmp_path: Path) -> None:
    csv = write_csv(tmp_path / "batching.csv", "batching", rows() + rows("bert", H100))
    out = tmp_path / "profiles.yaml"
    result = CliRunner().invoke(app, ["predictor", "profiles", "convert", str(csv), "-o", str(out)])
    assert result.exit_code == 0, result.output
    config = tmp_path / "tandem.yaml"
    config.write_text(yaml.safe_dump({"profiles": {"files": [str(out)]}}))
    cfg = load_config(config, environ={})
    profiles = ProfileIndex(load_profiles(cfg.profile_files, cfg.nexus_profiles))
    gpu_type = "NVIDIA-H100-80GB-HBM3"
    resnet = profiles[("models/resnet50.onnx", gpu_type)]  # found by file name, as pods name it
    # Nexus's margin on every measured batch, interpolated between them.
    assert resnet.latency_ms(4) == pytest.approx((4.0 + 0.1) * 1.15)
    assert resnet.latency_ms(3) == pytest.approx(((3.0 + 0.1) + (4.0 + 0.1)) / 2 * 1.15)
    assert resnet.max_batch == 8 and resnet.memory_mib == 908
    assert profiles[("bert", gpu_type)].latency_ms(1) == pytest.approx(2.6 * 1.15)


def test_renames_and_raw_means() -> None:
    [entry] = profile_entries(rows(), gpu_type="H100", model="rn50", margin=NO_MARGIN)
    assert (entry["model"], entry["gpu_type"]) == ("rn50", "H100")
    assert entry["table"][0] == [1, 2.5]


def test_one_name_for_several_profiles_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConvertError, match="--model names one model"):
        profile_entries(rows() + rows("bert"), model="x")
    with pytest.raises(ConvertError, match="--gpu-type names one GPU type"):
        profile_entries(rows() + rows(product="NVIDIA A100-SXM4-40GB"), gpu_type="x")
    csv = write_csv(tmp_path / "batching.csv", "batching", rows() + rows("bert"))
    result = CliRunner().invoke(app, ["predictor", "profiles", "convert", str(csv),
                                      "--model", "x"])
    assert result.exit_code == 2 and "--model names one model" in result.output


def test_invalid_rows_are_named(tmp_path: Path) -> None:
    bad = rows()
    bad[1]["latency_mean_ms"] = "fast"
    csv = write_csv(tmp_path / "batching.csv", "batching", bad)
    result = CliRunner().invoke(app, ["predictor", "profiles", "convert", str(csv)])
    assert result.exit_code == 2 and "latency_mean_ms" in result.output
