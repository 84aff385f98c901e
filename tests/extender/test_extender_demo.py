"""``tandem demo`` end to end (real cheroot server on loopback, simulated cluster)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tandem.demo import demo_command, render, run_demo
from tandem.demo_render import short_reason


@pytest.fixture(scope="module")
def result():
    return run_demo()


def test_demo_places_mixed_pods_and_explains_rejections(result):
    by_pod = {p["pod"]: p for p in result["placements"]}
    assert by_pod["train-resnet50"]["outcome"] == "placed"
    assert by_pod["train-gpt-small"]["node"] == "h100-node-1"  # only H100 has 60 GB free
    serving = {by_pod[n]["node"] + "/" + by_pod[n]["gpu_index"]
               for n in ("serve-resnet50", "serve-resnet50-b")}
    assert len(serving) == 1  # best fit packs sessions onto one serving GPU
    assert int(by_pod["serve-resnet50"]["batch"]) >= 1
    assert "tandem.io/gpu-util" in by_pod["train-typo"]["reason"]
    assert "GPU memory smaller" in by_pod["train-huge"]["reason"]
    model_only = by_pod["train-model-only"]
    assert model_only["outcome"] == "placed"
    assert model_only["source"] == "cold-start+mem:no-overhead"
    assert model_only["predicted_util_percent"] == 100.0  # the whole GPU until observed
    summary = result["summary"]
    assert summary["pods_rejected"] == len(summary["rejected"]) >= 3
    for gpu in summary["gpus"]:
        training = any(by_pod[p]["workload"] == "training" for p in gpu["pods"])
        inference = any(by_pod[p]["workload"] == "inference" for p in gpu["pods"])
        assert not (training and inference)  # serving GPUs get no training jobs
        assert gpu["role"] == ("serving" if inference else "training" if training else "idle")
    assert "REJECTED" in render(result)


def test_demo_places_best_effort_pods_spread_over_serving_and_idle_gpus(result):
    best_effort = [p for p in result["placements"] if p["kind"] == "best-effort"]
    assert len(best_effort) >= 3 and all(p["outcome"] == "placed" for p in best_effort)
    gpus = {f"{g['node']}/{g['index']}": g for g in result["summary"]["gpus"]}
    targets = {f"{p['node']}/{p['gpu_index']}" for p in best_effort}
    # Spread while idle GPUs last: the model-only training pod now takes the last idle
    # GPU, so the third best-effort pod shares a serving GPU's slack.
    assert len(targets) == len(best_effort) - 1
    assert all(gpus[t]["role"] == "serving" for t in targets)


# Lines that a newcomer reads first; they depend only on decisions and the seed.
KEY_LINES = [
    "tandem demo",
    "  simulated:  5 nodes with 12 GPUs (6x A100-SXM4-40GB, 2x GeForce-GTX-1080, 4x",
    "train-resnet50    training        1  h100-node-1/0        45.0     12000",
    "                  cost 0.305, best of 3 node(s)",
    "serve-resnet50    slo             1  a100-node-1/0        28.5      2500",
    "                  batch 32 in a 77.8 ms duty cycle",
    "batch-embed       best-effort     1  gtx1080-node-1/1    100.0      2500",
    "                  weight 3, slack share 100% of the GPU",
    # No trained utilisation model ships: the model-only pod is placed on day one, alone
    # on an idle GPU, with the graph's memory estimate and the cold-start utilisation.
    "train-model-only  training        1  gtx1080-node-1/0    100.0        29",
    "                  cost 0.318, best of 4 node(s), util cold-start",
    "                  REJECTED: GPU memory smaller than the job",
    # Every GPU busy: small jobs share because it pays, a large one is refused.
    "train-small-a     training        1  a100-node-1/2        20.0      4000",
    "                  shares the GPU with train-lenet: together they do more work",
    "  serve-tight-slo",
    "    1 node(s): SLO unreachable on this GPU type on 2/2 GPUs",
]


def test_demo_text_is_deterministic_given_the_seed(result):
    text = render(result)
    lines = text.splitlines()
    for line in KEY_LINES:
        assert line in lines, line
    again = render(run_demo(seed=7)).splitlines()
    assert lines[:-2] == again[:-2]  # all but the closing timing lines
    closing = " ".join(lines[-2:])
    assert closing.startswith("Placed 17 of 22 pods on 12 of 12 GPUs in ")
    assert "scheduling cycle filter+prioritize+bind over HTTP: mean" in closing


def test_demo_lines_fit_80_columns_and_reasons_are_never_cut(result):
    text = render(result)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "..." not in text
    typo = next(p for p in result["placements"] if p["pod"] == "train-typo")
    assert short_reason(typo["reason"]) in " ".join(text.split())  # whole, wrapped


def test_training_jobs_share_a_gpu_where_it_pays_and_not_where_it_does_not(result):
    by_pod = {p["pod"]: p for p in result["placements"]}
    gpu_of = {(p["node"], p["gpu_index"]) for p in result["placements"]
              if p["outcome"] == "placed" and p["pod"] in ("train-lenet", "train-small-a")}
    assert len(gpu_of) == 1  # one GPU, two training jobs
    assert (by_pod["train-small-b"]["node"], by_pod["train-small-b"]["gpu_index"]) == \
        (by_pod["train-resnet50"]["node"], by_pod["train-resnet50"]["gpu_index"])
    refused = by_pod["train-no-gain"]
    assert refused["outcome"] == "rejected"
    assert short_reason(refused["reason"]).startswith("co-location would slow")


def test_a_session_no_gpu_type_can_serve_is_refused_for_its_slo(result):
    row = next(p for p in result["placements"] if p["pod"] == "serve-tight-slo")
    assert row["cause"].startswith("SLO unreachable: bert-base cannot meet 5 ms")
    assert "SloTooTight" in row["cause"] and "other workload kind" not in row["cause"]
    assert "REJECTED: SLO unreachable" in render(result)


@pytest.mark.parametrize(("reason", "short"), [
    ("2 node(s): GPU memory smaller than the job on 2/2 GPUs | 1 node(s): no known GPU inventory",
     "GPU memory smaller than the job"),
    ("1 node(s): GPU serves the other workload kind on 3/4 GPUs; duty cycle cannot absorb the "
     "session on 1/4 GPUs", "GPU serves the other workload kind"),
    ("1 node(s): insufficient free GPU memory on 1/4 GPUs; co-location would slow the GPU's "
     "jobs more than it gains on 3/4 GPUs", "co-location would slow the GPU's jobs more than "
     "it gains"),
    ("5 node(s): bad pod request: tandem.io/gpu-util='lots': must be a number in (0, 100]",
     "bad pod request: tandem.io/gpu-util='lots': must be a number in (0, 100]"),
    ("tandem: cluster state not synced yet", "tandem: cluster state not synced yet"),
], ids=["counts-dropped", "first-of-several", "most-gpus-of-several", "bad-request-kept-whole",
        "plain-error"])
def test_short_reason(reason, short):
    assert short_reason(reason) == short


def test_demo_cli_json():
    import typer

    app = typer.Typer()
    app.command()(demo_command)
    out = CliRunner().invoke(app, ["--json", "--seed", "3"])
    assert out.exit_code == 0
    doc = json.loads(out.stdout)
    assert set(doc) == {"placements", "summary", "agents", "elapsed_seconds"}
    assert doc["summary"]["seed"] == 3
    assert {"pod", "workload", "outcome", "node"} <= set(doc["placements"][0])


def test_a_rejection_is_summarised_by_what_holds_it_back(result):
    """train-4gpu fits only the two 4-GPU nodes; h100-node-1 refuses it for slowdown on two
    GPUs, so the summary says that, not the more common "fewer GPUs" of smaller nodes."""
    row = next(p for p in result["placements"] if p["pod"] == "train-4gpu")
    assert short_reason(row["reason"]).startswith("co-location would slow")
    assert "fewer GPUs than requested" in row["reason"]  # still listed, after
    assert row["reason"].index("co-location") < row["reason"].index("fewer GPUs")
