"""What one physical GPU is, as discovery reports it: shared by every component.

Here in the shared contract rather than in :mod:`plugin.gpu.backend` (the
driver port, which re-exports it) because the placement policy
(:mod:`plugin.placement`) is built from it, and placement must stay usable by
a component that never opens a GPU driver (a scheduler extender learns a
node's GPUs from the API server, not from NVML).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuInfo:
    """What is known about one physical GPU at discovery time."""

    index: int
    """NVML index: the order the driver enumerates GPUs in."""
    uuid: str
    """``GPU-xxxxxxxx-...``; stable across reboots, unlike the index."""
    name: str
    """Product name, e.g. ``NVIDIA A100-SXM4-80GB``."""
    memory_mib: int
    """Total framebuffer memory in MiB."""
    minor_number: int
    """N in ``/dev/nvidiaN``."""
    pci_bus_id: str
    """``00000000:3B:00.0``; what ``nvidia-smi`` shows and the kernel logs name."""
    numa_node: int | None
    """NUMA node of the GPU's PCI root, None when unknown or single-node."""
    mig_enabled: bool = False
    """MIG mode on: the GPU is split by hardware and cannot be shared as a whole."""
    mig_devices: tuple[str, ...] = ()
    """UUIDs (``MIG-…``) of the MIG devices on this GPU, when MIG is on: how
    another plugin's ``MIG-<uuid>`` device is traced back to its GPU
    (:mod:`plugin.placement.ownership`)."""
    unhealthy_reason: str | None = None
    """Set when discovery itself failed for this GPU (an NVML call errored): the
    GPU is advertised as Unhealthy instead of crashing the plugin."""
    identity_known: bool = True
    """False when discovery could not even read the UUID (a lost GPU answers
    nothing): ``uuid`` is then a placeholder that must never be advertised or
    handed to a container; :mod:`plugin.gpu.identity` puts back the identity an
    earlier discovery saw, or leaves the GPU out."""
