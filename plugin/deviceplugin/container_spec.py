"""What ``Allocate`` tells the runtime for one container (pure; the servicer makes it protobuf).

After NVIDIA's ``internal/plugin/server.go`` (``getAllocateResponse``,
``apiEnvs``, ``apiMounts``, ``updateResponseForMPS``), plus metagpu's own
variables. For a container holding meta-devices on one or more GPUs:

* ``NVIDIA_VISIBLE_DEVICES``: the GPUs (UUIDs or indices per
  ``device_id_strategy``) in NVML order, or, with the ``volume-mounts``
  strategy, ``/var/run/nvidia-container-devices`` plus one ``/dev/null``
  mount per GPU under it (the container cannot override a mount the way it can
  override an env var);
* ``METAGPU_UNITS``: total units; ``METAGPU_GPU_FRACTION``: the same in GPUs
  (``1.5``);
* ``METAGPU_MEMORY_LIMIT_MB``: per GPU, in the order of
  ``NVIDIA_VISIBLE_DEVICES``, comma-separated: ``floor(memory_mib × units /
  units_per_gpu)``. "MB" is MiB (2^20 bytes), NVML's unit;
* ``METAGPU_DEVICE_IDS``: the meta-devices, compressed to ranges per GPU
  (``GPU-a::0-49,GPU-b::7``) so a whole-node allocation stays far below the
  kernel's 128 KiB limit for one environment string;
* ``METAGPU_AGENT_SOCKET`` and a read-only mount of the agent's socket
  directory, so ``mgctl`` inside the container finds the node agent;
* with MPS: ``CUDA_MPS_PIPE_DIRECTORY``, the pipe directory mount (and
  ``/dev/shm``) from :mod:`plugin.api.mps_clients`, and
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``0=40960M,1=20480M``) keyed by each
  GPU's ordinal inside the container, i.e. its position in
  ``NVIDIA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from plugin.api.config import PluginConfig
from plugin.api.limits import memory_limit_mib, pinned_limit_env
from plugin.api.mps_clients import MountSpec, mps_client_env, mps_client_mounts
from plugin.api.resources import (
    AGENT_SOCKET_NAME,
    CONTAINER_AGENT_DIR,
    ENV_AGENT_SOCKET,
    ENV_DEVICE_IDS,
    ENV_GPU_FRACTION,
    ENV_MEMORY_LIMIT_MB,
    ENV_MPS_PINNED_DEVICE_MEM_LIMIT,
    ENV_NVIDIA_VISIBLE_DEVICES,
    ENV_UNITS,
    REPLICA_SEPARATOR,
)
from plugin.placement.devices import DEVICE_ORDER, Gpu, MetaDevice

VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
"""NVIDIA's ``deviceListAsVolumeMountsContainerPathRoot``; the NVIDIA container
runtime reads the GPU list from mount destinations under it."""

VOLUME_MOUNTS_HOST_PATH = "/dev/null"
"""NVIDIA's ``deviceListAsVolumeMountsHostPath``: the mount source is irrelevant."""


@dataclass(frozen=True)
class GpuShare:
    """The part of one GPU a container holds."""

    gpu: Gpu
    units: int
    memory_limit_mib: int


@dataclass(frozen=True)
class ContainerSpec:
    """Everything one ``ContainerAllocateResponse`` carries."""

    envs: dict[str, str]
    mounts: tuple[MountSpec, ...]
    shares: tuple[GpuShare, ...]


def build_container_spec(devices: Sequence[MetaDevice], *, config: PluginConfig) -> ContainerSpec:
    """The response for one container holding ``devices`` (already validated)."""
    units_per_gpu = config.units_per_gpu
    ordered = sorted(devices, key=DEVICE_ORDER)
    per_gpu: dict[int, list[MetaDevice]] = {}
    for d in ordered:
        per_gpu.setdefault(d.gpu.position, []).append(d)
    shares = tuple(
        GpuShare(
            gpu=held[0].gpu,
            units=len(held),
            memory_limit_mib=memory_limit_mib(
                len(held), units_per_gpu=units_per_gpu, memory_total_mib=held[0].gpu.memory_mib
            ),
        )
        for held in per_gpu.values()
    )
    total = sum(s.units for s in shares)
    gpu_ids = [s.gpu.device_id for s in shares]
    envs: dict[str, str] = {
        ENV_UNITS: str(total),
        ENV_GPU_FRACTION: format_fraction(total, units_per_gpu),
        ENV_MEMORY_LIMIT_MB: ",".join(str(s.memory_limit_mib) for s in shares),
        ENV_DEVICE_IDS: compress_ids(ordered, presorted=True),
        ENV_AGENT_SOCKET: str(PurePosixPath(CONTAINER_AGENT_DIR) / AGENT_SOCKET_NAME),
    }
    mounts: list[MountSpec] = [
        MountSpec(
            container_path=CONTAINER_AGENT_DIR,
            host_path=str(config.agent.socket_dir),
            read_only=True,
        )
    ]
    if config.device_list_strategy == "envvar":
        envs[ENV_NVIDIA_VISIBLE_DEVICES] = ",".join(gpu_ids)
    else:
        envs[ENV_NVIDIA_VISIBLE_DEVICES] = VOLUME_MOUNTS_ROOT
        mounts.extend(
            MountSpec(
                container_path=f"{VOLUME_MOUNTS_ROOT}/{gpu_id}",
                host_path=VOLUME_MOUNTS_HOST_PATH,
                read_only=True,
            )
            for gpu_id in gpu_ids
        )
    if config.mps.enabled:
        # the pipe directory and /dev/shm, as the DRA plugin's CDI spec hands them
        envs.update(mps_client_env(config.mps))
        envs[ENV_MPS_PINNED_DEVICE_MEM_LIMIT] = pinned_limit_env(
            [s.memory_limit_mib for s in shares]
        )
        mounts.extend(mps_client_mounts(config.mps))
    return ContainerSpec(envs=envs, mounts=tuple(mounts), shares=shares)


def format_fraction(units: int, units_per_gpu: int) -> str:
    """``150`` of ``100`` → ``1.5``; at most 4 decimals, no trailing zeros."""
    text = f"{units / units_per_gpu:.4f}".rstrip("0").rstrip(".")
    return text or "0"


def compress_ids(devices: Sequence[MetaDevice], *, presorted: bool = False) -> str:
    """Meta-device IDs as ``<gpu>::<first>-<last>`` runs, GPUs in NVML order.

    ``GPU-a::0-49,GPU-b::7`` stands for ``GPU-a::0`` … ``GPU-a::49`` and
    ``GPU-b::7``; :func:`expand_ids` is the inverse."""
    runs: list[str] = []
    ordered = devices if presorted else sorted(devices, key=DEVICE_ORDER)
    i = 0
    while i < len(ordered):
        start = ordered[i]
        j = i
        while (
            j + 1 < len(ordered)
            and ordered[j + 1].gpu.position == start.gpu.position
            and ordered[j + 1].unit == ordered[j].unit + 1
        ):
            j += 1
        prefix = f"{start.gpu.device_id}{REPLICA_SEPARATOR}"
        last = ordered[j].unit
        runs.append(f"{prefix}{start.unit}" if j == i else f"{prefix}{start.unit}-{last}")
        i = j + 1
    return ",".join(runs)


def expand_ids(text: str) -> list[str]:
    """The meta-device IDs a :func:`compress_ids` string stands for."""
    ids: list[str] = []
    for run in filter(None, text.split(",")):
        gpu, sep, span = run.rpartition(REPLICA_SEPARATOR)
        if not sep:
            raise ValueError(f"not <gpu>{REPLICA_SEPARATOR}<n>[-<m>]: {run!r}")
        first, dash, last = span.partition("-")
        lo = int(first)
        hi = int(last) if dash else lo
        ids.extend(f"{gpu}{REPLICA_SEPARATOR}{n}" for n in range(lo, hi + 1))
    return ids
