"""The NVML GPU backend: the only module that imports ``pynvml`` (package ``nvidia-ml-py``).

After NVIDIA's ``internal/resource`` (discovery) and ``internal/rm/health.go``
(events). Rules it keeps:

* every ``pynvml.NVMLError`` becomes :class:`~plugin.gpu.backend.GpuBackendError`
  (callers need exactly one ``except``); nothing else escapes;
* a GPU that cannot be described is still returned, with
  ``unhealthy_reason`` set, so it is advertised Unhealthy instead of the whole
  plugin crashing (the original MetaGPU crashed here);
* event waits are bounded (``nvmlEventSetWait_v2(set, timeout_ms)``), so the
  caller's thread notices a stop within one interval;
* the GPUs registered for events are the ones the health monitor watches
  (:meth:`NvmlBackend.watch_events`, after every discovery), not a second
  discovery of our own; GPUs added later are registered on the next wait;
* a driver that cannot deliver events for a GPU (``NVML_ERROR_NOT_SUPPORTED``
  on registration) gets a warning and the GPU stays healthy, as NVIDIA does
  ("too old to support health checking"); any other registration failure
  marks that GPU unhealthy and is retried on the next wait round; a failed
  wait raises :class:`~plugin.gpu.backend.GpuBackendError`, so the monitor marks
  every GPU unhealthy and backs off before waiting again.

NVML is not safe to shut down while another thread waits on an event set, so
:meth:`NvmlBackend.close` must be called after the health thread stopped
(:class:`plugin.gpu.health_monitor.HealthMonitor` guarantees that).
"""

from __future__ import annotations

import collections
import ctypes
import logging
import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from plugin.gpu.backend import (
    ComputeMode,
    ComputeModeControl,
    GpuBackend,
    GpuBackendError,
    GpuEvent,
    GpuInfo,
    GpuProcess,
    GpuUsage,
    MemoryHealth,
    RemappedRows,
)

# The name it had before plugin/ was split by concern: log lines (text and JSON
# show the logger) and any logging config that names it stay as they were.
logger = logging.getLogger("plugin.nvml")

MIB = 1 << 20
SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")
"""``<root>/<bus id>/numa_node`` holds the GPU's NUMA node (-1 when unknown);
NVIDIA's device plugin reads it the same way."""

WATCHED_EVENTS = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
"""Critical XIDs and double-bit ECC errors; single-bit ECC errors are corrected
by the hardware and do not make a GPU unusable."""

T = TypeVar("T")

_COMPUTE_MODES: dict[int, ComputeMode] = {
    0: "Default",  # NVML_COMPUTEMODE_DEFAULT
    1: "Exclusive_Thread",  # NVML_COMPUTEMODE_EXCLUSIVE_THREAD (deprecated)
    2: "Prohibited",  # NVML_COMPUTEMODE_PROHIBITED
    3: "Exclusive_Process",  # NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
}
"""``nvmlComputeMode_t`` values (nvml.h); pynvml exports them as ``NVML_COMPUTEMODE_*``."""


def _text(value: object) -> str:
    """NVML strings arrive as ``str`` (pynvml decodes) or raw ``bytes`` (struct fields)."""
    if isinstance(value, bytes):
        return value.decode(errors="replace").rstrip("\x00")
    return str(value)


def _code(exc: pynvml.NVMLError) -> int:
    value: int = getattr(exc, "value", -1)
    return value


def _lost(exc: pynvml.NVMLError) -> bool:
    return _code(exc) == int(pynvml.NVML_ERROR_GPU_IS_LOST)


def _handle_key(handle: Any) -> int | None:
    """The address a device handle points at: the same GPU's handle from
    ``nvmlDeviceGetHandleByUUID`` and from an event's ``eventData.device`` are
    different ctypes pointer objects to one address, and a lost GPU cannot be
    asked its UUID, so events are mapped back to their GPU by this key."""
    try:
        value: int | None = ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None
    return value


class NvmlBackend:
    """:class:`~plugin.gpu.backend.GpuBackend` over the real driver.

    Thread-safe for one health thread (``wait_event``) plus any number of
    readers: NVML itself is thread-safe, and our own event-set state is
    guarded by a lock.
    """

    kind = "nvml"

    def __init__(self, *, sysfs_pci_root: Path = SYSFS_PCI_DEVICES) -> None:
        self._sysfs = sysfs_pci_root
        self._lock = threading.Lock()
        self._event_set: Any = None
        self._wanted: frozenset[str] = frozenset()
        """What :meth:`watch_events` asked for."""
        self._watched: set[str] = set()
        """Registered in ``_event_set``."""
        self._handles: dict[int, str] = {}
        """Handle address → UUID of every GPU registered for events (see :func:`_handle_key`)."""
        self._unsupported: set[str] = set()
        """The driver cannot deliver events for these (logged once, never retried)."""
        self._register_due = True
        """Set after every wait round and when GPUs are added; registration runs at
        most once per round, so a GPU that keeps failing cannot make waits spin."""
        self._wake = threading.Event()
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
        identity_known = False
        step = "get a handle"
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            step = "read the UUID"
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            identity_known = True
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
            step = "list the MIG devices"
            migs = self._mig_devices(handle) if mig else ()
        except pynvml.NVMLError as exc:
            reason = f"NVML could not {step} of GPU {index}: {exc}"
            # DEBUG only: discovery runs every agent cycle; the callers log a
            # failure when it starts and when it ends (not 17,000 times a day).
            logger.debug("GPU discovery failed: %s", reason)
            return GpuInfo(
                index=index,
                uuid=uuid,
                name="unknown",
                memory_mib=0,
                minor_number=index,
                pci_bus_id="",
                numa_node=None,
                unhealthy_reason=reason,
                identity_known=identity_known,
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
            mig_devices=migs,
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

    @staticmethod
    def _mig_devices(handle: Any) -> tuple[str, ...]:
        """The UUIDs of the MIG devices on a MIG-enabled GPU (empty slots are skipped):
        another plugin names MIG devices by these (:mod:`plugin.placement.ownership`)."""
        uuids: list[str] = []
        for slot in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except pynvml.NVMLError as exc:
                if _code(exc) == pynvml.NVML_ERROR_NOT_FOUND:
                    continue
                raise
            uuids.append(_text(pynvml.nvmlDeviceGetUUID(mig)))
        return tuple(uuids)

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

    # ------------------------------------------------------------- health
    def check_alive(self, uuid: str) -> None:
        """One memory-info query: every GPU supports it, and a lost GPU answers
        ``NVML_ERROR_GPU_IS_LOST`` (the recovery probe always asked the same)."""
        handle = self._handle(uuid)
        self._call(f"read memory of {uuid}", pynvml.nvmlDeviceGetMemoryInfo, handle, uuid=uuid)

    def memory_health(self, uuid: str) -> MemoryHealth:
        handle = self._handle(uuid)
        ecc = self._optional(
            f"read the volatile uncorrectable ECC count of {uuid}",
            uuid,
            pynvml.nvmlDeviceGetTotalEccErrors,
            handle,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        rows = self._optional(
            f"read the remapped rows of {uuid}", uuid, pynvml.nvmlDeviceGetRemappedRows, handle
        )
        pages = self._optional(
            f"read the retired-pages pending status of {uuid}",
            uuid,
            pynvml.nvmlDeviceGetRetiredPagesPendingStatus,
            handle,
        )
        return MemoryHealth(
            volatile_uncorrected_ecc=None if ecc is None else int(ecc),
            remapped_rows=(
                None
                if rows is None
                else RemappedRows(
                    correctable=int(rows[0]),
                    uncorrectable=int(rows[1]),
                    pending=bool(rows[2]),
                    failure=bool(rows[3]),
                )
            ),
            retired_pages_pending=(
                None if pages is None else int(pages) == pynvml.NVML_FEATURE_ENABLED
            ),
        )

    @staticmethod
    def _optional(what: str, uuid: str, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(*args)``, or None when the GPU does not support it."""
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            if _code(exc) == pynvml.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise GpuBackendError(
                f"NVML could not {what}: {exc}", uuid=uuid, lost=_lost(exc)
            ) from exc

    # ------------------------------------------------------- compute mode
    def compute_mode(self, uuid: str) -> ComputeMode:
        handle = self._handle(uuid)
        value = int(
            self._call(
                f"read the compute mode of {uuid}",
                pynvml.nvmlDeviceGetComputeMode,
                handle,
                uuid=uuid,
            )
        )
        try:
            return _COMPUTE_MODES[value]
        except KeyError:
            raise GpuBackendError(f"unknown compute mode {value} on {uuid}", uuid=uuid) from None

    def set_compute_mode(self, uuid: str, mode: ComputeMode) -> None:
        """Needs root (``NVML_ERROR_NO_PERMISSION`` otherwise); some virtual machines
        refuse it (``NVML_ERROR_NOT_SUPPORTED``). Either is a :class:`GpuBackendError`
        naming the GPU and the mode."""
        value = next(k for k, v in _COMPUTE_MODES.items() if v == mode)
        handle = self._handle(uuid)
        self._call(
            f"set the compute mode of {uuid} to {mode}",
            pynvml.nvmlDeviceSetComputeMode,
            handle,
            value,
            uuid=uuid,
        )

    # ------------------------------------------------------------- events
    def watch_events(self, uuids: Collection[str]) -> None:
        with self._lock:
            added = frozenset(uuids) - self._wanted
            self._wanted = frozenset(uuids)
            if added:
                self._register_due = True
        self._wake.set()  # a thread idling without an event set registers them now

    def wait_event(self, timeout_s: float) -> GpuEvent | None:
        with self._lock:
            if self._closed:
                return None
            if not self._pending and self._register_due:
                self._register_due = False  # once per wait round: failures never spin
                self._register_wanted()
            if self._pending:
                return self._pending.popleft()
            event_set = self._event_set if self._watched else None
            self._wake.clear()
        try:
            if event_set is None:
                # Nothing registered (yet): idle, but wake when GPUs are handed over.
                self._wake.wait(max(0.0, timeout_s))
                return None
            return self._wait(event_set, timeout_s)
        finally:
            with self._lock:
                self._register_due = True

    def _wait(self, event_set: Any, timeout_s: float) -> GpuEvent | None:
        timeout_ms = max(0, int(timeout_s * 1000))
        try:
            data = pynvml.nvmlEventSetWait_v2(event_set, timeout_ms)
        except pynvml.NVMLError as exc:
            if _code(exc) == pynvml.NVML_ERROR_TIMEOUT:
                return None
            # NVIDIA: "Error waiting for event; Marking all devices as unhealthy".
            # Raised, not returned as events: the caller backs off before waiting again.
            raise GpuBackendError(f"waiting for NVML events failed: {exc}") from exc
        return self._to_event(data)

    def _register_wanted(self) -> None:
        """Register every wanted GPU not registered yet; runs under the lock.

        The event set is created on first use and kept (NVML cannot unregister a
        GPU, and GPUs already in it must stay watched). A GPU whose registration
        fails gets a ``backend_error`` event and is retried on the next round; one
        whose driver cannot deliver events is logged once and left healthy."""
        todo = sorted(self._wanted - self._watched - self._unsupported)
        if not todo:
            return
        if self._event_set is None:
            try:
                self._event_set = pynvml.nvmlEventSetCreate()
            except pynvml.NVMLError as exc:
                raise GpuBackendError(f"NVML could not create an event set: {exc}") from exc
        for uuid in todo:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                supported = int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
                pynvml.nvmlDeviceRegisterEvents(handle, WATCHED_EVENTS & supported, self._event_set)
                key = _handle_key(handle)
                if key is not None:
                    self._handles[key] = uuid
            except pynvml.NVMLError as exc:
                if _code(exc) == pynvml.NVML_ERROR_NOT_SUPPORTED:
                    logger.warning(
                        "GPU %s is too old to support health checking; it stays healthy",
                        uuid,
                        extra={"gpu": uuid},
                    )
                    self._unsupported.add(uuid)
                    continue
                self._pending.append(
                    GpuEvent(
                        uuid=uuid,
                        kind="backend_error",
                        detail=f"cannot register for health events: {exc}",
                    )
                )
                continue
            self._watched.add(uuid)

    def _to_event(self, data: Any) -> GpuEvent | None:
        """The event as a :class:`GpuEvent` of the GPU its handle was registered for.

        The handle is looked up first: a GPU that fell off the bus cannot be
        asked its UUID, and its event must blame it alone. Only a handle never
        registered here whose UUID cannot be read either suspects every GPU
        (what NVIDIA does for every unidentified event)."""
        key = _handle_key(data.device)
        with self._lock:
            uuid = self._handles.get(key) if key is not None else None
        if uuid is None:
            try:
                uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
            except pynvml.NVMLError as exc:
                raise GpuBackendError(f"NVML event from a GPU it cannot identify: {exc}") from exc
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
            self._wake.set()
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
            raise GpuBackendError(
                f"NVML could not {what}: {exc}", uuid=uuid, lost=_lost(exc)
            ) from exc


def _satisfies(backend: NvmlBackend) -> ComputeModeControl:
    return backend  # mypy: NvmlBackend still satisfies the compute-mode port


def open_nvml() -> GpuBackend:
    """Initialise NVML; :class:`GpuBackendError` when there is no usable driver."""
    return NvmlBackend()
