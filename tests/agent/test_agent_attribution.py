"""Pod attribution from cgroup paths: a table over runtimes, drivers and cgroup versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.node.attribution import (
    Attribution,
    ProcAttributor,
    attribute_cgroup_file,
    attribute_cgroup_path,
)

UID = "6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f"
UID_ = UID.replace("-", "_")
CID = "3f6a1e2b9c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f"
PROC = Path(__file__).parents[1] / "data" / "agent" / "proc"

PATHS = [
    pytest.param(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
                 f"cri-containerd-{CID}.scope", Attribution(UID, CID),
                 id="systemd-containerd-burstable"),
    pytest.param(f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
                 f"crio-{CID}.scope", Attribution(UID, CID), id="systemd-crio-besteffort"),
    pytest.param(f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope",
                 Attribution(UID, CID), id="systemd-containerd-guaranteed"),
    pytest.param(f"/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope",
                 Attribution(UID, CID), id="systemd-docker"),
    pytest.param(f"/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{CID}",
                 Attribution(UID, CID), id="systemd-containerd-v1-colon"),
    pytest.param(f"/kubepods/burstable/pod{UID}/{CID}", Attribution(UID, CID),
                 id="cgroupfs-burstable"),
    pytest.param(f"/kubepods/pod{UID}/{CID}", Attribution(UID, CID), id="cgroupfs-guaranteed"),
    pytest.param(f"/kubepods/besteffort/pod{UID}/{CID}", Attribution(UID, CID),
                 id="cgroupfs-besteffort"),
    pytest.param(f"/docker/{'a' * 64}/kubepods/burstable/pod{UID}/{CID}", Attribution(UID, CID),
                 id="kind-nested-under-docker"),
    pytest.param(f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
                 f"kubelet-kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope",
                 Attribution(UID, CID), id="kubelet-slice-nested"),
    pytest.param(f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{CID}.scope",
                 Attribution(UID, None), id="crio-conmon-is-not-the-container"),
    pytest.param(f"/kubepods.slice/kubepods-pod{UID_}.slice", Attribution(UID, None),
                 id="pod-slice-without-container"),
    pytest.param(f"/kubepods/burstable/pod{UID}/{CID}/sub", Attribution(UID, CID),
                 id="cgroupfs-nested-subgroup"),
    pytest.param("/system.slice/containerd.service", None, id="host-service"),
    pytest.param("/", None, id="root"),
    pytest.param(f"/user.slice/mypod{UID}", None, id="pod-word-inside-a-name"),
    pytest.param("/kubepods/burstable/podnot-a-uid/abc", None, id="malformed-uid"),
]


@pytest.mark.parametrize(("path", "expected"), PATHS)
def test_attribute_cgroup_path(path: str, expected: Attribution | None) -> None:
    assert attribute_cgroup_path(path) == expected


FILES = [
    pytest.param(f"0::/kubepods/pod{UID}/{CID}\n", Attribution(UID, CID), id="v2-only"),
    pytest.param(f"12:memory:/kubepods/pod{UID}/{CID}\n0::/\n", Attribution(UID, CID),
                 id="hybrid-v2-root-falls-back-to-v1"),
    pytest.param(f"0::/kubepods/pod{UID}/{CID}\n3:cpu:/kubepods/pod{'1' * 8}-{'2' * 4}-"
                 f"{'3' * 4}-{'4' * 4}-{'5' * 12}/{CID}\n", Attribution(UID, CID),
                 id="v2-wins-over-v1"),
    pytest.param("", None, id="empty"),
    pytest.param("not a cgroup line\n", None, id="garbage"),
]


@pytest.mark.parametrize(("text", "expected"), FILES)
def test_attribute_cgroup_file(text: str, expected: Attribution | None) -> None:
    assert attribute_cgroup_file(text) == expected


@pytest.mark.parametrize(("pid", "expected"), [
    pytest.param(101, Attribution(UID, CID), id="v2-systemd-containerd"),
    pytest.param(102, Attribution(UID, CID), id="v1-cgroupfs"),
    pytest.param(103, Attribution(UID, CID), id="v1-crio-hybrid"),
    pytest.param(104, None, id="host-process"),
    pytest.param(105, None, id="garbage-file"),
    pytest.param(106, None, id="vanished-pid"),
])
def test_proc_attributor_reads_a_fake_proc_tree(pid: int, expected: Attribution | None) -> None:
    assert ProcAttributor(PROC).attribute(pid) == expected
