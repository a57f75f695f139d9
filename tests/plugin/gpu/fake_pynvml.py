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
  (``nvmlDeviceRegisterEvents``); other events are dropped.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
# pynvml's own (mixedCase) names, so the fake has the module's shape.
nvmlEventTypeSingleBitEccError = 0x1  # noqa: N816
nvmlEventTypeDoubleBitEccError = 0x2  # noqa: N816
nvmlEventTypeXidCriticalError = 0x8  # noqa: N816
MIG_NONE = 0xFFFFFFFF

_NAMES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _NAMES.get(self.value, f"NVML error {self.value}")


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


@dataclass(frozen=True)
class Handle:
    gpu: FakeGpu


@dataclass(frozen=True)
class MigHandle:
    """A MIG device's handle; only its UUID is ever asked of it."""

    uuid: str


class FakePynvml:
    """Install with ``monkeypatch.setattr(plugin.gpu.nvml, "pynvml", fake)``."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
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
        self._script: queue.Queue[Any] = queue.Queue()
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

    def _event(self, uuid: str, kind: int, data: int) -> SimpleNamespace:
        return SimpleNamespace(
            device=Handle(self._by_uuid(uuid)),
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

    def _check(self, name: str, gpu: FakeGpu | None = None) -> None:
        with self._lock:
            self.calls.append(name)
        if self.initialised <= 0 and name != "nvmlInit":
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
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
        return Handle(gpu)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Handle:
        gpu = self._by_uuid(uuid)
        self._check("nvmlDeviceGetHandleByUUID", gpu)
        return Handle(gpu)

    def nvmlDeviceGetUUID(self, handle: Handle | MigHandle) -> str:
        if isinstance(handle, MigHandle):
            return handle.uuid
        self._check("nvmlDeviceGetUUID", handle.gpu)
        return handle.gpu.uuid

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:
        self._check("nvmlDeviceGetMaxMigDeviceCount", handle.gpu)
        return len(handle.gpu.mig_slots)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int) -> MigHandle:
        self._check("nvmlDeviceGetMigDeviceHandleByIndex", handle.gpu)
        uuid = handle.gpu.mig_slots[index]
        if uuid is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return MigHandle(uuid)

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        self._check("nvmlDeviceGetName", handle.gpu)
        return handle.gpu.name

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> SimpleNamespace:
        self._check("nvmlDeviceGetMemoryInfo", handle.gpu)
        total = handle.gpu.memory_mib << 20
        used = handle.gpu.used_mib << 20
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetMinorNumber(self, handle: Handle) -> int:
        self._check("nvmlDeviceGetMinorNumber", handle.gpu)
        return handle.gpu.minor

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> SimpleNamespace:
        self._check("nvmlDeviceGetPciInfo", handle.gpu)
        return SimpleNamespace(busId=handle.gpu.bus_id.encode())

    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:
        self._check("nvmlDeviceGetMigMode", handle.gpu)
        if handle.gpu.mig_mode is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [handle.gpu.mig_mode, handle.gpu.mig_mode]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[SimpleNamespace]:
        self._check("nvmlDeviceGetComputeRunningProcesses", handle.gpu)
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in handle.gpu.processes]

    def nvmlDeviceGetProcessUtilization(
        self, handle: Handle, last_seen: int
    ) -> list[SimpleNamespace]:
        self._check("nvmlDeviceGetProcessUtilization", handle.gpu)
        if handle.gpu.process_utilization is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [SimpleNamespace(pid=p, smUtil=u) for p, u in handle.gpu.process_utilization.items()]

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        self._check("nvmlDeviceGetUtilizationRates", handle.gpu)
        if handle.gpu.utilization is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=handle.gpu.utilization, memory=0)

    def nvmlEventSetCreate(self) -> object:
        self._check("nvmlEventSetCreate")
        if self.event_set_error is not None:
            raise NVMLError(self.event_set_error)
        return object()

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        self._check("nvmlDeviceGetSupportedEventTypes", handle.gpu)
        return handle.gpu.supported_events

    def nvmlDeviceRegisterEvents(self, handle: Handle, mask: int, event_set: object) -> None:
        self._check("nvmlDeviceRegisterEvents", handle.gpu)
        if handle.gpu.register_error is not None:
            raise NVMLError(handle.gpu.register_error)
        self.registered[handle.gpu.uuid] = mask
        self.registered_in[handle.gpu.uuid] = event_set

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
            if self.registered_in.get(data.device.gpu.uuid) is event_set:
                return data
            # Not registered in this set: the driver would never deliver it here.

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._check("nvmlEventSetFree")
        self.event_sets_freed += 1
