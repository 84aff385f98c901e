"""The kubelet's gRPC APIs the device plugin speaks, from the generated modules.

Two APIs, declared in the ``.proto`` files next to this module and compiled with
grpcio-tools into the committed ``*_pb2.py`` / ``*_pb2_grpc.py`` modules (the
command is at the top of ``api.proto``):

- ``v1beta1`` device plugin API (``api.proto``): the kubelet's ``Registration``
  service and the plugin's ``DevicePlugin`` service;
- ``v1`` pod resources API (``podresources.proto``): ``List``, which tells which
  pods already hold which devices.

This module names what the plugin and its tests use, so callers do not depend on
the generated modules' layout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.device_plugin import api_pb2, api_pb2_grpc, podresources_pb2, podresources_pb2_grpc

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
REGISTRATION_SERVICE = "v1beta1.Registration"
DEVICE_PLUGIN_SERVICE = "v1beta1.DevicePlugin"
POD_RESOURCES_SERVICE = "v1.PodResourcesLister"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"

_SERVICES = {
    REGISTRATION_SERVICE: api_pb2.DESCRIPTOR.services_by_name["Registration"],
    DEVICE_PLUGIN_SERVICE: api_pb2.DESCRIPTOR.services_by_name["DevicePlugin"],
    POD_RESOURCES_SERVICE: podresources_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"],
}
_MODULES = {"v1beta1": api_pb2, "v1": podresources_pb2}


def message(full_name: str) -> Any:
    """The message class for ``package.Name`` (e.g. ``v1beta1.AllocateRequest``)."""
    package, _, name = full_name.partition(".")
    module = _MODULES.get(package)
    if module is None or not hasattr(module, name):
        raise KeyError(f"no message {full_name!r} in the device plugin APIs")
    return getattr(module, name)


def method_types(service: str, method: str) -> tuple[Any, Any]:
    """(request class, response class) of ``service/method``."""
    descriptor = _SERVICES[service].methods_by_name[method]
    return (message(descriptor.input_type.full_name),
            message(descriptor.output_type.full_name))


def serializers(service: str, method: str) -> dict[str, Callable[..., Any]]:
    """Client-side (de)serializers of ``service/method`` for ``grpc.Channel`` calls."""
    request, response = method_types(service, method)
    return {"request_serializer": request.SerializeToString,
            "response_deserializer": response.FromString}


# The generated service glue the plugin uses.
DevicePluginServicer = api_pb2_grpc.DevicePluginServicer
add_device_plugin_to_server = api_pb2_grpc.add_DevicePluginServicer_to_server
RegistrationStub = api_pb2_grpc.RegistrationStub
add_registration_to_server = api_pb2_grpc.add_RegistrationServicer_to_server
PodResourcesListerStub = podresources_pb2_grpc.PodResourcesListerStub
add_pod_resources_to_server = podresources_pb2_grpc.add_PodResourcesListerServicer_to_server

Empty = api_pb2.Empty
DevicePluginOptions = api_pb2.DevicePluginOptions
RegisterRequest = api_pb2.RegisterRequest
Device = api_pb2.Device
ListAndWatchResponse = api_pb2.ListAndWatchResponse
PreferredAllocationRequest = api_pb2.PreferredAllocationRequest
PreferredAllocationResponse = api_pb2.PreferredAllocationResponse
AllocateRequest = api_pb2.AllocateRequest
AllocateResponse = api_pb2.AllocateResponse
ContainerAllocateResponse = api_pb2.ContainerAllocateResponse
PreStartContainerResponse = api_pb2.PreStartContainerResponse
ListPodResourcesRequest = podresources_pb2.ListPodResourcesRequest
ListPodResourcesResponse = podresources_pb2.ListPodResourcesResponse
