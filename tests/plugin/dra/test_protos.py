"""The DRA wire contract is Kubernetes': packages, method paths, field numbers and types.

The kubelet matches on the exact proto package, service, method and field numbers; a
renamed or renumbered field still compiles and silently stops working on a node. The
numbers below are Kubernetes' (``dra/v1`` at d62bd6ff plus ``share_id = 5`` from
kubernetes#134520, ``pluginregistration/v1`` at 56e225f4, ``dra-health/v1alpha1`` at
c4b5de20), asserted from the generated descriptors.
"""

from __future__ import annotations

from types import ModuleType

import pytest
from google.protobuf.descriptor import FieldDescriptor as F

from plugin._pb import dra_health_v1alpha1_pb2 as health
from plugin._pb import dra_v1_pb2 as dra
from plugin._pb import pluginregistration_v1_pb2 as reg

PATHS = {
    dra: {
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
    },
    reg: {
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
    },
    health: {"/v1alpha1.DRAResourceHealth/NodeWatchResources"},
}

S, B, M, E, I64 = F.TYPE_STRING, F.TYPE_BOOL, F.TYPE_MESSAGE, F.TYPE_ENUM, F.TYPE_INT64
FIELDS: dict[ModuleType, list[tuple[str, str, int, int]]] = {
    dra: [
        ("NodePrepareResourcesRequest", "claims", 1, M),
        ("NodePrepareResourcesResponse", "claims", 1, M),
        ("NodePrepareResourceResponse", "devices", 1, M),
        ("NodePrepareResourceResponse", "error", 2, S),
        ("Device", "request_names", 1, S),
        ("Device", "pool_name", 2, S),
        ("Device", "device_name", 3, S),
        ("Device", "cdi_device_ids", 4, S),
        ("Device", "share_id", 5, S),
        ("NodeUnprepareResourcesRequest", "claims", 1, M),
        ("NodeUnprepareResourcesResponse", "claims", 1, M),
        ("NodeUnprepareResourceResponse", "error", 1, S),
        ("Claim", "namespace", 1, S),
        ("Claim", "uid", 2, S),
        ("Claim", "name", 3, S),
    ],
    reg: [
        ("PluginInfo", "type", 1, S),
        ("PluginInfo", "name", 2, S),
        ("PluginInfo", "endpoint", 3, S),
        ("PluginInfo", "supported_versions", 4, S),
        ("RegistrationStatus", "plugin_registered", 1, B),
        ("RegistrationStatus", "error", 2, S),
    ],
    health: [
        ("DeviceIdentifier", "pool_name", 1, S),
        ("DeviceIdentifier", "device_name", 2, S),
        ("DeviceHealth", "device", 1, M),
        ("DeviceHealth", "health", 2, E),
        ("DeviceHealth", "last_updated_time", 3, I64),
        ("NodeWatchResourcesResponse", "devices", 1, M),
    ],
}
CASES = [
    pytest.param(module, *f, id=f"{module.DESCRIPTOR.package}.{f[0]}.{f[1]}")
    for module, fields in FIELDS.items()
    for f in fields
]


@pytest.mark.parametrize("module", list(PATHS), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_method_paths(module: ModuleType) -> None:
    paths = {
        f"/{service.full_name}/{method.name}"
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert paths == PATHS[module]


@pytest.mark.parametrize(("module", "message", "field", "number", "kind"), CASES)
def test_field_numbers_match_kubernetes(
    module: ModuleType, message: str, field: str, number: int, kind: int
) -> None:
    descriptor = module.DESCRIPTOR.message_types_by_name[message].fields_by_name[field]
    assert (descriptor.number, descriptor.type) == (number, kind)


@pytest.mark.parametrize("module", list(FIELDS), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_no_field_goes_unchecked(module: ModuleType) -> None:
    """A field added to a proto must be added here too (and checked against Kubernetes);
    map entries are the generated ``*Entry`` messages and are not Kubernetes'."""
    checked = {(m, f) for m, f, _, _ in FIELDS[module]}
    present = {
        (name, field)
        for name, message in module.DESCRIPTOR.message_types_by_name.items()
        for field in message.fields_by_name
    }
    assert present == checked


def test_share_id_has_presence() -> None:
    """``optional``: an unset share_id is absent, not "", as for a device allocated whole."""
    assert dra.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence
    assert health.HealthStatus.Name(0) == "UNKNOWN"
