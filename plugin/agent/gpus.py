"""Adapter: the agent's GPU facts through the :class:`~plugin.gpu.backend.GpuBackend` port.

:func:`open_backend` picks simulated GPUs (``gpus_file`` set) or NVML through
:func:`plugin.gpu.backends.open_backend`, the device plugin's own choice, so a node
without the driver library, or a test, never loads ``pynvml``. The agent never
crashes for lack of a driver:
with no usable NVML it serves an empty node (:class:`~plugin.gpu.backend.NullBackend`)
and says so, because the device plugin next to it is the component that decides
whether a GPU-less node is an error (``fail_on_init_error``).

:func:`read_gpus` and :func:`resolve_owners` block (driver calls, procfs
reads); the agent runs them in a worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from plugin.agent.accounting import GpuReading
from plugin.agent.cgroups import (
    CgroupFormatError,
    ContainerId,
    ProcessGoneError,
    pick_container,
    read_process_cgroup,
)
from plugin.gpu import backends
from plugin.gpu.backend import (
    GpuBackend,
    GpuBackendError,
    GpuInfo,
    GpuProcess,
    GpuUsage,
    NullBackend,
)
from plugin.gpu.identity import GpuIdentityBook

logger = logging.getLogger(__name__)


class NoDriver(NullBackend):
    """The empty node served when no GPU driver opens, keeping why for ``mgctl``."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def open_backend(*, gpus_file: Path | None) -> GpuBackend:
    """Simulated GPUs from ``gpus_file``, else NVML, else an empty node (logged).

    A bad ``gpus_file`` raises :class:`~plugin.api.settings.ConfigError`: that is
    the operator's typo, not a missing driver.
    """
    try:
        return backends.open_backend(gpus_file=gpus_file)
    except GpuBackendError as exc:
        logger.warning("no usable GPU driver, serving a node without GPUs: %s", exc)
        return NoDriver(str(exc))


def read_gpus(
    backend: GpuBackend,
    *,
    identities: GpuIdentityBook | None = None,
    unidentified: list[GpuInfo] | None = None,
) -> tuple[GpuReading, ...]:
    """Every GPU with its usage and processes now.

    A failure listing the GPUs at all raises :class:`GpuBackendError` (the
    whole reading is stale); a failure on one GPU is recorded in that GPU's
    :attr:`GpuReading.error` and the others are read normally.

    With ``identities``, a GPU discovery cannot identify (lost) is listed under
    the identity an earlier discovery saw (:mod:`plugin.gpu.identity`), without
    readings, so its shares stay visible; one never identified is left out and
    appended to ``unidentified``.
    """
    infos = tuple(backend.devices())
    if identities is not None:
        reconciled = identities.reconcile(infos)
        infos = reconciled.gpus
        if unidentified is not None:
            unidentified.extend(reconciled.unidentified)
    readings: list[GpuReading] = []
    for info in infos:
        if identities is not None and info.unhealthy_reason is not None:
            # Lost or undescribable: every query would fail the same way.
            readings.append(GpuReading(info=info, usage=None, processes=None))
            continue
        errors: list[str] = []
        processes: tuple[GpuProcess, ...] | None = None
        usage: GpuUsage | None = None
        try:
            processes = tuple(backend.processes(info.uuid))
        except GpuBackendError as exc:
            errors.append(str(exc))
        try:
            usage = backend.usage(info.uuid)
        except GpuBackendError as exc:
            errors.append(str(exc))
        readings.append(
            GpuReading(info=info, usage=usage, processes=processes, error="; ".join(errors) or None)
        )
    return tuple(readings)


def resolve_owners(
    pids: Iterable[int], *, proc_root: Path, known: Callable[[ContainerId], bool]
) -> dict[int, ContainerId | None]:
    """PID → container ID (None: a host process) for each GPU process.

    A process that exited since the GPU reading is left out; an unreadable
    cgroup file is logged once per cycle and treated as "not a container", so
    it is never enforced against.
    """
    owners: dict[int, ContainerId | None] = {}
    for pid in pids:
        try:
            owners[pid] = pick_container(read_process_cgroup(pid, proc_root=proc_root), known=known)
        except ProcessGoneError:
            continue
        except CgroupFormatError as exc:
            logger.warning("cannot attribute GPU process %d: %s", pid, exc)
            owners[pid] = None
    return owners
