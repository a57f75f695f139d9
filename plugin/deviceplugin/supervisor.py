"""The device plugin's main loop: start, watch the kubelet, restart, reload, stop (adapter).

After NVIDIA's ``cmd/nvidia-device-plugin/main.go`` (``start``): after every
start it waits for the first of

* **SIGTERM/SIGINT**: stop serving, remove the sockets, exit 0;
* **SIGHUP**: reload the configuration (same file, env and flags). A config
  that does not load, whose GPUs file or driver does not open (whatever
  ``fail_on_init_error`` says), or whose GPU selection fails on the GPUs found
  now, is logged and ignored: the plugin keeps serving what it served (never a
  half-applied change). A good one restarts everything with it;
* **the kubelet restarted**: it re-created ``kubelet.sock`` or deleted our
  socket (it wipes the directory when it starts). Seen through inotify on the
  directory, plus a timer that checks our socket is still the one we bound.
  Serving and registration restart at once (well within 2 s);
* **the retry timer**: a start that failed (the kubelet refused us, the
  socket could not be bound, discovery failed) is retried after
  ``retry_interval_s`` instead of crash-looping; the kubelet re-creating its
  socket also triggers the retry at once. A GPU selection that cannot work
  on this node's GPUs (one GPU selected twice) is a config error: logged, and
  not retried until SIGHUP or the next kubelet restart.

Two layers restart at different rates. The *node* layer (GPU backend, health
monitor) is rebuilt only on SIGHUP, so a kubelet restart does not lose health
state or re-initialise NVML. The *serving* layer (discovery, device tables,
gRPC servers, registrations) restarts on every event. The
:class:`~plugin.gpu.health_monitor.HealthBoard` outlives both: a GPU that was sick
stays sick across any restart.

With no GPUs to advertise it logs that and waits (for signals); it does not
exit, so a DaemonSet on a GPU-less node does not crash-loop.

The scheduler extender's assignments (:class:`~plugin.deviceplugin.assignments.AssignmentBook`)
outlive restarts too: the pod watch that fills the book starts once, with the
first config (``placement``), when the Kubernetes API can be opened; without
it the plugin places with its own policy, as before, and says so once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from plugin.api.chart_values import setting
from plugin.api.config import PluginConfig
from plugin.api.resources import ResourceName
from plugin.api.settings import ConfigError
from plugin.deviceplugin.assignments import AssignmentBook
from plugin.deviceplugin.inotify import DirectoryWatcher, DirEvent
from plugin.deviceplugin.ownership import DEFAULT_INTERVAL_S, NodeDevicesSource, OwnershipWatch
from plugin.deviceplugin.podresources import PodResourcesReader
from plugin.deviceplugin.server import KUBELET_SOCKET_NAME, PluginServer, PluginServerError
from plugin.deviceplugin.servicer import DevicePluginServicer
from plugin.gpu.backend import GpuBackend, GpuBackendError, NullBackend
from plugin.gpu.backends import open_backend
from plugin.gpu.health import HealthPolicy
from plugin.gpu.health_file import REFRESH_INTERVAL_S, BoardPublisher, health_file_path
from plugin.gpu.health_monitor import HealthBoard, HealthMonitor
from plugin.gpu.identity import GpuIdentityBook
from plugin.gpu.mps import MpsGpu, MpsNode
from plugin.gpu.mps_supervisor import MpsSupervisor, compute_mode_control, supervisor_for
from plugin.placement.devices import (
    DeviceError,
    DeviceTable,
    GpuSelectionError,
    ResourceSelection,
    select_gpus,
)

if TYPE_CHECKING:
    from plugin.kube.errors import ApiOpener

# The name it had before plugin/ was split by concern: log lines (text and JSON
# show the logger) and any logging config that names it stay as they were.
logger = logging.getLogger("plugin.supervisor")

EXIT_OK: Final = 0
EXIT_FATAL: Final = 1

Signal = Literal["terminate", "reload"]
State = Literal[
    "starting", "serving", "waiting-for-kubelet", "retrying", "idle", "misconfigured", "stopped"
]
"""``misconfigured``: the GPU selection cannot work on this node's GPUs (e.g. one
GPU selected twice); it waits for SIGHUP instead of retrying."""


class FatalInitError(Exception):
    """The GPU driver failed and ``fail_on_init_error`` says to crash rather than degrade."""


def open_configured_backend(config: PluginConfig) -> GpuBackend:
    """The backend ``config`` asks for (:func:`plugin.gpu.backends.open_backend`). Blocking."""
    return open_backend(gpus_file=config.gpus_file)


def open_pod_resources(config: PluginConfig) -> NodeDevicesSource:
    """The kubelet's PodResources API at the path the node agent reads it from too."""
    return PodResourcesReader(
        config.agent.pod_resources_socket, timeout_s=config.agent.pod_resources_timeout_s
    )


@dataclass
class _Node:
    config: PluginConfig
    backend: GpuBackend
    monitor: HealthMonitor | None
    pod_resources: NodeDevicesSource | None = None
    mps: MpsSupervisor | None = None
    """The supervised MPS control daemon (``mps.supervise``); kept across a reload
    that leaves ``mps`` unchanged, so running clients keep their daemon."""


@dataclass
class _Serving:
    tables: list[DeviceTable] = field(default_factory=list)
    servers: list[PluginServer] = field(default_factory=list)
    ownership: asyncio.Task[None] | None = None


class Supervisor:
    """Runs the device plugin until SIGTERM. ``await Supervisor(load).run()``."""

    def __init__(
        self,
        load: Callable[[], PluginConfig],
        *,
        config: PluginConfig | None = None,
        backend_factory: Callable[[PluginConfig], GpuBackend] = open_configured_backend,
        retry_interval_s: float = 30.0,
        socket_check_interval_s: float = 1.0,
        settle_s: float = 0.05,
        register_timeout_s: float = 5.0,
        stop_grace_s: float = 1.0,
        open_api: ApiOpener | None = None,
        pod_resources_factory: Callable[[PluginConfig], NodeDevicesSource] = open_pod_resources,
        ownership_interval_s: float = DEFAULT_INTERVAL_S,
        board_refresh_s: float = REFRESH_INTERVAL_S,
    ) -> None:
        """``open_api`` opens the Kubernetes API for the pod watch (None: no API,
        the placement policy alone decides, as without the extender)."""
        self._load = load
        self._open_api = open_api
        self.book = AssignmentBook()
        """The extender's assignments of this node's pods; outlives every restart."""
        self._assignments = AsyncExitStack()
        self._initial = config
        self._backend_factory = backend_factory
        self.retry_interval_s = retry_interval_s
        self.socket_check_interval_s = socket_check_interval_s
        self.settle_s = settle_s
        self.register_timeout_s = register_timeout_s
        self.stop_grace_s = stop_grace_s
        self._pod_resources_factory = pod_resources_factory
        self.ownership_interval_s = ownership_interval_s
        self.ownership: OwnershipWatch | None = None
        """The check that withdraws GPUs another device plugin hands out (while serving)."""
        self.board: HealthBoard | None = None
        self.identities = GpuIdentityBook()
        """Every GPU identity seen since start: a GPU lost at a rediscovery keeps
        its UUID and device IDs (:mod:`plugin.gpu.identity`)."""
        self.publisher: BoardPublisher | None = None
        self.board_refresh_s = board_refresh_s
        """How often the health board file is rewritten unchanged, to keep the
        freshness its stamp promises (:mod:`plugin.gpu.health_file`)."""
        self.state: State = "starting"
        self.starts = 0
        """Serving (re)starts so far; tests wait on it."""
        self._events: asyncio.Queue[Signal | DirEvent] = asyncio.Queue()
        """Created here, not in :meth:`run`, so a stop requested before ``run``
        starts is not lost (asyncio queues bind to a loop on first use)."""
        self._node: _Node | None = None
        self._serving = _Serving()
        self._retiring: set[asyncio.Task[None]] = set()

    # -------------------------------------------------------- public hooks
    @property
    def backend(self) -> GpuBackend | None:
        return self._node.backend if self._node else None

    @property
    def config(self) -> PluginConfig | None:
        return self._node.config if self._node else None

    @property
    def servers(self) -> list[PluginServer]:
        return list(self._serving.servers)

    def request_stop(self) -> None:
        """What SIGTERM does; for embedding (``metagpu dev``) and tests."""
        self._post("terminate")

    def request_reload(self) -> None:
        """What SIGHUP does."""
        self._post("reload")

    def _post(self, item: Signal | DirEvent) -> None:
        self._events.put_nowait(item)

    # ------------------------------------------------------------ main loop
    async def run(self, *, handle_signals: bool = True) -> int:
        """Serve until terminated; returns the process exit code.

        A config that fails to load the first time raises :class:`ConfigError`
        (the CLI exits 2); later reloads never raise."""
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        refresh: asyncio.Task[None] | None = None
        if handle_signals:
            for signum, item in (
                (signal.SIGTERM, self.request_stop),
                (signal.SIGINT, self.request_stop),
                (signal.SIGHUP, self.request_reload),
            ):
                loop.add_signal_handler(signum, item)
                installed.append(signum)
        try:
            config = self._initial or self._load()
            backend = await self._open_first_backend(config)
            self.board = HealthBoard(HealthPolicy.of(config.health))
            self.publisher = BoardPublisher(health_file_path(config.device_plugins_dir))
            self.board.add_listener(self.publisher)
            refresh = asyncio.create_task(self._refresh_board(), name="health-board-refresh")
            await self._watch_assignments(config)
            self._node = await self._start_node(config, backend)
            while True:
                outcome = await self._serve_until_reload()
                if outcome is None:
                    return EXIT_OK
                new_config, new_backend = outcome
                # The old health thread may sit in a bounded wait for up to
                # event_timeout_s: retire the old node in the background and
                # serve the new one now (NVML allows two event sets at once).
                old, self._node = self._node, None
                kept_mps = _keep_mps(old, new_config, new_backend)
                if old is not None:
                    retiring = asyncio.create_task(self._close_node(old), name="retire-old-node")
                    self._retiring.add(retiring)
                    retiring.add_done_callback(self._retiring.discard)
                self._node = await self._start_node(new_config, new_backend, mps=kept_mps)
        except FatalInitError as exc:
            logger.error("%s", exc)
            return EXIT_FATAL
        finally:
            await self._stop_serving()
            await self._stop_node()
            await self._assignments.aclose()
            if refresh is not None:
                await _cancel(refresh)
            if self.publisher is not None and self.publisher.remove():
                # Written by this process only, and true only while it runs: a
                # file left behind would be ignored, but an uninstall should
                # leave nothing on the host.
                logger.info("removed the GPU health board %s", self.publisher.path)
            if self._retiring:
                await asyncio.gather(*self._retiring, return_exceptions=True)
            self.state = "stopped"
            for signum in installed:
                loop.remove_signal_handler(signum)
            logger.info("device plugin stopped")

    async def _serve_until_reload(self) -> tuple[PluginConfig, GpuBackend] | None:
        """Serve, restarting on kubelet events, until SIGHUP brings a good config
        (returned with its opened backend) or SIGTERM (None)."""
        assert self._node is not None
        watch = _DirectoryWatch(self._node.config.device_plugins_dir, self._post)
        try:
            while True:
                if not await watch.ensure():
                    logger.error(
                        "device-plugins directory %s does not exist: is the kubelet's root "
                        "directory different on this node? (set %s); retrying in %ss",
                        watch.directory,
                        setting("device_plugins_dir"),
                        self.retry_interval_s,
                    )
                retry_at = await self._start_serving()
                while True:
                    reason = await self._next_reason(retry_at, watching=watch.active)
                    if reason == "terminate":
                        return None
                    if reason == "reload":
                        reloaded = await self._try_reload()
                        if reloaded is None:
                            continue  # bad config: keep serving as before
                        return reloaded
                    break
                logger.info("restarting: %s", reason)
                await self._stop_serving()
        finally:
            await self._stop_serving()
            await watch.close()

    async def _next_reason(self, retry_at: float | None, *, watching: bool) -> str:
        """Wait for the next thing that needs a restart, reload or stop."""
        assert self._node is not None
        kubelet_socket = self._node.config.device_plugins_dir / KUBELET_SOCKET_NAME
        if not watching and retry_at is None:
            retry_at = time.monotonic() + self.retry_interval_s
        while True:
            timeout = self.socket_check_interval_s
            if retry_at is not None:
                timeout = min(timeout, max(0.0, retry_at - time.monotonic()))
            try:
                item = await asyncio.wait_for(self._events.get(), timeout)
            except TimeoutError:
                item = None
            if item in ("terminate", "reload"):
                return item
            if isinstance(item, DirEvent):
                reason = self._judge(item)
                if reason is not None:
                    return await self._settle(reason)
                continue
            # The periodic check: catches what events missed.
            if retry_at is not None and time.monotonic() >= retry_at:
                return "retry timer"
            if self.state == "serving" and not all(
                s.socket_is_ours() for s in self._serving.servers
            ):
                return "our socket was removed (kubelet restart)"
            if self.state == "waiting-for-kubelet" and kubelet_socket.exists():
                return "kubelet.sock appeared"

    def _judge(self, event: DirEvent) -> str | None:
        """Does this directory event mean we must re-serve and re-register?"""
        if event.kind == "created" and event.name == KUBELET_SOCKET_NAME:
            return "kubelet.sock re-created (kubelet restart)"
        if event.kind in ("overflow", "gone"):
            return f"device-plugins directory event: {event.kind}"
        if event.kind == "deleted" and self.state == "serving":
            for server in self._serving.servers:
                if event.name == server.socket_path.name and not server.socket_is_ours():
                    return f"our socket {event.name} was removed (kubelet restart)"
        return None

    async def _settle(self, reason: str) -> str:
        """A restarting kubelet deletes sockets and re-creates its own within
        microseconds: let the burst pass, so one restart handles all of it.
        A signal arriving meanwhile wins."""
        deadline = time.monotonic() + self.settle_s
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                item = await asyncio.wait_for(self._events.get(), remaining)
            except TimeoutError:
                break
            if item in ("terminate", "reload"):
                return item
        return reason

    async def _try_reload(self) -> tuple[PluginConfig, GpuBackend] | None:
        """The new config with its opened backend, or None (logged) to keep the old.

        Accepted only if it could serve: it loads, its backend opens (a driver
        that fails is rejected whatever ``fail_on_init_error`` says; that setting
        decides only what the *first* start does, and degrading to no GPUs is
        never better than the working config), and its GPU selection and device
        tables build on the GPUs the new backend discovers now."""
        logger.info("SIGHUP: reloading configuration")
        try:
            config = self._load()
            backend = await asyncio.to_thread(self._backend_factory, config)
        except (ConfigError, GpuBackendError) as exc:
            logger.error("new configuration rejected; still serving the old one: %s", exc)
            return None
        try:
            await asyncio.to_thread(_dry_run, config, backend)
        except (GpuBackendError, DeviceError) as exc:
            logger.error("new configuration rejected; still serving the old one: %s", exc)
            await asyncio.to_thread(_close_quietly, backend)
            return None
        return config, backend

    async def _refresh_board(self) -> None:
        """Rewrite the health board file every ``board_refresh_s`` even when nothing
        changed: its stamp promises the node agent a fresh file, and the agent
        stops trusting one that is not refreshed (a hung plugin)."""
        while True:
            await asyncio.sleep(self.board_refresh_s)
            if self.board is not None and self.publisher is not None:
                self.publisher(self.board)

    # ------------------------------------------------------ assignment book
    async def _watch_assignments(self, config: PluginConfig) -> None:
        """Start the pod watch that fills :attr:`book`, or say once why there is none."""
        placement = config.placement
        why: str | None = None
        if not placement.honour_assignments:
            why = f"{setting('placement.honour_assignments')} is false"
        elif placement.node_name is None:
            why = "no node name (set NODE_NAME from the downward API)"
        elif self._open_api is None:
            why = "no Kubernetes API client"
        else:
            try:
                api, source = await self._assignments.enter_async_context(self._open_api())
            except Exception as exc:  # no credentials: degrade, whatever error type says so
                why = f"the Kubernetes API cannot be opened: {exc}"
            else:
                from plugin.kube.node_pods import NodePodWatcher  # noqa: PLC0415 - aiohttp

                watcher = NodePodWatcher(api, node_name=placement.node_name, sink=self.book)
                task = asyncio.create_task(watcher.run(), name="assignment pod watch")
                self._assignments.push_async_callback(_cancel, task)
                logger.info(
                    "honouring the scheduler extender's GPU assignments of pods on %s",
                    placement.node_name,
                    extra={"source": source},
                )
                return
        logger.info(
            "not watching pods for GPU assignments (%s): GetPreferredAllocation places "
            "with allocation_policy alone",
            why,
        )

    # ----------------------------------------------------------- node layer
    async def _open_first_backend(self, config: PluginConfig) -> GpuBackend:
        """The backend of the first start, where ``fail_on_init_error`` decides
        between crashing (:class:`FatalInitError`) and serving no GPUs."""
        try:
            return await asyncio.to_thread(self._backend_factory, config)
        except GpuBackendError as exc:
            if config.fail_on_init_error:
                raise FatalInitError(
                    f"GPU driver initialisation failed: {exc} "
                    f"({setting('fail_on_init_error')} is true; set it to false to run "
                    "without GPUs on this node)"
                ) from exc
            logger.warning(
                "GPU driver initialisation failed, advertising no GPUs (%s is false): %s",
                setting("fail_on_init_error"),
                exc,
            )
            return NullBackend()

    async def _start_node(
        self, config: PluginConfig, backend: GpuBackend, *, mps: MpsSupervisor | None = None
    ) -> _Node:
        """``mps``: a supervised daemon kept from the node before a reload."""
        assert self.board is not None
        self.board.ledger.set_policy(HealthPolicy.of(config.health))
        if self.publisher is not None:
            self.publisher.path = health_file_path(config.device_plugins_dir)
        monitor: HealthMonitor | None = None
        if config.health.enabled and not isinstance(backend, NullBackend):
            monitor = HealthMonitor(
                backend,
                self.board,
                uuids=(),
                event_timeout_s=config.health.event_timeout_s,
                liveness_interval_s=config.health.liveness_interval_s,
            )
            await monitor.__aenter__()
        elif not config.health.enabled:
            # Nothing will probe or heal GPUs that events made sick (e.g. before a
            # SIGHUP turned checks off): they would stay Unhealthy for good.
            self.board.clear_event_failures()
            logger.warning(
                "health checking is disabled: every GPU is advertised Healthy, "
                "except GPUs whose discovery failed"
            )
        logger.info("GPU backend: %s", getattr(backend, "kind", type(backend).__name__))
        if mps is None:
            mps = supervisor_for(config.mps, backend, self.board)
        if mps is None:
            # The supervised daemon publishes its own state when it serves; without
            # one the agent must still learn that nothing is enforced here.
            self.board.set_mps_node(MpsNode(mode="unsupervised" if config.mps.enabled else "off"))
        return _Node(
            config=config,
            backend=backend,
            monitor=monitor,
            pod_resources=self._pod_resources_factory(config),
            mps=mps,
        )

    async def _stop_node(self) -> None:
        node, self._node = self._node, None
        if node is not None:
            await self._close_node(node)

    async def _close_node(self, node: _Node) -> None:
        if node.mps is not None:
            await node.mps.stop()
        if node.monitor is not None:
            await node.monitor.stop()
        if node.pod_resources is not None:
            await node.pod_resources.close()
        try:
            await asyncio.to_thread(node.backend.close)
        except GpuBackendError as exc:
            logger.warning("closing the GPU backend failed: %s", exc)

    # -------------------------------------------------------- serving layer
    async def _start_serving(self) -> float | None:
        """Discover, build tables, serve and register. Returns when to retry (None:
        no retry needed)."""
        assert self._node is not None
        assert self.board is not None
        config = self._node.config
        self.starts += 1
        self.state = "starting"
        logger.info(
            "starting device plugin",
            extra={"config": json.dumps(config.model_dump(mode="json"), sort_keys=True)},
        )
        try:
            tables = await self._discover(config)
        except GpuSelectionError as exc:
            # A config problem: retrying cannot fix it, a corrected config can.
            logger.error(
                "the configured GPU selection cannot be served on this node; fix "
                "%s and send SIGHUP, or helm upgrade (not retrying): %s",
                setting("resources[].gpus"),
                exc,
            )
            self.state = "misconfigured"
            return None
        except (GpuBackendError, DeviceError) as exc:
            logger.error("GPU discovery failed; retrying in %ss: %s", self.retry_interval_s, exc)
            self.state = "retrying"
            return time.monotonic() + self.retry_interval_s
        self._serving = _Serving(tables=tables)
        if not tables:
            logger.info("no GPUs to advertise on this node; waiting (SIGHUP re-reads the config)")
            self.state = "idle"
            return None
        await self._start_ownership(config)
        kubelet_socket = config.device_plugins_dir / KUBELET_SOCKET_NAME
        if not kubelet_socket.exists():
            logger.info("waiting for the kubelet to create %s", kubelet_socket)
            self.state = "waiting-for-kubelet"
            return None
        try:
            for table in tables:
                await self._serve_table(config, table, kubelet_socket)
        except PluginServerError as exc:
            logger.error("could not start serving; retrying in %ss: %s", self.retry_interval_s, exc)
            await self._stop_serving()
            self._serving = _Serving(tables=tables)
            self.state = "retrying"
            return time.monotonic() + self.retry_interval_s
        self.state = "serving"
        return None

    async def _discover(self, config: PluginConfig) -> list[DeviceTable]:
        assert self._node is not None
        assert self.board is not None
        discovered = await asyncio.to_thread(self._node.backend.devices)
        reconciled = self.identities.reconcile(discovered)
        for gpu in reconciled.unidentified:
            logger.error(
                "GPU %d could not be identified and was never seen since the plugin started; "
                "not advertising it under a made-up name: %s",
                gpu.index,
                gpu.unhealthy_reason,
            )
        infos = reconciled.gpus
        selection = select_gpus(infos, config.resources)
        for warning in selection.warnings:
            logger.warning("%s", warning)
        self.board.set_discovery_failures(
            {g.uuid: g.unhealthy_reason for g in infos if g.unhealthy_reason is not None}
        )
        self.board.ledger.forget(g.uuid for g in infos)
        tables: list[DeviceTable] = []
        for chosen in selection.resources:
            if not chosen.gpus:
                logger.info("resource %s has no GPUs on this node; not advertised", chosen.name)
                continue
            table = _table(config, chosen)
            logger.info(
                "advertising %d meta-devices on %d GPU(s): %s",
                len(table),
                len(table.gpus),
                ", ".join(f"{g.info.index}:{g.uuid} ({g.info.name})" for g in table.gpus),
                extra={"resource": table.resource},
            )
            tables.append(table)
        self.board.set_gpus(g.info for t in tables for g in t.gpus)
        if self._node.mps is not None:
            # Before serving: the first device list already says which GPUs the
            # daemon can serve (bounded by mps.start_timeout_s).
            await self._node.mps.serve(
                [
                    MpsGpu(uuid=g.uuid, index=g.info.index, memory_mib=g.info.memory_mib)
                    for t in tables
                    for g in t.gpus
                    if g.info.unhealthy_reason is None
                ]
            )
        if self._node.monitor is not None:
            # GPUs whose discovery failed are sick until the next discovery
            # anyway, and may not even have a real UUID to register.
            self._node.monitor.watch(
                g.uuid for t in tables for g in t.gpus if g.info.unhealthy_reason is None
            )
        return tables

    async def _serve_table(
        self, config: PluginConfig, table: DeviceTable, kubelet_socket: Path
    ) -> None:
        assert self.board is not None
        resource = next(r for r in config.resources if r.name == table.resource)
        stop = asyncio.Event()
        servicer = DevicePluginServicer(
            table=table, config=config, board=self.board, stop=stop, book=self.book
        )
        server = PluginServer(
            servicer,
            resource=table.resource,
            socket_path=config.device_plugins_dir / resource.socket_name,
            stop=stop,
        )
        await server.start()
        self._serving.servers.append(server)
        await server.register(kubelet_socket, timeout_s=self.register_timeout_s)

    async def _start_ownership(self, config: PluginConfig) -> None:
        """Check once before registering (so the first ListAndWatch already leaves out
        GPUs another plugin hands out), then every ``ownership_interval_s``."""
        assert self._node is not None
        assert self.board is not None
        source = self._node.pod_resources
        if source is None:
            return
        serving = self._serving
        watch = OwnershipWatch(
            self.board,
            source,
            gpus=lambda: [g.info for t in serving.tables for g in t.gpus],
            own_resources=lambda: [r.name for r in config.resources],
            interval_s=self.ownership_interval_s,
        )
        self.ownership = watch
        await watch.check()
        serving.ownership = asyncio.create_task(watch.run(), name="gpu-ownership-check")

    async def _stop_serving(self) -> None:
        ownership, self._serving.ownership = self._serving.ownership, None
        if ownership is not None:
            ownership.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ownership
        servers, self._serving.servers = self._serving.servers, []
        for server in servers:
            try:
                await server.stop(grace_s=self.stop_grace_s)
            except Exception:  # one bad server must not keep the others' sockets around
                logger.exception("stopping the server of %s failed", server.resource)


class _DirectoryWatch:
    """The watcher on the device-plugins directory, re-created when the directory
    itself was removed or replaced (an inotify watch follows the old inode)."""

    def __init__(self, directory: Path, post: Callable[[DirEvent], None]) -> None:
        self.directory = directory
        self._post = post
        self._watcher: DirectoryWatcher | None = None
        self._forward: asyncio.Task[None] | None = None
        self._identity: tuple[int, int] | None = None

    @property
    def active(self) -> bool:
        return self._watcher is not None

    async def ensure(self) -> bool:
        """Watch the directory as it is now; False when it does not exist."""
        identity = _dir_identity(self.directory)
        if self._watcher is not None and identity == self._identity:
            return True
        await self.close()
        if identity is None:
            return False
        watcher = DirectoryWatcher(self.directory)
        try:
            await watcher.__aenter__()
        except FileNotFoundError:
            return False
        self._watcher, self._identity = watcher, identity

        async def forward() -> None:
            while True:
                self._post(await watcher.get())

        self._forward = asyncio.create_task(forward(), name="device-plugins-dir-events")
        return True

    async def close(self) -> None:
        forward, self._forward = self._forward, None
        if forward is not None:
            forward.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await forward
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            await watcher.close()


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _dir_identity(directory: Path) -> tuple[int, int] | None:
    try:
        st = directory.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _table(config: PluginConfig, chosen: ResourceSelection) -> DeviceTable:
    return DeviceTable(
        ResourceName(chosen.config.name),
        chosen.gpus,
        units_per_gpu=config.units_per_gpu,
        id_strategy=config.device_id_strategy,
    )


def _dry_run(config: PluginConfig, backend: GpuBackend) -> None:
    """Discover and build every table as serving would, keeping nothing; raises
    what serving would fail with. Blocking (driver calls, tens of ms of tables)."""
    selection = select_gpus(backend.devices(), config.resources)
    for chosen in selection.resources:
        if chosen.gpus:
            _table(config, chosen)


def _keep_mps(old: _Node | None, config: PluginConfig, backend: GpuBackend) -> MpsSupervisor | None:
    """Hand the running daemon to the reloaded node when ``mps`` did not change: a quit
    would wait for every running client to finish (the daemon's quit is synchronous)."""
    if old is None or old.mps is None or old.config.mps != config.mps:
        return None
    kept, old.mps = old.mps, None
    kept.set_modes(compute_mode_control(config.mps, backend))
    return kept


def _close_quietly(backend: GpuBackend) -> None:
    try:
        backend.close()
    except GpuBackendError as exc:
        logger.warning("closing the rejected GPU backend failed: %s", exc)
