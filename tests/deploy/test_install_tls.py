"""The extender, started with the TLS and token settings of the cluster config
(manifests/base/config/tandem.yaml), serves HTTPS that verifies against the CA
from manifests/tls/generate-certs.sh and refuses unauthenticated agent reports."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest
import yaml
from manifests_helpers import MANIFESTS, example_objects

from extender.cluster.sim import SimSource, parse_cluster
from extender.config.loader import ConfigHolder, load_config
from extender.transport.server import start_background
from extender.wiring import create_app

pytestmark = pytest.mark.skipif(
    shutil.which("openssl") is None or shutil.which("sh") is None,
    reason="needs openssl and sh to generate a throwaway certificate",
)

CLUSTER = yaml.safe_load("""
nodes:
  - name: gpu-node-1
    gpus: [{product: NVIDIA-A100-SXM4-40GB, memory_mib: 40960, count: 2}]
""")
TOKEN = "s3cr3t-token-for-tests-only"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    tmp = tmp_path_factory.mktemp("tls")
    subprocess.run(["sh", str(MANIFESTS / "tls/generate-certs.sh"), str(tmp)],
                   check=True, capture_output=True, timeout=60)
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    # The cluster config as shipped; only file locations and the port differ here,
    # set through the same TANDEM__ overrides an operator would use.
    environ = {
        "TANDEM__SERVER__TLS_CERT_FILE": str(tmp / "tls.crt"),
        "TANDEM__SERVER__TLS_KEY_FILE": str(tmp / "tls.key"),
        "TANDEM__REPORTS__TOKEN_FILE": str(token_file),
        "TANDEM__SERVER__HOST": "127.0.0.1",
        # a simulated cluster has no API server to review per-node tokens with
        "TANDEM__REPORTS__IDENTITY": "shared-token",
    }
    cfg = load_config(MANIFESTS / "base/config/tandem.yaml", environ=environ)
    nodes, pods = parse_cluster(CLUSTER)
    source = SimSource(nodes, pods)
    app = create_app(ConfigHolder(cfg), source, environ={})
    running = start_background(app, cfg.server, port=0)
    try:
        yield SimpleNamespace(running=running, ca=tmp / "ca.crt", cfg=cfg, source=source)
    finally:
        running.stop()


def _client(served: SimpleNamespace, host: str = "127.0.0.1") -> httpx.Client:
    context = ssl.create_default_context(cafile=str(served.ca))
    return httpx.Client(base_url=f"https://{host}:{served.running.port}", verify=context,
                        timeout=10)


def _wait_ready(client: httpx.Client) -> None:
    for _ in range(100):  # bounded: the sim source syncs at once
        if client.get("/readyz").status_code == 200:
            return
        time.sleep(0.02)
    raise AssertionError("extender never became ready")


def _report() -> dict:
    return {"node": "gpu-node-1", "timestamp": time.time(), "interval_seconds": 1.0,
            "gpus": [{"index": 0, "uuid": "GPU-0", "product": "NVIDIA A100-SXM4-40GB",
                      "memory_total_mib": 40960, "memory_used_mib": 1024,
                      "utilization_percent": 12.5, "processes": []}]}


def test_serves_https_verified_against_the_generated_ca(served: SimpleNamespace) -> None:
    assert served.running.scheme == "https"
    # 127.0.0.1 is what the sidecar scheduler's urlPrefix uses; localhost too.
    for host in ("127.0.0.1", "localhost"):
        with _client(served, host) as client:
            assert client.get("/livez").status_code == 200
            _wait_ready(client)


def test_untrusted_clients_and_plain_http_are_refused(served: SimpleNamespace) -> None:
    with pytest.raises(httpx.ConnectError), httpx.Client(timeout=5) as client:
        client.get(f"https://127.0.0.1:{served.running.port}/livez")  # system CAs only
    with httpx.Client(timeout=5) as client:
        try:
            response = client.get(f"http://127.0.0.1:{served.running.port}/livez")
        except httpx.HTTPError:
            return  # connection dropped: plain HTTP refused
        assert response.status_code == 400  # cheroot's answer to HTTP on a TLS port


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer wrong"}, 401), ({"Authorization": TOKEN}, 401),
     ({"Authorization": f"Bearer {TOKEN}"}, 200)],
    ids=["no-token", "wrong-token", "no-bearer-scheme", "valid-token"],
)
def test_agent_reports_need_the_bearer_token(
    served: SimpleNamespace, headers: dict, status: int
) -> None:
    with _client(served) as client:
        response = client.post("/v1/agents/report", json=_report(), headers=headers)
    assert response.status_code == status
    assert TOKEN not in response.text


def test_rejected_report_leaves_state_unchanged(served: SimpleNamespace) -> None:
    with _client(served) as client:
        before = client.get("/v1/state").json()
        client.post("/v1/agents/report", json=_report() | {"node": "gpu-node-1"},
                    headers={"Authorization": "Bearer nope"})
        after = client.get("/v1/state").json()
    assert before == after


def test_oversized_body_gets_413(served: SimpleNamespace) -> None:
    limit = served.cfg.server.max_body_bytes
    body = b"{" + b" " * (limit + 1) + b"}"
    with _client(served) as client:
        response = client.post("/filter", content=body,
                               headers={"Content-Type": "application/json"})
    assert response.status_code == 413


def test_filter_over_https_with_an_example_pod(served: SimpleNamespace) -> None:
    pod = next(o for o in example_objects() if o["kind"] == "Pod")
    pod = json.loads(json.dumps(pod))
    pod["metadata"].update(namespace="default", uid="uid-tls-1")
    with _client(served) as client:
        _wait_ready(client)
        result = client.post("/filter", json={"Pod": pod, "NodeNames": ["gpu-node-1"]}).json()
    assert result["NodeNames"] == ["gpu-node-1"], result
    assert result.get("Error", "") == ""
