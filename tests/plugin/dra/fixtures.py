"""The captured DRA fixtures (``tests/fixtures/dra``, a copy of ``../shared/fixtures/dra``)
and the node they were captured on, for the DRA plugin's tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from plugin.api.gpus import GpuInfo
from plugin.dra.claims import ClaimRef
from plugin.dra.config import DraConfig
from tests.conftest import REPO_ROOT

DRA_FIXTURES = REPO_ROOT / "tests" / "fixtures" / "dra"
NODE = "localhost"
DRIVER = "gpu.metagpu.io"

A100 = "NVIDIA A100-SXM4-80GB"
CAPTURED_GPUS = (
    GpuInfo(
        index=0,
        uuid="GPU-0b1c2d3e-0000-4000-8000-000000000001",
        name=A100,
        memory_mib=81920,
        minor_number=0,
        pci_bus_id="00000000:07:00.0",
        numa_node=0,
    ),
    GpuInfo(
        index=1,
        uuid="GPU-0b1c2d3e-0000-4000-8000-000000000002",
        name=A100,
        memory_mib=81920,
        minor_number=1,
        pci_bus_id="00000000:0B:00.0",
        numa_node=0,
    ),
)
"""The 2 x A100-SXM4-80GB of node ``localhost`` the fixtures were captured on."""

PREPARE_CALLS = (
    "kubelet-node-prepare-consumable-50-units.json",
    "kubelet-node-prepare-empty-cdi.json",
)
"""Captured NodePrepareResources calls on the consumable (one device per GPU) slice."""


def load(name: str) -> Any:
    return json.loads((DRA_FIXTURES / name).read_text())


def dra_config(cdi_dir: Path, **overrides: Any) -> DraConfig:
    return DraConfig.model_validate({"cdi_dir": str(cdi_dir), "node_name": NODE, **overrides})


def claim_from_call(call: dict[str, Any]) -> tuple[ClaimRef, dict[str, Any]]:
    """The claim a captured prepare call names, rebuilt as the API server served it:
    its reference, and an object whose status carries the allocation the plugin read."""
    (request,) = call["request"]["claims"]
    ref = ClaimRef(namespace=request["namespace"], name=request["name"], uid=request["uid"])
    allocation = call["claim_allocation_read_by_plugin"][ref.uid]
    return ref, claim_object(ref, allocation)


def claim_object(ref: ClaimRef, allocation: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {"allocation": allocation},
    }
