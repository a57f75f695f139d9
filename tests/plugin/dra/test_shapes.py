"""What we write, checked against the published schemas of its readers.

* The ResourceSlice: the Kubernetes 1.36 OpenAPI schema, strictly (unknown fields are
  errors), through kubernetes-validate, as the webhook's tests check its pods.
* Each CDI spec: the CDI specification's JSON schema (``schema/schema.json`` and
  ``schema/defs.json`` of cncf-tags/container-device-interface, looked up at commits
  9c1a1bde and 1537b1db), restated below in our own words, plus the name rules its Go
  parser applies when a runtime loads the spec (``pkg/parser/parser.go``:
  ``ValidateVendorName``/``ValidateClassName``: a letter first, letters, digits, ``_-.``,
  a letter or digit last; ``ValidateDeviceName``: also ``:`` and a digit first) and its
  ``KEY=VALUE`` environment entries. The schema is loose (only names and structure), so
  the parser's rules are where a bad spec would really be refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs; kubernetes-validate brings it
import kubernetes_validate
import pytest

from plugin.api.gpus import GpuInfo
from plugin.dra.cdi import CONTROL_DEVICE_NODES
from plugin.dra.claims import ClaimRef
from plugin.dra.prepare import Preparer
from plugin.dra.slices import build_slice
from plugin.dra.validation import slice_errors
from tests.plugin.dra.fixtures import CAPTURED_GPUS, NODE, dra_config, load
from tests.plugin.dra.gpu_check import CONTROL_NODES

KUBERNETES_VERSION = "1.36"

VENDOR_OR_CLASS = r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?"
DEVICE_NAME = r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$"
CDI_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")

_STRINGS = {"type": "array", "items": {"type": "string"}}
_DEVICE_NODE = {
    "type": "object",
    "required": ["path"],
    "properties": {
        "path": {"type": "string"},
        "hostPath": {"type": "string"},
        "permissions": {"type": "string"},
        "type": {"type": "string"},
        "major": {"type": "integer"},
        "minor": {"type": "integer"},
        "uid": {"type": "integer", "minimum": 0},
        "gid": {"type": "integer", "minimum": 0},
    },
}
_CONTAINER_EDITS = {
    "type": "object",
    "properties": {
        # the schema says strings; the runtime splits each at its first "="
        "env": {"type": "array", "items": {"type": "string", "pattern": r"^[^=]+=.*$"}},
        "deviceNodes": {"type": "array", "items": _DEVICE_NODE},
        "mounts": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["hostPath", "containerPath"],
                "properties": {
                    "hostPath": {"type": "string"},
                    "containerPath": {"type": "string"},
                    "options": _STRINGS,
                    "type": {"type": "string"},
                },
            },
        },
        "hooks": {"type": "array", "items": {"type": "object", "required": ["hookName", "path"]}},
        "intelRdt": {"type": "object"},
        "additionalGids": _STRINGS,
    },
}
CDI_SPEC_SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "required": ["cdiVersion", "kind", "devices"],
    "properties": {
        "cdiVersion": {"type": "string", "enum": list(CDI_VERSIONS)},
        "kind": {"type": "string", "pattern": f"^{VENDOR_OR_CLASS}/{VENDOR_OR_CLASS}$"},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "devices": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "containerEdits"],
                "properties": {
                    "name": {"type": "string", "pattern": DEVICE_NAME},
                    "annotations": {"type": "object"},
                    "containerEdits": _CONTAINER_EDITS,
                },
            },
        },
        "containerEdits": _CONTAINER_EDITS,
    },
}

CLAIMS = (
    "claim-p50-a-50-units-40gi-allocated.json",
    "claim-10gi-memory-only-allocated.json",
    "claim-1500mi-rounded-allocated.json",
    "claim-no-capacity-request-allocated.json",
    "claim-70-units-allocated-after-release.json",
)


def test_the_schema_restatement_refuses_what_the_parser_refuses() -> None:
    validator = jsonschema.Draft7Validator(CDI_SPEC_SCHEMA)
    device = {"name": "x", "containerEdits": {}}
    good = {"cdiVersion": "0.5.0", "kind": "a.b/c", "devices": [device]}
    assert validator.is_valid(good)
    for bad in (
        {**good, "kind": "gpu"},  # no class
        {**good, "kind": "1vendor/gpu"},  # a vendor starts with a letter
        {**good, "devices": [{"name": "-x", "containerEdits": {}}]},
        {**good, "devices": [{"name": "x"}]},  # containerEdits required
        {**good, "devices": []},
        {**good, "containerEdits": {"env": ["NO_VALUE"]}},
        {**good, "containerEdits": {"deviceNodes": [{"hostPath": "/dev/x"}]}},
        {**good, "containerEdits": {"mounts": [{"hostPath": "/x"}]}},  # no containerPath
        {
            **good,
            "containerEdits": {
                "mounts": [{"hostPath": "/x", "containerPath": "/y", "options": "rw"}]
            },
        },
    ):
        assert not validator.is_valid(bad), bad


@pytest.mark.parametrize("name", CLAIMS)
def test_every_cdi_spec_we_write_is_valid(tmp_path: Path, name: str) -> None:
    preparer = Preparer(config=dra_config(tmp_path), node_name=NODE)
    preparer.offer(CAPTURED_GPUS, withdrawn={})
    claim = load(name)
    meta = claim["metadata"]
    (device,) = preparer.prepare(ClaimRef(meta["namespace"], meta["name"], meta["uid"]), claim)
    (path,) = tmp_path.glob("*.json")
    spec = json.loads(path.read_text())
    jsonschema.Draft7Validator(CDI_SPEC_SCHEMA).validate(spec)
    (cdi_id,) = device.cdi_device_ids
    assert cdi_id == f"{spec['kind']}={spec['devices'][0]['name']}"
    assert oct(path.stat().st_mode & 0o777) == "0o644"  # the runtime reads it


@pytest.mark.parametrize(
    "settings",
    [{}, {"units_per_gpu": 1000, "units": {"default": 10, "min": 10, "step": 10}}],
)
def test_the_slice_we_build_passes_the_1_36_openapi_schema(
    tmp_path: Path, settings: dict[str, Any]
) -> None:
    config = dra_config(tmp_path, **settings)
    plan = build_slice(CAPTURED_GPUS, records={}, config=config, node_name=NODE)
    kubernetes_validate.validate(plan.body, KUBERNETES_VERSION, strict=True)


H100 = GpuInfo(
    index=0,
    uuid="GPU-b8aca273-79c4-ddf2-b8d1-386c407ba247",
    name="NVIDIA H100 80GB HBM3",
    memory_mib=81559,
    minor_number=0,
    pci_bus_id="",
    numa_node=None,
)
"""What NVML reported on a lent H100 (2026-11-27, tests/plugin/dra/gpu_check.py): 81559 MiB, not a
whole GiB, and no NUMA node; /dev/nvidia0, nvidiactl, nvidia-uvm and nvidia-uvm-tools
all existed there, the nodes each CDI spec names."""


def test_a_real_h100_gives_a_valid_slice(tmp_path: Path) -> None:
    plan = build_slice((H100,), records={}, config=dra_config(tmp_path), node_name=NODE)
    (device,) = plan.body["spec"]["devices"]
    assert "numa" not in device["attributes"]
    memory = device["capacity"]["memory"]
    assert memory["value"] == memory["requestPolicy"]["validRange"]["max"] == "81559Mi"
    assert slice_errors(plan.body) == []  # a max off the 1Gi step was accepted (captured)
    kubernetes_validate.validate(plan.body, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("name", CLAIMS)
def test_the_captured_claims_pass_the_schema_the_harness_serves_them_by(name: str) -> None:
    """The claims the tests put into the in-test API server are real 1.36 objects."""
    kubernetes_validate.validate(load(name), KUBERNETES_VERSION, strict=True)


def test_the_gpu_check_looks_for_the_nodes_the_specs_name() -> None:
    assert CONTROL_NODES == CONTROL_DEVICE_NODES
