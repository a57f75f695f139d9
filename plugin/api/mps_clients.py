"""What every MPS client container gets besides its limits (pure; shared words).

One definition for both ways a container reaches a GPU: the device plugin's
``Allocate`` (:mod:`plugin.deviceplugin.container_spec`, as kubelet mounts) and the
DRA plugin's CDI spec (:mod:`plugin.dra.cdi`, as CDI ``mounts``). They must agree, or
a pod would find the daemon under one plugin and run without MPS (and without its
limits) under the other:

* ``CUDA_MPS_PIPE_DIRECTORY``: ``mps.container_pipe_directory``, where the host's
  pipe directory is mounted read-write (clients create their own pipes there);
* with ``mps.shm_directory``: that host directory at ``/dev/shm``, because the MPS
  server (started by the daemon in the plugin's container) and its clients exchange
  shared memory there and must share one tmpfs, as NVIDIA's plugin arranges
  (``updateResponseForMPS``, ``mount-shm``).

The per-share limits (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, the thread percentage)
are :mod:`plugin.api.limits`, computed by each caller from what it knows of the share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from plugin.api.config import MpsConfig
from plugin.api.resources import ENV_MPS_PIPE_DIRECTORY

SHM_PATH: Final = "/dev/shm"
"""Where ``mps.shm_directory`` is mounted in MPS clients (NVIDIA's ``ShmDir``)."""


@dataclass(frozen=True)
class MountSpec:
    """A host path in a container: the shape both the kubelet's ``Mount`` and CDI's
    ``mounts`` entries are made from."""

    container_path: str
    host_path: str
    read_only: bool


def mps_client_env(mps: MpsConfig) -> dict[str, str]:
    """The MPS variables every client gets; empty without ``mps.enabled``."""
    if not mps.enabled:
        return {}
    return {ENV_MPS_PIPE_DIRECTORY: str(mps.container_pipe_directory)}


def mps_client_mounts(mps: MpsConfig) -> tuple[MountSpec, ...]:
    """The pipe directory (and the shm directory when set); none without ``mps.enabled``."""
    if not mps.enabled:
        return ()
    mounts = [
        MountSpec(
            container_path=str(mps.container_pipe_directory),
            host_path=str(mps.pipe_directory),
            read_only=False,
        )
    ]
    if mps.shm_directory is not None:
        mounts.append(
            MountSpec(container_path=SHM_PATH, host_path=str(mps.shm_directory), read_only=False)
        )
    return tuple(mounts)
