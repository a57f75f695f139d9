"""The node agent: one accounting cycle every ``interval_s``, and the processes' lifecycle.

A cycle (:meth:`Agent.cycle`):

1. read every GPU (devices, usage, processes) in a worker thread;
2. ask the kubelet which container holds which meta-devices or DRA claims
   (PodResources; a claim's share is read from its CDI spec);
3. map each GPU process to its container (``/proc/<pid>/cgroup``);
4. join into a :class:`~plugin.agent.accounting.Snapshot`
   (:meth:`Agent.process`, pure and benchmarked), decide enforcement, update
   metrics; then carry out kills/Events and update the Node labels.

Degrading, input by input: when an input cannot be read the agent logs it once
(and again when it recovers), keeps the last good value, flags it in the
snapshot's ``stale`` set and in ``metagpu_agent_source_up``, takes no
enforcement decision, and leaves the Node labels alone. ``mgctl`` and
``/metrics`` keep answering from what it knows.

:class:`AgentRuntime` owns the sockets and tasks (mgctl API, metrics, pod
watch, the cycle loop) as one async context manager; :func:`serve` runs it
until a stop event. Signals are handled only at the top, in
:mod:`plugin.agent.cli`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, Protocol

from plugin.agent.accounting import (
    Allocation,
    GpuReading,
    Snapshot,
    Source,
    build_snapshot,
)
from plugin.agent.api import ApiContext, ApiServer, install_mgctl
from plugin.agent.cgroups import (
    CgroupFormatError,
    ContainerId,
    ProcessGoneError,
    read_process_cgroup,
)
from plugin.agent.containers import PodIndex
from plugin.agent.dra_shares import DraShareReader
from plugin.agent.enforcement import (
    Decision,
    EnforcementRecord,
    Enforcer,
    EventSink,
    OverrunTracker,
)
from plugin.agent.events import QueuedEventSink
from plugin.agent.gpu_health import BoardReader, DiscoveryLog
from plugin.agent.gpus import NoDriver, open_backend, read_gpus, resolve_owners
from plugin.agent.kube import ApiOpener, KubeEventSink, LedgerPublisher, NodeLabeler
from plugin.agent.labels import desired_labels
from plugin.agent.ledger import build_ledger
from plugin.agent.metrics import AgentMetrics
from plugin.agent.ownership import OwnershipReporter, build_node_event
from plugin.agent.podresources import PodResourcesReader
from plugin.agent.pods import PodWatcher
from plugin.agent.probes import ProbeServer, ProbeState
from plugin.agent.processes import ProcessHandle, open_process
from plugin.agent.tasks import create_guarded_task, stop_tasks
from plugin.agent.usage_history import UsageHistory
from plugin.agent.views import iso_time
from plugin.api.config import PluginConfig
from plugin.api.resources import AGENT_SOCKET_NAME
from plugin.api.scheduling import NodeLedger
from plugin.gpu.backend import GpuBackend, GpuBackendError, GpuInfo
from plugin.gpu.health_file import health_file_path
from plugin.gpu.identity import GpuIdentityBook
from plugin.kubelet.podresources import PodResourcesError
from plugin.placement.devices import GpuSelectionError, select_gpus
from plugin.placement.ownership import AssignedDevices, ResourceDevices, find_foreign_claims

logger = logging.getLogger(__name__)

GPU_READ_TIMEOUT_S: Final = 30.0
"""A driver call that takes longer is wedged; the cycle goes on with the last reading."""
STOP_TIMEOUT_S: Final = 5.0
"""How long stopping waits for tasks and an in-flight GPU read; well under the
30 s a pod gets between SIGTERM and SIGKILL by default."""
EVENT_FLUSH_TIMEOUT_S: Final = 2.0
"""At stop, how long queued Events may take to reach the API server."""


class AllocationSource(Protocol):
    """The kubelet's PodResources API (:class:`plugin.agent.podresources.PodResourcesReader`)."""

    async def list_allocations(self) -> tuple[Allocation, ...]: ...

    async def close(self) -> None: ...


class AllocatableSource(Protocol):
    """Every resource's devices (``GetAllocatableResources``; the same
    :class:`plugin.agent.podresources.PodResourcesReader`)."""

    async def list_allocatable(self) -> tuple[ResourceDevices, ...]: ...


class LabelSink(Protocol):
    """Node labels (:class:`plugin.agent.kube.NodeLabeler`)."""

    async def sync(self, desired: dict[str, str]) -> bool: ...


class LedgerSink(Protocol):
    """The Node's GPU ledger annotation (:class:`plugin.agent.kube.LedgerPublisher`)."""

    async def publish(self, ledger: NodeLedger) -> bool: ...

    async def withdraw(self) -> bool: ...


@dataclass
class CycleResult:
    """What one cycle produced (for tests and the benchmark)."""

    snapshot: Snapshot
    decisions: list[Decision]
    records: list[EnforcementRecord]


class Agent:
    """The accounting cycle. Holds the last snapshot; owns no sockets."""

    def __init__(
        self,
        config: PluginConfig,
        *,
        backend: GpuBackend,
        allocations: AllocationSource,
        index: PodIndex | None = None,
        pods_problem: Callable[[], str | None] = lambda: None,
        pods_watched: bool = True,
        events: EventSink | None = None,
        labels: LabelSink | None = None,
        ledger: LedgerSink | None = None,
        metrics: AgentMetrics | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        open_process: Callable[..., ProcessHandle] = open_process,
        allocatable: AllocatableSource | None = None,
    ) -> None:
        """``allocatable``: what other device plugins advertise, so a GPU they serve
        is never called free (None: only their allocations are seen)."""
        self.config = config
        self.settings = config.agent
        self.backend = backend
        self.allocation_source = allocations
        self.index = index if index is not None else PodIndex()
        self.pods_problem = pods_problem
        self.pods_watched = pods_watched
        """False without a node name: pods are not watched at all, which is not staleness."""
        self.identities = GpuIdentityBook()
        """GPU identities the agent's own discovery saw since start, so a lost GPU
        stays listed under its UUID with its shares. Those the plugin published
        are added each cycle only while its board is current (:meth:`_read_node`):
        a GPU known only from a board must not outlive the board."""
        self.board = BoardReader(
            health_file_path(config.device_plugins_dir),
            proc_root=self.settings.proc_root,
            wall=wall,
        )
        """The device plugin's health board: the one health truth of this node."""
        self.discovery_log = DiscoveryLog()
        self.labels = labels
        self.ledger = ledger
        self._ledger_withdrawn = False
        self.allocatable_source = allocatable
        self._events = events
        self.ownership = OwnershipReporter()
        self.metrics = metrics or AgentMetrics(backend=backend.kind)
        self.tracker = OverrunTracker()
        self.history = UsageHistory(window_s=self.settings.rightsizing_window_s)
        """Each share's peak over the right-sizing window; in memory only, so a
        restart starts the window over (each peak says so)."""
        self.enforcer = Enforcer(
            events=events,
            pods=self.index.pod,
            known=self.index.knows,
            proc_root=self.settings.proc_root,
            reporting_instance=self.settings.node_name or os.uname().nodename,
            open_process=open_process,
        )
        self._monotonic = monotonic
        self._wall = wall
        self.snapshot: Snapshot | None = None
        self.last_cycle_at: float | None = None
        """Monotonic time the last cycle finished."""
        self._readings: tuple[GpuReading, ...] = ()
        self._allocations: tuple[Allocation, ...] = ()
        self._allocatable: tuple[ResourceDevices, ...] = ()
        self._problems: dict[Source, str | None] = {}
        self._gpu_read: asyncio.Future[tuple[GpuReading, ...]] | None = None
        self._resources_key: tuple[tuple[str, int, bool], ...] | None = None
        self._gpu_resources: dict[str, str] = {}
        self._resource_names = tuple(r.name for r in config.resources)
        self._share_resources = (*self._resource_names, self.settings.dra_driver)
        """Whose allocations are shares: the device plugin's resources, and the DRA
        driver's claims (:mod:`plugin.agent.dra_shares`); the rest are other plugins'."""
        self._waiters: list[asyncio.Future[CycleResult]] = []
        self._known: tuple[int, frozenset[ContainerId]] | None = None
        """(index generation, container IDs): rebuilt only when the pod index changed."""

    # -------------------------------------------------------------- cycle
    async def cycle(self) -> CycleResult:
        """Read every input, join, enforce, export. Never raises for an input failure."""
        started = self._monotonic()
        stale: set[Source] = set()
        readings = await self._read_gpus(stale)
        allocations, allocatable = await self._read_allocations(stale)
        pods_problem = self.pods_problem() if self.pods_watched else None
        self._note("pods", pods_problem)
        if pods_problem is not None:
            stale.add("pods")
        # One cgroup read per process, however many GPUs it uses.
        pids = list(dict.fromkeys(p.pid for r in readings for p in r.processes or ()))
        known = self._known_containers()
        owners = await asyncio.to_thread(
            resolve_owners, pids, proc_root=self.settings.proc_root, known=known.__contains__
        )
        snapshot, decisions = self.process(
            readings,
            allocations,
            owners,
            stale=frozenset(stale),
            now_s=self._monotonic(),
            allocatable=allocatable,
        )
        records = await self.enforcer.execute(decisions)
        self.metrics.count(records)
        await self._report_ownership(snapshot)
        if not stale & {"gpus", "podresources"}:
            # Both describe what the kubelet allocated: a stale input would
            # publish yesterday's truth as today's, so they wait for a good read.
            if self.labels is not None:
                await self.labels.sync(desired_labels(snapshot))
            await self._sync_ledger(snapshot)
        self.snapshot = snapshot
        self.last_cycle_at = self._monotonic()
        self.metrics.cycle_seconds.observe(self.last_cycle_at - started)
        result = CycleResult(snapshot, decisions, records)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(result)
        return result

    async def _sync_ledger(self, snapshot: Snapshot) -> None:
        """Publish the ledger (if it changed), or with ``publish_ledger`` off remove
        the annotation once, so a ledger nobody keeps current steers no scheduler."""
        if self.ledger is None:
            return
        if self.settings.publish_ledger:
            await self.ledger.publish(self.node_ledger(snapshot))
        elif not self._ledger_withdrawn:
            self._ledger_withdrawn = await self.ledger.withdraw()

    def node_ledger(self, snapshot: Snapshot) -> NodeLedger:
        """The GPU ledger of the first configured resource (the one the extender
        manages) in ``snapshot``."""

        def uid(namespace: str, pod: str) -> str | None:
            ref = self.index.pod(namespace, pod)
            return ref.uid if ref is not None and ref.uid else None

        return build_ledger(
            snapshot,
            resource=self._resource_names[0],
            id_strategy=self.config.device_id_strategy,
            pod_uid=uid,
            observed_at=iso_time(snapshot.taken_at),
        )

    def _known_containers(self) -> frozenset[ContainerId]:
        """The indexed container IDs, as a copy the worker thread may read while the pod
        watch changes the index; rebuilt only when the index's generation moved."""
        generation = self.index.generation
        if self._known is None or self._known[0] != generation:
            self._known = (
                generation,
                frozenset(c.container_id for c in self.index.containers()),
            )
        return self._known[1]

    async def drain(self, *, timeout_s: float) -> None:
        """Wait (bounded) for a GPU read still running in its thread, so the backend
        is not closed under a driver call (NVML must not shut down mid-call)."""
        read = self._gpu_read
        if read is not None and not read.done():
            with suppress(TimeoutError, GpuBackendError):
                await asyncio.wait_for(asyncio.shield(read), timeout=timeout_s)

    async def next_cycle(self) -> CycleResult:
        """Wait for the next cycle to finish (for tests and tools; no polling)."""
        waiter: asyncio.Future[CycleResult] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return await waiter

    def process(
        self,
        readings: Sequence[GpuReading],
        allocations: Sequence[Allocation],
        owners: dict[int, ContainerId | None],
        *,
        stale: frozenset[Source],
        now_s: float,
        allocatable: Sequence[ResourceDevices] = (),
    ) -> tuple[Snapshot, list[Decision]]:
        """The CPU part of a cycle: join, enforcement decision, metrics update."""
        board = self.board.last
        ownership = find_foreign_claims(
            [r.info for r in readings],
            allocatable,
            [
                AssignedDevices(
                    a.key.namespace, a.key.pod, a.key.container, a.resource, a.device_ids
                )
                for a in allocations
                if a.resource not in self._share_resources
            ],
            own_resources=self._resource_names,
        )
        snapshot = build_snapshot(
            readings,
            allocations,
            owners,
            directory=self.index,
            units_per_gpu=self.config.units_per_gpu,
            gpu_resources=self._resources_for(readings),
            resources=self._share_resources,
            taken_at=self._wall(),
            stale=stale,
            health=board.health() if board is not None else None,
            liveness=board.liveness() if board is not None else None,
            pods_watched=self.pods_watched,
            ownership=ownership,
            no_gpus_reason=None if readings else self.no_gpus_reason(),
            mps=board.board.mps if board is not None else None,
            advertised=(
                [(r.resource_name, r.device_ids) for r in allocatable]
                if self.allocatable_source is not None
                else None
            ),
        )
        snapshot = replace(snapshot, usage_peaks=self.history.record(snapshot, now_s=now_s))
        decisions = self.tracker.decide(
            snapshot,
            now_s=now_s,
            policy=self.settings.memory_enforcement,
            grace_s=self.settings.kill_grace_s,
            cooldown_s=self.settings.report_cooldown_s,
        )
        self.metrics.update(snapshot)
        return snapshot, decisions

    # ------------------------------------------------------------- inputs
    def _read_node(self) -> tuple[GpuReading, ...]:
        """The plugin's board, then every GPU under its remembered identity
        (blocking; one at a time, in a worker thread)."""
        board = self.board.read()
        identities = self.identities
        if board is not None:
            identities = GpuIdentityBook(identities.known())
            identities.learn(g.info for g in board.gpus)
        unidentified: list[GpuInfo] = []
        readings = read_gpus(self.backend, identities=identities, unidentified=unidentified)
        # Only what discovery itself described is remembered (lost ones carry a reason).
        self.identities.learn(r.info for r in readings)
        self.discovery_log.note(readings, unidentified)
        return readings

    def no_gpus_reason(self) -> str:
        """Why this node shows no GPUs at all (for ``mgctl``; the labels say
        ``gpu-count=0`` and the ledger lists none)."""
        if self.board.last is not None:
            return "the device plugin found no GPUs on this node (its health board lists none)"
        driver = (
            f"no usable GPU driver ({self.backend.reason})"
            if isinstance(self.backend, NoDriver)
            else f"the {self.backend.kind} GPU backend lists no GPUs"
        )
        board = self.board.problem or "no GPU health board from the device plugin was read yet"
        return f"{driver}, and {board}"

    async def _read_gpus(self, stale: set[Source]) -> tuple[GpuReading, ...]:
        if self._gpu_read is None or self._gpu_read.done():
            self._gpu_read = asyncio.ensure_future(asyncio.to_thread(self._read_node))
        try:
            readings = await asyncio.wait_for(
                asyncio.shield(self._gpu_read), timeout=GPU_READ_TIMEOUT_S
            )
        except TimeoutError:
            # The thread cannot be interrupted; the next cycle waits on the same read
            # instead of piling up threads behind a wedged driver.
            self._note("gpus", f"reading the GPUs took longer than {GPU_READ_TIMEOUT_S:g} s")
        except GpuBackendError as exc:
            self._note("gpus", f"cannot list GPUs: {exc}")
        else:
            self._note("gpus", None)
            self._readings = readings
            return readings
        stale.add("gpus")
        return self._readings

    async def _read_allocations(
        self, stale: set[Source]
    ) -> tuple[tuple[Allocation, ...], tuple[ResourceDevices, ...]]:
        """Who holds what (``List``) and what every device plugin advertises
        (``GetAllocatableResources``), as one input: either both are fresh or
        both are the last good ones."""
        source = self.allocatable_source
        try:
            allocations = await self.allocation_source.list_allocations()
            allocatable = await source.list_allocatable() if source is not None else ()
        except PodResourcesError as exc:
            self._note("podresources", str(exc))
            stale.add("podresources")
            return self._allocations, self._allocatable
        self._note("podresources", None)
        self._allocations, self._allocatable = allocations, allocatable
        return allocations, allocatable

    async def _report_ownership(self, snapshot: Snapshot) -> None:
        """Log and write a Node Event for each GPU that became (or stopped being)
        contested by another device plugin (:mod:`plugin.agent.ownership`)."""
        notices = self.ownership.decide(snapshot)
        node = self.settings.node_name
        if self._events is None or node is None:
            return
        now = dt.datetime.fromtimestamp(self._wall(), dt.UTC)
        for notice in notices:
            await self._events.record(
                build_node_event(notice, node=node, reporting_instance=node, now=now)
            )

    def _resources_for(self, readings: Sequence[GpuReading]) -> dict[str, str]:
        key = tuple((r.info.uuid, r.info.index, r.info.mig_enabled) for r in readings)
        if key != self._resources_key:
            self._resources_key = key
            try:
                selection = select_gpus([r.info for r in readings], self.config.resources)
            except GpuSelectionError as exc:
                logger.error("GPUs cannot be assigned to resources: %s", exc)
                self._gpu_resources = {}
            else:
                for warning in selection.warnings:
                    logger.warning("%s", warning)
                self._gpu_resources = {
                    gpu.uuid: sel.config.name for sel in selection.resources for gpu in sel.gpus
                }
        return self._gpu_resources

    def _note(self, source: Source, problem: str | None) -> None:
        """Log an input's change of state once, not every cycle."""
        before = self._problems.get(source)
        if problem == before:
            return
        self._problems[source] = problem
        if problem is None:
            logger.info("%s readable again", source, extra={"source": source})
        else:
            logger.warning(
                "%s unavailable, using the last known data: %s",
                source,
                problem,
                extra={"source": source},
            )

    def problem(self, source: Source) -> str | None:
        """Why ``source`` was stale in the last cycle, or None."""
        return self._problems.get(source)

    # --------------------------------------------------------------- loop
    async def run(self) -> None:
        """Cycle every ``interval_s`` until cancelled; a failed cycle is logged, not fatal."""
        interval = self.settings.interval_s
        while True:
            started = self._monotonic()
            try:
                await self.cycle()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("accounting cycle failed; trying again next interval")
            elapsed = self._monotonic() - started
            await asyncio.sleep(max(0.0, interval - elapsed))


def own_cgroup(proc_root: Path) -> str | None:
    """The cgroup path of the container the agent runs in (None on the host or when
    unreadable).

    Root callers in this very cgroup (``kubectl exec`` into the agent) get the
    node view: the container already runs with hostPID and CAP_KILL."""
    try:
        cgroup = read_process_cgroup(os.getpid(), proc_root=proc_root)
    except (ProcessGoneError, CgroupFormatError):
        return None
    return cgroup.path if cgroup.in_container else None


class AgentRuntime:
    """Everything the running agent owns, started and stopped in order.

    Start: GPU backend, Kubernetes client and pod watch (optional), mgctl
    program and API socket, metrics endpoint, then the cycle loop. Stop: the
    reverse; sockets are removed and the backend is closed last.
    """

    def __init__(
        self,
        config: PluginConfig,
        *,
        open_api: ApiOpener,
        backend: GpuBackend | None = None,
        version: str = "unknown",
    ) -> None:
        """``open_api`` loads the Kubernetes credentials (:data:`plugin.agent.kube.ApiOpener`)."""
        self.config = config
        self._open_api = open_api
        self.settings = config.agent
        self.version = version
        self._backend = backend
        self._stack = AsyncExitStack()
        self._tasks: list[asyncio.Task[None]] = []
        self._events: QueuedEventSink | None = None
        self.agent: Agent
        self.metrics_port: int | None = None
        self.socket_path = self.settings.socket_dir / AGENT_SOCKET_NAME

    async def __aenter__(self) -> AgentRuntime:
        try:
            await self._start()
        except BaseException:
            await self._stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stop()

    async def _start(self) -> None:
        settings = self.settings
        backend = self._backend
        if backend is None:
            backend = await asyncio.to_thread(open_backend, gpus_file=self.config.gpus_file)
        self._stack.callback(backend.close)
        podresources = PodResourcesReader(
            settings.pod_resources_socket,
            timeout_s=settings.pod_resources_timeout_s,
            dra=DraShareReader(settings.dra_cdi_dir, driver=settings.dra_driver),
        )
        self._stack.push_async_callback(podresources.close)
        index = PodIndex()
        metrics = AgentMetrics(
            version=self.version, backend=backend.kind, node=settings.node_name or ""
        )
        events, labels, ledger, pods_problem = await self._start_kube(index)
        self.agent = Agent(
            self.config,
            backend=backend,
            allocations=podresources,
            allocatable=podresources,
            index=index,
            pods_problem=pods_problem,
            pods_watched=settings.node_name is not None,
            events=events,
            labels=labels,
            ledger=ledger,
            metrics=metrics,
        )
        logger.info(
            "node agent starting",
            extra={
                "node": settings.node_name,
                "backend": backend.kind,
                "units_per_gpu": self.config.units_per_gpu,
                "resources": ",".join(r.name for r in self.config.resources),
                "interval_s": settings.interval_s,
                "memory_enforcement": settings.memory_enforcement,
                "kill_grace_s": settings.kill_grace_s,
                "socket": str(self.socket_path),
                "pod_resources_socket": str(settings.pod_resources_socket),
                "dra_driver": settings.dra_driver,
                "dra_cdi_dir": str(settings.dra_cdi_dir),
            },
        )
        if settings.install_mgctl:
            install_mgctl(settings.socket_dir, version=self.version)
        agent = self.agent
        api = ApiServer(
            ApiContext(
                snapshot=lambda: agent.snapshot,
                lookup=index.lookup,
                pods_problem=pods_problem,
                proc_root=settings.proc_root,
                agent_cgroup=own_cgroup(settings.proc_root),
                node_name=settings.node_name,
                version=self.version,
                backend=backend.kind,
                agent_uid=os.getuid(),
            ),
            self.socket_path,
        )
        await self._stack.enter_async_context(api)
        monotonic = time.monotonic

        def age() -> float | None:
            return None if agent.last_cycle_at is None else monotonic() - agent.last_cycle_at

        probes = ProbeServer(
            ProbeState(
                metrics=metrics,
                last_cycle_age_s=age,
                stuck_after_s=3 * settings.interval_s + GPU_READ_TIMEOUT_S,
            ),
            settings.metrics_listen,
        )
        await self._stack.enter_async_context(probes)
        self.metrics_port = probes.port
        self._tasks.insert(0, create_guarded_task(agent.run(), name="accounting cycle"))

    async def _start_kube(
        self, index: PodIndex
    ) -> tuple[EventSink | None, LabelSink | None, LedgerSink | None, Callable[[], str | None]]:
        node = self.settings.node_name
        if node is None:
            logger.warning(
                "no node name (set NODE_NAME from the downward API): running without the "
                "Kubernetes API; no pod names, Events or node labels, and only host root (or "
                "the agent's own user) can use mgctl"
            )
            return None, None, None, lambda: "the agent has no node name, so it does not watch pods"
        try:
            api, source = await self._stack.enter_async_context(self._open_api())
        except Exception as exc:  # no credentials: degrade, whatever error type says so
            logger.warning("running without the Kubernetes API: %s", exc)
            reason = str(exc)
            return None, None, None, lambda: reason
        logger.info("Kubernetes API credentials loaded", extra={"source": source})
        watcher = PodWatcher(api, node_name=node, index=index)
        self._tasks.append(create_guarded_task(watcher.run(), name="pod watch"))
        labels = NodeLabeler(api, node) if self.settings.label_node else None
        self._events = QueuedEventSink(KubeEventSink(api))
        self._tasks.append(create_guarded_task(self._events.run(), name="event writer"))
        ledger = LedgerPublisher(
            api,
            node,
            max_bytes=self.settings.ledger_max_bytes,
            refresh_s=self.settings.ledger_refresh_s,
        )
        return self._events, labels, ledger, lambda: watcher.error

    async def _stop(self) -> None:
        # The cycle first (it is tasks[0]: it may still queue Events), then what is
        # queued gets a moment to reach the API server, then everything else.
        await stop_tasks(self._tasks[:1], timeout_s=STOP_TIMEOUT_S)
        events = self._events
        if events is not None and not await events.flush(timeout_s=EVENT_FLUSH_TIMEOUT_S):
            logger.warning("%d Events were not written before stopping", events.pending)
        await stop_tasks(self._tasks, timeout_s=STOP_TIMEOUT_S)
        self._tasks.clear()
        if hasattr(self, "agent"):
            await self.agent.drain(timeout_s=STOP_TIMEOUT_S)
        await self._stack.aclose()


async def serve(
    config: PluginConfig, *, stop: asyncio.Event, open_api: ApiOpener, version: str = "unknown"
) -> None:
    """Run the agent until ``stop`` is set."""
    async with AgentRuntime(config, open_api=open_api, version=version):
        await stop.wait()
    logger.info("node agent stopped")
