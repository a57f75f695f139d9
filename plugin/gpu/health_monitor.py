"""The health event loop and the board ListAndWatch streams read from (asyncio adapter).

:class:`HealthBoard` holds the node's GPU health (a :class:`~plugin.gpu.health.HealthLedger`)
and wakes every waiting ``ListAndWatch`` stream when it changes: each change
bumps a version and sets the current :class:`asyncio.Event`, which is then
replaced, so any number of streams see every change without per-stream queues.
The board outlives plugin restarts (kubelet restarts, SIGHUP): a GPU that was
sick before a restart is still sick after it.

:class:`HealthMonitor` runs the NVML wait in a worker thread
(``asyncio.to_thread`` around the backend's bounded ``wait_event``, as NVIDIA
loops on ``eventSet.Wait(5000)``), hands events to the loop through an
:class:`asyncio.Queue`, applies them to the board, and probes sick GPUs for
recovery when they are due.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from plugin.gpu.backend import GpuBackend, GpuBackendError, GpuEvent
from plugin.gpu.health import HealthChange, HealthLedger, HealthPolicy

# The name it had before plugin/ was split by concern: log lines (text and JSON
# show the logger) and any logging config that names it stay as they were.
logger = logging.getLogger("plugin.health_monitor")

Clock = Callable[[], float]


@dataclass(frozen=True)
class HealthSnapshot:
    version: int
    unhealthy: Mapping[str, str]
    """UUID → reason."""


class HealthBoard:
    """Node-wide GPU health with change notification. Use from one event loop."""

    def __init__(
        self, policy: HealthPolicy | None = None, *, clock: Clock = time.monotonic
    ) -> None:
        self.ledger = HealthLedger(policy or HealthPolicy())
        self.clock = clock
        self._version = 0
        self._changed = asyncio.Event()
        self._foreign: dict[str, str] = {}
        """GPU UUID → why another device plugin's resource claims it
        (:mod:`plugin.placement.ownership`). Kept apart from the ledger: it is not
        a fault, no probe heals it, and it ends only when the other plugin lets go."""

    def snapshot(self) -> HealthSnapshot:
        unhealthy = dict(self.ledger.unhealthy())
        for uuid, reason in self._foreign.items():
            other = unhealthy.get(uuid)
            unhealthy[uuid] = reason if other is None else f"{reason}; also {other}"
        return HealthSnapshot(version=self._version, unhealthy=unhealthy)

    @property
    def foreign(self) -> Mapping[str, str]:
        """GPU UUID → reason, for every GPU another resource claims now."""
        return dict(self._foreign)

    def set_foreign(self, reasons: Mapping[str, str]) -> None:
        """Replace the set of GPUs another resource claims; log each GPU once when it
        is withdrawn for that and once when it is offered again (never per check)."""
        if reasons == self._foreign:
            return
        for uuid, reason in reasons.items():
            if uuid not in self._foreign:
                logger.warning(
                    "GPU withdrawn, all its meta-devices Unhealthy: %s",
                    reason,
                    extra={"gpu": uuid},
                )
        for uuid in self._foreign.keys() - reasons.keys():
            logger.info(
                "GPU no longer handed out by another device plugin; offered again",
                extra={"gpu": uuid},
            )
        self._foreign = dict(reasons)
        self._bump()

    @property
    def version(self) -> int:
        return self._version

    async def wait_changed(self, version: int) -> int:
        """Return the current version once it differs from ``version``."""
        while self._version == version:
            await self._changed.wait()
        return self._version

    def apply(self, changes: Collection[HealthChange]) -> None:
        """Log state changes and wake the streams (once for the whole batch)."""
        if not changes:
            return
        for change in changes:
            if change.healthy:
                logger.info("GPU healthy again: %s", change.reason, extra={"gpu": change.uuid})
            else:
                logger.warning(
                    "GPU unhealthy, all its meta-devices withdrawn: %s",
                    change.reason,
                    extra={"gpu": change.uuid},
                )
        self._bump()

    def _bump(self) -> None:
        self._version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def record(self, event: GpuEvent) -> None:
        change = self.ledger.record(event, now=self.clock())
        if change is None:
            logger.debug("health event without state change: %s", event)
        self.apply([change] if change else [])

    def set_discovery_failures(self, failures: Mapping[str, str]) -> None:
        self.apply(self.ledger.mark_discovery_failures(failures, now=self.clock()))

    def clear_event_failures(self) -> None:
        """Health checking is off: heal what only events made sick (see
        :meth:`~plugin.gpu.health.HealthLedger.clear_events`)."""
        self.apply(self.ledger.clear_events())


class HealthMonitor:
    """Watch one backend's events for ``uuids`` and keep ``board`` up to date.

    ``async with HealthMonitor(...)`` starts it; leaving stops it and waits for
    the worker thread (at most ``event_timeout_s``), so the backend may be
    closed right after.
    """

    def __init__(
        self,
        backend: GpuBackend,
        board: HealthBoard,
        *,
        uuids: Iterable[str],
        event_timeout_s: float,
    ) -> None:
        self._backend = backend
        self._board = board
        self._uuids: frozenset[str] = frozenset()
        self._timeout_s = event_timeout_s
        self._queue: asyncio.Queue[GpuEvent] = asyncio.Queue()
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self.watch(uuids)

    def watch(self, uuids: Iterable[str]) -> None:
        """Change which GPUs are watched (after a rediscovery); others' events are ignored.

        The backend is told too, so GPUs that a rediscovery adds (or heals) get
        registered for driver events, not only counted."""
        self._uuids = frozenset(uuids)
        self._backend.watch_events(self._uuids)

    async def __aenter__(self) -> HealthMonitor:
        self._tasks = [
            asyncio.create_task(self._read_events(), name="health-events-reader"),
            asyncio.create_task(self._apply_events(), name="health-events-apply"),
        ]
        for task in self._tasks:
            task.add_done_callback(_log_unexpected_exit)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        self._stopping = True
        reader, applier = self._tasks or (None, None)
        self._tasks = []
        if applier is not None:
            applier.cancel()
        if reader is not None:
            # Not cancelled: the worker thread cannot be interrupted, and the
            # backend must not be closed under it. It returns within one wait.
            # A task that failed was logged when it did (_log_unexpected_exit).
            await asyncio.gather(reader, return_exceptions=True)
        if applier is not None:
            await asyncio.gather(applier, return_exceptions=True)

    async def _read_events(self) -> None:
        """The only code that calls the blocking ``wait_event``."""
        while not self._stopping:
            try:
                event = await asyncio.to_thread(self._backend.wait_event, self._timeout_s)
            except GpuBackendError as exc:
                uuids = [exc.uuid] if exc.uuid else sorted(self._uuids)
                logger.error("waiting for GPU events failed; marking %s unhealthy: %s", uuids, exc)
                for uuid in uuids:
                    event = GpuEvent(uuid=uuid, kind="backend_error", detail=str(exc))
                    await self._queue.put(event)
                # Don't spin on a broken driver: one interval before trying again.
                await asyncio.sleep(min(self._timeout_s, 1.0))
                continue
            if event is not None:
                await self._queue.put(event)

    async def _apply_events(self) -> None:
        board = self._board
        while True:
            due_at = board.ledger.next_recovery_at()
            timeout = None if due_at is None else max(0.0, due_at - board.clock())
            try:
                event = await asyncio.wait_for(self._queue.get(), timeout)
            except TimeoutError:
                await self._probe_due()
                continue
            if event.uuid not in self._uuids:
                logger.debug("event for a GPU this plugin does not advertise: %s", event)
                continue
            board.record(event)

    async def _probe_due(self) -> None:
        """Heal GPUs clean for ``recovery_s`` that still answer the driver."""
        board = self._board
        for uuid in board.ledger.recovery_due(now=board.clock()):
            try:
                await asyncio.to_thread(self._backend.usage, uuid)
            except GpuBackendError as exc:
                logger.warning(
                    "GPU still not answering; staying unhealthy: %s", exc, extra={"gpu": uuid}
                )
                board.ledger.probe_failed(uuid, str(exc), now=board.clock())
                continue
            change = board.ledger.recover(uuid, now=board.clock())
            board.apply([change] if change else [])


def _log_unexpected_exit(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        logger.error("health task %s failed", task.get_name(), exc_info=exc)
