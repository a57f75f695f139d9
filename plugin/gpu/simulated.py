"""Simulated GPUs behind the same :class:`~plugin.gpu.backend.GpuBackend` port as NVML.

Used by the embedded default (``make run``) and by the tests, which is why it
is protocol-faithful rather than convenient: it returns the same shapes, raises
the same :class:`~plugin.gpu.backend.GpuBackendError`, and delivers health events
through the same bounded ``wait_event``.

The GPUs come from a YAML file (``--gpus-file``)::

    live_pids_only: false          # report only processes whose PID exists here
    gpus:
      - uuid: GPU-0b8a5e3c-1f6e-4a53-9c1e-2d7b8f1a0c01
        name: NVIDIA A100-SXM4-80GB
        memory_mib: 81920
        numa_node: 0
        # optional: index, minor_number, pci_bus_id, mig_enabled,
        # utilization_percent, memory_reserved_mib, fail, xids, processes,
        # lost, volatile_uncorrected_ecc, remapped_rows, retired_pages_pending
        processes: [{pid: 4242, used_memory_mib: 2048}]  # + utilization_percent
        xids: []                   # append 79 to simulate "GPU fell off the bus"
        lost: false                # true: every query answers "GPU is lost"
        volatile_uncorrected_ecc: 0   # null: the GPU has no ECC (not supported)
        remapped_rows: {correctable: 0, uncorrectable: 0, pending: false, failure: false}
        retired_pages_pending: false  # null: not supported (Ampere and later)
        compute_mode: Default      # Exclusive_Process once the MPS supervisor set it

The file is re-read when it changes, so a test (or a person trying
``make run``) can drive a running plugin from outside the process: appending to
``xids`` emits one event per new entry, ``processes`` changes what the agent
sees, ``fail: usage`` makes readings fail like a wedged NVML call. A file that
stops parsing is logged and ignored; the last good state stays.

Faults play out as NVML plays them (:mod:`plugin.gpu.nvml` is the reference):
a ``lost`` GPU answers every query with "GPU is lost" (``GpuBackendError``
with ``lost`` set) and is described by discovery without its UUID
(``identity_known`` false, a placeholder UUID, as NVML cannot read it), yet
its events still name it (NVML maps an event's handle to the GPU it was
registered for); a memory query a GPU lacks is ``None`` (NOT_SUPPORTED);
:meth:`SimulatedGpus.emit_unidentified` is an event whose handle no GPU
was registered with, which NVML turns into a wait error with no UUID.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from plugin.api.settings import ConfigError, StrictModel, format_validation_error, read_config_file
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
logger = logging.getLogger("plugin.simulated")

FILE_POLL_INTERVAL_S = 0.1
"""How often ``wait_event`` looks at the file; short, because it is a stat() call."""


class SimulatedProcess(StrictModel):
    """One compute process on a simulated GPU."""

    pid: int = Field(gt=0)
    used_memory_mib: int = Field(default=0, ge=0)
    utilization_percent: int | None = Field(default=None, ge=0, le=100)
    """SM utilisation of this process; None like a driver that cannot sample it."""


class SimulatedRemappedRows(StrictModel):
    """``nvmlDeviceGetRemappedRows``: ``(corrRows, uncRows, isPending, failureOccurred)``."""

    correctable: int = Field(default=0, ge=0)
    uncorrectable: int = Field(default=0, ge=0)
    pending: bool = False
    failure: bool = False


class SimulatedGpu(StrictModel):
    """One simulated GPU; only ``uuid``, ``name`` and ``memory_mib`` are required."""

    uuid: str = Field(pattern=r"^(GPU|MIG)-[0-9A-Za-z-]{1,60}$")
    name: str = Field(min_length=1)
    memory_mib: int = Field(gt=0)
    numa_node: int | None = Field(default=None, ge=0)
    index: int | None = Field(default=None, ge=0)
    minor_number: int | None = Field(default=None, ge=0)
    pci_bus_id: str | None = None
    mig_enabled: bool = False
    mig_devices: list[str] = Field(default_factory=list)
    """UUIDs (``MIG-…``) of the MIG devices on this GPU, as NVML would list them."""
    utilization_percent: int | None = Field(default=0, ge=0, le=100)
    memory_reserved_mib: int = Field(default=0, ge=0)
    """Memory in use that no listed process holds (driver, context overhead)."""
    fail: Literal["discovery", "usage", "processes", "compute_mode"] | None = None
    """Make one kind of call fail for this GPU, as a flaky NVML call would."""
    xids: list[int] = Field(default_factory=list)
    """XID errors that have happened, oldest first. New entries become events."""
    processes: list[SimulatedProcess] = Field(default_factory=list)
    lost: bool = False
    """Fallen off the bus: every query fails with "GPU is lost", discovery cannot
    read the UUID (``NVML_ERROR_GPU_IS_LOST``)."""
    volatile_uncorrected_ecc: int | None = Field(default=0, ge=0)
    """Uncorrectable ECC errors since the last driver load; None: no ECC."""
    remapped_rows: SimulatedRemappedRows | None = Field(default_factory=SimulatedRemappedRows)
    """None: no row remapper (before Ampere)."""
    retired_pages_pending: bool | None = False
    """None: no page retirement (Ampere and later)."""
    compute_mode: ComputeMode = "Default"
    """As ``nvmlDeviceGetComputeMode`` reports it; :meth:`SimulatedGpus.set_compute_mode`
    changes it in memory, as the driver does."""


class SimulatedGpusFile(StrictModel):
    """The whole ``--gpus-file``."""

    live_pids_only: bool = False
    """Report only processes whose PID exists on this host, as NVML would after
    a kill. Tests that kill real processes turn this on."""
    gpus: list[SimulatedGpu] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> SimulatedGpusFile:
        uuids = [g.uuid for g in self.gpus]
        dup = {u for u in uuids if uuids.count(u) > 1}
        if dup:
            raise ValueError(f"GPU uuids must be unique; repeated: {', '.join(sorted(dup))}")
        indices = [g.index if g.index is not None else i for i, g in enumerate(self.gpus)]
        dup_idx = {i for i in indices if indices.count(i) > 1}
        if dup_idx:
            raise ValueError(f"GPU indices must be unique; repeated: {sorted(dup_idx)}")
        return self


def load_gpus_file(path: Path) -> SimulatedGpusFile:
    """Parse and validate a simulated-GPU file; :class:`ConfigError` says what is wrong."""
    data = read_config_file(path)
    try:
        return SimulatedGpusFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            f"GPUs file {path}: "
            + format_validation_error(exc, model=SimulatedGpusFile).split("\n", 1)[-1].strip()
        ) from exc


class SimulatedGpus:
    """A :class:`~plugin.gpu.backend.GpuBackend` over :class:`SimulatedGpusFile`.

    Thread-safe: the plugin's health loop calls :meth:`wait_event` from a worker
    thread while the agent reads usage from another.
    """

    kind = "simulated"

    def __init__(self, spec: SimulatedGpusFile, *, path: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._events: queue.Queue[GpuEvent | None] = queue.Queue()
        """None stands for an event with an unknown handle (:meth:`emit_unidentified`)."""
        self._spec = spec
        self._path = path
        self._stamp = self._file_stamp()
        self._closed = False
        self._modes: dict[str, ComputeMode] = {}
        """Compute modes set through :meth:`set_compute_mode`; they outlive file reloads."""
        self.compute_mode_changes: list[tuple[str, ComputeMode]] = []
        """Every :meth:`set_compute_mode`, in order: what a test checks was set and restored."""

    @classmethod
    def from_file(cls, path: Path) -> SimulatedGpus:
        """Load ``path`` now (errors are :class:`ConfigError`) and follow its changes."""
        return cls(load_gpus_file(path), path=path)

    # ------------------------------------------------------------- the port
    def devices(self) -> Sequence[GpuInfo]:
        self._refresh()
        with self._lock:
            return tuple(self._info(i, g) for i, g in enumerate(self._spec.gpus))

    def processes(self, uuid: str) -> Sequence[GpuProcess]:
        self._refresh()
        with self._lock:
            gpu = self._answering(uuid, "list processes on")
            if gpu.fail == "processes":
                raise GpuBackendError(f"simulated failure listing processes on {uuid}", uuid=uuid)
            live_only = self._spec.live_pids_only
            procs = list(gpu.processes)
        return tuple(
            GpuProcess(
                pid=p.pid,
                used_memory_mib=p.used_memory_mib,
                utilization_percent=p.utilization_percent,
            )
            for p in procs
            if not live_only or _pid_alive(p.pid)
        )

    def usage(self, uuid: str) -> GpuUsage:
        procs = self.processes(uuid) if not self._fails(uuid, "processes") else ()
        with self._lock:
            gpu = self._answering(uuid, "read memory of")
            if gpu.fail == "usage":
                raise GpuBackendError(f"simulated failure reading usage of {uuid}", uuid=uuid)
            used = gpu.memory_reserved_mib + sum(p.used_memory_mib for p in procs)
            return GpuUsage(
                memory_used_mib=min(used, gpu.memory_mib),
                memory_total_mib=gpu.memory_mib,
                utilization_percent=gpu.utilization_percent,
            )

    def check_alive(self, uuid: str) -> None:
        """A memory query, as NVML's: a lost GPU or one whose readings fail does not answer."""
        self._refresh()
        with self._lock:
            gpu = self._answering(uuid, "read memory of")
            if gpu.fail == "usage":
                raise GpuBackendError(f"simulated failure reading memory of {uuid}", uuid=uuid)

    def memory_health(self, uuid: str) -> MemoryHealth:
        self._refresh()
        with self._lock:
            gpu = self._answering(uuid, "read the memory error state of")
            rows = gpu.remapped_rows
            return MemoryHealth(
                volatile_uncorrected_ecc=gpu.volatile_uncorrected_ecc,
                remapped_rows=(
                    None
                    if rows is None
                    else RemappedRows(
                        correctable=rows.correctable,
                        uncorrectable=rows.uncorrectable,
                        pending=rows.pending,
                        failure=rows.failure,
                    )
                ),
                retired_pages_pending=gpu.retired_pages_pending,
            )

    def watch_events(self, uuids: Collection[str]) -> None:
        """Nothing to register: every simulated GPU delivers its events, and the
        caller ignores those it does not watch (as it must for NVML too)."""

    def wait_event(self, timeout_s: float) -> GpuEvent | None:
        deadline = time.monotonic() + max(0.0, timeout_s)
        while not self._closed:
            self._refresh()
            remaining = deadline - time.monotonic()
            try:
                item = self._events.get(timeout=max(0.0, min(remaining, FILE_POLL_INTERVAL_S)))
            except queue.Empty:
                if remaining <= FILE_POLL_INTERVAL_S:
                    return None
                continue
            if item is None:  # an event whose handle no GPU was registered with
                raise GpuBackendError("NVML event from a GPU it cannot identify: Unknown Error")
            return item
        return None

    def close(self) -> None:
        self._closed = True

    # --------------------------------------------------------- compute mode
    def compute_mode(self, uuid: str) -> ComputeMode:
        self._refresh()
        with self._lock:
            return self._answering(uuid, "read the compute mode of").compute_mode

    def set_compute_mode(self, uuid: str, mode: ComputeMode) -> None:
        """Kept in memory, as the driver keeps it (a reload of the file does not
        undo it), and recorded in :attr:`compute_mode_changes` in call order."""
        with self._lock:
            gpu = self._answering(uuid, f"set the compute mode to {mode} of")
            if gpu.fail == "compute_mode":
                raise GpuBackendError(
                    f"NVML could not set the compute mode of {uuid} to {mode}: "
                    "Insufficient Permissions",
                    uuid=uuid,
                )
            self._modes[uuid] = mode
            self.compute_mode_changes.append((uuid, mode))
        self.update(uuid, compute_mode=mode)

    # ----------------------------------------------------- test/demo hooks
    def emit(self, event: GpuEvent) -> None:
        """Deliver ``event`` to the next :meth:`wait_event` (as a driver event would)."""
        self._events.put(event)

    def emit_unidentified(self) -> None:
        """An event whose device handle no GPU was registered with: the next
        :meth:`wait_event` fails with no UUID, as NVML's does, so every GPU is suspect."""
        self._events.put(None)

    def update(self, uuid: str, **changes: object) -> None:
        """Change fields of one GPU in place, e.g. ``update(u, processes=[...])``.

        Values are validated like the file is, so a test cannot build a state
        the YAML could not describe.
        """
        with self._lock:
            gpus = list(self._spec.gpus)
            for i, gpu in enumerate(gpus):
                if gpu.uuid == uuid:
                    merged = gpu.model_dump() | changes
                    gpus[i] = SimulatedGpu.model_validate(merged)
                    break
            else:
                raise GpuBackendError(f"unknown GPU: {uuid}", uuid=uuid)
            self._spec = SimulatedGpusFile(live_pids_only=self._spec.live_pids_only, gpus=gpus)

    # ----------------------------------------------------------- internals
    def _fails(self, uuid: str, what: str) -> bool:
        with self._lock:
            return any(g.uuid == uuid and g.fail == what for g in self._spec.gpus)

    def _find(self, uuid: str) -> SimulatedGpu:
        for gpu in self._spec.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise GpuBackendError(f"unknown GPU: {uuid}", uuid=uuid)

    def _answering(self, uuid: str, what: str) -> SimulatedGpu:
        """The GPU ``uuid``, unless it is lost (then the NVML error a lost GPU gives)."""
        gpu = self._find(uuid)
        if gpu.lost:
            raise GpuBackendError(
                f"NVML could not {what} {uuid}: GPU is lost", uuid=uuid, lost=True
            )
        return gpu

    @staticmethod
    def _info(position: int, gpu: SimulatedGpu) -> GpuInfo:
        index = gpu.index if gpu.index is not None else position
        if gpu.lost:
            # What NVML's discovery returns for a lost GPU: the handle call fails,
            # so nothing about it is known, not even its UUID.
            return GpuInfo(
                index=index,
                uuid=f"GPU-unknown-index-{index}",
                name="unknown",
                memory_mib=0,
                minor_number=index,
                pci_bus_id="",
                numa_node=None,
                unhealthy_reason=f"NVML could not get a handle of GPU {index}: GPU is lost",
                identity_known=False,
            )
        return GpuInfo(
            index=index,
            uuid=gpu.uuid,
            name=gpu.name,
            memory_mib=gpu.memory_mib,
            minor_number=gpu.minor_number if gpu.minor_number is not None else index,
            pci_bus_id=gpu.pci_bus_id or f"00000000:{0x10 + index:02X}:00.0",
            numa_node=gpu.numa_node,
            mig_enabled=gpu.mig_enabled,
            mig_devices=tuple(gpu.mig_devices),
            unhealthy_reason=(
                f"simulated discovery failure on {gpu.uuid}" if gpu.fail == "discovery" else None
            ),
        )

    def _file_stamp(self) -> tuple[int, int] | None:
        if self._path is None:
            return None
        try:
            st = self._path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def _refresh(self) -> None:
        """Re-read the file if it changed, turning new ``xids`` entries into events."""
        stamp = self._file_stamp()
        if self._path is None or stamp is None or stamp == self._stamp:
            return
        try:
            new = load_gpus_file(self._path)
        except ConfigError as exc:
            logger.error("ignoring changed GPUs file, keeping the last good state: %s", exc)
            self._stamp = stamp
            return
        with self._lock:
            old_xids = {g.uuid: g.xids for g in self._spec.gpus}
            if self._modes:
                new = new.model_copy(
                    update={
                        "gpus": [
                            g.model_copy(update={"compute_mode": self._modes[g.uuid]})
                            if g.uuid in self._modes
                            else g
                            for g in new.gpus
                        ]
                    }
                )
            self._spec = new
            self._stamp = stamp
        for gpu in new.gpus:
            before = old_xids.get(gpu.uuid, [])
            if gpu.xids[: len(before)] == before:
                for xid in gpu.xids[len(before) :]:
                    self._events.put(GpuEvent(uuid=gpu.uuid, kind="xid", xid=xid))


def _pid_alive(pid: int) -> bool:
    """True for a running process; a zombie (killed, not yet reaped) counts as gone,
    because NVML stops listing a process once it has exited."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust kill(0)
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


_: GpuBackend = SimulatedGpus(SimulatedGpusFile())  # mypy: still satisfies the port
_modes: ComputeModeControl = SimulatedGpus(SimulatedGpusFile())  # and the compute-mode port
