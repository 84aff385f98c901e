"""The kubelet's gRPC APIs the device plugin speaks, as protobuf messages built at import.

Two APIs, field numbers as the kubelet defines them:

- ``v1beta1`` device plugin API (``k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1``):
  the kubelet's ``Registration`` service and the plugin's ``DevicePlugin`` service;
- ``v1`` pod resources API (``k8s.io/kubelet/pkg/apis/podresources/v1``): ``List``,
  which tells which pods already hold which devices.

The messages are described here as ``FileDescriptorProto`` values and turned into
classes by protobuf's own message factory, so no generated ``*_pb2.py`` (tied to
one protobuf release) and no ``protoc`` at build time are needed; the wire format
is exactly what generated code would produce.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto
_STRING, _BOOL, _INT64, _INT32, _MESSAGE = (F.TYPE_STRING, F.TYPE_BOOL, F.TYPE_INT64,
                                            F.TYPE_INT32, F.TYPE_MESSAGE)
_ONE, _MANY = F.LABEL_OPTIONAL, F.LABEL_REPEATED

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
REGISTRATION_SERVICE = "v1beta1.Registration"
DEVICE_PLUGIN_SERVICE = "v1beta1.DevicePlugin"
POD_RESOURCES_SERVICE = "v1.PodResourcesLister"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"

# (message name, [(field name, number, type, label, message type or None)])
Messages = list[tuple[str, list[tuple[str, int, int, int, str | None]]]]
Services = dict[str, list[tuple[str, str, str, bool]]]

_DEVICE_PLUGIN: Messages = [
    ("DevicePluginOptions", [("pre_start_required", 1, _BOOL, _ONE, None),
                             ("get_preferred_allocation_available", 2, _BOOL, _ONE, None)]),
    ("RegisterRequest", [("version", 1, _STRING, _ONE, None),
                         ("endpoint", 2, _STRING, _ONE, None),
                         ("resource_name", 3, _STRING, _ONE, None),
                         ("options", 4, _MESSAGE, _ONE, "DevicePluginOptions")]),
    ("Empty", []),
    ("ListAndWatchResponse", [("devices", 1, _MESSAGE, _MANY, "Device")]),
    ("TopologyInfo", [("nodes", 1, _MESSAGE, _MANY, "NUMANode")]),
    ("NUMANode", [("ID", 1, _INT64, _ONE, None)]),
    ("Device", [("ID", 1, _STRING, _ONE, None), ("health", 2, _STRING, _ONE, None),
                ("topology", 3, _MESSAGE, _ONE, "TopologyInfo")]),
    ("PreStartContainerRequest", [("devices_ids", 1, _STRING, _MANY, None)]),
    ("PreStartContainerResponse", []),
    ("PreferredAllocationRequest",
     [("container_requests", 1, _MESSAGE, _MANY, "ContainerPreferredAllocationRequest")]),
    ("ContainerPreferredAllocationRequest",
     [("available_deviceIDs", 1, _STRING, _MANY, None),
      ("must_include_deviceIDs", 2, _STRING, _MANY, None),
      ("allocation_size", 3, _INT32, _ONE, None)]),
    ("PreferredAllocationResponse",
     [("container_responses", 1, _MESSAGE, _MANY, "ContainerPreferredAllocationResponse")]),
    ("ContainerPreferredAllocationResponse", [("deviceIDs", 1, _STRING, _MANY, None)]),
    ("AllocateRequest", [("container_requests", 1, _MESSAGE, _MANY, "ContainerAllocateRequest")]),
    ("ContainerAllocateRequest", [("devices_ids", 1, _STRING, _MANY, None)]),
    ("CDIDevice", [("name", 1, _STRING, _ONE, None)]),
    ("AllocateResponse",
     [("container_responses", 1, _MESSAGE, _MANY, "ContainerAllocateResponse")]),
    ("ContainerAllocateResponse", [("envs", 1, _MESSAGE, _MANY, "map:EnvsEntry"),
                                   ("mounts", 2, _MESSAGE, _MANY, "Mount"),
                                   ("devices", 3, _MESSAGE, _MANY, "DeviceSpec"),
                                   ("annotations", 4, _MESSAGE, _MANY, "map:AnnotationsEntry"),
                                   ("cdi_devices", 5, _MESSAGE, _MANY, "CDIDevice")]),
    ("Mount", [("container_path", 1, _STRING, _ONE, None), ("host_path", 2, _STRING, _ONE, None),
               ("read_only", 3, _BOOL, _ONE, None)]),
    ("DeviceSpec", [("container_path", 1, _STRING, _ONE, None),
                    ("host_path", 2, _STRING, _ONE, None),
                    ("permissions", 3, _STRING, _ONE, None)]),
]

_POD_RESOURCES: Messages = [
    ("ListPodResourcesRequest", []),
    ("ListPodResourcesResponse", [("pod_resources", 1, _MESSAGE, _MANY, "PodResources")]),
    ("PodResources", [("name", 1, _STRING, _ONE, None), ("namespace", 2, _STRING, _ONE, None),
                      ("containers", 3, _MESSAGE, _MANY, "ContainerResources")]),
    ("ContainerResources", [("name", 1, _STRING, _ONE, None),
                            ("devices", 2, _MESSAGE, _MANY, "ContainerDevices")]),
    ("ContainerDevices", [("resource_name", 1, _STRING, _ONE, None),
                          ("device_ids", 2, _STRING, _MANY, None)]),
]


def _file(name: str, package: str, messages: Messages,
          services: Services) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name=name, package=package, syntax="proto3")
    for message_name, fields in messages:
        message = proto.message_type.add(name=message_name)
        for field_name, number, kind, label, type_name in fields:
            field = message.field.add(name=field_name, number=number, type=kind, label=label,
                                      json_name=field_name)
            if type_name and type_name.startswith("map:"):
                entry = message.nested_type.add(name=type_name[4:])
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, type=_STRING, label=_ONE)
                entry.field.add(name="value", number=2, type=_STRING, label=_ONE)
                field.type_name = f".{package}.{message_name}.{type_name[4:]}"
            elif type_name:
                field.type_name = f".{package}.{type_name}"
    for service_name, methods in services.items():
        service = proto.service.add(name=service_name)
        for method, request, response, streaming in methods:
            service.method.add(name=method, input_type=f".{package}.{request}",
                               output_type=f".{package}.{response}",
                               server_streaming=streaming)
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file("tandem/deviceplugin/v1beta1/api.proto", "v1beta1", _DEVICE_PLUGIN, {
    "Registration": [("Register", "RegisterRequest", "Empty", False)],
    "DevicePlugin": [
        ("GetDevicePluginOptions", "Empty", "DevicePluginOptions", False),
        ("ListAndWatch", "Empty", "ListAndWatchResponse", True),
        ("GetPreferredAllocation", "PreferredAllocationRequest",
         "PreferredAllocationResponse", False),
        ("Allocate", "AllocateRequest", "AllocateResponse", False),
        ("PreStartContainer", "PreStartContainerRequest", "PreStartContainerResponse", False),
    ],
}))
_POOL.Add(_file("tandem/podresources/v1/api.proto", "v1", _POD_RESOURCES, {
    "PodResourcesLister": [("List", "ListPodResourcesRequest", "ListPodResourcesResponse",
                            False)],
}))


def message(full_name: str) -> Any:
    """The message class for ``package.Name`` (e.g. ``v1beta1.AllocateRequest``)."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(full_name))


def method_types(service: str, method: str) -> tuple[Any, Any]:
    """(request class, response class) of ``service/method``."""
    descriptor = _POOL.FindServiceByName(service).FindMethodByName(method)
    return (message_factory.GetMessageClass(descriptor.input_type),
            message_factory.GetMessageClass(descriptor.output_type))


def serializers(service: str, method: str) -> dict[str, Callable[..., Any]]:
    """Client-side (de)serializers of ``service/method`` for ``grpc.Channel`` calls."""
    request, response = method_types(service, method)
    return {"request_serializer": request.SerializeToString,
            "response_deserializer": response.FromString}


Empty = message("v1beta1.Empty")
DevicePluginOptions = message("v1beta1.DevicePluginOptions")
RegisterRequest = message("v1beta1.RegisterRequest")
Device = message("v1beta1.Device")
ListAndWatchResponse = message("v1beta1.ListAndWatchResponse")
PreferredAllocationRequest = message("v1beta1.PreferredAllocationRequest")
PreferredAllocationResponse = message("v1beta1.PreferredAllocationResponse")
AllocateRequest = message("v1beta1.AllocateRequest")
AllocateResponse = message("v1beta1.AllocateResponse")
ContainerAllocateResponse = message("v1beta1.ContainerAllocateResponse")
PreStartContainerResponse = message("v1beta1.PreStartContainerResponse")
ListPodResourcesRequest = message("v1.ListPodResourcesRequest")
ListPodResourcesResponse = message("v1.ListPodResourcesResponse")
