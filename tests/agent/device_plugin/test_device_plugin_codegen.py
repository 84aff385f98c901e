"""The committed gRPC modules of the device plugin are what grpcio-tools makes of the
committed ``.proto`` files, and they carry the kubelet's wire names and numbers."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from agent.device_plugin import api_pb2, podresources_pb2
from agent.device_plugin import protocol as api

PACKAGE = Path(__file__).resolve().parents[3] / "agent" / "device_plugin"
PROTOS = ("api.proto", "podresources.proto")
GENERATED = ("api_pb2.py", "api_pb2_grpc.py", "podresources_pb2.py", "podresources_pb2_grpc.py")
TOOLS_VERSION = "1.85.1"
"""The grpcio-tools release the committed modules name (pinned in the dev extra)."""


def test_regenerating_gives_the_committed_modules_byte_for_byte(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) is not installed")
    installed = metadata.version("grpcio-tools")
    if installed != TOOLS_VERSION:
        pytest.skip(f"grpcio-tools {installed} installed; the modules were made with "
                    f"{TOOLS_VERSION} and name it")
    out = tmp_path / "agent" / "device_plugin"
    out.mkdir(parents=True)
    for proto in PROTOS:
        shutil.copy(PACKAGE / proto, out / proto)
    # The documented command (top of api.proto), run from a scratch repository root.
    done = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.",
         "--grpc_python_out=.", *(f"agent/device_plugin/{p}" for p in PROTOS)],
        cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    stale = [name for name in GENERATED
             if (out / name).read_bytes() != (PACKAGE / name).read_bytes()]
    assert not stale, (f"{stale} differ from the .proto files: regenerate with the command "
                       "at the top of agent/device_plugin/api.proto")


@pytest.mark.parametrize(("message", "fields"), [
    ("v1beta1.RegisterRequest",
     {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}),
    ("v1beta1.DevicePluginOptions",
     {"pre_start_required": 1, "get_preferred_allocation_available": 2}),
    ("v1beta1.Device", {"ID": 1, "health": 2, "topology": 3}),
    ("v1beta1.ContainerPreferredAllocationRequest",
     {"available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3}),
    ("v1beta1.ContainerAllocateResponse",
     {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}),
    ("v1beta1.DeviceSpec", {"container_path": 1, "host_path": 2, "permissions": 3}),
    ("v1.PodResources", {"name": 1, "namespace": 2, "containers": 3}),
    ("v1.ContainerDevices", {"resource_name": 1, "device_ids": 2}),
])
def test_wire_numbers_are_the_kubelets(message: str, fields: dict[str, int]) -> None:
    descriptor = api.message(message).DESCRIPTOR
    assert {f.name: f.number for f in descriptor.fields} == fields


def test_service_paths_are_the_kubelets() -> None:
    """The kubelet dials these exact method paths; a package rename would break them."""
    plugin = api_pb2.DESCRIPTOR.services_by_name["DevicePlugin"]
    assert plugin.full_name == api.DEVICE_PLUGIN_SERVICE
    assert sorted(m.name for m in plugin.methods) == sorted([
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate",
        "PreStartContainer"])
    assert plugin.methods_by_name["ListAndWatch"].server_streaming
    assert api_pb2.DESCRIPTOR.services_by_name["Registration"].full_name == \
        api.REGISTRATION_SERVICE
    assert podresources_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"].full_name == \
        api.POD_RESOURCES_SERVICE
    with pytest.raises(KeyError, match="no message"):
        api.message("v1beta1.Nope")
