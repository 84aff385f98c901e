"""User models in a campaign: torch factories and ONNX files, from the spec to the worker.

A user names a torch model by factory (``module:callable`` or ``file.py:callable``)
and describes one input sample; the profiler must resolve it before any run, run
it in its workers for training and inference, read its graph features, and bring
its details back when a later phase co-locates it (rows keep only the name).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from predictor.profiling.backend import (
    Environment,
    JobResult,
    JobSpec,
    Measurement,
    MeasureSettings,
    TorchModelSpec,
)
from predictor.profiling.campaign import Campaign
from predictor.profiling.commands import profile_command
from predictor.profiling.errors import SpecError
from predictor.profiling.graph import GraphFeatureSource
from predictor.profiling.spec import CampaignSpec, CatalogueEntry, plan_isolated, spec_from_mapping
from predictor.profiling.store import DataDir
from predictor.profiling.usermodels import (
    UserModelError,
    build_module,
    example_input,
    factory_problems,
    load_factory,
)
from predictor.profiling.worker import JobRunner

NETS = '''
import torch
from torch import nn


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))


def embedder():
    return nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(5 * 8, 2))


def not_a_module():
    return 42
'''


@pytest.fixture
def nets(tmp_path: Path) -> Path:
    path = tmp_path / "nets.py"
    path.write_text(NETS)
    return path


def _spec(nets: Path, **over: Any) -> TorchModelSpec:
    return TorchModelSpec(**{"factory": f"{nets}:mlp", "input_shape": (3, 4), **over})


# --- spec ---------------------------------------------------------------------------


def test_torch_models_parse_with_files_relative_to_the_spec(nets: Path) -> None:
    spec = spec_from_mapping({"torch_models": [
        {"name": "mine", "family": "custom", "factory": "nets.py:mlp", "input_shape": [3, 4]},
        {"name": "tok", "family": "custom", "factory": "mypkg.models:build",
         "input_shape": [5], "input_dtype": "int64", "input_high": 50,
         "workloads": ["inference"]},
    ]}, base_dir=nets.parent)  # fmt: skip
    mine, tok = spec.torch_models
    assert mine.torch_model == TorchModelSpec(f"{nets}:mlp", (3, 4))
    assert mine.workloads == ("training", "inference")
    assert tok.torch_model == TorchModelSpec("mypkg.models:build", (5,), "int64", 50)
    assert tok.workloads == ("inference",)


@pytest.mark.parametrize(("entry", "message"), [
    ({"name": "m", "family": "f", "factory": "nets.py:mlp"}, "expected {name, family"),
    ({"name": "m", "family": "f", "factory": "no_colon", "input_shape": [3]},
     "is not 'module:callable'"),
    ({"name": "m", "family": "f", "factory": "a:b", "input_shape": [0, 3]}, "sizes >= 1"),
    ({"name": "m", "family": "f", "factory": "a:b", "input_shape": "3x4"},
     "expected a list of integers"),
    ({"name": "m", "family": "f", "factory": "a:b", "input_shape": [3], "input_dtype": "uint8"},
     "input_dtype: 'uint8' is not one of"),
    ({"name": "m", "family": "f", "factory": "a:b", "input_shape": [3], "workloads": ["serve"]},
     "workloads: 'serve' is not one of"),
    ({"name": "m", "family": "f", "factory": "a:b", "input_shape": [3], "batch": 4},
     "torch_models[0].batch: unknown key"),
], ids=["missing-input-shape", "bad-factory", "zero-size", "shape-not-list", "bad-dtype",
        "bad-workload", "unknown-key"])  # fmt: skip
def test_bad_torch_model_entries_are_named(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        spec_from_mapping({"torch_models": [entry]})
    assert message in str(err.value)


def test_user_model_names_must_be_unique_and_not_hide_catalogue_models(nets: Path) -> None:
    twice = [{"name": "m", "family": "f", "factory": f"{nets}:mlp", "input_shape": [3, 4]}] * 2
    with pytest.raises(SpecError, match="the name 'm' is used twice"):
        spec_from_mapping({"torch_models": twice})
    spec = spec_from_mapping({"torch_models": [
        {"name": "mlp", "family": "f", "factory": f"{nets}:mlp", "input_shape": [3, 4]}]})
    with pytest.raises(SpecError, match="'mlp' is also a catalogue model"):
        plan_isolated(spec, {"mlp": CatalogueEntry("mlp", "mlp")})


def test_user_torch_models_are_planned_even_when_models_are_listed(nets: Path) -> None:
    spec = spec_from_mapping({
        "models": ["resnet18"], "batch_sizes": {"training": [2], "inference": [1, 8]},
        "torch_models": [{"name": "mine", "family": "custom", "factory": f"{nets}:mlp",
                          "input_shape": [3, 4], "workloads": ["inference"]}],
    })  # fmt: skip
    jobs = plan_isolated(spec, {"resnet18": CatalogueEntry("resnet18", "resnet"),
                                "vgg11": CatalogueEntry("vgg11", "vgg")})  # fmt: skip
    assert [j.key for j in jobs] == ["mine|inference|1", "mine|inference|8",
                                     "resnet18|training|2", "resnet18|inference|1",
                                     "resnet18|inference|8"]  # fmt: skip
    assert jobs[0].torch_model == TorchModelSpec(f"{nets}:mlp", (3, 4))
    assert jobs[2].torch_model is None


def test_jobspec_survives_the_worker_protocol(nets: Path) -> None:
    job = JobSpec("mine", "custom", "training", 4, torch_model=_spec(nets))
    wire = json.loads(json.dumps(dataclasses.asdict(job)))
    assert JobSpec.from_json(wire) == job
    plain = JobSpec("mlp", "mlp", "inference", 2)
    assert JobSpec.from_json(json.loads(json.dumps(dataclasses.asdict(plain)))) == plain


# --- resolving factories --------------------------------------------------------------


def test_factory_from_a_file_and_from_an_importable_module(nets: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_factory(f"{nets}:mlp")().__class__.__name__ == "Sequential"
    (nets.parent / "tandem_test_pkg_nets.py").write_text(NETS)
    monkeypatch.syspath_prepend(str(nets.parent))
    monkeypatch.delitem(sys.modules, "tandem_test_pkg_nets", raising=False)
    assert callable(load_factory("tandem_test_pkg_nets:embedder"))


@pytest.mark.parametrize(("ref", "message"), [
    ("{dir}/missing.py:mlp", "no such file"),
    ("tandem_no_such_module_xyz:build", "cannot import 'tandem_no_such_module_xyz'"),
    ("{dir}/broken.py:build", "cannot import"),
    ("{dir}/nets.py:missing", "has no callable 'missing'"),
], ids=["missing-file", "missing-module", "module-raises", "missing-callable"])
def test_factory_failures_say_what_is_wrong(nets: Path, ref: str, message: str) -> None:
    (nets.parent / "broken.py").write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(UserModelError, match=message):
        load_factory(ref.format(dir=nets.parent))


def test_factory_must_return_a_torch_module(nets: Path) -> None:
    with pytest.raises(UserModelError, match="returned int, not a torch.nn.Module"):
        build_module(_spec(nets, factory=f"{nets}:not_a_module"))


def test_factory_problems_are_collected_per_model(nets: Path) -> None:
    problems = factory_problems([("ok", _spec(nets)), ("bad", _spec(nets, factory="nope:x"))])
    assert len(problems) == 1 and problems[0].startswith("torch_models.bad: factory 'nope:x'")


def test_example_inputs_follow_the_description(nets: Path) -> None:
    import torch

    x = example_input(_spec(nets), 5)
    assert x.shape == (5, 3, 4) and x.dtype == torch.float32
    assert torch.equal(x, example_input(_spec(nets), 5))  # deterministic
    ids = example_input(_spec(nets, input_shape=(5,), input_dtype="int64", input_high=50), 7)
    assert ids.dtype == torch.int64 and int(ids.min()) >= 0 and int(ids.max()) < 50
    assert example_input(_spec(nets, input_dtype="bfloat16"), 1).dtype == torch.bfloat16


def test_cli_refuses_a_spec_whose_factory_does_not_resolve(nets: Path, tmp_path: Path) -> None:
    import typer

    app = typer.Typer()
    app.command()(profile_command)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump({"torch_models": [
        {"name": "mine", "family": "custom", "factory": "nets.py:typo", "input_shape": [3, 4]}]}))
    result = CliRunner().invoke(app, ["plan", "--spec", str(spec_file), "--backend", "cuda",
                                      "--out", str(tmp_path / "out")])  # fmt: skip
    assert result.exit_code == 2
    assert "torch_models.mine: factory" in result.output and "no callable 'typo'" in result.output


# --- running and reading them -----------------------------------------------------------


@pytest.mark.parametrize("workload", ["training", "inference"])
def test_worker_runs_a_user_torch_model(nets: Path, workload: str) -> None:
    runner = JobRunner("cpu")
    settings = MeasureSettings(warmup_seconds=0.0, measure_seconds=0.02, min_steps=2)
    job = JobSpec("mine", "custom", workload, 4, torch_model=_spec(nets))  # type: ignore[arg-type]
    assert runner.prepare(job, settings) == {"event": "ready"}
    result = runner.measure()
    assert result["status"] == "ok", result
    assert result["n_steps"] >= 2 and result["step_time_ms"] > 0


def test_worker_reports_a_broken_factory_as_the_jobs_error(nets: Path) -> None:
    job = JobSpec("mine", "custom", "inference", 1,
                  torch_model=_spec(nets, factory=f"{nets}:not_a_module"))  # fmt: skip
    result = JobRunner("cpu").prepare(job, MeasureSettings())
    assert result["status"] == "error" and "not a torch.nn.Module" in result["error"]


def test_graph_features_of_a_user_torch_model_scale_with_the_batch(nets: Path) -> None:
    source = GraphFeatureSource()
    try:
        one = source.features(JobSpec("mine", "c", "inference", 1, torch_model=_spec(nets)))
        eight = source.features(JobSpec("mine", "c", "inference", 8, torch_model=_spec(nets)))
    finally:
        source.close()
    # Linear(12, 16) and Linear(16, 3): 2 * (12 * 16 + 16 * 3) multiply-adds per sample.
    assert one["flops"] == pytest.approx(2 * (12 * 16 + 16 * 3), rel=0.1)
    assert eight["flops"] == pytest.approx(8 * one["flops"], rel=0.01)
    assert one["params_bytes"] == eight["params_bytes"] == 4 * (12 * 16 + 16 + 16 * 3 + 3)
    assert one["op_counts"]["Gemm"] == 2
    assert source.fixed_batch_exports == 0


# --- co-location brings the details back --------------------------------------------------


class RecordingBackend:
    """Answers every job as ok and records what it was asked to run."""

    def __init__(self) -> None:
        self.calls: list[tuple[JobSpec, ...]] = []

    def measure(self, jobs: Any) -> Measurement:
        self.calls.append(tuple(jobs))
        return Measurement(tuple(JobResult("ok", "", 5.0, 0.1, 10, 100.0, 120.0) for _ in jobs),
                           40.0, 40.0, 45.0, 8)  # fmt: skip


class Features:
    def features(self, job: JobSpec) -> dict[str, Any]:
        return {"flops": 1e6, "params_bytes": 1e3, "activations_bytes": 1e3,
                "peak_activation_bytes": 1e3, "op_counts": {"Gemm": 1}}  # fmt: skip


def test_colocated_runs_get_the_user_models_back_from_the_spec(nets: Path,
                                                               tmp_path: Path) -> None:
    onnx_file = tmp_path / "tiny.onnx"
    onnx_file.write_bytes(b"not read by the recording backend")
    spec = CampaignSpec(
        batch_sizes={"training": (2,), "inference": (1,)}, pairs=10, triples=0,
        colocated_util_range_percent=(0.0, 500.0),
        onnx_models=(CatalogueEntry("tiny", "custom", ("inference",), str(onnx_file)),),
        torch_models=(CatalogueEntry("mine", "custom", torch_model=_spec(nets)),),
    )  # fmt: skip
    env = Environment("TEST GPU", 16384.0, "1", "12.4", "pytorch", "2.0", False,
                      software={"onnxruntime": "1.31.1"})
    catalogue = {"mlp": CatalogueEntry("mlp", "mlp")}
    data = DataDir(tmp_path / "gpu")
    backend = RecordingBackend()
    campaign = Campaign(spec, backend, env, data, Features(), catalogue=set(catalogue))
    summary = campaign.run(plan_isolated(spec, catalogue), ["isolated", "colocated"])
    assert summary.state == "complete" and summary.colocated_run > 0
    colocated = [jobs for jobs in backend.calls if len(jobs) > 1]
    members = {j.model: j for jobs in colocated for j in jobs}
    assert set(members) == {"mlp", "mine", "tiny"}
    assert members["mine"].torch_model == _spec(nets)
    assert members["tiny"].onnx_path == str(onnx_file)
    assert members["mlp"].torch_model is None and members["mlp"].onnx_path is None
    # Memory overheads are fitted per framework: the ONNX model's rows say onnxruntime.
    frameworks = {(r["model"], r["framework"], r["framework_version"])
                  for r in data.rows("isolated")}  # fmt: skip
    assert frameworks == {("mlp", "pytorch", "2.0"), ("mine", "pytorch", "2.0"),
                          ("tiny", "onnxruntime", "1.31.1")}  # fmt: skip

    # A later campaign whose spec no longer names "mine" cannot run its rows again.
    later = dataclasses.replace(spec, torch_models=(), pairs=20)
    again = Campaign(later, RecordingBackend(), env, DataDir(tmp_path / "gpu"), Features(),
                     catalogue=set(catalogue))  # fmt: skip
    combos, _ = again.planned_combos()
    assert again.unrunnable_models == ["mine"]
    assert all(j.model != "mine" for c in combos for j in c.jobs)


def test_cuda_backend_runs_a_user_torch_model_beside_a_user_onnx_model(nets: Path,
                                                                       tmp_path: Path) -> None:
    """Real CPU worker processes: both kinds of user model, co-located."""
    import onnx
    from onnx import TensorProto, helper

    from lab.fakes.nvml import FakeNvml, ScriptedSampler
    from predictor.profiling.cuda import CudaBackend

    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 2], np.ones(8, dtype=np.float32))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])], [w])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10
    path = tmp_path / "tiny.onnx"
    onnx.save(model, str(path))
    settings = MeasureSettings(warmup_seconds=0.0, measure_seconds=0.05, min_steps=2,
                               timeout_seconds=60.0)  # fmt: skip
    argv = [sys.executable, "-m", "predictor.profiling.worker", "--device", "cpu"]
    backend = CudaBackend(settings, nvml=FakeNvml.scripted(), worker_argv=argv,
                          sampler_factory=ScriptedSampler)  # fmt: skip
    try:
        pair = backend.measure([
            JobSpec("mine", "custom", "training", 4, torch_model=_spec(nets)),
            JobSpec("tiny", "custom", "inference", 3, onnx_path=str(path)),
        ])  # fmt: skip
    finally:
        backend.close()
    assert [j.status for j in pair.jobs] == ["ok", "ok"], [j.error for j in pair.jobs]
    assert all(j.n_steps >= 2 for j in pair.jobs)
