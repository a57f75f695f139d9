"""The NVML GPU backend: the only module that imports ``pynvml`` (package ``nvidia-ml-py``).

After NVIDIA's ``internal/resource`` (discovery) and ``internal/rm/health.go``
(events). Rules it keeps:

* every ``pynvml.NVMLError`` becomes :class:`~plugin.backend.GpuBackendError`
  (callers need exactly one ``except``); nothing else escapes;
* a GPU that cannot be described is still returned, with
  ``unhealthy_reason`` set, so it is advertised Unhealthy instead of the whole
  plugin crashing (the original MetaGPU crashed here);
* event waits are bounded (``nvmlEventSetWait_v2(set, timeout_ms)``), so the
  caller's thread notices a stop within one interval;
* a driver that cannot deliver events for a GPU (``NVML_ERROR_NOT_SUPPORTED``
  on registration) gets a warning and the GPU stays healthy, as NVIDIA does
  ("too old to support health checking"); any other registration failure
  marks that GPU unhealthy; a failed wait marks every GPU unhealthy.

NVML is not safe to shut down while another thread waits on an event set, so
:meth:`NvmlBackend.close` must be called after the health thread stopped
(:class:`plugin.health_monitor.HealthMonitor` guarantees that).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from plugin.backend import GpuBackend, GpuBackendError, GpuEvent, GpuInfo, GpuProcess, GpuUsage

logger = logging.getLogger(__name__)

MIB = 1 << 20
SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")
"""``<root>/<bus id>/numa_node`` holds the GPU's NUMA node (-1 when unknown);
NVIDIA's device plugin reads it the same way."""

WATCHED_EVENTS = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
"""Critical XIDs and double-bit ECC errors; single-bit ECC errors are corrected
by the hardware and do not make a GPU unusable."""

T = TypeVar("T")


def _text(value: object) -> str:
    """NVML strings arrive as ``str`` (pynvml decodes) or raw ``bytes`` (struct fields)."""
    if isinstance(value, bytes):
        return value.decode(errors="replace").rstrip("\x00")
    return str(value)


def _code(exc: pynvml.NVMLError) -> int:
    value: int = getattr(exc, "value", -1)
    return value


class NvmlBackend:
    """:class:`~plugin.backend.GpuBackend` over the real driver.

    Thread-safe for one health thread (``wait_event``) plus any number of
    readers: NVML itself is thread-safe, and our own event-set state is
    guarded by a lock.
    """

    kind = "nvml"

    def __init__(self, *, sysfs_pci_root: Path = SYSFS_PCI_DEVICES) -> None:
        self._sysfs = sysfs_pci_root
        self._lock = threading.Lock()
        self._event_set: Any = None
        self._watched: set[str] = set()
        self._pending: collections.deque[GpuEvent] = collections.deque()
        self._closed = False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuBackendError(
                f"cannot initialise NVML ({exc}); is the NVIDIA driver installed and the "
                "container started with the NVIDIA runtime (runtimeClassName: nvidia)?"
            ) from exc
        self.driver_version = self._call(
            "read the driver version", pynvml.nvmlSystemGetDriverVersion
        )

    # ----------------------------------------------------------- discovery
    def devices(self) -> Sequence[GpuInfo]:
        count = self._call("count GPUs", pynvml.nvmlDeviceGetCount)
        return tuple(self._describe(index) for index in range(count))

    def _describe(self, index: int) -> GpuInfo:
        uuid = f"GPU-unknown-index-{index}"
        step = "get a handle"
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            step = "read the UUID"
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            step = "read the name"
            name = _text(pynvml.nvmlDeviceGetName(handle))
            step = "read the memory size"
            memory_mib = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB
            step = "read the minor number"
            minor = int(pynvml.nvmlDeviceGetMinorNumber(handle))
            step = "read the PCI bus id"
            bus_id = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
            step = "read the MIG mode"
            mig = self._mig_enabled(handle)
        except pynvml.NVMLError as exc:
            reason = f"NVML could not {step} of GPU {index}: {exc}"
            logger.error("GPU discovery failed; advertising it unhealthy: %s", reason)
            return GpuInfo(
                index=index,
                uuid=uuid,
                name="unknown",
                memory_mib=0,
                minor_number=index,
                pci_bus_id="",
                numa_node=None,
                unhealthy_reason=reason,
            )
        return GpuInfo(
            index=index,
            uuid=uuid,
            name=name,
            memory_mib=memory_mib,
            minor_number=minor,
            pci_bus_id=bus_id,
            numa_node=self._numa_node(bus_id),
            mig_enabled=mig,
        )

    @staticmethod
    def _mig_enabled(handle: Any) -> bool:
        try:
            current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError as exc:
            if _code(exc) == pynvml.NVML_ERROR_NOT_SUPPORTED:
                return False  # pre-Ampere GPUs have no MIG at all
            raise
        return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)

    def _numa_node(self, bus_id: str) -> int | None:
        """NVML bus ids have an 8-digit domain (``00000000:3B:00.0``); sysfs uses 4,
        lower case (``0000:3b:00.0``)."""
        if not bus_id:
            return None
        sysfs_id = bus_id[-12:].lower() if len(bus_id) >= 12 else bus_id.lower()
        try:
            value = int((self._sysfs / sysfs_id / "numa_node").read_text().strip())
        except (OSError, ValueError):
            return None
        return value if value >= 0 else None

    # -------------------------------------------------------------- usage
    def processes(self, uuid: str) -> Sequence[GpuProcess]:
        handle = self._handle(uuid)
        procs = self._call(
            f"list processes on {uuid}",
            pynvml.nvmlDeviceGetComputeRunningProcesses,
            handle,
            uuid=uuid,
        )
        utilization = self._process_utilization(handle)
        return tuple(
            GpuProcess(
                pid=int(p.pid),
                used_memory_mib=int(p.usedGpuMemory or 0) // MIB,
                utilization_percent=utilization.get(int(p.pid)),
            )
            for p in procs
        )

    @staticmethod
    def _process_utilization(handle: Any) -> dict[int, int]:
        """Per-process SM utilisation from NVML's sample buffer; empty when the
        driver cannot sample it (not supported, no samples yet)."""
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
        except pynvml.NVMLError:
            return {}
        return {int(s.pid): int(s.smUtil) for s in samples}

    def usage(self, uuid: str) -> GpuUsage:
        handle = self._handle(uuid)
        memory = self._call(
            f"read memory of {uuid}", pynvml.nvmlDeviceGetMemoryInfo, handle, uuid=uuid
        )
        try:
            utilization: int | None = int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except pynvml.NVMLError as exc:
            if _code(exc) != pynvml.NVML_ERROR_NOT_SUPPORTED:
                raise GpuBackendError(
                    f"NVML could not read utilisation of {uuid}: {exc}", uuid=uuid
                ) from exc
            utilization = None
        return GpuUsage(
            memory_used_mib=int(memory.used) // MIB,
            memory_total_mib=int(memory.total) // MIB,
            utilization_percent=utilization,
        )

    # ------------------------------------------------------------- events
    def wait_event(self, timeout_s: float) -> GpuEvent | None:
        with self._lock:
            if self._closed:
                return None
            if self._event_set is None:
                self._register_events()
            if self._pending:
                return self._pending.popleft()
            event_set = self._event_set
        timeout_ms = max(0, int(timeout_s * 1000))
        try:
            data = pynvml.nvmlEventSetWait_v2(event_set, timeout_ms)
        except pynvml.NVMLError as exc:
            if _code(exc) == pynvml.NVML_ERROR_TIMEOUT:
                return None
            # NVIDIA: "Error waiting for event; Marking all devices as unhealthy".
            with self._lock:
                for uuid in sorted(self._watched):
                    self._pending.append(
                        GpuEvent(
                            uuid=uuid,
                            kind="backend_error",
                            detail=f"waiting for NVML events failed: {exc}",
                        )
                    )
                return self._pending.popleft() if self._pending else None
        return self._to_event(data)

    def _register_events(self) -> None:
        """Create the event set and register every GPU; runs once, under the lock."""
        try:
            self._event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            raise GpuBackendError(f"NVML could not create an event set: {exc}") from exc
        for info in self.devices():
            if info.unhealthy_reason is not None:
                continue  # already unhealthy from discovery
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(info.uuid)
                supported = int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
                pynvml.nvmlDeviceRegisterEvents(handle, WATCHED_EVENTS & supported, self._event_set)
            except pynvml.NVMLError as exc:
                if _code(exc) == pynvml.NVML_ERROR_NOT_SUPPORTED:
                    logger.warning(
                        "GPU %s is too old to support health checking; it stays healthy",
                        info.uuid,
                        extra={"gpu": info.uuid},
                    )
                    continue
                self._pending.append(
                    GpuEvent(
                        uuid=info.uuid,
                        kind="backend_error",
                        detail=f"cannot register for health events: {exc}",
                    )
                )
                continue
            self._watched.add(info.uuid)

    def _to_event(self, data: Any) -> GpuEvent | None:
        try:
            uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError as exc:
            # The event names a GPU we cannot identify: as NVIDIA does, suspect them all.
            with self._lock:
                for watched in sorted(self._watched):
                    self._pending.append(
                        GpuEvent(
                            uuid=watched,
                            kind="backend_error",
                            detail=f"event from an unidentifiable GPU: {exc}",
                        )
                    )
                return self._pending.popleft() if self._pending else None
        kind = int(data.eventType)
        if kind & pynvml.nvmlEventTypeDoubleBitEccError:
            return GpuEvent(uuid=uuid, kind="ecc_double_bit", xid=48)
        if kind & pynvml.nvmlEventTypeXidCriticalError:
            xid = int(data.eventData)
            detail = ""
            gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
            if gi != 0xFFFFFFFF:
                detail = f"MIG GPU instance {gi}, compute instance {ci}"
            return GpuEvent(uuid=uuid, kind="xid", xid=xid, detail=detail)
        logger.debug("ignoring NVML event type %#x on %s", kind, uuid)
        return None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._event_set is not None:
                try:
                    pynvml.nvmlEventSetFree(self._event_set)
                except pynvml.NVMLError as exc:
                    logger.warning("NVML could not free the event set: %s", exc)
                self._event_set = None
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            logger.warning("NVML shutdown failed: %s", exc)

    # ---------------------------------------------------------- internals
    def _handle(self, uuid: str) -> Any:
        return self._call(f"find GPU {uuid}", pynvml.nvmlDeviceGetHandleByUUID, uuid, uuid=uuid)

    @staticmethod
    def _call(what: str, fn: Callable[..., T], *args: Any, uuid: str | None = None) -> T:
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            raise GpuBackendError(f"NVML could not {what}: {exc}", uuid=uuid) from exc


def open_nvml() -> GpuBackend:
    """Initialise NVML; :class:`GpuBackendError` when there is no usable driver."""
    return NvmlBackend()
