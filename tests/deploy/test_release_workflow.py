"""The release workflow, dry-run here: its version check runs as the workflow runs it
(a tag that is not the package's and the chart's version is refused), the images it
builds are the Dockerfile's targets the installs name, and the chart packages with
``helm package`` into what ``helm install oci://...`` would fetch (schema and
dashboard inside, renders)."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import CHART, HELM, KUSTOMIZE_KUBE_VERSION, NAMESPACE

from contracts.version import version

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github/workflows/release.yml"


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    return yaml.safe_load(WORKFLOW.read_text())


def _step(job: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in job["steps"] if s.get("name", "").startswith(name))


def test_runs_on_a_version_tag_with_package_rights(workflow: dict[str, Any]) -> None:
    assert workflow[True] == {"push": {"tags": ["v*.*.*"]}}  # YAML reads the key `on` as True
    assert workflow["permissions"] == {"contents": "read", "packages": "write"}
    assert workflow["jobs"]["chart"]["needs"] == ["version", "images"]


@pytest.mark.parametrize(("tag", "ok"), [(f"v{version()}", True), ("v9.9.9", False)])
def test_the_version_check_refuses_a_tag_the_release_does_not_carry(
        workflow: dict[str, Any], tmp_path: Path, tag: str, ok: bool) -> None:
    script = _step(workflow["jobs"]["version"], "The tag is")["run"]
    output = tmp_path / "out"
    env = {**os.environ, "GITHUB_REF_NAME": tag, "GITHUB_OUTPUT": str(output),
           "GITHUB_REPOSITORY_OWNER": "Example-Org"}
    done = subprocess.run(["bash", "-e", "-c", script], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert (done.returncode == 0) is ok, done.stderr
    if ok:
        assert output.read_text().split() == [f"version={version()}", "owner=example-org"]


def test_both_images_are_built_from_the_dockerfiles_targets(workflow: dict[str, Any]) -> None:
    matrix = workflow["jobs"]["images"]["strategy"]["matrix"]["include"]
    assert {m["name"]: m["target"] for m in matrix} == {"tandem": "cpu", "tandem-gpu": "gpu"}
    stages = {line.split(" AS ")[1].strip() for line in (REPO / "Dockerfile").read_text()
              .splitlines() if line.startswith("FROM ") and " AS " in line}
    assert {"cpu", "gpu"} <= stages
    values = yaml.safe_load((CHART / "values.yaml").read_text())["image"]
    assert {values["repository"], values["gpuRepository"]} == {m["name"] for m in matrix}
    push = _step(workflow["jobs"]["images"], "Build and push")["with"]
    assert push["push"] is True and push["target"] == "${{ matrix.target }}"


def test_the_chart_packages_and_renders_as_published(workflow: dict[str, Any],
                                                     tmp_path: Path) -> None:
    if HELM is None:
        pytest.skip("no helm")
    run = _step(workflow["jobs"]["chart"], "Lint and package")["run"]
    assert "helm package charts/tandem" in run
    assert "oci://" in _step(workflow["jobs"]["chart"], "Push the chart")["run"]
    subprocess.run([HELM, "package", str(CHART), "--destination", str(tmp_path), "--version",
                    version(), "--app-version", version()], check=True, capture_output=True,
                   timeout=60)
    package = tmp_path / f"tandem-{version()}.tgz"
    with tarfile.open(package) as tar:
        names = set(tar.getnames())
    assert {"tandem/values.schema.json", "tandem/dashboards/tandem-dashboard.json",
            "tandem/Chart.yaml"} <= names
    rendered = subprocess.run(
        [HELM, "template", "tandem", str(package), "--namespace", NAMESPACE, "--kube-version",
         KUSTOMIZE_KUBE_VERSION, "--set", "grafana.dashboard.enabled=true"],
        check=True, capture_output=True, text=True, timeout=60).stdout
    assert "tandem-grafana-dashboard" in rendered
