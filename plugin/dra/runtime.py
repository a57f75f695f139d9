"""``metagpu dra-plugin`` from start to stop (adapter: it owns the tasks and the sockets).

Order, and why:

1. discover the GPUs (simulated or NVML, :func:`plugin.gpu.backends.open_backend`) and
   start health checking into the one health record (:class:`HealthBoard`); a node
   whose driver fails publishes an empty slice and says so rather than crash-looping;
   with ``mps.supervise``, start the MPS control daemon (:func:`supervisor_for`, the
   device plugin's supervisor): until it answers, and whenever it stops answering,
   its GPUs are withdrawn on that board (check ``mps``), so they leave the slice and
   a prepare on them is refused rather than handing out a GPU without its limits;
2. open the API server (claims are read from it; the slice is written to it);
3. serve the driver socket, then the registration socket (:class:`DraServer`);
4. publish the slice, and again on every deletion, health change and resync
   (:class:`SlicePublisher`);
5. on stop: sockets first (no new prepares), then publishing, the MPS daemon (quit,
   compute modes restored), health, the driver.

The slice is not deleted on stop: a rolling update restarts the plugin within seconds,
and pods being scheduled meanwhile should still see the GPUs. The kubelet deletes a
driver's slices 30 s after its sockets go away (captured), which covers an uninstall.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from plugin.api.gpus import GpuInfo
from plugin.api.settings import ConfigError
from plugin.dra.cdi_runtime import cdi_verdict
from plugin.dra.config import DraConfig
from plugin.dra.device_health import DeviceHealthEntry, device_health
from plugin.dra.kube import ClaimReader, SlicePublisher, read_runtime_version
from plugin.dra.prepare import Preparer
from plugin.dra.server import DraServer
from plugin.dra.servicer import DraServicer, HealthServicer, ReadClaim, RegistrationServicer
from plugin.dra.slices import SlicePlan, build_slice
from plugin.gpu.backend import GpuBackend, GpuBackendError, NullBackend
from plugin.gpu.backends import open_backend
from plugin.gpu.health import HealthPolicy
from plugin.gpu.health_monitor import HealthBoard, HealthMonitor
from plugin.gpu.mps import MpsGpu
from plugin.gpu.mps_supervisor import MpsSupervisor, supervisor_for
from plugin.kube.errors import ApiOpener

logger = logging.getLogger(__name__)

BackendFactory = Callable[[DraConfig], GpuBackend]


def _open_backend(config: DraConfig) -> GpuBackend:
    return open_backend(gpus_file=config.gpus_file)


@dataclass
class DraPlugin:
    """The running plugin; :meth:`run` until ``stop`` is set."""

    config: DraConfig
    open_api: ApiOpener
    backend_factory: BackendFactory = _open_backend
    resync_s: float = 300.0
    watch_timeout_s: int = 300
    """Server-side timeout of the slice watch (re-opened after it)."""
    claims: ReadClaim | None = None
    """Read claims here instead of from the API server, which is then never opened: no
    runtime check and no slice written (:meth:`plan` is what would be). For
    ``metagpu dev --dra``, which has no API server; a node always reads the API server."""
    board: HealthBoard = field(init=False)
    preparer: Preparer = field(init=False)
    registration: RegistrationServicer = field(init=False)
    health: HealthServicer = field(init=False)
    publisher: SlicePublisher | None = field(init=False, default=None)
    started: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    """Set once both sockets serve and publishing runs (tests wait on it)."""
    _gpus: tuple[GpuInfo, ...] = field(init=False, default=())
    blocked: str | None = field(init=False, default=None)
    """Why every GPU is withdrawn (a runtime without CDI), or None."""
    _offer: object = field(init=False, default=None)
    mps: MpsSupervisor | None = field(init=False, default=None)
    """The supervised MPS control daemon (``mps.supervise``) while :meth:`run` runs."""
    """The devices and withdrawals last acted on (:meth:`_on_health`)."""

    def __post_init__(self) -> None:
        if not self.config.node_name:
            raise ConfigError("node_name is required (the chart sets NODE_NAME)")
        self.node_name = self.config.node_name
        self.board = HealthBoard(HealthPolicy.of(self.config.health))
        self.preparer = Preparer(config=self.config, node_name=self.node_name)
        self.registration = RegistrationServicer(
            driver=self.config.driver_name, endpoint=self.config.socket_path
        )
        self.health = HealthServicer(self.device_health)

    def plan(self, generation: int = 1) -> SlicePlan:
        """The slice the node should have now, from the GPUs and their health records."""
        return build_slice(
            self._gpus,
            records=self.board.records(),
            config=self.config,
            node_name=self.node_name,
            generation=generation,
            blocked=self.blocked,
        )

    def device_health(self) -> tuple[DeviceHealthEntry, ...]:
        """What the health stream sends now (from the same records as the slice)."""
        return device_health(self._gpus, records=self.board.records(), pool=self.node_name)

    def _on_health(self, _board: HealthBoard) -> None:
        """After every board change, liveness counts included: act only on what the slice
        shows, so a healthy node's 10 s liveness rounds cost no API request."""
        plan = self.plan()
        offer = (tuple(plan.devices.items()), tuple(sorted(plan.withdrawn.items())))
        self.health.notify()  # it sends only when the device health differs
        if offer == self._offer:
            return
        self._offer = offer
        for uuid, reason in plan.withdrawn.items():
            logger.warning("GPU not offered: %s", reason, extra={"gpu": uuid})
        self.preparer.offer(self._gpus, withdrawn=plan.withdrawn)
        if self.publisher is not None:
            self.publisher.wake()

    async def run(self, stop: asyncio.Event) -> int:
        config = self.config
        logger.info(
            "starting DRA plugin",
            extra={"config": json.dumps(config.model_dump(mode="json"), sort_keys=True)},
        )
        backend = await self._open(config)
        monitor: HealthMonitor | None = None
        try:
            self._gpus = tuple(await asyncio.to_thread(backend.devices))
            if not self._gpus:
                logger.warning("no GPUs found: publishing an empty ResourceSlice")
            self.board.set_gpus(g for g in self._gpus if g.identity_known)
            self.board.add_listener(self._on_health)
            if config.health.enabled and not isinstance(backend, NullBackend):
                monitor = HealthMonitor(
                    backend,
                    self.board,
                    uuids=[g.uuid for g in self._gpus if g.identity_known],
                    event_timeout_s=config.health.event_timeout_s,
                    liveness_interval_s=config.health.liveness_interval_s,
                )
                await monitor.__aenter__()
            self.mps = supervisor_for(config.mps, backend, self.board)
            if self.mps is not None:
                # Before serving: the first slice already leaves out what the daemon
                # cannot serve (bounded by mps.start_timeout_s and the command timeouts).
                await self.mps.serve(
                    [
                        MpsGpu(uuid=g.uuid, index=g.index, memory_mib=g.memory_mib)
                        for g in self._gpus
                        if g.identity_known and g.unhealthy_reason is None
                    ]
                )
            await self._serve(stop)
        finally:
            if self.mps is not None:
                await self.mps.stop()  # quit, then the compute modes as they were
            if monitor is not None:
                await monitor.stop()
            with contextlib.suppress(GpuBackendError):
                await asyncio.to_thread(backend.close)
        return 0

    async def _open(self, config: DraConfig) -> GpuBackend:
        try:
            return await asyncio.to_thread(self.backend_factory, config)
        except GpuBackendError as exc:
            logger.warning("GPU driver initialisation failed, offering no GPUs: %s", exc)
            return NullBackend()

    async def _check_runtime(self, api: Any) -> None:
        """Withdraw every GPU when the node's runtime is known to ignore CDI devices."""
        mode = self.config.runtime_check
        if mode == "off":
            return
        try:
            version = await read_runtime_version(
                api, node_name=self.node_name, timeout_s=self.config.api_timeout_s
            )
        except Exception as exc:  # RBAC or a missing node: say so, do not block
            logger.warning("cannot tell whether the container runtime applies CDI: %s", exc)
            return
        verdict = cdi_verdict(version)
        if verdict.support == "supported":
            logger.info(verdict.reason)
        elif verdict.support == "unknown" or mode == "warn":
            logger.warning(verdict.reason)
        else:
            logger.error("offering no GPUs: %s", verdict.reason)
            self.blocked = verdict.reason
            self._on_health(self.board)

    async def _serve(self, stop: asyncio.Event) -> None:
        config = self.config
        if self.claims is not None:
            await self._serve_sockets(self.claims, stop)
            return
        async with self.open_api() as (api, source):
            logger.info("API server credentials loaded", extra={"source": source})
            await self._check_runtime(api)
            self.publisher = SlicePublisher(
                api,
                self.plan,
                node_name=self.node_name,
                driver=config.driver_name,
                timeout_s=config.api_timeout_s,
                resync_s=self.resync_s,
                watch_timeout_s=self.watch_timeout_s,
            )
            publishing = asyncio.create_task(self.publisher.run(), name="dra-slice-publisher")
            publishing.add_done_callback(_log_unexpected_exit)
            try:
                await self._serve_sockets(ClaimReader(api, timeout_s=config.api_timeout_s), stop)
            finally:
                publishing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await publishing
                self.publisher = None

    async def _serve_sockets(self, claims: ReadClaim, stop: asyncio.Event) -> None:
        """Serve both sockets, prepares reading ``claims``, until ``stop``."""
        config = self.config
        servicer = DraServicer(self.preparer, claims, timeout_s=config.prepare_timeout_s)
        async with DraServer(
            servicer,
            self.registration,
            self.health,
            socket_path=config.socket_path,
            registration_path=config.registration_socket_path,
            grace_s=config.grace_s,
        ):
            self.started.set()
            await stop.wait()


def _log_unexpected_exit(task: asyncio.Task[None]) -> None:
    """The publisher runs until cancelled; anything else leaves the node without a slice."""
    if not task.cancelled() and task.exception() is not None:
        logger.error("the ResourceSlice publisher stopped", exc_info=task.exception())
