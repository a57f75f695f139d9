"""The CDI spec of one prepared share: what the runtime adds to a container (pure).

With DRA the kubelet passes the runtime CDI device IDs (``vendor/class=name``), and a
CDI-capable runtime (containerd >= 1.7 with CDI on, 2.x, CRI-O) applies the matching
spec from ``/var/run/cdi``. One spec file per share, named after the claim UID, so
Unprepare removes a claim's files without reading the claim (it may be gone by then).

Why one CDI device per *share*, not per GPU: two claims sharing GPU 0 need different
limits, and the CDI registry refuses a device name defined by two spec files. So the
name is the scheduler's ``shareID`` (a fresh UUID per allocation), or
``<claim UID>-<device>`` for a device allocated whole. The captured recording plugin
answered ``gpu.metagpu.io/gpu=<GPU UUID>`` (one name per GPU); that works for one claim
per GPU only (kubernetes/kubernetes#134519 is this very failure).

The limits are the share's, computed by :mod:`plugin.api.limits` (the one formula):

* memory: the ``memory`` the scheduler charged the share (requested, rounded up to the
  policy's step, or the policy default), floored to MiB and capped at the GPU;
  consumable capacity guarantees the shares of one GPU add up to at most its memory.
  A result without consumed memory (a device allocated whole) gets
  :func:`~plugin.api.limits.memory_limit_mib` of its units;
* compute: :func:`~plugin.api.limits.thread_percentage` of the charged ``units``.

With ``mps.enabled`` the spec also carries what every MPS client needs, from
:mod:`plugin.api.mps_clients` (the device plugin's ``Allocate`` hands the same):
``CUDA_MPS_PIPE_DIRECTORY`` and CDI ``mounts`` of the host's pipe directory (and of
``mps.shm_directory`` at ``/dev/shm``). Without those two the limits above are
variables nobody reads: CUDA finds no daemon and runs the client unlimited.

A container holds one share per GPU in the way the webhook's DRA mode will write claims
(one claim, one request, count 1), so its CUDA ordinal for the share is 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final

from plugin.api.cdi_names import cdi_kind, driver_spec_prefix
from plugin.api.gpus import GpuInfo
from plugin.api.limits import memory_limit_mib, pinned_limit_env, thread_percentage
from plugin.api.mps_clients import MountSpec, mps_client_env, mps_client_mounts
from plugin.api.resources import (
    AGENT_SOCKET_NAME,
    CONTAINER_AGENT_DIR,
    ENV_AGENT_SOCKET,
    ENV_COMPUTE_POLICY,
    ENV_MEMORY_LIMIT_MB,
    ENV_MPS_PINNED_DEVICE_MEM_LIMIT,
    ENV_MPS_THREAD_PERCENTAGE,
    ENV_NVIDIA_VISIBLE_DEVICES,
    ENV_UNITS,
)
from plugin.dra.claims import AllocatedShare
from plugin.dra.config import DraConfig

CDI_VERSION: Final = "0.5.0"
"""The oldest spec version with everything used here (env, deviceNodes, spec-level
edits), so containerd 1.7's vendored CDI library reads it."""
CONTROL_DEVICE_NODES: Final = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
"""Nodes every CUDA process needs besides its GPU's ``/dev/nvidia<minor>``."""
MOUNT_OPTIONS_RW: Final = ("rbind", "rw", "nosuid", "nodev")
"""A read-write bind of a host directory: what the kubelet asks the runtime for a
device plugin's ``Mount`` (containerd turns it into ``rbind``, ``rw``), plus
``nosuid``/``nodev`` as NVIDIA's DRA driver mounts its MPS directories: a client has no
business running set-uid programs or device files from the pipe directory. CDI
(``specs-go`` ``Mount``: ``hostPath``, ``containerPath``, ``options``, and ``type``
from 0.4.0) leaves the type out here: runc binds a mount whose options say ``rbind``."""
MOUNT_OPTIONS_RO: Final = ("rbind", "ro", "nosuid", "nodev")


def cdi_device_name(share: AllocatedShare, *, claim_uid: str) -> str:
    """Unique per share on the node (see the module docstring)."""
    return share.share_id or f"{claim_uid}-{share.device}"


def cdi_device_id(share: AllocatedShare, *, driver: str, claim_uid: str) -> str:
    """The fully qualified ID the kubelet hands the runtime."""
    return f"{cdi_kind(driver)}={cdi_device_name(share, claim_uid=claim_uid)}"


def spec_file_prefix(*, driver: str, claim_uid: str) -> str:
    """Every spec file of one claim starts with this (how Unprepare finds them)."""
    return f"{driver_spec_prefix(driver)}{claim_uid}_"


def spec_file_name(share: AllocatedShare, *, driver: str, claim_uid: str) -> str:
    """One file per share: two requests of one claim may share one GPU (two shareIDs)."""
    key = share.share_id or share.device
    return f"{spec_file_prefix(driver=driver, claim_uid=claim_uid)}{key}.json"


@dataclass(frozen=True)
class ShareLimits:
    """What one share may use of its GPU."""

    units: int
    memory_mib: int
    thread_percentage: int | None


def share_limits(share: AllocatedShare, *, gpu: GpuInfo, config: DraConfig) -> ShareLimits:
    """The share's limits (see the module docstring for why memory is the charged amount)."""
    units = config.units_per_gpu if share.units is None else min(share.units, config.units_per_gpu)
    if share.memory_mib is None:
        memory = memory_limit_mib(
            units, units_per_gpu=config.units_per_gpu, memory_total_mib=gpu.memory_mib
        )
    else:
        memory = min(share.memory_mib, gpu.memory_mib)
    percent = thread_percentage(
        units, units_per_gpu=config.units_per_gpu, policy=config.compute_policy
    )
    return ShareLimits(units=units, memory_mib=memory, thread_percentage=percent)


def build_spec(
    share: AllocatedShare, *, gpu: GpuInfo, claim_uid: str, config: DraConfig
) -> dict[str, Any]:
    """The CDI spec (one device) for one share of ``gpu``."""
    limits = share_limits(share, gpu=gpu, config=config)
    env = [
        f"{ENV_NVIDIA_VISIBLE_DEVICES}={gpu.uuid}",
        f"{ENV_UNITS}={limits.units}",
        f"{ENV_MEMORY_LIMIT_MB}={limits.memory_mib}",
        f"{ENV_MPS_PINNED_DEVICE_MEM_LIMIT}={pinned_limit_env([limits.memory_mib])}",
        f"{ENV_COMPUTE_POLICY}={config.compute_policy}",
    ]
    if limits.thread_percentage is not None:
        env.append(f"{ENV_MPS_THREAD_PERCENTAGE}={limits.thread_percentage}")
    env.extend(f"{name}={value}" for name, value in mps_client_env(config.mps).items())
    mounts = list(mps_client_mounts(config.mps))
    if config.agent_socket_dir is not None:
        env.append(f"{ENV_AGENT_SOCKET}={PurePosixPath(CONTAINER_AGENT_DIR) / AGENT_SOCKET_NAME}")
        mounts.insert(0, agent_mount(config.agent_socket_dir))
    edits: dict[str, Any] = {
        "env": env,
        "deviceNodes": [{"path": f"/dev/nvidia{gpu.minor_number}"}],
    }
    if mounts:
        edits["mounts"] = [cdi_mount(m) for m in mounts]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": cdi_kind(config.driver_name),
        "devices": [{"name": cdi_device_name(share, claim_uid=claim_uid), "containerEdits": edits}],
        "containerEdits": {"deviceNodes": [{"path": p} for p in CONTROL_DEVICE_NODES]},
    }


def agent_mount(socket_dir: Path) -> MountSpec:
    """The node agent's socket directory, read-only: ``mgctl`` in the container asks the
    agent about its own share (the device plugin's Allocate mounts the same)."""
    return MountSpec(container_path=CONTAINER_AGENT_DIR, host_path=str(socket_dir), read_only=True)


def cdi_mount(mount: MountSpec) -> dict[str, Any]:
    """One CDI ``mounts`` entry: a bind of a host path (see :data:`MOUNT_OPTIONS_RW`)."""
    return {
        "hostPath": mount.host_path,
        "containerPath": mount.container_path,
        "options": list(MOUNT_OPTIONS_RO if mount.read_only else MOUNT_OPTIONS_RW),
    }
