"""The pure ownership core: which of our GPUs another resource names, in every ID shape."""

from __future__ import annotations

import dataclasses

import pytest

from plugin.placement.ownership import (
    AssignedDevices,
    ResourceDevices,
    find_foreign_claims,
    resolve_device,
)
from tests.plugin.builders import gpu, uuid_for

GPUS = [gpu(0), gpu(1), gpu(2)]
OWN = ["cnvrg.io/metagpu"]


@pytest.mark.parametrize(
    ("resource", "device_id", "index"),
    [
        pytest.param("nvidia.com/gpu", uuid_for(1), 1, id="uuid"),
        pytest.param("nvidia.com/gpu", uuid_for(1).lower(), 1, id="uuid-any-case"),
        pytest.param("nvidia.com/gpu", "1", 1, id="index"),
        pytest.param("nvidia.com/gpu", "1::3", 1, id="index-replica"),
        pytest.param("nvidia.com/gpu.shared", f"{uuid_for(2)}::0", 2, id="uuid-replica"),
        pytest.param("nvidia.com/mig-1g.10gb", "2:0", 2, id="mig-index"),
        pytest.param("nvidia.com/mig-1g.10gb", "2:1::1", 2, id="mig-index-replica"),
        pytest.param("nvidia.com/mig-1g.10gb", f"MIG-{uuid_for(0)}/7/0", 0, id="mig-old-uuid"),
        pytest.param("example.com/sharing", f"{uuid_for(0)}-3", 0, id="third-party-suffix"),
        pytest.param("nvidia.com/gpu", "7", None, id="index-not-here"),
        pytest.param("example.com/fpga", "1", None, id="index-of-another-vendor"),
        pytest.param("example.com/fpga", "0:1", None, id="mig-index-of-another-vendor"),
        pytest.param(
            "nvidia.com/gpu", "GPU-ffffffff-0000-4000-8000-000000000009", None, id="other"
        ),
        pytest.param("nvidia.com/gpu", "01", None, id="not-an-index"),
    ],
)
def test_resolve_device(resource: str, device_id: str, index: int | None) -> None:
    found = resolve_device(device_id, resource, GPUS)
    assert (found.index if found else None) == index


def test_a_mig_device_uuid_is_traced_to_its_gpu() -> None:
    """Drivers R470+ name MIG devices MIG-<uuid>, unrelated to the GPU's UUID: only
    the MIG devices NVML lists under the GPU tell."""
    parent = dataclasses.replace(gpu(3, mig_enabled=True), mig_devices=("MIG-1234-abcd",))
    assert resolve_device("MIG-1234-abcd", "nvidia.com/mig-1g.10gb", [*GPUS, parent]) == parent
    assert resolve_device("mig-1234-ABCD::2", "nvidia.com/gpu", [*GPUS, parent]) == parent
    assert resolve_device("MIG-9999", "nvidia.com/gpu", [*GPUS, parent]) is None


def test_claims_join_advertised_and_held_devices_and_skip_our_own() -> None:
    ownership = find_foreign_claims(
        GPUS,
        [
            ResourceDevices("cnvrg.io/metagpu", (f"{uuid_for(0)}::0", f"{uuid_for(1)}::0")),
            ResourceDevices("nvidia.com/gpu", (uuid_for(1),)),
            ResourceDevices("nvidia.com/gpu", (uuid_for(2),)),
        ],
        [
            AssignedDevices("ml", "a", "main", "cnvrg.io/metagpu", (f"{uuid_for(0)}::0",)),
            AssignedDevices("ml", "b", "main", "nvidia.com/gpu", (uuid_for(2),)),
        ],
        own_resources=OWN,
    )
    assert list(ownership.claims) == [uuid_for(1), uuid_for(2)]
    one, two = ownership.claims.values()
    assert not one.held
    assert one.resources == ("nvidia.com/gpu",)
    assert two.held
    assert [str(h) for h in two.holders] == [f"ml/b/main (nvidia.com/gpu {uuid_for(2)})"]
    assert "held now by 1 container(s)" in two.reason()
    assert "nvidia.com/gpu (gpu-uuid" in one.reason()


def test_no_other_resource_no_claims() -> None:
    ownership = find_foreign_claims(
        GPUS,
        [ResourceDevices("cnvrg.io/metagpu", (f"{uuid_for(0)}::0",))],
        [],
        own_resources=OWN,
    )
    assert ownership.claims == {}
    assert ownership.reasons() == {}


def test_a_long_id_list_is_shortened_in_the_reason() -> None:
    ownership = find_foreign_claims(
        GPUS,
        [ResourceDevices("nvidia.com/gpu", tuple(f"1::{n}" for n in range(10)))],
        [],
        own_resources=OWN,
    )
    reason = ownership.reasons()[uuid_for(1)]
    assert "and 6 more" in reason
    assert "replica" in reason
