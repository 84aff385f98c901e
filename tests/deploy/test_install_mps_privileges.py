"""The MPS path as shipped (experimental until measured on a GPU): an init step owns the
host directories, and the agent gets what nvidia-cuda-mps-control needs (root with
CAP_SETUID and CAP_SETGID, to start each client's server as that client's user) and
nothing more; without MPS the agent stays non-root with every capability dropped."""

from __future__ import annotations

from typing import Any

import pytest
from chart_helpers import render
from manifests_helpers import MANIFESTS, resolve

from contracts import mps as layout


def _effective(spec: dict[str, Any], container: dict[str, Any], key: str) -> Any:
    own = container.get("securityContext") or {}
    return own[key] if key in own else (spec.get("securityContext") or {}).get(key)


def _agent_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet"
             and o["metadata"]["name"] == "tandem-agent"]
    return ds["spec"]["template"]["spec"]


@pytest.mark.parametrize("source", ["chart", "kustomize"])
def test_mps_agent_gets_only_what_the_control_daemon_needs(source: str) -> None:
    objects = render("mps.enabled=true") if source == "chart" else \
        resolve(MANIFESTS / "overlays/sidecar-mps")
    spec = _agent_spec(objects)
    (agent,) = [c for c in spec["containers"] if c["name"] == "agent"]
    assert _effective(spec, agent, "runAsUser") == 0
    assert _effective(spec, agent, "runAsNonRoot") is False
    caps = agent["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"] and sorted(caps["add"]) == ["SETGID", "SETUID"]
    assert agent["securityContext"].get("privileged") in (None, False)
    assert agent["securityContext"].get("allowPrivilegeEscalation") in (None, False)
    (init,) = spec["initContainers"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert init["securityContext"]["runAsUser"] == 0
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    root = str(layout.DEFAULT_ROOT)
    assert init["command"][-1] == root and '"$0/shm"' in init["command"][2]
    assert "chmod 1777" in init["command"][2]  # MPS servers run as each client's user
    assert {m["mountPath"] for m in init["volumeMounts"]} == {root}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[init["volumeMounts"][0]["name"]]["hostPath"]["path"] == root


@pytest.mark.parametrize("source", ["chart", "kustomize"])
def test_without_mps_the_agent_is_not_root_and_has_no_capability(source: str) -> None:
    objects = render() if source == "chart" else resolve(MANIFESTS / "overlays/sidecar")
    spec = _agent_spec(objects)
    (agent,) = [c for c in spec["containers"] if c["name"] == "agent"]
    assert _effective(spec, agent, "runAsUser") == 65532
    assert _effective(spec, agent, "runAsNonRoot") is True
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not spec.get("initContainers")


def test_mps_directories_let_each_clients_server_add_entries(tmp_path: Any) -> None:
    from agent.node.mps import MpsDaemonConfig, MpsDaemons

    calls: list[list[str]] = []

    def run(cmd: list[str], **_: Any) -> Any:
        calls.append(cmd)
        return type("Done", (), {"returncode": 0})()

    daemons = MpsDaemons(MpsDaemonConfig(root=tmp_path), lambda: ["GPU-a"], run=run)
    assert daemons.start("GPU-a")
    for directory in (layout.pipe_dir(tmp_path, "GPU-a"), layout.log_dir(tmp_path, "GPU-a")):
        assert directory.stat().st_mode & 0o7777 == 0o1777
