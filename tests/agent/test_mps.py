"""MPS enforcement without a GPU: what the device plugin's Allocate returns where a node
runs MPS (pipe, memory limit = reservation, thread percentage), and what the agent tells
the per-GPU control daemons (a fake nvidia-cuda-mps-control on PATH)."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.device_plugin import protocol as api
from agent.device_plugin.health import HealthTracker
from agent.device_plugin.main import reservations_of
from agent.device_plugin.mps import (
    CONTAINER_PIPE,
    MpsHook,
    MpsSettings,
    Reservation,
    control_pipe_exists,
    mps_grant,
)
from agent.device_plugin.server import DevicePluginService, PluginConfig
from agent.node.extender_view import parse_node_view
from agent.node.gpus import GpuInfo, GpuSample, NodeSample
from agent.node.mps import MpsDaemonConfig, MpsDaemons
from contracts import mps as layout

G0, G1 = "GPU-aaaa", "GPU-bbbb"
RESERVED = {"uid-1": Reservation(8192, 37.5), "uid-2": Reservation(20000, 90.0)}


def running(_: Path) -> bool:
    return True


def test_a_container_gets_its_gpus_pipe_and_its_reservation_as_limit(tmp_path: Path) -> None:
    given = mps_grant(MpsSettings(root=tmp_path), "uid-1", [G1], RESERVED, running)
    assert given.refusal is None
    assert dict(given.envs) == {"CUDA_MPS_PIPE_DIRECTORY": CONTAINER_PIPE,
                                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M"}
    assert dict(given.mounts) == {CONTAINER_PIPE: str(tmp_path / G1 / "pipe"),
                                  "/dev/shm": str(tmp_path / "shm")}


@pytest.mark.parametrize(("util", "floor", "want"), [
    (37.5, 10, "38"), (2.0, 10, "10"), (100.0, 10, "100"), (0.0, 1, "1")])
def test_thread_percentage_follows_predicted_utilisation(util: float, floor: int,
                                                         want: str) -> None:
    settings = MpsSettings(thread_percentage=True, min_thread_percentage=floor)
    given = mps_grant(settings, "u", [G0], {"u": Reservation(100, util)}, running)
    assert dict(given.envs)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == want
    off = mps_grant(MpsSettings(), "u", [G0], {"u": Reservation(100, util)}, running)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in dict(off.envs)


def test_refusals_name_the_reason() -> None:
    assert mps_grant(MpsSettings(), "nobody", [G0], RESERVED, running).refusal[0] == \
        "MpsLimitUnknown"
    assert mps_grant(MpsSettings(), "u", [G0], {"u": Reservation(None, 5.0)},
                     running).refusal[0] == "MpsLimitUnknown"
    assert mps_grant(MpsSettings(), "uid-1", [G0], RESERVED,
                     lambda _: False).refusal[0] == "MpsNotRunning"


def test_multi_gpu_containers_are_left_to_the_plain_hand_off() -> None:
    # A client connects to one MPS server and the daemons are per GPU.
    assert mps_grant(MpsSettings(), "uid-2", [G0, G1], RESERVED, running).envs == ()


def test_reservations_come_from_the_extenders_view() -> None:
    view = parse_node_view({"nodes": {"n1": {"gpus": [
        {"index": 0, "uuid": G0, "pods": [{"pod": "ml/a", "uid": "uid-1", "mem_mib": 8192,
                                           "util_percent": 37.5}]}]}}}, "n1")
    assert reservations_of(view) == {"uid-1": Reservation(8192, 37.5)}


# --- Allocate with the hook ---------------------------------------------------------

class Source:
    def inventory(self) -> list[GpuInfo]:
        return [GpuInfo(0, G0, "H100", 81559), GpuInfo(1, G1, "H100", 81559)]

    def sample(self, interval_seconds: float) -> NodeSample:
        return NodeSample(0.0, interval_seconds, tuple(
            GpuSample(i, 0, 0.0, None, None, None, 0, 0) for i in self.inventory()))


class Aborted(Exception):
    pass


class Context:
    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


def service(hook: MpsHook | None, rows: list[tuple]) -> DevicePluginService:
    health = HealthTracker(Source())
    health.poll()
    return DevicePluginService(PluginConfig(node="n1", assignment_retry_seconds=0),
                               health, lambda: rows, dict, set, threading.Event(), mps=hook)


def allocate(svc: DevicePluginService, *ids: str) -> Any:
    request = api.AllocateRequest()
    request.container_requests.add(devices_ids=list(ids))
    return svc.Allocate(request, Context()).container_responses[0]


def test_allocate_adds_the_mps_pipe_and_limit(tmp_path: Path) -> None:
    (layout.pipe_dir(tmp_path, G1)).mkdir(parents=True)
    (layout.pipe_dir(tmp_path, G1) / layout.CONTROL_PIPE).touch()
    hook = MpsHook(MpsSettings(root=tmp_path, thread_percentage=True), lambda: RESERVED)
    container = allocate(service(hook, [("ml", "a", "uid-1", 1, G1, None, "placed")]), f"{G0}::0")
    envs = dict(container.envs)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == G1  # the plain hand-off is still there
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "38"
    assert {(m.container_path, m.host_path) for m in container.mounts} == {
        (CONTAINER_PIPE, str(tmp_path / G1 / "pipe")), ("/dev/shm", str(tmp_path / "shm"))}


def test_allocate_refuses_when_the_gpus_daemon_is_down(tmp_path: Path) -> None:
    hook = MpsHook(MpsSettings(root=tmp_path), lambda: RESERVED)  # no control pipe
    with pytest.raises(Aborted) as err:
        allocate(service(hook, [("ml", "a", "uid-1", 1, G1, None, "placed")]), f"{G1}::0")
    assert err.value.args[0] == grpc.StatusCode.FAILED_PRECONDITION
    assert "MpsNotRunning" in err.value.args[1] and G1 in err.value.args[1]


def test_allocate_without_mps_is_unchanged() -> None:
    container = allocate(service(None, [("ml", "a", "uid-1", 1, G1, None, "placed")]), f"{G1}::0")
    assert not any(k.startswith("CUDA_MPS") for k in container.envs)
    assert len(container.mounts) == 0


# --- the agent's daemons, with a fake nvidia-cuda-mps-control -----------------------

FAKE_CONTROL = """#!/bin/sh
# Records each call; "-d" creates the control pipe, "quit" removes it, and a query
# answers 0 only while the pipe is there (as the real control client does).
input=""
[ "$#" -eq 0 ] && input="$(cat)"
printf '{"args": "%s", "gpu": "%s", "pipe": "%s", "log": "%s", "input": "%s"}\\n' \\
  "$*" "$CUDA_VISIBLE_DEVICES" "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" \\
  "$input" >> "$FAKE_MPS_CALLS"
if [ "$1" = "-d" ]; then touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0; fi
case "$input" in
  quit) rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0 ;;
  *) [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] ;;
esac
"""


@pytest.fixture
def fake_control(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-cuda-mps-control"
    script.write_text(FAKE_CONTROL)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}",
            "FAKE_MPS_CALLS": str(tmp_path / "calls.jsonl")}


def calls(environ: dict[str, str]) -> list[dict[str, str]]:
    path = Path(environ["FAKE_MPS_CALLS"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_agent_starts_one_daemon_per_gpu_with_its_own_dirs(tmp_path: Path,
                                                         fake_control: dict[str, str]) -> None:
    root = tmp_path / "mps"
    now = [0.0]
    daemons = MpsDaemons(MpsDaemonConfig(root=root, restart_backoff_seconds=10),
                         lambda: [G0, G1], clock=lambda: now[0],
                         environ={**os.environ, **fake_control})
    assert daemons.check() == {G0: True, G1: True}
    starts = [c for c in calls(fake_control) if c["args"] == "-d"]
    assert [(c["gpu"], c["pipe"], c["log"]) for c in starts] == [
        (g, str(root / g / "pipe"), str(root / g / "log")) for g in (G0, G1)]
    assert (root / "shm").is_dir()
    # What the device plugin checks is what the agent's daemon made.
    assert control_pipe_exists(layout.pipe_dir(root, G0))
    # Running daemons are asked, not restarted.
    assert daemons.check() == {G0: True, G1: True} and daemons.starts == {G0: 1, G1: 1}
    # A daemon that died is started again, but not more than once per backoff.
    (layout.pipe_dir(root, G1) / layout.CONTROL_PIPE).unlink()
    now[0] = 5.0
    assert daemons.check() == {G0: True, G1: False} and daemons.starts[G1] == 1
    now[0] = 11.0
    assert daemons.check() == {G0: True, G1: True} and daemons.starts[G1] == 2
    daemons.stop()
    quits = [c["gpu"] for c in calls(fake_control) if c["input"] == "quit"]
    assert quits == [G0, G1]
    assert not control_pipe_exists(layout.pipe_dir(root, G0))


def test_a_missing_control_binary_is_reported_not_raised(tmp_path: Path) -> None:
    daemons = MpsDaemons(MpsDaemonConfig(root=tmp_path, command=str(tmp_path / "absent")),
                         lambda: [G0])
    assert daemons.check() == {G0: False}


def test_uuids_that_are_paths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        layout.pipe_dir(tmp_path, "../etc")
