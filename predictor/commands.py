"""``tandem predictor``: features, predict, train, evaluate, fit-curves, export-zoo, profiles.

Heavy libraries (onnx, xgboost, torch, matplotlib) load inside the commands so
that ``tandem --help`` stays fast. Errors print one line on stderr (and, with
``--json``, an ``{"error", "reason"}`` object on stdout) and exit non-zero.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from predictor.dataset import GpuDataset

app = typer.Typer(no_args_is_help=True)

DEFAULT_DATA = Path("training_data")
DEFAULT_ARTIFACTS = DEFAULT_DATA / "artifacts"
_WORKLOADS = ("training", "inference")


def _fail(message: str, as_json: bool, reason: str = "error", code: int = 2) -> None:
    """Exit with ``message``: 2 for a bad command line or input (the default), 1 when the
    command ran and failed, 3 when no trained model exists (docs/troubleshooting.md)."""
    if as_json:
        typer.echo(json.dumps({"error": message, "reason": reason}))
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _guarded(as_json: bool, body: Callable[[], Any], looked_in: Path | None = None) -> Any:
    """Run ``body`` turning the predictor's typed errors into clean exits."""
    from predictor.dataset import DatasetError, MissingProvenance, SimulatedData
    from predictor.errors import ModelNotFound, ModelRejected, ModelUnavailable, NoTrainedModel

    try:
        return body()
    except ModelRejected as exc:
        _fail(str(exc), as_json, exc.reason.value, 2)
    except ModelNotFound as exc:  # a path that names no file: the input (2, as elsewhere)
        _fail(str(exc), as_json, "no_such_model", 2)
    except MissingProvenance as exc:
        _fail(f"training data without provenance: {exc}", as_json, "missing_provenance", 2)
    except SimulatedData as exc:
        _fail(f"simulated training data refused: {exc}", as_json, "simulated_data", 2)
    except DatasetError as exc:
        _fail(f"invalid training data: {exc}", as_json, "invalid_data", 2)
    except NoTrainedModel as exc:
        where = f" (looked in {looked_in}; pass --artifacts DIR)" if looked_in else ""
        _fail(f"{exc}{where}", as_json, "no_trained_model", 3)
    except ModelUnavailable as exc:  # ran, and the model could not be had
        _fail(str(exc), as_json, "error", 1)
    except (ValueError, KeyError) as exc:  # the input is wrong
        _fail(str(exc), as_json, "error", 2)


# Options several commands share, declared once so their flags and help stay the same.
_JSON = typer.Option(False, "--json", help="Print one JSON object.")
_DATA = typer.Option(DEFAULT_DATA, "--data", help="training_data/ root.")
_BASELINES = typer.Option(
    True, "--baselines/--no-baselines", help="Also cross-validate ridge, random forest, hist GB."
)
_ALLOW_SIMULATED = typer.Option(
    False,
    "--allow-simulated",
    help="Accept directories whose provenance says simulated (sim: backend dry runs); "
    "everything produced is then marked simulated.",
)


def _note_missing_plots(what: str) -> None:
    """Before the work: say on stderr that no PNG will be written, and how to get one
    (the result's ``plot`` is then null; the fit itself does not need matplotlib)."""
    from contracts.extras import missing_extra

    problem = missing_extra("plots", what)
    if problem:
        typer.echo(f"note: no plot: {problem}", err=True)


def _echo_guarded(as_json: bool, body: Callable[[], dict[str, Any]]) -> None:
    """Run ``body`` under ``_guarded`` and print its result: one line with --json, else indented."""
    result = _guarded(as_json, body)
    typer.echo(json.dumps(result) if as_json else json.dumps(result, indent=2))


def _kinds(baselines: bool) -> tuple[str, ...]:
    """Model kinds to cross-validate: XGBoost, plus the baselines unless --no-baselines."""
    from predictor.model import KINDS

    return KINDS if baselines else ("xgboost",)


def _load(data: Path, allow_simulated: bool) -> list[GpuDataset]:
    """Load training data, warning on stderr when synthetic rows were let in."""
    from predictor.dataset import any_simulated, load_training_data

    datasets = load_training_data(data, allow_simulated=allow_simulated)
    if any_simulated(datasets):
        typer.echo("warning: training on SIMULATED data; outputs are marked simulated", err=True)
    return datasets


def _progress(desc: str) -> Callable[[Any], Any]:
    from tqdm import tqdm

    return lambda it: tqdm(
        list(it), desc=desc, file=sys.stderr, leave=False, disable=not sys.stderr.isatty()
    )


@app.command("features")
def features_command(
    model: str = typer.Argument(..., help="ONNX file (path, file:// or https://)."),
    batch_size: int = typer.Option(1, "--batch-size", min=1, help="Batch size to bind."),
    as_json: bool = _JSON,
) -> None:
    """Graph features of an ONNX model: FLOPs, parameter/activation bytes, op counts."""
    from predictor.api import Predictor

    feats = _guarded(as_json, lambda: Predictor().features(model, batch_size))
    if as_json:
        typer.echo(json.dumps(feats.as_dict()))
        return
    d = feats.as_dict()
    typer.echo(
        f"flops {d['flops']:,}\nparams_bytes {d['params_bytes']:,}\n"
        f"activations_bytes {d['activations_bytes']:,} (peak {d['peak_activation_bytes']:,})"
        f"\nbatch_size {d['batch_size']}\nnodes {d['n_nodes']} opset {d['opset']}"
    )
    for op, n in sorted(d["op_counts"].items(), key=lambda kv: -kv[1]):
        typer.echo(f"  {op:24s} {n}")
    if d["unknown_ops"]:
        typer.echo(f"unknown ops (no FLOP formula): {d['unknown_ops']}")


@app.command("predict")
def predict_command(
    model: str = typer.Argument(..., help="ONNX file (path, file:// or https://)."),
    batch_size: int = typer.Option(
        None, "--batch-size", min=1, help="Default: 1 for inference, 32 for training."
    ),
    gpu_type: str = typer.Option(None, "--gpu-type", help="GPU product the model was trained on."),
    workload: str = typer.Option("training", "--workload", help="training or inference."),
    artifacts: Path = typer.Option(DEFAULT_ARTIFACTS, "--artifacts", help="Trained artifacts."),
    as_json: bool = _JSON,
) -> None:
    """Predicted GPU utilisation (percent) and memory (MiB) of a job."""
    from contracts.annotations import DEFAULT_BATCH_SIZE
    from predictor.api import Predictor

    if workload not in _WORKLOADS:
        _fail(f"--workload must be one of {_WORKLOADS}", as_json)
    batch = batch_size or DEFAULT_BATCH_SIZE[workload]
    predictor = Predictor.from_dirs(artifacts)
    pred = _guarded(as_json, lambda: predictor.predict(model, batch, gpu_type, workload),
                    artifacts)
    out = {
        "gpu_util_percent": pred.gpu_util_percent,
        "gpu_mem_mib": pred.gpu_mem_mib,
        "source": pred.source,
        "batch_size": batch,
        "workload": workload,
    }
    if pred.gpu_util_percent is None and not as_json:
        typer.echo(f"note: no trained utilisation model in {artifacts} (run `tandem predictor "
                   "train`); the memory estimate needs none", err=True)
    trained = predictor.artifacts.gpu_types if predictor.artifacts is not None else ()
    if gpu_type is not None and trained and gpu_type not in trained:
        typer.echo(f"note: --gpu-type {gpu_type} is not one the model was trained for "
                   f"({', '.join(trained)}); the utilisation is the largest prediction over "
                   "those (source ...,gpu=max)", err=True)
    typer.echo(
        json.dumps(out)
        if as_json
        else f"gpu_util_percent {_or_unknown(out['gpu_util_percent'])}\n"
        f"gpu_mem_mib {out['gpu_mem_mib']}\n"
        f"source {out['source']}"
    )


@app.command("train")
def train_command(
    data: Path = _DATA,
    out: Path = typer.Option(DEFAULT_ARTIFACTS, "--out", help="Artifacts directory."),
    baselines: bool = _BASELINES,
    allow_simulated: bool = _ALLOW_SIMULATED,
    no_observed: bool = typer.Option(
        False, "--no-observed",
        help="Leave out the fleet's observed.csv rows (export-observations); train on "
        "profiled rows only."),
    as_json: bool = _JSON,
) -> None:
    """Train the utilisation model (leave-one-family-out CV) and fit memory overhead.

    observed.csv rows under --data (what a cluster observed, written by
    export-observations) are training rows too unless --no-observed."""
    from predictor.observed import local_featurise
    from predictor.training import fit_all, save_artifacts

    def body() -> dict[str, Any]:
        datasets = _load(data, allow_simulated)
        est, card, overheads, _ = fit_all(
            datasets, _kinds(baselines), progress=_progress("cv folds"),
            observed=not no_observed, featurise=None if no_observed else local_featurise(),
        )
        save_artifacts(out, est, card, overheads, [d.provenance for d in datasets])
        return {
            "artifacts": str(out),
            "n_rows": card["n_rows"],
            "n_rows_by_source": card["n_rows_by_source"],
            "observed_rows_skipped": card["observed_rows_skipped"],
            "data_digest": card["data_digest"],
            "simulated": card["simulated"],
            "rmsle": {k: v["rmsle"] for k, v in card["metrics"].items()},
        }

    _echo_guarded(as_json, body)


@app.command("evaluate")
def evaluate_command(
    data: Path = _DATA,
    out_dir: Path = typer.Option(
        Path("benchmarks/results"), "--out-dir", help="Where predictor_evaluation.json/.png go."
    ),
    baselines: bool = _BASELINES,
    allow_simulated: bool = _ALLOW_SIMULATED,
    as_json: bool = _JSON,
) -> None:
    """RMSLE per held-out family for XGBoost and baselines; JSON + predicted-vs-measured PNG."""
    from predictor.training import build_table, cross_validate

    _note_missing_plots("the predicted-vs-measured PNG")

    def body() -> dict[str, Any]:
        datasets = _load(data, allow_simulated)
        table = build_table(datasets)
        cv = cross_validate(table, _kinds(baselines), progress=_progress("cv folds"))
        preds = cv.pop("_predictions")
        out_dir.mkdir(parents=True, exist_ok=True)
        result = {
            "data_digest": table.data_digest,
            "simulated": table.simulated,
            "n_rows": len(table.y),
            "metrics": cv,
        }
        (out_dir / "predictor_evaluation.json").write_text(json.dumps(result, indent=2) + "\n")
        from predictor.plots import plot_predicted_vs_measured

        png = plot_predicted_vs_measured(
            out_dir / "predictor_evaluation.png", table.y, preds["xgboost"], table.families
        )
        return dict(result, plot=str(png) if png else None)

    _echo_guarded(as_json, body)


@app.command("fit-curves")
def fit_curves_command(
    data: Path = _DATA,
    out: Path = typer.Option(
        DEFAULT_ARTIFACTS / "curves.yaml", "--out",
        help="Curves file (YAML) for the extender's cost.curves_file.",
    ),
    allow_simulated: bool = _ALLOW_SIMULATED,
    as_json: bool = _JSON,
) -> None:
    """Fit interference curves per GPU type from colocated.csv, in the extender's config form."""
    from predictor.curves import fit_curves, save_curves
    from predictor.dataset import any_simulated
    from predictor.training import data_digest

    if out.suffix not in (".yaml", ".yml"):
        _fail(f"--out {out}: the curves file is YAML; name it *.yaml", as_json)
    _note_missing_plots(f"{out.with_suffix('.png')}")

    def body() -> dict[str, Any]:
        datasets = _load(data, allow_simulated)
        fits = fit_curves([r for d in datasets for r in d.colocated])
        out.parent.mkdir(parents=True, exist_ok=True)
        simulated = any_simulated(datasets)
        save_curves(out, fits, data_digest(datasets), simulated)
        from predictor.plots import plot_curves

        png = plot_curves(
            out.with_suffix(".png"), fits, [r for d in datasets for r in d.colocated]
        )
        return {
            "curves": str(out),
            "plot": str(png) if png else None,
            "simulated": simulated,
            "r2": {g: {"below": f.r2_below, "above": f.r2_above} for g, f in fits.items()},
            "cost_curves": {g: f.curve.to_config() for g, f in fits.items()},
        }

    result = _guarded(as_json, body)
    if as_json:
        typer.echo(json.dumps(result))
        return
    typer.echo(f"wrote {result['curves']}" + (" (fitted on SIMULATED data)"
                                             if result["simulated"] else ""))
    for gpu, r2 in sorted(result["r2"].items()):
        typer.echo(f"  {gpu}: R^2 {_r2(r2['below'])} up to 100% utilisation, "
                   f"{_r2(r2['above'])} above")
    if result["plot"]:
        typer.echo(f"plot: {result['plot']}")
    typer.echo("use it: cost.curves_file in the extender's config (docs/training.md)")


def _r2(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


@app.command("export-zoo")
def export_zoo_command(
    out: Path = typer.Option(Path("zoo-onnx"), "--out", help="Output directory."),
    models: str = typer.Option("", "--models", help="Comma list (default: the whole zoo)."),
    batch_sizes: str = typer.Option("1", "--batch-sizes", help="Comma list of batch sizes."),
    training: bool = typer.Option(False, "--training", help="Export training-mode graphs."),
    as_json: bool = _JSON,
) -> None:
    """Export zoo models to ONNX (CPU; needs the 'zoo' extra: torch)."""
    from predictor.zoo import ZOO, export_onnx

    names = [m for m in models.split(",") if m] or sorted(ZOO)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        _fail(f"unknown zoo models {unknown}; known: {', '.join(sorted(ZOO))}", as_json)
    try:
        batches = [int(b) for b in batch_sizes.split(",") if b]
    except ValueError:
        _fail("--batch-sizes must be a comma list of integers", as_json)
    mode = "train" if training else "infer"
    jobs = [(n, b) for n in names for b in batches]
    written = [
        str(export_onnx(n, b, out / f"{n}_b{b}_{mode}.onnx", training=training))
        for n, b in _progress("export")(jobs)
    ]
    typer.echo(json.dumps({"files": written}) if as_json else "\n".join(written))


def _or_unknown(util: float | None) -> str:
    # No trained model: the memory estimate stands alone; the extender observes the rest.
    return "unknown (no trained utilisation model)" if util is None else str(util)


@app.command("export-observations")
def export_observations_command(
    source: str = typer.Argument(
        ..., help="Learning document: the tandem-learning ConfigMap's observations.json, "
        "a saved GET /v1/state answer (read with the agent token), or - for stdin."),
    out: Path = typer.Option(DEFAULT_DATA, "--out", help="training_data/ root to write into."),
    min_samples: int = typer.Option(1, "--min-samples", min=1,
                                    help="Leave out estimates with fewer samples."),
    as_json: bool = _JSON,
) -> None:
    """Write the utilisation the cluster observed as <out>/<gpu>/observed.csv rows."""
    from predictor.observed import (
        ObservationDocumentError,
        ensure_provenance,
        observed_rows,
        write_observed,
    )

    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
        rows = observed_rows(json.loads(text), min_samples)
    except (OSError, ValueError) as exc:  # ObservationDocumentError and JSON errors included
        kind = "invalid_document" if isinstance(exc, ObservationDocumentError) else "error"
        _fail(f"{source}: {exc}", as_json, kind, 2)
    files = write_observed(rows, out)
    from contracts.version import version

    for f in files:
        ensure_provenance(f.parent, version())
    if as_json:
        typer.echo(json.dumps({"rows": len(rows), "files": [str(f) for f in files]}))
    else:
        typer.echo(f"{len(rows)} observed row(s) in {len(files)} file(s) under {out}")


profiles_app = typer.Typer(no_args_is_help=True, help="Batching profiles l(b) for serving.")
app.add_typer(profiles_app, name="profiles")


@profiles_app.command("convert")
def profiles_convert_command(
    batching_csv: Path = typer.Argument(..., help="batching.csv written by `tandem profile`."),
    gpu_type: str | None = typer.Option(
        None, "--gpu-type", help="GPU type to name (default: the CSV's gpu_product, "
        "spaces as dashes, as the extender names GPU types)."),
    model: str | None = typer.Option(
        None, "--model", help="Model name to give (default: the CSV's model column); "
        "match tandem.io/model or its file name without .onnx."),
    margin: bool = typer.Option(
        True, "--margin/--no-margin", help="Plan with (mean + std) * 1.15 (Nexus's margin), "
        "or with the measured mean alone."),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="YAML file to write (default: stdout)."),
) -> None:
    """Turn a profiler batching.csv into a profiles YAML for the extender's profiles.files."""
    import yaml

    from predictor.profile_convert import ConvertError, convert_file
    from predictor.profiles import NEXUS_MARGIN, NO_MARGIN

    def body() -> dict[str, Any]:
        try:
            return convert_file(batching_csv, gpu_type=gpu_type, model=model,
                                margin=NEXUS_MARGIN if margin else NO_MARGIN)
        except OSError as exc:
            raise ValueError(f"{batching_csv}: cannot read ({exc.strerror or exc})") from None
        except ConvertError as exc:
            raise ValueError(f"{batching_csv}: {exc}") from None

    doc = _guarded(False, body)
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)
    if output is None:
        typer.echo(text, nl=False)
        return
    output.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {len(doc['profiles'])} profile(s) to {output}", err=True)
