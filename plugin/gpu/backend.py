"""The GPU backend port: what the device plugin and the node agent need from a GPU driver.

Two implementations sit behind it, exactly like NVIDIA's ``internal/resource``
interfaces with their ``null.go``: :mod:`plugin.gpu.nvml` (the real driver, the only
module that imports ``pynvml``) and :mod:`plugin.gpu.simulated` (GPUs described in
a YAML file, for the embedded default and for tests). :class:`NullBackend`
serves nodes without GPUs so the plugin can degrade instead of crash-looping.

Every method may block (NVML calls do): async callers wrap them in
``asyncio.to_thread``. Every failure is a :class:`GpuBackendError`, never a
driver-specific exception, so callers need exactly one ``except``.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from plugin.api.gpus import GpuInfo as GpuInfo  # noqa: PLC0414 - re-exported: part of the port


@dataclass(frozen=True)
class GpuProcess:
    """A compute process running on a GPU, as the driver reports it."""

    pid: int
    """PID in the host PID namespace (the agent runs with ``hostPID``)."""
    used_memory_mib: int
    """GPU memory the process holds, in MiB (0 when the driver can't tell)."""
    utilization_percent: int | None = None
    """SM utilisation of this process over the driver's last sample period
    (NVML ``nvmlDeviceGetProcessUtilization``); None when unsupported or not sampled.
    The node agent sums it per container."""


@dataclass(frozen=True)
class GpuUsage:
    """A point-in-time reading of one GPU."""

    memory_used_mib: int
    memory_total_mib: int
    utilization_percent: int | None
    """SM utilisation over the driver's last sample period; None if unsupported."""


GpuEventKind = Literal["xid", "ecc_double_bit", "gpu_lost", "backend_error"]
"""``backend_error``: a driver call about this GPU failed while watching it
(event registration, the event wait itself); NVIDIA marks the GPU unhealthy
for these too."""


@dataclass(frozen=True)
class GpuEvent:
    """A health event for one GPU, delivered by :meth:`GpuBackend.wait_event`."""

    uuid: str
    kind: GpuEventKind
    xid: int | None = None
    """The XID number for ``kind == "xid"``; ECC double-bit errors are XID 48."""
    detail: str = ""


@dataclass(frozen=True)
class RemappedRows:
    """``nvmlDeviceGetRemappedRows``: ``(corrRows, uncRows, isPending, failureOccurred)``."""

    correctable: int
    uncorrectable: int
    pending: bool
    """A remap is waiting for the next GPU reset to take effect."""
    failure: bool
    """A remap failed: the GPU ran out of spare rows and needs service."""


@dataclass(frozen=True)
class MemoryHealth:
    """What the driver says about a GPU's memory now, for the recovery checks.

    ``None`` means the GPU does not support that query (``NVML_ERROR_NOT_SUPPORTED``:
    no ECC on consumer boards, no row remapping before Ampere, no page
    retirement from Ampere on); a check whose query is unsupported is skipped."""

    volatile_uncorrected_ecc: int | None
    """``nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)``: errors since the
    driver loaded or the GPU was last reset."""
    remapped_rows: RemappedRows | None
    retired_pages_pending: bool | None
    """``nvmlDeviceGetRetiredPagesPendingStatus``: pages wait for a reset to be retired."""


ComputeMode = Literal["Default", "Exclusive_Thread", "Prohibited", "Exclusive_Process"]
"""A GPU's compute mode as NVML names it (``nvmlComputeMode_t``: ``NVML_COMPUTEMODE_DEFAULT``
= 0, ``EXCLUSIVE_THREAD`` = 1 (deprecated), ``PROHIBITED`` = 2, ``EXCLUSIVE_PROCESS`` = 3);
``nvidia-smi -q`` prints the same words. MPS wants ``Exclusive_Process``: then the MPS
server holds the GPU's only context, and a process that bypasses MPS cannot create one."""


class GpuBackendError(Exception):
    """A driver call failed. ``uuid`` names the GPU when the failure is specific to one;
    ``lost`` is True when the driver says the GPU itself is gone
    (``NVML_ERROR_GPU_IS_LOST``: fallen off the bus, needs a reset or a reboot)."""

    def __init__(self, message: str, *, uuid: str | None = None, lost: bool = False) -> None:
        super().__init__(message)
        self.uuid = uuid
        self.lost = lost


class GpuBackend(Protocol):
    """The narrow driver interface. All methods may block; none may raise anything
    but :class:`GpuBackendError`."""

    @property
    def kind(self) -> str:
        """``nvml``, ``simulated`` or ``null``: logged at start-up and shown by mgctl."""
        ...

    def devices(self) -> Sequence[GpuInfo]:
        """Every GPU on the node, in index order."""
        ...

    def processes(self, uuid: str) -> Sequence[GpuProcess]:
        """Compute processes currently on the GPU ``uuid``."""
        ...

    def usage(self, uuid: str) -> GpuUsage:
        """Memory and utilisation of the GPU ``uuid`` now."""
        ...

    def check_alive(self, uuid: str) -> None:
        """The cheap liveness poll: one driver query that a lost GPU cannot answer.

        Returns when the GPU answers; raises :class:`GpuBackendError` (``lost``
        set when the driver says so) when it does not. Microseconds on a
        healthy GPU, so the health monitor runs it for every GPU every
        ``health.liveness_interval_s``."""
        ...

    def memory_health(self, uuid: str) -> MemoryHealth:
        """The memory-error state the recovery checks judge (ECC, row remap, page
        retirement). An unsupported query is ``None`` in the result, never an error."""
        ...

    def watch_events(self, uuids: Collection[str]) -> None:
        """Which GPUs :meth:`wait_event` must watch; called after every discovery.

        Replaces the previous set. A backend that must register GPUs with the
        driver (NVML) does it on the next :meth:`wait_event`, and retries a
        failed registration on later waits, so GPUs that a rediscovery adds or
        heals are watched too. Events of GPUs outside the set may still arrive
        (NVML cannot unregister); the caller ignores them. Never blocks on the
        driver, so the event loop may call it.
        """
        ...

    def wait_event(self, timeout_s: float) -> GpuEvent | None:
        """Block up to ``timeout_s`` for the next health event; None on timeout.

        Bounded so the caller can notice a stop request between waits
        (NVIDIA ``health.go`` loops on ``eventSet.Wait(5000)`` for the same reason).
        A failure of the wait itself raises :class:`GpuBackendError` (with no
        ``uuid``: every watched GPU is suspect) rather than returning at once,
        so a caller that backs off on errors cannot spin on a broken driver.
        """
        ...

    def close(self) -> None:
        """Release the driver (NVML shutdown); idempotent."""
        ...


@runtime_checkable
class ComputeModeControl(Protocol):
    """Reading and setting a GPU's compute mode: what the supervised MPS daemon needs from
    the driver (:mod:`plugin.gpu.mps_supervisor`). Kept apart from :class:`GpuBackend`
    because only the MPS supervisor calls it, and setting needs root on the node.

    Both methods may block and raise only :class:`GpuBackendError`."""

    def compute_mode(self, uuid: str) -> ComputeMode:
        """The GPU's compute mode now (``nvmlDeviceGetComputeMode``)."""
        ...

    def set_compute_mode(self, uuid: str, mode: ComputeMode) -> None:
        """Set it (``nvmlDeviceSetComputeMode``). Not persistent: a driver reload or a
        reboot puts the GPU back in ``Default``."""
        ...


class NullBackend:
    """A node with no GPUs: everything is empty and no event ever comes.

    Used when GPU discovery fails and the operator chose to degrade rather than
    crash (NVIDIA's ``FailOnInitError=false`` returns a null manager the same way).
    """

    kind = "null"

    def devices(self) -> Sequence[GpuInfo]:
        return ()

    def processes(self, uuid: str) -> Sequence[GpuProcess]:
        raise GpuBackendError(f"unknown GPU: {uuid}", uuid=uuid)

    def usage(self, uuid: str) -> GpuUsage:
        raise GpuBackendError(f"unknown GPU: {uuid}", uuid=uuid)

    def check_alive(self, uuid: str) -> None:
        raise GpuBackendError(f"unknown GPU: {uuid}", uuid=uuid)

    def memory_health(self, uuid: str) -> MemoryHealth:
        raise GpuBackendError(f"unknown GPU: {uuid}", uuid=uuid)

    def watch_events(self, uuids: Collection[str]) -> None:
        return None

    def wait_event(self, timeout_s: float) -> GpuEvent | None:
        time.sleep(max(0.0, timeout_s))
        return None

    def close(self) -> None:
        return None


_: GpuBackend = NullBackend()  # mypy checks NullBackend still satisfies the port
