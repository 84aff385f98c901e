"""One strict batching-profile parser for the extender, the inference server and
``tandem plan``: unknown keys, keys written twice, two profiles for one (model, GPU type)
and ``batches:`` get one answer, a refusal naming the path."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.inference.preparation.batching_profiles import ProfileFileError as ServerProfileError
from agent.inference.preparation.batching_profiles import load_profiles as server_profiles
from contracts.profilefile import ProfileFileError
from extender.inference_profiles import ProfileFileError as ExtenderProfileError
from extender.inference_profiles import load_profiles as extender_profiles
from predictor.profiles import NO_MARGIN, load_profile_file, profiles_from_document

REPO = Path(__file__).resolve().parents[2]
GPU = "NVIDIA-A100-SXM4-40GB"
GOOD = f"  - {{model: a, gpu_type: {GPU}, linear: {{alpha_ms: 1.0, beta_ms: 2.0}}}}\n"

REFUSED = [
    pytest.param(GOOD + f"  - {{model: b, gpu_type: {GPU}, table: [[1, 2.0]], memroy_mib: 5}}\n",
                 "profiles[1].memroy_mib: unknown key", id="unknown-key"),
    pytest.param(f"  - {{model: a, model: b, gpu_type: {GPU}, table: [[1, 2.0]]}}\n",
                 "written twice", id="yaml-key-twice"),
    pytest.param(GOOD + GOOD, f"profiles[1]: duplicate profile for (a, {GPU})",
                 id="two-profiles-one-key"),
    pytest.param(f"  - {{model: a, gpu_type: {GPU}, table: [[1, 2.0], [8, 9.0]], "
                 "batches: [1]}\n", "profiles[0].batches: only tandem plan", id="batches"),
    pytest.param(f"  - {{model: a, gpu_type: {GPU}, linear: {{alpha_ms: 1.0, beta: 2}}}}\n",
                 "profiles[0].linear.beta: unknown key", id="unknown-linear-key"),
]


@pytest.mark.parametrize(("body", "problem"), REFUSED)
def test_the_extender_and_the_server_refuse_the_same_files_the_same_way(
        tmp_path: Path, body: str, problem: str) -> None:
    """Before: the extender and the server read profile files leniently (unknown keys and
    ``batches`` ignored, a repeated key or profile silently replaced), each with its own
    error class, while ``tandem plan`` refused them."""
    path = tmp_path / "profiles.yaml"
    path.write_text("profiles:\n" + body)
    with pytest.raises(ProfileFileError, match=re.escape(problem)) as extender:
        extender_profiles([str(path)])
    with pytest.raises(ProfileFileError, match=re.escape(problem)) as server:
        server_profiles(path, GPU, NO_MARGIN)
    assert str(extender.value) == str(server.value)
    assert str(path) in str(extender.value)
    assert ExtenderProfileError is ServerProfileError is ProfileFileError


def test_a_good_file_reads_the_same_everywhere(tmp_path: Path) -> None:
    path = tmp_path / "profiles.yaml"
    path.write_text("profiles:\n" + GOOD)
    ext = extender_profiles([str(path)])
    assert server_profiles(path, GPU, NO_MARGIN) == {"a": ext[("a", GPU)]}


def _profile_files() -> list[Path]:
    """Every YAML file in the repository whose document is a ``profiles:`` list of
    batching profiles (not a kube-scheduler ``profiles:`` list)."""
    listed = subprocess.run(["git", "ls-files", "*.yaml", "*.yml"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout.split()
    found = []
    for name in listed:
        try:
            doc = yaml.safe_load((REPO / name).read_text())
        except (yaml.YAMLError, UnicodeDecodeError):
            continue  # chart templates are not YAML until rendered
        entries = doc.get("profiles") if isinstance(doc, dict) else None
        if isinstance(entries, list) and entries and all(
                isinstance(e, dict) and "gpu_type" in e for e in entries):
            found.append(REPO / name)
    return found


def test_every_shipped_profile_file_loads() -> None:
    files = _profile_files()
    assert REPO / "tandem" / "demo_profiles.yaml" in files
    for path in files:
        assert load_profile_file(path)


def test_plan_files_use_the_same_loader_a_key_written_twice_is_refused(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tandem.cli import app

    plan = tmp_path / "plan.yaml"
    plan.write_text(f"gpu_types: {{{GPU}: {{memory_mib: 40960}}}}\n"
                    f"profiles:\n  - {{model: a, gpu_type: {GPU}, table: [[1, 2.0]], "
                    "table: [[1, 3.0]]}\n")
    result = CliRunner().invoke(app, ["plan", str(plan)])
    assert result.exit_code != 0 and "written twice" in result.output


values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**70) | st.floats(allow_nan=True)
    | st.text(max_size=6) | st.sampled_from(["model", "gpu_type", "linear", "table"]),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
        st.sampled_from(["model", "gpu_type", "linear", "table", "memory_mib", "max_batch",
                         "batches", "alpha_ms", "beta_ms", "nexus_profile", "x"]), kids,
        max_size=5), max_leaves=16)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(values, max_size=4))
def test_any_document_is_profiles_or_a_profile_file_error(entries: list) -> None:
    try:
        profiles_from_document({"profiles": entries}, "f")
    except ProfileFileError as err:
        assert err.problems and all(isinstance(p, str) and p for p in err.problems)


@pytest.mark.parametrize("entry", [
    {"model": "a", "gpu_type": GPU, "table": [[2**70, 1.0]]},
    {"model": "a", "gpu_type": GPU, "linear": {"alpha_ms": 1.0, "beta_ms": 1.0},
     "max_batch": 10**9}],
    ids=["table-batch-2^70", "max-batch-1e9"])
def test_a_profile_past_the_largest_batch_size_is_refused_at_once(entry: dict) -> None:
    """Before: the latency table was built batch by batch up to the last row's batch, so
    a batch of 2**70 (or max_batch 10**9) held the loader for good."""
    with pytest.raises(ProfileFileError, match="1..65536"):
        profiles_from_document({"profiles": [entry]}, "f")
