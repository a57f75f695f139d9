"""The node's ResourceSlice: one multi-allocatable device per healthy GPU (pure).

The shape is the one a kube-apiserver v1.36.2 accepted and the scheduler allocated
shares from (``../shared/fixtures/dra/resourceslice-consumable-accepted.json``):
``resource.k8s.io/v1``, one pool named after the node with one slice, devices
``gpu-<index>`` with ``allowMultipleAllocations: true``, attributes ``uuid``,
``productName``, ``index`` and ``numa``, and capacities ``units`` and ``memory``,
each with a ``requestPolicy`` (``default`` + ``validRange``).

Why one device per GPU rather than one per unit: a claim may be allocated at most 32
devices, so 50 meta-devices can never be one claim (captured:
``number of requested devices 50 exceeds the claim limit of 32``); consumable capacity
gives "50 units of one GPU" as one device with a ``shareID``.

A GPU the one health record (:class:`~plugin.gpu.health.GpuHealth`) calls Unhealthy, or
that discovery could not identify, or that runs MIG, is left out and its reason returned,
so the scheduler places nothing new on it. Device taints would keep it visible with a
reason, but any taint lowers the slice limit to 64 devices and needs the DRADeviceTaints
gate; removal works on every 1.36 cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from plugin.api.gpus import GpuInfo
from plugin.api.quantity import format_mib
from plugin.api.resources import DRA_MEMORY, DRA_UNITS
from plugin.dra.config import DraConfig
from plugin.gpu.health import UNHEALTHY, GpuHealth

API_VERSION: Final = "resource.k8s.io/v1"
KIND: Final = "ResourceSlice"
MAX_DEVICES_PER_SLICE: Final = 128
"""The API server's limit (``spec.devices: Too many: 200: must have at most 128 items``);
64 when any device has taints, counters or list attributes, none of which we use."""
UNITS: Final = DRA_UNITS
MEMORY: Final = DRA_MEMORY


class SliceError(ValueError):
    """The node's GPUs cannot be published as one slice; the message says why."""


@dataclass(frozen=True)
class SlicePlan:
    """What to publish and what was left out."""

    body: dict[str, Any]
    """The ResourceSlice object (without resourceVersion)."""
    devices: Mapping[str, str]
    """Device name → GPU UUID, for every device in the slice."""
    withdrawn: Mapping[str, str]
    """GPU UUID → why it is not in the slice."""


def device_name(gpu: GpuInfo) -> str:
    """``gpu-<index>``: a DNS label, stable while the GPU keeps its NVML index."""
    return f"gpu-{gpu.index}"


def slice_name(*, node_name: str, driver: str) -> str:
    """One slice per node and driver, named deterministically so that publishing again
    after a deletion or a restart replaces rather than duplicates it."""
    return f"{node_name}-{driver}"


def withdrawal_reason(gpu: GpuInfo, record: GpuHealth | None) -> str | None:
    """Why ``gpu`` must not be offered, or None when it may be."""
    if not gpu.identity_known:
        return "discovery could not read the GPU's UUID"
    if gpu.unhealthy_reason:
        return gpu.unhealthy_reason
    if gpu.mig_enabled:
        return "MIG is enabled: the GPU is split by hardware and cannot be shared as a whole"
    if record is not None and record.state == UNHEALTHY:
        return record.reason or "unhealthy"
    return None


def build_device(gpu: GpuInfo, *, config: DraConfig) -> dict[str, Any]:
    """One GPU as a multi-allocatable device with the configured request policies."""
    attributes: dict[str, Any] = {
        "uuid": {"string": gpu.uuid},
        "productName": {"string": gpu.name},
        "index": {"int": gpu.index},
    }
    if gpu.numa_node is not None:
        attributes["numa"] = {"int": gpu.numa_node}
    units, memory = config.units, config.memory
    memory_value = format_mib(gpu.memory_mib)
    return {
        "name": device_name(gpu),
        "allowMultipleAllocations": True,
        "attributes": attributes,
        "capacity": {
            UNITS: {
                "value": str(config.units_per_gpu),
                "requestPolicy": {
                    "default": str(units.default),
                    "validRange": {
                        "min": str(units.min),
                        "max": str(config.units_per_gpu),
                        "step": str(units.step),
                    },
                },
            },
            MEMORY: {
                "value": memory_value,
                "requestPolicy": {
                    "default": format_mib(min(memory.default_mib, gpu.memory_mib)),
                    "validRange": {
                        "min": format_mib(min(memory.min_mib, gpu.memory_mib)),
                        # max may not exceed the capacity and need not be a step multiple
                        "max": memory_value,
                        "step": format_mib(memory.step_mib),
                    },
                },
            },
        },
    }


def build_slice(
    gpus: Sequence[GpuInfo],
    *,
    records: Mapping[str, GpuHealth],
    config: DraConfig,
    node_name: str,
    generation: int = 1,
    blocked: str | None = None,
) -> SlicePlan:
    """The ResourceSlice for ``gpus`` on ``node_name``, healthy ones only, in index order.

    ``records`` is the health board's record per GPU UUID (missing = nothing known
    against it); ``blocked``, when set, withdraws every GPU with that reason (a node
    whose container runtime cannot apply CDI). Raises :class:`SliceError` past the API
    server's device limit."""
    devices: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    withdrawn: dict[str, str] = {}
    for gpu in sorted(gpus, key=lambda g: g.index):
        reason = blocked or withdrawal_reason(gpu, records.get(gpu.uuid))
        if reason is not None:
            withdrawn[gpu.uuid] = reason
            continue
        devices.append(build_device(gpu, config=config))
        names[device_name(gpu)] = gpu.uuid
    if len(devices) > MAX_DEVICES_PER_SLICE:
        raise SliceError(
            f"{len(devices)} GPUs exceed the {MAX_DEVICES_PER_SLICE} devices one slice may hold"
        )
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": slice_name(node_name=node_name, driver=config.driver_name)},
        "spec": {
            "driver": config.driver_name,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
    return SlicePlan(body=body, devices=names, withdrawn=withdrawn)


def same_devices(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two slices offer the same devices on the same node (generation aside):
    publishing is needed only when this is False."""
    sa, sb = a.get("spec") or {}, b.get("spec") or {}
    return bool(
        sa.get("driver") == sb.get("driver")
        and sa.get("nodeName") == sb.get("nodeName")
        and (sa.get("pool") or {}).get("name") == (sb.get("pool") or {}).get("name")
        and sa.get("devices") == sb.get("devices")
    )
