"""Programs under benchmarks/ that tests use too (the loopback Kubernetes API server,
the baseline extender), loaded once by file path: benchmarks/ is not a package."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as module ``name`` (one instance per test process)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


load("fake_kube_policy")  # fake_kube_api imports it by name
fake_kube_api = load("fake_kube_api")


@contextmanager
def running_api(**objects: Any) -> Iterator[tuple[Any, Any]]:
    """A started loopback API server and an official ``CoreV1Api`` client for it."""
    from kubernetes import client

    server = fake_kube_api.FakeKubeApi(**objects)
    server.start()
    try:
        with client.ApiClient(client.Configuration(host=server.url)) as api_client:
            yield server, client.CoreV1Api(api_client)
    finally:
        server.stop()
