"""Predictor speed (and accuracy, when real profiles exist).

- Feature extraction for a ResNet-50 graph at 224x224 exported from the zoo
  (batch 32): cold (a fresh extractor: read, sha256, parse, shape inference,
  FLOPs; imports already done) and cached (digest memo + feature cache hit).
  Goals: cold <= 1 s, cached <= 1 ms.
- Predictions per second through ``Predictor.predict``: cache hits, and misses
  (new batch size each call: features + XGBoost + memory). The XGBoost model used
  for timing is trained on SYNTHETIC rows in a temp dir: its speed is real, its
  answers are meaningless and are not reported.
- RMSLE per held-out family: only from real ``training_data/`` (with provenance);
  reported as absent otherwise, never synthesised.

Prints one JSON object and writes ``benchmarks/results/predictor.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import _common

from predictor.api import Predictor
from predictor.dataset import DatasetError, load_training_data
from predictor.features import FeatureExtractor
from predictor.store import ModelStore


def _timing_artifacts(tmp: Path):
    """A model trained on synthetic rows, for timing only (see module docstring)."""
    import random

    from predictor.dataset import write_csv
    from predictor.dataset_schema import ISOLATED_COLUMNS
    from predictor.training import fit_all, load_artifacts, save_artifacts

    rnd = random.Random(0)
    rows = []
    for i in range(60):
        row = dict.fromkeys(ISOLATED_COLUMNS, "synthetic")
        row.update(
            timestamp="t",
            gpu_product="SYNTHETIC",
            framework="pytorch",
            family=f"f{i % 3}",
            model=f"m{i}",
            workload="training",
            batch_size=8,
            status="ok",
            error="",
            flops=rnd.uniform(1e8, 1e11),
            params_bytes=1e7,
            activations_bytes=1e7,
            peak_activation_bytes=1e6,
            op_counts={"Conv": i},
            util_mean_percent=rnd.uniform(5, 95),
            util_p50_percent=50,
            util_p90_percent=60,
            process_util_mean_percent=None,
            mem_used_nvml_mib=1000,
            mem_peak_framework_mib=900,
            step_time_ms=1,
            throughput_per_s=1,
            n_samples=1,
        )
        rows.append(row)
    gpu = tmp / "data" / "SYNTHETIC"
    gpu.mkdir(parents=True)
    write_csv(gpu / "isolated.csv", "isolated", rows)
    (gpu / "provenance.json").write_text(
        json.dumps(
            {
                "command": "benchmarks/predictor.py (synthetic, timing only)",
                "tandem_version": "bench",
                "started_at": "t",
                "finished_at": "t",
                "hardware": {
                    "gpu_product": "none",
                    "driver_version": "none",
                    "cuda_version": "none",
                    "cpu": "none",
                },
                "software": {},
                "notes": "SYNTHETIC rows for timing the prediction path only",
            }
        )
    )
    est, card, overheads, _ = fit_all(load_training_data(tmp / "data"), ("xgboost",))
    return load_artifacts(save_artifacts(tmp / "artifacts", est, card, overheads))


def _real_rmsle(data: Path) -> dict:
    try:
        datasets = load_training_data(data)
    except DatasetError as exc:
        return {"status": "absent", "why": str(exc)[:300]}
    from predictor.training import build_table, cross_validate

    table = build_table(datasets)
    cv = cross_validate(table)
    cv.pop("_predictions")
    return {
        "status": "measured",
        "n_rows": len(table.y),
        "data_digest": table.data_digest,
        "metrics": cv,
    }


def main() -> None:
    """Run the benchmark and write its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data", type=Path, default=_common.ROOT / "training_data")
    _common.add_out_option(parser, "predictor")
    args = parser.parse_args()
    from predictor.zoo import export_onnx

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        t0 = time.perf_counter()
        model = export_onnx("resnet50", args.batch_size, tmp / "resnet50.onnx")
        export_s = time.perf_counter() - t0
        FeatureExtractor().extract(model, args.batch_size)  # imports and page cache warm
        cold = []
        for _ in range(args.repeats):
            fx = FeatureExtractor()
            t0 = time.perf_counter()
            feats = fx.extract(model, args.batch_size)
            cold.append(time.perf_counter() - t0)
        n_cached = 2000
        t0 = time.perf_counter()
        for _ in range(n_cached):
            fx.extract(model, args.batch_size)
        cached_ms = (time.perf_counter() - t0) / n_cached * 1e3

        predictor = Predictor(_timing_artifacts(tmp), ModelStore(), FeatureExtractor())
        ref = str(model)
        predictor.predict(ref, args.batch_size, "SYNTHETIC", "training")
        t0 = time.perf_counter()
        for _ in range(n_cached):
            predictor.predict(ref, args.batch_size, "SYNTHETIC", "training")
        hits_per_s = n_cached / (time.perf_counter() - t0)
        n_miss = 20  # each miss binds a new batch size: features of a 25M-parameter graph
        t0 = time.perf_counter()
        for b in range(1, n_miss + 1):
            predictor.predict(ref, b + 100, "SYNTHETIC", "training")
        misses_per_s = n_miss / (time.perf_counter() - t0)

    result = {
        "benchmark": "predictor",
        **_common.context(("onnx", "xgboost-cpu", "numpy", "torch", "scikit-learn")),
        "model": {
            "name": "resnet50 (zoo, 224x224)",
            "batch_size": args.batch_size,
            "params_mib": round(feats.params_bytes / 2**20, 1),
            "gflops": round(feats.flops / 1e9, 2),
            "export_seconds": round(export_s, 2),
        },
        "feature_extraction": {
            "cold_seconds_median": round(statistics.median(cold), 4),
            "cold_seconds_all": [round(c, 4) for c in cold],
            "cached_ms": round(cached_ms, 5),
            "goal": {"cold_seconds": 1.0, "cached_ms": 1.0},
            "meets_goal": statistics.median(cold) <= 1.0 and cached_ms <= 1.0,
        },
        "predictions_per_second": {
            "cache_hits": round(hits_per_s),
            "cache_misses_new_batch": round(misses_per_s, 2),
            "note": "timing-only model trained on synthetic rows",
        },
        "rmsle_per_held_out_family": _real_rmsle(args.data),
    }
    _common.write_result(result, args.out)


if __name__ == "__main__":
    main()
