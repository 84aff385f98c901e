"""Only the scheduler calls the scheduling verbs: with server.tls_client_ca_file the
extender verifies client certificates, and /filter, /prioritize, /bind and /preempt
answer only kube-scheduler's (the certificate manifests/tls/generate-certs.sh issues);
the agents' routes keep their bearer token."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import yaml
from manifests_helpers import MANIFESTS

from extender.cluster.sim import SimSource, parse_cluster
from extender.config.loader import ConfigHolder, load_config
from extender.config.schema import ConfigError
from extender.scheduler_auth import ask_for_client_certificates, scheduler_only
from extender.transport.server import start_background
from extender.wiring import create_app

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None,
                                reason="needs openssl to generate throwaway certificates")

CLUSTER = yaml.safe_load("""
nodes:
  - name: gpu-node-1
    gpus: [{product: NVIDIA-A100-SXM4-40GB, memory_mib: 40960, count: 2}]
""")
TOKEN = "s3cr3t-token-for-tests-only"
FILTER = {"Pod": {"metadata": {"name": "p", "namespace": "ml", "uid": "u-1",
                               "annotations": {"tandem.io/gpu-util": "20",
                                               "tandem.io/gpu-mem-mib": "1000"}},
                  "spec": {"containers": [{"name": "c", "resources": {
                      "limits": {"tandem.io/gpu": "1"}}}]}},
          "NodeNames": ["gpu-node-1"]}


def issue(tmp: Path, name: str) -> tuple[str, str]:
    """A client certificate for ``name`` signed by the generated CA."""
    key, crt, csr = tmp / f"{name}.key", tmp / f"{name}.crt", tmp / f"{name}.csr"
    ext = tmp / f"{name}.ext"
    ext.write_text("extendedKeyUsage=clientAuth\n")
    subprocess.run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-subj", f"/CN={name}", "-keyout", key, "-out", csr],
                   check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-days", "1", "-in", csr, "-CA", tmp / "ca.crt",
                    "-CAkey", tmp / "ca.key", "-CAcreateserial", "-extfile", ext, "-out", crt],
                   check=True, capture_output=True)
    return str(crt), str(key)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    tmp = tmp_path_factory.mktemp("mtls")
    subprocess.run(["sh", str(MANIFESTS / "tls/generate-certs.sh"), str(tmp)],
                   check=True, capture_output=True, timeout=60)
    (tmp / "token").write_text(TOKEN)
    other = tmp_path_factory.mktemp("other-ca")
    subprocess.run(["sh", str(MANIFESTS / "tls/generate-certs.sh"), str(other)],
                   check=True, capture_output=True, timeout=60)
    # The cluster config as shipped (mTLS on), files moved by TANDEM__ overrides.
    cfg = load_config(MANIFESTS / "base/config/tandem.yaml", environ={
        "TANDEM__SERVER__TLS_CERT_FILE": str(tmp / "tls.crt"),
        "TANDEM__SERVER__TLS_KEY_FILE": str(tmp / "tls.key"),
        "TANDEM__SERVER__TLS_CLIENT_CA_FILE": str(tmp / "ca.crt"),
        "TANDEM__REPORTS__TOKEN_FILE": str(tmp / "token"),
        "TANDEM__SERVER__HOST": "127.0.0.1",
        "TANDEM__REPORTS__IDENTITY": "shared-token"})  # no API server to review tokens
    assert cfg.server.tls_client_ca_file and cfg.server.scheduler_client_names
    nodes, pods = parse_cluster(CLUSTER)
    app = scheduler_only(create_app(ConfigHolder(cfg), SimSource(nodes, pods), environ={}),
                         cfg.server.scheduler_client_names)
    running = start_background(app, cfg.server, port=0)
    ask_for_client_certificates(running.server.ssl_adapter, cfg.server.tls_client_ca_file)
    try:
        yield SimpleNamespace(running=running, tmp=tmp, other=other,
                              stranger=issue(tmp, "someone-else"))
    finally:
        running.stop()


def client(served: SimpleNamespace, cert: tuple[str, str] | None) -> httpx.Client:
    context = ssl.create_default_context(cafile=str(served.tmp / "ca.crt"))
    if cert is not None:
        context.load_cert_chain(*cert)
    return httpx.Client(base_url=f"https://127.0.0.1:{served.running.port}", verify=context,
                        timeout=10)


def scheduler_cert(served: SimpleNamespace) -> tuple[str, str]:
    return str(served.tmp / "scheduler.crt"), str(served.tmp / "scheduler.key")


def wait_ready(c: httpx.Client) -> None:
    for _ in range(100):
        if c.get("/readyz").status_code == 200:
            return
        time.sleep(0.02)
    raise AssertionError("never ready")


def test_the_scheduler_certificate_may_filter(served: SimpleNamespace) -> None:
    with client(served, scheduler_cert(served)) as c:
        wait_ready(c)
        response = c.post("/filter", json=FILTER)
    assert response.status_code == 200
    assert response.json()["NodeNames"] == ["gpu-node-1"]


@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/bind", "/preempt"])
def test_without_a_certificate_the_verbs_are_forbidden(served: SimpleNamespace,
                                                      path: str) -> None:
    with client(served, None) as c:
        response = c.post(path, json=FILTER)
    assert response.status_code == 403
    assert "client certificate" in response.json()["Error"]


def test_a_certificate_of_the_same_ca_for_another_name_is_forbidden(
        served: SimpleNamespace) -> None:
    with client(served, served.stranger) as c:
        response = c.post("/filter", json=FILTER)
    assert response.status_code == 403 and "someone-else" in response.json()["Error"]


def test_a_certificate_of_another_ca_fails_the_handshake(served: SimpleNamespace) -> None:
    foreign = (str(served.other / "scheduler.crt"), str(served.other / "scheduler.key"))
    with pytest.raises(httpx.HTTPError), client(served, foreign) as c:
        c.post("/filter", json=FILTER)


def test_agents_need_no_certificate(served: SimpleNamespace) -> None:
    report = {"node": "gpu-node-1", "timestamp": time.time(), "interval_seconds": 1.0,
              "gpus": [{"index": 0, "uuid": "GPU-0", "product": "NVIDIA A100-SXM4-40GB",
                        "memory_total_mib": 40960, "memory_used_mib": 1024,
                        "utilization_percent": 12.5, "processes": []}]}
    with client(served, None) as c:
        assert c.get("/livez").status_code == 200
        ok = c.post("/v1/agents/report", json=report,
                    headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200


def test_an_unusable_ca_file_is_a_config_error(tmp_path: Path) -> None:
    context = SimpleNamespace(context=ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
    with pytest.raises(ConfigError, match="tls_client_ca_file"):
        ask_for_client_certificates(context, str(tmp_path / "missing.crt"))


class CapturingServer:
    """Stands in for cheroot in ``serve``: keeps the app and TLS context, binds nothing."""

    last: CapturingServer | None = None

    def __init__(self, app: object, *_: object) -> None:
        self.app = app
        self.ssl_adapter = SimpleNamespace(
            context=ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
        CapturingServer.last = self

    def prepare(self) -> None:
        raise OSError(98, "Address already in use")  # stop serve before it serves


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_serve_wires_mutual_tls_from_the_config(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner
    from werkzeug.test import Client

    from extender import commands
    from extender.cluster.sim import DEFAULT_CLUSTER

    subprocess.run(["sh", str(MANIFESTS / "tls/generate-certs.sh"), str(tmp_path)],
                   check=True, capture_output=True, timeout=60)
    config = tmp_path / "tandem.yaml"
    config.write_text(yaml.safe_dump({"server": {
        "host": "127.0.0.1", "tls_cert_file": str(tmp_path / "tls.crt"),
        "tls_key_file": str(tmp_path / "tls.key"),
        "tls_client_ca_file": str(tmp_path / "ca.crt")}, "predictor": {"enabled": False}}))
    monkeypatch.setattr("extender.transport.server.make_server", CapturingServer)
    CliRunner().invoke(commands.app, ["serve", "--config", str(config),
                                      "--cluster", f"sim:{DEFAULT_CLUSTER}"])
    server = CapturingServer.last
    assert server is not None
    assert server.ssl_adapter.context.verify_mode == ssl.CERT_OPTIONAL
    response = Client(server.app).post("/filter", json=FILTER)
    assert response.status_code == 403
    assert Client(server.app).get("/livez").status_code == 200
