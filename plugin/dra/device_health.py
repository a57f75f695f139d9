"""What the DRA health stream tells the kubelet: each device's health now (pure).

The kubelet (ResourceHealthStatus, on by default in 1.36) opens
``/v1alpha1.DRAResourceHealth/NodeWatchResources`` right after registering and, when it
gets UNIMPLEMENTED, logs an error and retries every 5 s for as long as the driver is
registered (captured). Served, it puts each device's health into the status of the pods
whose claims hold it, so a pod on a GPU that fell off the bus says so. Every message is
the complete list (the kubelet marks a device left out Unknown after a timeout), built
from the one health record, so it never disagrees with the slice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from plugin.api.gpus import GpuInfo
from plugin.dra.slices import device_name
from plugin.gpu.health import UNHEALTHY, GpuHealth


@dataclass(frozen=True)
class DeviceHealthEntry:
    pool: str
    device: str
    healthy: bool
    last_updated_s: int
    """Unix seconds of the last change of the GPU's state (when it was first seen if never)."""


def device_health(
    gpus: Sequence[GpuInfo], *, records: Mapping[str, GpuHealth], pool: str
) -> tuple[DeviceHealthEntry, ...]:
    """One entry per identified GPU, in index order. A GPU with no record is healthy."""
    entries = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        if not gpu.identity_known:
            continue  # no stable device to name; it is not in the slice either
        record = records.get(gpu.uuid)
        unhealthy = bool(gpu.unhealthy_reason) or (record is not None and record.state == UNHEALTHY)
        entries.append(
            DeviceHealthEntry(
                pool=pool,
                device=device_name(gpu),
                healthy=not unhealthy,
                last_updated_s=int(record.since) if record is not None else 0,
            )
        )
    return tuple(entries)
