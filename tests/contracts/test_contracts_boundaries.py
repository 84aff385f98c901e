"""One strict integer reader for every integer annotation and resource count; one batch
size (what the filter places a pod at is what learning files its samples under); one GPU
identity lookup (UUID first) for the table, the device plugin and learning; one bearer-token
reader and check; one learning-document decoder; one NVML sample reader; each default and
range in one place."""

from __future__ import annotations

import inspect
import io
import json
from typing import Any

import pytest
import yaml
from extender_builders import TOKEN, MemoryOnlyPredictor, args, binding, make_app, node, pod

from agent.inference.errors import Unauthorized as ServerUnauthorized
from agent.inference.http.auth import AdminGuard, AdminToken
from agent.node.reporter import TokenSource
from agent.session.proxy import ProxyConfigError, parse_gpu_index
from contracts.annotations import (
    BATCH_SIZE_RANGE,
    AnnotationError,
    BindOutputs,
    decode_outputs,
    parse_integer,
    read_bound_inputs,
)
from contracts.gpus import GpuRef, find_gpus, gpu_type_of
from contracts.learningdoc import decode_document
from contracts.tokens import bearer_of, read_token, same_token
from extender.config.loader import DEFAULT_CONFIG
from extender.config.schema import ConfigError, build_config
from extender.config.sections import QueueSettings, ReportsConfig
from extender.core import CostPolicy, Reason, is_unresolvable
from extender.core.cost import MAX_PODS_RANGE
from extender.core.demand import DemandError, parse_demand
from extender.exposure import exposure_problem
from extender.learning.store import ObservationStore
from extender.queue import QueueConfig, QueueError
from extender.state.reports import expected_token
from extender.webhook.mutate import WebhookSettings
from extender.webhook.server import make_app as webhook_app
from extender.wiring import gate_config
from lab.fakes.nvml import NOT_FOUND, FakeNvml
from predictor.observed import ObservationDocumentError, observed_rows
from predictor.profiling.nvml import read_samples

HUGE = "9" * 5000


@pytest.mark.parametrize("text", ["²", "١", "1_0", "0x10", "٨", HUGE, "", "1.0", "++1"])
def test_integer_text_other_than_ascii_digits_is_refused_with_a_reason(text: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        parse_integer(text, "tandem.io/batch-size", BATCH_SIZE_RANGE)
    assert "ASCII digits" in caught.value.problem
    assert len(str(caught.value)) < 300  # a 5,000-digit value is not echoed whole


@pytest.mark.parametrize("gpus", ["²", HUGE, "١"])
def test_a_gpu_count_the_reader_refuses_is_a_clear_reason_at_filter(gpus: str) -> None:
    """Before: '²' passed str.isdigit and int('²') raised ValueError ("internal error");
    5,000 digits hit int()'s digit limit the same way; '١' was read as 1."""
    with pytest.raises(DemandError) as caught:
        parse_demand(pod("p", gpus, gpu_util="10", gpu_mem_mib="100"))
    assert "tandem.io/gpu" in caught.value.field
    app, *_ = make_app([node("n1", 2)])
    answer = app.test_client().post(
        "/filter", json=args(pod("p", gpus, gpu_util="10", gpu_mem_mib="100"), ["n1"])).get_json()
    reason = answer["FailedAndUnresolvableNodes"]["n1"]
    assert "internal error" not in reason and "ASCII digits" in reason
    assert answer["Error"] == ""


def test_bound_gpu_indices_are_read_by_the_same_reader() -> None:
    assert decode_outputs({"tandem.io/gpu-index": "0,1"}) == BindOutputs((0, 1))
    # Before: int('١') == 1, so an Arabic-Indic digit named GPU 1.
    assert decode_outputs({"tandem.io/gpu-index": "١"}) is None
    assert decode_outputs({"tandem.io/gpu-index": HUGE}) is None


@pytest.mark.parametrize("value", ["²", "١", HUGE])
def test_the_session_process_refuses_an_unreadable_gpu_index(value: str) -> None:
    with pytest.raises(ProxyConfigError):  # before: ValueError from int()
        parse_gpu_index(value)



@pytest.mark.parametrize("text", ["+8", " 8", "08", "8"])
def test_learning_files_samples_under_the_batch_size_the_pod_was_placed_at(text: str) -> None:
    """Before: the store re-read the annotation with str.isdigit and its own default, so
    '+8' (placed at batch 8) was learned as batch 32."""
    placed_at = parse_demand(pod("a", 1, model="m.onnx", batch_size=text)).batch_size
    assert placed_at == 8
    app, ext, source, _ = make_app([node("n1", 1)], QUICK, predictor=MemoryOnlyPredictor())
    ext.learner.use_wall_clock(ticks())
    c = app.test_client()
    p = pod("a", 1, uid="uid-a", model="m.onnx", batch_size=text)
    source.create_pod(p)
    assert c.post("/filter", json=args(p, ["n1"])).get_json()["NodeNames"] == ["n1"]
    assert c.post("/bind", json=binding(p, "n1")).get_json() == {"Error": ""}
    report: dict[str, Any] = {
        "node": "n1", "timestamp": 1.0, "interval_seconds": 1.0,
        "gpus": [{"index": 0, "uuid": "GPU-0", "product": "NVIDIA A100-SXM4-40GB",
                  "memory_total_mib": 40960, "memory_used_mib": 1000,
                  "utilization_percent": 30.0,
                  "processes": [{"pid": 1, "pod_uid": "uid-a", "used_memory_mib": 900}]}]}
    taken = [c.post("/v1/agents/report", json=report,
                    headers={"Authorization": f"Bearer {TOKEN}"}).get_json()["samples"]
             for _ in range(2)]
    assert taken == [0, 1]  # a pod's first report is its warm-up
    state = c.get("/v1/state", headers={"Authorization": f"Bearer {TOKEN}"}).get_json()
    (entry,) = state["learning"]["alone"]
    assert entry["batch_size"] == placed_at


def test_a_bound_pod_without_a_batch_size_reads_the_one_default() -> None:
    assert read_bound_inputs({}).batch == 32
    assert read_bound_inputs({"tandem.io/workload": "inference",
                              "tandem.io/model": "m"}).batch == 1
    assert read_bound_inputs({"tandem.io/batch-size": "²"}).batch == 32


# ---- GPU identity: learning attribution follows the UUID, as the GPU table does ----------

def test_learning_attributes_a_sample_by_the_gpu_uuid_not_a_renumbered_index() -> None:
    """Before: attribution compared indices only, so after NVML renumbered the node's GPUs
    the pod's samples were refused ("not-placed-here") while the table followed the UUID."""
    app, ext, source, _ = make_app([node("n1", 2)], QUICK, predictor=MemoryOnlyPredictor())
    ext.learner.use_wall_clock(ticks())
    c = app.test_client()
    p = pod("a", 1, uid="uid-a", model="m.onnx")
    source.create_pod(p)
    assert c.post("/filter", json=args(p, ["n1"])).get_json()["NodeNames"] == ["n1"]
    assert c.post("/bind", json=binding(p, "n1")).get_json() == {"Error": ""}
    ann = source.read_pod("default", "a")["metadata"]["annotations"]
    index, uuid = int(ann["tandem.io/gpu-index"]), ann["tandem.io/gpu-uuid"]
    other = f"GPU-n1-{1 - index}"

    def entry(i: int, u: str, procs: list[dict[str, Any]]) -> dict[str, Any]:
        return {"index": i, "uuid": u, "product": "NVIDIA A100-SXM4-40GB",
                "memory_total_mib": 40960, "memory_used_mib": 1000,
                "utilization_percent": 30.0, "processes": procs}

    mine = [{"pid": 1, "pod_uid": "uid-a", "used_memory_mib": 900}]
    # The pod's GPU now answers to the other index, and its old index names the other GPU.
    doc = {"node": "n1", "timestamp": 1.0, "interval_seconds": 1.0,
           "gpus": [entry(1 - index, uuid, mine), entry(index, other, [])]}
    taken = [c.post("/v1/agents/report", json=doc,
                    headers={"Authorization": f"Bearer {TOKEN}"}).get_json()["samples"]
             for _ in range(2)]
    assert taken == [0, 1]  # a pod's first report is its warm-up
    # A process claimed on the GPU the pod's old index now names is not the pod's.
    doc["gpus"] = [entry(1 - index, uuid, []), entry(index, other, mine)]
    r = c.post("/v1/agents/report", json=doc, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.get_json()["samples"] == 0


def test_one_lookup_rule_for_recorded_gpus() -> None:
    have = [GpuRef(0, "GPU-b"), GpuRef(1, "GPU-c")]
    assert find_gpus([GpuRef(1, "GPU-b")], have) == [0]  # renumbered: the UUID decides
    assert find_gpus([GpuRef(1, "GPU-a")], have, gone={"GPU-a"}) is None  # vanished
    assert find_gpus([GpuRef(1, "0")], have) == [1]  # a placeholder UUID: the index decides
    assert find_gpus([GpuRef(1, "GPU-a")], have, complete=True) is None
    assert find_gpus([GpuRef(0, ""), GpuRef(1, "")], have) == [0, 1]
    assert gpu_type_of(" NVIDIA  A100-SXM4-40GB ") == "NVIDIA-A100-SXM4-40GB"


# ---- bearer tokens: one reader (stripped), one check ------------------------------------

def _report() -> dict[str, Any]:
    return {"node": "n1", "timestamp": 1.0, "interval_seconds": 1.0, "gpus": []}


@pytest.mark.parametrize("configured", ["s3cret\n", " s3cret ", "s3cret"])
def test_the_extender_strips_the_agent_token_from_its_environment(configured: str) -> None:
    """Before: the environment value was used as is, so a token set with a trailing
    newline (``echo`` into a Secret) refused every agent report for good."""
    app, *_ = make_app([node("n1", 1)], environ={"TANDEM_AGENT_TOKEN": configured})
    c = app.test_client()
    ok = c.post("/v1/agents/report", json=_report(), headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    bad = c.post("/v1/agents/report", json=_report(), headers={"Authorization": "Bearer s3cre"})
    assert bad.status_code == 401


def test_agent_and_server_tokens_are_read_and_checked_by_one_implementation(tmp_path) -> None:
    (tmp_path / "t").write_text("s3cret\n")
    env = {"TANDEM_AGENT_TOKEN": "s3cret\n", "TANDEM_ADMIN_TOKEN": "s3cret\n"}
    assert TokenSource(environ=env).get() == AdminToken(environ=env).get() == "s3cret"
    assert TokenSource(tmp_path / "t").get() == AdminToken(tmp_path / "t").get() == "s3cret"
    assert expected_token(ReportsConfig(), env) == "s3cret"
    assert expected_token(ReportsConfig(token_file=str(tmp_path / "t")), {}) == "s3cret"
    AdminGuard(AdminToken(environ=env)).check("Bearer s3cret")
    with pytest.raises(ServerUnauthorized):
        AdminGuard(AdminToken(environ=env)).check("Bearer s3cret-not")
    assert read_token(None, "X", {"X": " a\n"}) == "a" and not same_token("", "")
    assert bearer_of("Bearer  a ") == "a" and bearer_of("Basic a") == ""


# ---- the learning document: one encoder, one decoder -------------------------------------

QUICK = {"learning": {"warmup_seconds": 0, "min_observed_seconds": 0}}
"""Learning from a pod's second report on (its first is always its warm-up)."""


def ticks():
    """A wall clock one second further on each call (reports a second apart)."""
    now = iter(range(1000, 10**6))
    return lambda: float(next(now))


GOOD_ENTRY = {"model": "sha256:ab12", "reference": "models/m.onnx", "batch_size": 32,
              "workload": "training", "gpu_type": "NVIDIA-A100-SXM4-40GB",
              "util_percent": 41.5, "stddev_percent": 3.0, "samples": 12, "updated_at": 5.0}


@pytest.mark.parametrize("bad", [{"stddev_percent": 500.0}, {"samples": 0},
                                 {"updated_at": float("nan")}, {"batch_size": True},
                                 {"workload": "batch"}],
                         ids=["spread-500", "no-samples", "nan-time", "bool-batch", "workload"])
def test_the_extender_and_the_exporter_refuse_the_same_entries(bad: dict[str, Any]) -> None:
    """Before: ``predictor/observed.py`` re-read the document with its own checks and took
    entries the extender refuses (a 500% spread, 0 samples, a NaN time)."""
    doc = {"version": 2, "alone": [{**GOOD_ENTRY, **bad}], "colocated": []}
    with pytest.raises(ValueError):
        ObservationStore().load_document(doc)
    with pytest.raises(ObservationDocumentError):
        observed_rows(doc)


def test_what_the_extender_writes_the_exporter_reads_with_the_same_figures() -> None:
    store = ObservationStore()
    assert store.load_document({"version": 2, "alone": [GOOD_ENTRY], "colocated": []}) == 1
    doc = store.to_document()
    (written,) = doc["alone"]  # the contract's fields as read, and the additive ones
    assert {k: written[k] for k in GOOD_ENTRY} == GOOD_ENTRY and doc["colocated"] == []
    assert (written["gpus"], written["seconds"], written["pods"]) == (1, 12.0, 1)
    (row,) = observed_rows(doc)
    assert (row["model"], row["model_digest"], row["util_mean_percent"], row["n_samples"]) == \
        ("models/m.onnx", "ab12", 41.5, 12)
    assert decode_document(doc)["alone"][0].digest == "ab12"


# ---- NVML's sample ring buffer: one reader for the agent and the profiler -----------------

def test_one_reader_of_nvml_samples_for_the_agent_and_the_profiler() -> None:
    import agent.node.nvml
    import predictor.profiling.nvml

    fake = FakeNvml.scripted(samples=[[(30, 7), (10, 5), (20, 6)], NOT_FOUND])
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    assert read_samples(fake, handle, 1, 10) == [(20, 6.0), (30, 7.0)]  # newer only, in order
    assert read_samples(fake, handle, 1, 30) == []  # NOT_FOUND: nothing new yet
    for module in (agent.node.nvml, predictor.profiling.nvml):
        calls = inspect.getsource(module).count(".nvmlDeviceGetSamples(")
        assert calls == (1 if module is predictor.profiling.nvml else 0), module


# ---- each default and range in one place -----------------------------------------------------

def test_the_shipped_yaml_repeats_the_codes_defaults() -> None:
    shipped = yaml.safe_load(DEFAULT_CONFIG.read_text())
    policy = CostPolicy()
    assert shipped["limits"]["max_pods_per_gpu"] == policy.max_pods_per_gpu
    assert shipped["limits"]["min_best_effort_slack_percent"] == \
        policy.min_best_effort_slack_percent
    assert (shipped["cost"]["w_mem"], shipped["cost"]["w_util"]) == (policy.w_mem, policy.w_util)
    built = build_config({})
    assert built.policy.max_pods_per_gpu == policy.max_pods_per_gpu
    assert built.queue.fair == QueueConfig()
    with pytest.raises(ConfigError, match=f"must be in 1..{MAX_PODS_RANGE[1]}"):
        build_config({"limits": {"max_pods_per_gpu": MAX_PODS_RANGE[1] + 1}})


@pytest.mark.parametrize(("field", "value"), [("k", 65), ("beta", 10_001)])
def test_the_queue_knobs_have_one_range(field: str, value: int) -> None:
    """Before: ``queue:`` refused k=65 while the queue itself (and the gate's --k override)
    took it; QueueSettings and QueueConfig each declared k, beta and starvation."""
    with pytest.raises(QueueError):
        QueueConfig(**{field: value})
    with pytest.raises(ConfigError, match=f"queue.{field}: must be in"):
        build_config({"queue": {field: value}})
    with pytest.raises(QueueError):
        gate_config(QueueSettings(), **{field: value})


def test_pod_and_handoff_rejections_are_reasons_of_the_closed_enum() -> None:
    assert Reason.BAD_POD_REQUEST.event_reason == "BadPodRequest"  # the wire text is kept
    assert Reason.HANDOFF_PENDING.event_reason == "HandoffPending"
    assert is_unresolvable(Reason.BAD_POD_REQUEST)
    assert not is_unresolvable(Reason.HANDOFF_PENDING)
    app, *_ = make_app([node("n1", 1)])
    c = app.test_client()
    c.post("/filter", json=args(pod("p", "²", gpu_util="1", gpu_mem_mib="1"), ["n1"]))
    assert 'reason="BadPodRequest"' in c.get("/metrics").get_data(as_text=True)


# ---- readers that arrived later go through the same contracts ------------------------------

@pytest.mark.parametrize("value", ["\n", "  "])
def test_a_blank_token_variable_does_not_count_as_a_token_for_exposure(value: str) -> None:
    """Before: exposure_problem read the variable raw, so a token of "\\n" let the extender
    serve on an open address while every report was refused (the reader strips it)."""
    cfg = build_config({"server": {"host": "0.0.0.0", "tls_cert_file": "/c.crt",
                                   "tls_key_file": "/c.key"}})
    problem = exposure_problem(cfg, {"TANDEM_AGENT_TOKEN": value})
    assert problem is not None and "agent token" in problem


def test_the_webhook_reads_its_body_with_the_one_reader() -> None:
    app = webhook_app(WebhookSettings())
    answers: list[str] = []

    def call(environ: dict[str, Any]) -> dict[str, Any]:
        base = {"PATH_INFO": "/mutate", "REQUEST_METHOD": "POST"}
        body = b"".join(app({**base, **environ}, lambda status, headers: answers.append(status)))
        return json.loads(body)

    big = call({"CONTENT_LENGTH": str(4 << 20), "wsgi.input": io.BytesIO(b"")})
    assert answers[-1].startswith("413") and big == {"error": "too large"}
    call({"CONTENT_LENGTH": "١", "wsgi.input": io.BytesIO(b"{}")})  # ASCII digits only
    assert answers[-1].startswith("400")
