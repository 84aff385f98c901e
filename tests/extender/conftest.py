"""Fixtures the extender's tests share (this folder and the ones below it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from bench_modules import running_api


@pytest.fixture
def kube_api() -> Iterator[tuple]:
    """A loopback Kubernetes API server and a real client on it: (server, CoreV1Api)."""
    with running_api() as server_and_api:
        yield server_and_api
