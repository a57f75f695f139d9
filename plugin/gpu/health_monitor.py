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
recovery when they are due: a due GPU must answer and pass the recovery checks
(:func:`~plugin.gpu.health.memory_problems`). Every ``liveness_interval_s`` it
also polls every healthy GPU (:meth:`~plugin.gpu.backend.GpuBackend.check_alive`),
so a GPU that falls off the bus without an XID is noticed within one interval.

The board also holds the one :class:`~plugin.gpu.health.GpuHealth` record per
GPU (:meth:`HealthBoard.records`) and tells listeners (the board file the agent
reads, :mod:`plugin.gpu.health_file`) whenever a record or a liveness count changes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from plugin.gpu.backend import GpuBackend, GpuBackendError, GpuEvent, GpuInfo
from plugin.gpu.health import (
    HEALTHY,
    UNHEALTHY,
    GpuHealth,
    HealthChange,
    HealthLedger,
    HealthPolicy,
    memory_problems,
)
from plugin.gpu.mps import MpsNode

# The name it had before plugin/ was split by concern: log lines (text and JSON
# show the logger) and any logging config that names it stay as they were.
logger = logging.getLogger("plugin.health_monitor")

Clock = Callable[[], float]


@dataclass(frozen=True)
class HealthSnapshot:
    version: int
    unhealthy: Mapping[str, str]
    """UUID → reason."""


@dataclass(frozen=True)
class LivenessCount:
    """Liveness polls of one GPU since the plugin started."""

    ok: int = 0
    failed: int = 0


class HealthBoard:
    """Node-wide GPU health with change notification. Use from one event loop."""

    def __init__(
        self,
        policy: HealthPolicy | None = None,
        *,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
    ) -> None:
        self.ledger = HealthLedger(policy or HealthPolicy())
        self.clock = clock
        self.wall = wall
        self._version = 0
        self._changed = asyncio.Event()
        self._gpus: dict[str, GpuInfo] = {}
        self._since: dict[str, float] = {}
        self._liveness: dict[str, LivenessCount] = {}
        self._listeners: list[Callable[[HealthBoard], None]] = []
        self._foreign: dict[str, str] = {}
        """GPU UUID → why another device plugin's resource claims it
        (:mod:`plugin.placement.ownership`). Kept apart from the ledger: it is not
        a fault, no probe heals it, and it ends only when the other plugin lets go."""
        self._mps: dict[str, str] = {}
        """GPU UUID → why the supervised MPS control daemon cannot serve it now
        (:mod:`plugin.gpu.mps_supervisor`). Not a fault of the GPU either: it ends
        when the daemon answers again, and no probe heals it."""
        self._mps_node = MpsNode()

    def snapshot(self) -> HealthSnapshot:
        unhealthy = dict(self.ledger.unhealthy())
        for uuid, reason in self._mps.items():
            other = unhealthy.get(uuid)
            unhealthy[uuid] = reason if other is None else f"{reason}; also {other}"
        for uuid, reason in self._foreign.items():
            other = unhealthy.get(uuid)
            unhealthy[uuid] = reason if other is None else f"{reason}; also {other}"
        return HealthSnapshot(version=self._version, unhealthy=unhealthy)

    @property
    def mps(self) -> Mapping[str, str]:
        """GPU UUID → reason, for every GPU the MPS daemon cannot serve now."""
        return dict(self._mps)

    def set_mps(self, reasons: Mapping[str, str]) -> None:
        """Replace the set of GPUs withdrawn because the supervised MPS control daemon
        cannot serve them (down, restarting, compute mode not set); log each GPU once
        when it is withdrawn for that and once when it is offered again."""
        if reasons == self._mps:
            return
        for uuid, reason in reasons.items():
            if uuid not in self._mps:
                logger.warning(
                    "GPU withdrawn, all its meta-devices Unhealthy: %s", reason, extra={"gpu": uuid}
                )
        for uuid in self._mps.keys() - reasons.keys():
            logger.info(
                "MPS control daemon serves the GPU again; offered again", extra={"gpu": uuid}
            )
        now = self.wall()
        for uuid in reasons.keys() ^ self._mps.keys():
            self._since[uuid] = now
        self._mps = dict(reasons)
        self._bump()

    @property
    def mps_node(self) -> MpsNode:
        """How this node serves MPS and its daemon's status, for the board file."""
        return self._mps_node

    def set_mps_node(self, node: MpsNode) -> None:
        """Listeners hear of a change (the board file); no record changes with it, so
        ListAndWatch streams are not woken."""
        if node == self._mps_node:
            return
        self._mps_node = node
        self._notify()

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
        now = self.wall()
        for uuid in reasons.keys() ^ self._foreign.keys():
            self._since[uuid] = now
        self._foreign = dict(reasons)
        self._bump()

    # ------------------------------------------------ the one health record
    def set_gpus(self, infos: Iterable[GpuInfo]) -> None:
        """The GPUs the plugin serves now (after a discovery), by their remembered
        identity: these are the ones :meth:`records` lists."""
        self._gpus = {g.uuid: g for g in infos}
        now = self.wall()
        for uuid in self._gpus:
            self._since.setdefault(uuid, now)
        self._notify()

    @property
    def gpus(self) -> Mapping[str, GpuInfo]:
        """UUID → identity of every GPU :meth:`records` covers."""
        return dict(self._gpus)

    def record_of(self, uuid: str) -> GpuHealth:
        """The health record of one GPU (Healthy for one the board holds nothing against).

        Another device plugin's claim (:meth:`set_foreign`) outranks a fault: no
        probe heals it, so it is the check an operator must act on first.
        """
        reason = self.ledger.unhealthy().get(uuid)
        since = self._since.get(uuid, 0.0)
        foreign = self._foreign.get(uuid)
        mps = self._mps.get(uuid)
        if foreign is not None:
            also = "; ".join(r for r in (mps, reason) if r)
            shown = foreign if not also else f"{foreign}; also {also}"
            return GpuHealth(uuid=uuid, state=UNHEALTHY, reason=shown, check="foreign", since=since)
        if mps is not None:
            shown = mps if reason is None else f"{mps}; also {reason}"
            return GpuHealth(uuid=uuid, state=UNHEALTHY, reason=shown, check="mps", since=since)
        if reason is None:
            return GpuHealth(uuid=uuid, state=HEALTHY, reason="", check="", since=since)
        return GpuHealth(
            uuid=uuid,
            state=UNHEALTHY,
            reason=reason,
            check=self.ledger.check_of(uuid),
            since=since,
        )

    def records(self) -> dict[str, GpuHealth]:
        """THE health record of every GPU on the node, by UUID: what ListAndWatch
        advertises, and what the agent's mgctl, metrics and labels show."""
        return {uuid: self.record_of(uuid) for uuid in self._gpus}

    def liveness(self) -> dict[str, LivenessCount]:
        """Liveness poll counts per GPU UUID."""
        return dict(self._liveness)

    def count_liveness(self, results: Mapping[str, bool]) -> None:
        """One liveness round's results (UUID → answered); listeners hear of it."""
        for uuid, ok in results.items():
            c = self._liveness.get(uuid, LivenessCount())
            self._liveness[uuid] = LivenessCount(c.ok + ok, c.failed + (not ok))
        self._notify()

    def add_listener(self, listener: Callable[[HealthBoard], None]) -> None:
        """Call ``listener(board)`` after every change of a record or a count (and now)."""
        self._listeners.append(listener)
        listener(self)

    def _notify(self) -> None:
        for listener in self._listeners:
            try:
                listener(self)
            except Exception:  # a broken listener must not stop health checking
                logger.exception("health board listener failed")

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
        now = self.wall()
        for change in changes:
            if not change.reason_only:
                self._since[change.uuid] = now
            if change.reason_only:
                logger.warning("GPU still unhealthy: %s", change.reason, extra={"gpu": change.uuid})
            elif change.healthy:
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
        self._notify()

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
        liveness_interval_s: float = 0.0,
    ) -> None:
        self._backend = backend
        self._board = board
        self._uuids: frozenset[str] = frozenset()
        self._timeout_s = event_timeout_s
        self._liveness_s = liveness_interval_s
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
        if self._liveness_s > 0:
            self._tasks.append(asyncio.create_task(self._poll_liveness(), name="health-liveness"))
        for task in self._tasks:
            task.add_done_callback(_log_unexpected_exit)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        self._stopping = True
        reader, applier, *others = self._tasks or (None, None)
        self._tasks = []
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
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
        """Heal GPUs clean for ``recovery_s`` that answer the driver and pass the
        recovery checks; the others stay sick, with the reason the checks give."""
        board = self._board
        for uuid in board.ledger.recovery_due(now=board.clock()):
            try:
                await asyncio.to_thread(self._backend.check_alive, uuid)
                memory = await asyncio.to_thread(self._backend.memory_health, uuid)
            except GpuBackendError as exc:
                logger.warning(
                    "GPU still not answering; staying unhealthy: %s", exc, extra={"gpu": uuid}
                )
                board.ledger.probe_failed(uuid, str(exc), now=board.clock())
                continue
            problems = memory_problems(memory, board.ledger.policy.checks)
            if problems:
                change = board.ledger.checks_failed(uuid, problems, now=board.clock())
            else:
                change = board.ledger.recover(uuid, now=board.clock())
            board.apply([change] if change else [])

    async def _poll_liveness(self) -> None:
        """Every ``liveness_interval_s``: one cheap query to every watched, healthy
        GPU; one that does not answer gets a ``gpu_lost`` (or ``backend_error``)
        event, judged like any other. Sick GPUs are left to the recovery probe."""
        board = self._board
        while True:
            await asyncio.sleep(self._liveness_s)
            uuids = sorted(u for u in self._uuids if board.ledger.is_healthy(u))
            if not uuids:
                continue
            results = await asyncio.to_thread(_check_all, self._backend, uuids)
            board.count_liveness({uuid: exc is None for uuid, exc in results.items()})
            for uuid, exc in results.items():
                if exc is not None:
                    detail = f"liveness check: {exc}"
                    event = (
                        GpuEvent(uuid=uuid, kind="gpu_lost", detail=detail)
                        if exc.lost
                        else GpuEvent(uuid=uuid, kind="backend_error", detail=detail)
                    )
                    await self._queue.put(event)


def _check_all(backend: GpuBackend, uuids: Iterable[str]) -> dict[str, GpuBackendError | None]:
    """One liveness round in one worker thread (not one thread hop per GPU)."""
    results: dict[str, GpuBackendError | None] = {}
    for uuid in uuids:
        try:
            backend.check_alive(uuid)
        except GpuBackendError as exc:
            results[uuid] = exc
        else:
            results[uuid] = None
    return results


def _log_unexpected_exit(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        logger.error("health task %s failed", task.get_name(), exc_info=exc)
