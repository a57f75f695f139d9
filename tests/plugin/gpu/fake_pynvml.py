"""A narrow fake of the ``pynvml`` module: only what :mod:`plugin.gpu.nvml` calls.

After NVIDIA's ``fakeNvmlLib`` (STYLE §4): no GPU exists on these machines,
so the driver is the one edge we fake; everything above it is the real code.
Behaviour follows nvidia-ml-py where ``plugin.gpu.nvml`` can tell the difference:

* errors are ``NVMLError`` instances carrying ``.value`` (the NVML return
  code), raised by any function, per GPU, through :attr:`FakeGpu.fail`;
* ``nvmlDeviceGetPciInfo().busId`` is ``bytes`` (a ctypes char array), while
  the string getters return ``str`` (pynvml's ``convertStrBytes``);
* memory is in bytes; ``usedGpuMemory`` may be None;
* ``nvmlEventSetWait_v2`` blocks up to its timeout for the next scripted item
  (event data, or an error to raise) and raises ``NVML_ERROR_TIMEOUT`` when
  none comes, like the driver; scripted items are delivered in order. As with
  the driver, an event reaches only an event set its GPU was registered in
  (``nvmlDeviceRegisterEvents``); other events are dropped;
* ``NVMLError(code)`` is an instance of the per-code subclass pynvml
  generates (``NVMLError_GPUIsLost``, ``NVMLError_NotSupported``, ...);
* device handles are ctypes pointers (``POINTER(struct_c_nvmlDevice_t)``):
  every ``nvmlDeviceGetHandleBy*`` call returns a new pointer object to the
  one address per GPU, and an event's ``device`` is another such object;
* a lost GPU (:meth:`FakePynvml.lose`) answers ``NVML_ERROR_GPU_IS_LOST`` to
  every per-GPU call, including ``nvmlDeviceGetHandleByIndex`` (the NVML docs
  list it there) but not ``nvmlDeviceGetCount``: the driver still counts it;
* ``nvmlDeviceGetTotalEccErrors`` / ``nvmlDeviceGetRemappedRows`` (a 4-tuple
  ``(corrRows, uncRows, isPending, failureOccurred)``) /
  ``nvmlDeviceGetRetiredPagesPendingStatus`` (``NVML_FEATURE_ENABLED`` or
  ``_DISABLED``) raise ``NVML_ERROR_NOT_SUPPORTED`` where the GPU lacks them.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
# pynvml's own (mixedCase) names, so the fake has the module's shape.
nvmlEventTypeSingleBitEccError = 0x1  # noqa: N816
nvmlEventTypeDoubleBitEccError = 0x2  # noqa: N816
nvmlEventTypeXidCriticalError = 0x8  # noqa: N816
MIG_NONE = 0xFFFFFFFF

_NAMES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """As pynvml's: ``NVMLError(code)`` builds the subclass registered for ``code``."""

    _classes: dict[int, type[NVMLError]] = {}  # noqa: RUF012 - pynvml's own shape

    def __new__(cls, value: int) -> NVMLError:
        target = NVMLError._classes.get(value, cls) if cls is NVMLError else cls
        return Exception.__new__(target)

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _NAMES.get(self.value, f"NVML error {self.value}")


class NVMLError_GPUIsLost(NVMLError):  # noqa: N801, N818 - pynvml's generated name
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801, N818 - pynvml's generated name
    pass


class NVMLError_Timeout(NVMLError):  # noqa: N801, N818 - pynvml's generated name
    pass


NVMLError._classes.update(
    {
        NVML_ERROR_GPU_IS_LOST: NVMLError_GPUIsLost,
        NVML_ERROR_NOT_SUPPORTED: NVMLError_NotSupported,
        NVML_ERROR_TIMEOUT: NVMLError_Timeout,
    }
)


class struct_c_nvmlDevice_t(ctypes.Structure):  # noqa: N801 - pynvml's name
    """Opaque in NVML; one per GPU here, so every handle of a GPU has one address."""

    _fields_ = [("index", ctypes.c_uint)]


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_mib: int = 81920
    used_mib: int = 1024
    minor: int = 0
    bus_id: str = "00000000:3B:00.0"
    mig_mode: int | None = NVML_DEVICE_MIG_DISABLE
    """None: the GPU predates MIG (``nvmlDeviceGetMigMode`` is not supported)."""
    mig_slots: list[str | None] = field(default_factory=list)
    """MIG device UUID per slot (None: an empty slot, NVML_ERROR_NOT_FOUND)."""
    utilization: int | None = 37
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    """``(pid, used bytes or None)``."""
    process_utilization: dict[int, int] | None = None
    """pid → SM %; None: not supported."""
    supported_events: int = (
        nvmlEventTypeXidCriticalError
        | nvmlEventTypeDoubleBitEccError
        | nvmlEventTypeSingleBitEccError
    )
    register_error: int | None = None
    fail: dict[str, int] = field(default_factory=dict)
    """pynvml function name → NVML error code it raises for this GPU."""
    lost: bool = False
    """Fallen off the bus: every per-GPU call raises ``NVML_ERROR_GPU_IS_LOST``."""
    volatile_uncorrected_ecc: int | None = 0
    """None: no ECC (``nvmlDeviceGetTotalEccErrors`` is not supported)."""
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    """``(corrRows, uncRows, isPending, failureOccurred)``; None: pre-Ampere, not supported."""
    retired_pages_pending: int | None = NVML_FEATURE_DISABLED
    """None: not supported (Ampere and later retire no pages; they remap rows)."""
    compute_mode: int = 0
    """``nvmlComputeMode_t``: 0 DEFAULT, 1 EXCLUSIVE_THREAD, 2 PROHIBITED, 3 EXCLUSIVE_PROCESS."""
    device: struct_c_nvmlDevice_t = field(default_factory=struct_c_nvmlDevice_t)
    """What this GPU's handles point at."""


Handle = Any
"""A ``POINTER(struct_c_nvmlDevice_t)``, as pynvml's ``c_nvmlDevice_t``."""


@dataclass(frozen=True)
class MigHandle:
    """A MIG device's handle; only its UUID is ever asked of it."""

    uuid: str


class FakePynvml:
    """Install with ``monkeypatch.setattr(plugin.gpu.nvml, "pynvml", fake)``."""

    NVMLError = NVMLError
    NVMLError_GPUIsLost = NVMLError_GPUIsLost
    NVMLError_NotSupported = NVMLError_NotSupported
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_FEATURE_ENABLED = NVML_FEATURE_ENABLED
    NVML_FEATURE_DISABLED = NVML_FEATURE_DISABLED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = NVML_VOLATILE_ECC
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE
    nvmlEventTypeXidCriticalError = nvmlEventTypeXidCriticalError  # noqa: N815
    nvmlEventTypeDoubleBitEccError = nvmlEventTypeDoubleBitEccError  # noqa: N815

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.count_error: int | None = None
        self.event_set_error: int | None = None
        """``nvmlEventSetCreate`` raises this code while set."""
        self.calls: list[str] = []
        self.initialised = 0
        self.registered: dict[str, int] = {}
        """UUID → event mask, for GPUs registered in an event set."""
        self.registered_in: dict[str, object] = {}
        """UUID → the event set it was registered in."""
        self.event_sets_freed = 0
        self.wait_timeouts_ms: list[int] = []
        self.compute_mode_changes: list[tuple[str, int]] = []
        """``(uuid, mode)`` per successful ``nvmlDeviceSetComputeMode``, in order."""
        self._script: queue.Queue[Any] = queue.Queue()
        self._stray: list[struct_c_nvmlDevice_t] = []
        self._lock = threading.Lock()

    # ----------------------------------------------------------- scripting
    def xid(self, uuid: str, xid: int) -> None:
        """The driver reports XID ``xid`` on ``uuid``."""
        self._script.put(self._event(uuid, nvmlEventTypeXidCriticalError, xid))

    def double_bit_ecc(self, uuid: str) -> None:
        self._script.put(self._event(uuid, nvmlEventTypeDoubleBitEccError, 0))

    def wait_fails(self, code: int) -> None:
        """The next event wait fails with ``code``."""
        self._script.put(NVMLError(code))

    def lose(self, uuid: str) -> None:
        """``uuid`` falls off the bus, silently (no event): only a query notices."""
        self._by_uuid(uuid).lost = True

    def unknown_handle_xid(self, xid: int) -> None:
        """An event whose handle no GPU was registered with (nor any GPU has):
        delivered to every event set, like a driver-wide event."""
        stray = struct_c_nvmlDevice_t()
        self._stray.append(stray)  # keep it alive: the event holds only a pointer
        self._script.put(
            SimpleNamespace(
                device=ctypes.pointer(stray),
                eventType=nvmlEventTypeXidCriticalError,
                eventData=xid,
                gpuInstanceId=MIG_NONE,
                computeInstanceId=MIG_NONE,
            )
        )

    def _event(self, uuid: str, kind: int, data: int) -> SimpleNamespace:
        return SimpleNamespace(
            device=ctypes.pointer(self._by_uuid(uuid).device),
            eventType=kind,
            eventData=data,
            gpuInstanceId=MIG_NONE,
            computeInstanceId=MIG_NONE,
        )

    # ----------------------------------------------------------- internals
    def _by_uuid(self, uuid: str) -> FakeGpu:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def _gpu(self, handle: Handle) -> FakeGpu | None:
        """The GPU a handle points at (None for a handle of no GPU)."""
        address = ctypes.addressof(handle.contents)
        for gpu in self.gpus:
            if ctypes.addressof(gpu.device) == address:
                return gpu
        return None

    def _of(self, name: str, handle: Handle) -> FakeGpu:
        gpu = self._gpu(handle)
        if gpu is None:
            self._check(name)
            raise NVMLError(NVML_ERROR_UNKNOWN)  # NVML: "invalid device handle"
        self._check(name, gpu)
        return gpu

    def _check(self, name: str, gpu: FakeGpu | None = None) -> None:
        with self._lock:
            self.calls.append(name)
        if self.initialised <= 0 and name != "nvmlInit":
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if gpu is not None and gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if gpu is not None and name in gpu.fail:
            raise NVMLError(gpu.fail[name])

    # -------------------------------------------------------- the functions
    def nvmlInit(self) -> None:
        self._check("nvmlInit")
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        if self.count_error is not None:
            raise NVMLError(self.count_error)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        gpu = self.gpus[index]
        self._check("nvmlDeviceGetHandleByIndex", gpu)
        return ctypes.pointer(gpu.device)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Handle:
        gpu = self._by_uuid(uuid)
        self._check("nvmlDeviceGetHandleByUUID", gpu)
        return ctypes.pointer(gpu.device)

    def nvmlDeviceGetUUID(self, handle: Handle | MigHandle) -> str:
        if isinstance(handle, MigHandle):
            return handle.uuid
        gpu = self._of("nvmlDeviceGetUUID", handle)
        return gpu.uuid

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:
        gpu = self._of("nvmlDeviceGetMaxMigDeviceCount", handle)
        return len(gpu.mig_slots)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int) -> MigHandle:
        gpu = self._of("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        uuid = gpu.mig_slots[index]
        if uuid is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return MigHandle(uuid)

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        gpu = self._of("nvmlDeviceGetName", handle)
        return gpu.name

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> SimpleNamespace:
        gpu = self._of("nvmlDeviceGetMemoryInfo", handle)
        total = gpu.memory_mib << 20
        used = gpu.used_mib << 20
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetMinorNumber(self, handle: Handle) -> int:
        gpu = self._of("nvmlDeviceGetMinorNumber", handle)
        return gpu.minor

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> SimpleNamespace:
        gpu = self._of("nvmlDeviceGetPciInfo", handle)
        return SimpleNamespace(busId=gpu.bus_id.encode())

    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:
        gpu = self._of("nvmlDeviceGetMigMode", handle)
        if gpu.mig_mode is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_mode, gpu.mig_mode]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[SimpleNamespace]:
        gpu = self._of("nvmlDeviceGetComputeRunningProcesses", handle)
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in gpu.processes]

    def nvmlDeviceGetProcessUtilization(
        self, handle: Handle, last_seen: int
    ) -> list[SimpleNamespace]:
        gpu = self._of("nvmlDeviceGetProcessUtilization", handle)
        if gpu.process_utilization is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [SimpleNamespace(pid=p, smUtil=u) for p, u in gpu.process_utilization.items()]

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        gpu = self._of("nvmlDeviceGetUtilizationRates", handle)
        if gpu.utilization is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=gpu.utilization, memory=0)

    def nvmlEventSetCreate(self) -> object:
        self._check("nvmlEventSetCreate")
        if self.event_set_error is not None:
            raise NVMLError(self.event_set_error)
        return object()

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        gpu = self._of("nvmlDeviceGetSupportedEventTypes", handle)
        return gpu.supported_events

    def nvmlDeviceRegisterEvents(self, handle: Handle, mask: int, event_set: object) -> None:
        gpu = self._of("nvmlDeviceRegisterEvents", handle)
        if gpu.register_error is not None:
            raise NVMLError(gpu.register_error)
        self.registered[gpu.uuid] = mask
        self.registered_in[gpu.uuid] = event_set

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        self._check("nvmlEventSetWait_v2")
        self.wait_timeouts_ms.append(timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            try:
                item = self._script.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise NVMLError(NVML_ERROR_TIMEOUT) from None
            if isinstance(item, NVMLError):
                raise item
            data: SimpleNamespace = item
            gpu = self._gpu(data.device)
            if gpu is None or self.registered_in.get(gpu.uuid) is event_set:
                return data
            # Not registered in this set: the driver would never deliver it here.

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._check("nvmlEventSetFree")
        self.event_sets_freed += 1

    def nvmlDeviceGetTotalEccErrors(
        self, handle: Handle, error_type: int, counter_type: int
    ) -> int:
        gpu = self._of("nvmlDeviceGetTotalEccErrors", handle)
        if gpu.volatile_uncorrected_ecc is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        assert (error_type, counter_type) == (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)
        return gpu.volatile_uncorrected_ecc

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        gpu = self._of("nvmlDeviceGetRemappedRows", handle)
        if gpu.remapped_rows is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.remapped_rows

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Handle) -> int:
        gpu = self._of("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        if gpu.retired_pages_pending is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.retired_pages_pending

    def nvmlDeviceGetComputeMode(self, handle: Handle) -> int:
        return self._of("nvmlDeviceGetComputeMode", handle).compute_mode

    def nvmlDeviceSetComputeMode(self, handle: Handle, mode: int) -> None:
        """Root only on a real driver: ``fail`` with ``NVML_ERROR_NO_PERMISSION`` plays a
        plugin that is not root; ``NVML_ERROR_NOT_SUPPORTED`` a VM that refuses it."""
        gpu = self._of("nvmlDeviceSetComputeMode", handle)
        if mode not in (0, 1, 2, 3):
            raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
        gpu.compute_mode = mode
        self.compute_mode_changes.append((gpu.uuid, mode))
