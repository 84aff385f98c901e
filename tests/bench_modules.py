"""Programs under benchmarks/ that tests use too (the loopback Kubernetes API server,
the baseline extender), loaded once by file path: benchmarks/ is not a package."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


sys.path.append(str(BENCHMARKS))  # only for this import: benchmarks/ must not shadow packages
try:
    import _common
finally:
    sys.path.remove(str(BENCHMARKS))


def load(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as module ``name`` (one instance per test process), by the
    loader the benchmarks use for each other (``_common.sibling``)."""
    return _common.sibling(name)


fake_kube_api = importlib.import_module("lab.fakes.kube_api")


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
