"""Our slice checks give the verdicts and texts a v1.36.2 API server gave every captured
slice, and every slice we build passes them."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from plugin.dra.slices import build_slice
from plugin.dra.validation import slice_errors
from tests.plugin.dra.fixtures import CAPTURED_GPUS, NODE, dra_config, load

VARIANTS = load("resourceslice-consumable-variants.json")


def api_server_causes(exchange: dict[str, Any]) -> set[str]:
    """The causes in a 422 message: ``<Kind> "<name>" is invalid: [a, b]`` or ``... : a``."""
    if exchange["response"]["code"] in (200, 201):
        return set()
    message = exchange["response"]["body"]["message"]
    causes = message.split(" is invalid: ", 1)[1]
    if causes.startswith("[") and causes.endswith("]"):
        causes = causes[1:-1]
    return set(re.split(r", (?=spec\.)", causes))


@pytest.mark.parametrize("variant", VARIANTS, ids=[v["variant"] for v in VARIANTS])
def test_each_captured_variant_gets_the_api_servers_verdict(variant: dict[str, Any]) -> None:
    assert set(slice_errors(variant["request"]["body"])) == api_server_causes(variant)


def test_too_many_devices_as_captured() -> None:
    exchange = load("resourceslice-meta-200-devices-rejected.json")
    assert set(slice_errors(exchange["request"]["body"])) == api_server_causes(exchange)
    body = copy.deepcopy(exchange["request"]["body"])
    body["spec"]["devices"] = body["spec"]["devices"][:128]  # the accepted 128
    assert slice_errors(body) == []


def test_taints_lower_the_limit_to_64_as_captured() -> None:
    exchange = load("resourceslice-meta-65-tainted-devices-rejected.json")
    body = copy.deepcopy(exchange["request"]["body"])
    taint = {"key": "gpu.metagpu.io/unhealthy", "effect": "NoSchedule"}
    body["spec"]["devices"] = [
        {"name": f"gpu-0-unit-{i:02d}", "taints": [taint]} for i in range(65)
    ]
    assert set(slice_errors(body)) == api_server_causes(exchange)
    body["spec"]["devices"] = body["spec"]["devices"][:64]
    assert slice_errors(body) == []


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"units_per_gpu": 1000, "units": {"default": 10, "min": 10, "step": 30}},
        {"memory": {"default_mib": 512, "min_mib": 256, "step_mib": 256}},
        {"memory": {"default_mib": 200000, "min_mib": 200000}},  # above the GPU: clamped
    ],
)
def test_every_slice_we_build_passes(tmp_path: Path, settings: dict[str, Any]) -> None:
    config = dra_config(tmp_path, **settings)
    plan = build_slice(CAPTURED_GPUS, records={}, config=config, node_name=NODE)
    assert slice_errors(plan.body) == []


def test_an_unparsable_quantity_is_named() -> None:
    body = copy.deepcopy(VARIANTS[0]["request"]["body"])
    device = body["spec"]["devices"][1]
    device["capacity"]["units"]["requestPolicy"]["default"] = "lots"
    assert slice_errors(body)[-1] == (
        "spec.devices[1].capacity[units].requestPolicy: 'lots' is not a quantity; "
        "write a number such as 0.5, 500m, 1.5 or 2"
    )
