"""The committed gRPC stubs are fresh, and the wire contract is Kubernetes' v1beta1.

The kubelet only understands the exact package, service, method and field
numbers of ``k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto``; a
renamed field still compiles but silently stops working on a node. So the
numbers the plugin depends on are asserted from the generated descriptors.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from google.protobuf.descriptor import FieldDescriptor

from plugin._pb import deviceplugin_v1beta1_pb2 as pb
from tests.conftest import REPO_ROOT


@pytest.mark.slow
def test_committed_stubs_are_not_stale() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/gen_proto.py", "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_package_and_method_paths() -> None:
    services = pb.DESCRIPTOR.services_by_name
    assert pb.DESCRIPTOR.package == "v1beta1"
    paths = {
        f"/{service.full_name}/{method.name}"
        for service in services.values()
        for method in service.methods
    }
    assert paths == {
        "/v1beta1.Registration/Register",
        "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        "/v1beta1.DevicePlugin/ListAndWatch",
        "/v1beta1.DevicePlugin/GetPreferredAllocation",
        "/v1beta1.DevicePlugin/Allocate",
        "/v1beta1.DevicePlugin/PreStartContainer",
    }
    list_and_watch = services["DevicePlugin"].methods_by_name["ListAndWatch"]
    assert list_and_watch.server_streaming
    assert not list_and_watch.client_streaming


FIELDS = [
    ("DevicePluginOptions", "pre_start_required", 1, FieldDescriptor.TYPE_BOOL),
    ("DevicePluginOptions", "get_preferred_allocation_available", 2, FieldDescriptor.TYPE_BOOL),
    ("RegisterRequest", "version", 1, FieldDescriptor.TYPE_STRING),
    ("RegisterRequest", "endpoint", 2, FieldDescriptor.TYPE_STRING),
    ("RegisterRequest", "resource_name", 3, FieldDescriptor.TYPE_STRING),
    ("RegisterRequest", "options", 4, FieldDescriptor.TYPE_MESSAGE),
    ("ListAndWatchResponse", "devices", 1, FieldDescriptor.TYPE_MESSAGE),
    ("TopologyInfo", "nodes", 1, FieldDescriptor.TYPE_MESSAGE),
    ("NUMANode", "ID", 1, FieldDescriptor.TYPE_INT64),
    ("Device", "ID", 1, FieldDescriptor.TYPE_STRING),
    ("Device", "health", 2, FieldDescriptor.TYPE_STRING),
    # Kubernetes numbers it 3 (api.proto: "TopologyInfo topology = 3").
    ("Device", "topology", 3, FieldDescriptor.TYPE_MESSAGE),
    ("PreStartContainerRequest", "devices_ids", 1, FieldDescriptor.TYPE_STRING),
    ("PreferredAllocationRequest", "container_requests", 1, FieldDescriptor.TYPE_MESSAGE),
    (
        "ContainerPreferredAllocationRequest",
        "available_deviceIDs",
        1,
        FieldDescriptor.TYPE_STRING,
    ),
    (
        "ContainerPreferredAllocationRequest",
        "must_include_deviceIDs",
        2,
        FieldDescriptor.TYPE_STRING,
    ),
    ("ContainerPreferredAllocationRequest", "allocation_size", 3, FieldDescriptor.TYPE_INT32),
    ("PreferredAllocationResponse", "container_responses", 1, FieldDescriptor.TYPE_MESSAGE),
    ("ContainerPreferredAllocationResponse", "deviceIDs", 1, FieldDescriptor.TYPE_STRING),
    ("AllocateRequest", "container_requests", 1, FieldDescriptor.TYPE_MESSAGE),
    ("ContainerAllocateRequest", "devices_ids", 1, FieldDescriptor.TYPE_STRING),
    ("CDIDevice", "name", 1, FieldDescriptor.TYPE_STRING),
    ("AllocateResponse", "container_responses", 1, FieldDescriptor.TYPE_MESSAGE),
    ("ContainerAllocateResponse", "envs", 1, FieldDescriptor.TYPE_MESSAGE),
    ("ContainerAllocateResponse", "mounts", 2, FieldDescriptor.TYPE_MESSAGE),
    ("ContainerAllocateResponse", "devices", 3, FieldDescriptor.TYPE_MESSAGE),
    ("ContainerAllocateResponse", "annotations", 4, FieldDescriptor.TYPE_MESSAGE),
    ("ContainerAllocateResponse", "cdi_devices", 5, FieldDescriptor.TYPE_MESSAGE),
    ("Mount", "container_path", 1, FieldDescriptor.TYPE_STRING),
    ("Mount", "host_path", 2, FieldDescriptor.TYPE_STRING),
    ("Mount", "read_only", 3, FieldDescriptor.TYPE_BOOL),
    ("DeviceSpec", "container_path", 1, FieldDescriptor.TYPE_STRING),
    ("DeviceSpec", "host_path", 2, FieldDescriptor.TYPE_STRING),
    ("DeviceSpec", "permissions", 3, FieldDescriptor.TYPE_STRING),
]


@pytest.mark.parametrize(
    ("message", "field", "number", "kind"),
    [pytest.param(*f, id=f"{f[0]}.{f[1]}") for f in FIELDS],
)
def test_field_numbers_match_kubernetes(message: str, field: str, number: int, kind: int) -> None:
    descriptor = pb.DESCRIPTOR.message_types_by_name[message].fields_by_name[field]
    assert descriptor.number == number
    assert descriptor.type == kind


def test_no_message_has_fields_we_did_not_check() -> None:
    """A field added to the proto must be added here too (and checked against Kubernetes)."""
    checked = {(m, f) for m, f, _, _ in FIELDS}
    present = {
        (name, field)
        for name, message in pb.DESCRIPTOR.message_types_by_name.items()
        for field in message.fields_by_name
    }
    assert present == checked


@pytest.mark.parametrize(
    ("message", "field", "nested"),
    [
        pytest.param("ContainerAllocateResponse", "cdi_devices", "CDIDevice", id="cdi-devices"),
        pytest.param("ContainerAllocateResponse", "mounts", "Mount", id="mounts"),
        pytest.param("ContainerAllocateResponse", "devices", "DeviceSpec", id="device-specs"),
        pytest.param("Device", "topology", "TopologyInfo", id="device-topology"),
        pytest.param("TopologyInfo", "nodes", "NUMANode", id="topology-nodes"),
        pytest.param("RegisterRequest", "options", "DevicePluginOptions", id="register-options"),
    ],
)
def test_message_field_types(message: str, field: str, nested: str) -> None:
    descriptor = pb.DESCRIPTOR.message_types_by_name[message].fields_by_name[field]
    assert descriptor.message_type.name == nested


@pytest.mark.parametrize("field", ["envs", "annotations"])
def test_string_maps(field: str) -> None:
    descriptor = pb.DESCRIPTOR.message_types_by_name["ContainerAllocateResponse"].fields_by_name[
        field
    ]
    entry = descriptor.message_type
    assert entry.GetOptions().map_entry
    assert entry.fields_by_name["key"].type == FieldDescriptor.TYPE_STRING
    assert entry.fields_by_name["value"].type == FieldDescriptor.TYPE_STRING
