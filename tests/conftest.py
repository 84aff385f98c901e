"""Shared pytest setup: opt-in markers and the fixtures tests of several packages use.

A fixture only one package's tests use lives in that folder's ``conftest.py``.

Warnings are errors (pyproject). ``gpu`` tests run only where NVML sees a GPU;
``kube`` tests only with ``--with-kube`` (they need a real API server);
``slow`` (exhaustive) tests only with ``--with-slow``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
NEXUS_PROFILES_DIR = REPO_ROOT / "training_data" / "nexus-profiles"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--with-kube", action="store_true", help="run tests that need a cluster")
    parser.addoption("--with-slow", action="store_true", help="run exhaustive `slow` tests")


@functools.cache
def _gpu_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library: no GPU
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (NVML found none)")
    skip_kube = pytest.mark.skip(reason="needs a cluster: pass --with-kube")
    skip_slow = pytest.mark.skip(reason="exhaustive check: pass --with-slow")
    for item in items:
        if "gpu" in item.keywords and not _gpu_present():
            item.add_marker(skip_gpu)
        if "kube" in item.keywords and not config.getoption("--with-kube"):
            item.add_marker(skip_kube)
        if "slow" in item.keywords and not config.getoption("--with-slow"):
            item.add_marker(skip_slow)


@pytest.fixture(scope="session")
def nexus_profiles_dir() -> Path:
    """The real TITAN X batching profiles published with Nexus (vendored, BSD licence)."""
    return NEXUS_PROFILES_DIR
