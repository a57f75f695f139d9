"""Builders for plugin tests: GPUs, device tables and simulated-GPU files.

Like NVIDIA's ``internal/resource/testing`` builders: tests say what matters
(memory, NUMA node) and get valid defaults for the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from plugin.api.config import DeviceIdStrategy
from plugin.api.resources import DEFAULT_RESOURCE_NAME, ResourceName
from plugin.gpu.backend import GpuInfo
from plugin.placement.devices import DeviceTable


def uuid_for(index: int) -> str:
    return f"GPU-00000000-0000-4000-8000-{index:012d}"


def gpu(
    index: int,
    *,
    memory_mib: int = 81920,
    numa_node: int | None = 0,
    mig_enabled: bool = False,
    unhealthy_reason: str | None = None,
    uuid: str | None = None,
    name: str = "NVIDIA A100-SXM4-80GB",
) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=uuid or uuid_for(index),
        name=name,
        memory_mib=memory_mib,
        minor_number=index,
        pci_bus_id=f"00000000:{0x10 + index:02X}:00.0",
        numa_node=numa_node,
        mig_enabled=mig_enabled,
        unhealthy_reason=unhealthy_reason,
    )


def gpus(count: int, *, numa_nodes: int = 1, memory_mib: int = 81920) -> list[GpuInfo]:
    """``count`` GPUs spread evenly over ``numa_nodes`` nodes, in index order."""
    per_node = max(1, -(-count // numa_nodes))
    return [gpu(i, numa_node=i // per_node, memory_mib=memory_mib) for i in range(count)]


def table(
    infos: Sequence[GpuInfo],
    *,
    units_per_gpu: int = 100,
    id_strategy: DeviceIdStrategy = "uuid",
    resource: str = DEFAULT_RESOURCE_NAME,
) -> DeviceTable:
    return DeviceTable(
        ResourceName(resource), infos, units_per_gpu=units_per_gpu, id_strategy=id_strategy
    )


def gpus_file_spec(infos: Sequence[GpuInfo], **per_gpu: Any) -> dict[str, Any]:
    """A simulated-GPUs YAML document for ``infos``; ``per_gpu`` adds fields to every GPU."""
    return {
        "gpus": [
            {
                "uuid": g.uuid,
                "name": g.name,
                "memory_mib": g.memory_mib,
                "numa_node": g.numa_node,
                "index": g.index,
                **per_gpu,
            }
            for g in infos
        ]
    }


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    """Write atomically (rename), like a ConfigMap update, so readers never see half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    tmp.replace(path)
    return path
