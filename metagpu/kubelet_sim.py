"""A kubelet, as far as device plugins can tell: real gRPC over unix sockets (adapter).

``metagpu dev`` uses it to let someone try the plugin without a cluster, and
the tests use it as the kubelet harness. It behaves like the kubelet's device
manager (``pkg/kubelet/cm/devicemanager``) where a plugin can notice:

* :class:`KubeletSim` serves ``v1beta1.Registration`` on
  ``<dir>/kubelet.sock``. ``Register`` checks the version (``v1beta1``) and the
  resource name, then *dials the plugin's endpoint during the call*, asks for
  its options and opens ``ListAndWatch``, failing the registration if the
  plugin does not answer (so a plugin that registers before serving fails
  here as it would on a node);
* every ``RegisterRequest`` is recorded with its arrival time, as are the
  options the plugin returned from ``GetDevicePluginOptions``;
* the latest device list per resource is kept from the ``ListAndWatch``
  stream; a later registration of the same resource replaces the connection;
* :meth:`KubeletSim.restart` does what a kubelet restart does to the
  directory: stops serving, deletes every socket and file except the
  checkpoint, and serves ``kubelet.sock`` again;
* :meth:`KubeletSim.allocate` admits a container like the kubelet: it picks
  from healthy, unallocated devices, asks ``GetPreferredAllocation`` when the
  plugin offers it, checks the answer, and calls ``Allocate``;
* given ``pod_resources_socket``, it also serves the PodResources API v1
  (``GetAllocatableResources``, ``List``) in the kubelet's shapes (one
  ``ContainerDevices`` per device): every registered plugin's devices, its
  allocations (as pods ``dev/alloc-<n>``), and the devices of other device
  plugins a session pretends are there (:attr:`KubeletSim.other_devices`).

:class:`PluginClient` is the client half on its own: every DevicePlugin call,
exactly as the kubelet makes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc

from plugin._pb import deviceplugin_v1beta1_pb2 as pb
from plugin._pb import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from plugin._pb import podresources_v1_pb2 as pr_pb
from plugin._pb import podresources_v1_pb2_grpc as pr_grpc
from plugin.api.resources import ResourceName, ResourceNameError

# The name it had before plugin/ was split by concern: log lines (text and JSON
# show the logger) and any logging config that names it stay as they were.
logger = logging.getLogger("plugin.kubelet_sim")

KUBELET_SOCKET_NAME: Final = "kubelet.sock"
CHECKPOINT_NAME: Final = "kubelet_internal_checkpoint"
"""The only file the kubelet keeps when it cleans the directory at start-up."""
SUPPORTED_VERSIONS: Final = ("v1beta1",)


class KubeletSimError(Exception):
    """The simulated kubelet could not do what was asked (and says why)."""


class PluginClient:
    """Calls one device plugin's socket like the kubelet does."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.channel: Any = grpc.aio.insecure_channel(
            f"unix://{socket_path}",
            options=(("grpc.max_receive_message_length", 64 * 1024 * 1024),),
        )
        self._stub: Any = pb_grpc.DevicePluginStub(self.channel)
        """The raw stub, for callers that bring their own messages."""

    async def connect(self, *, timeout_s: float) -> None:
        """Block until the socket answers (the kubelet's ``grpc.WithBlock`` dial)."""
        try:
            await asyncio.wait_for(self.channel.channel_ready(), timeout_s)
        except TimeoutError as exc:
            raise KubeletSimError(
                f"device plugin at {self.socket_path} did not answer within {timeout_s}s"
            ) from exc

    async def close(self) -> None:
        await self.channel.close()

    async def options(self, *, timeout_s: float = 5.0) -> Any:
        return await self._stub.GetDevicePluginOptions(pb.Empty(), timeout=timeout_s)

    async def list_and_watch(self) -> AsyncIterator[Any]:
        """Every ``ListAndWatchResponse`` until the plugin ends the stream."""
        call = self._stub.ListAndWatch(pb.Empty())
        try:
            async for response in call:
                yield response
        finally:
            call.cancel()

    async def preferred_allocation(
        self,
        available: Sequence[str],
        size: int,
        *,
        must_include: Sequence[str] = (),
        timeout_s: float = 5.0,
    ) -> list[str]:
        """One container's preferred allocation."""
        request = pb.PreferredAllocationRequest()
        request.container_requests.add(
            available_deviceIDs=list(available),
            must_include_deviceIDs=list(must_include),
            allocation_size=size,
        )
        response = await self._stub.GetPreferredAllocation(request, timeout=timeout_s)
        return list(response.container_responses[0].deviceIDs)

    async def allocate(self, containers: Sequence[Sequence[str]], *, timeout_s: float = 5.0) -> Any:
        """``Allocate`` for one or more containers; returns the ``AllocateResponse``."""
        request = pb.AllocateRequest()
        for ids in containers:
            request.container_requests.add(devices_ids=list(ids))
        return await self._stub.Allocate(request, timeout=timeout_s)

    async def pre_start(self, ids: Sequence[str], *, timeout_s: float = 5.0) -> Any:
        return await self._stub.PreStartContainer(
            pb.PreStartContainerRequest(devices_ids=list(ids)), timeout=timeout_s
        )


@dataclass
class Registration:
    """One accepted ``Register`` call."""

    request: Any
    """The ``RegisterRequest`` as received."""
    at: float
    """``time.monotonic()`` when it arrived."""


@dataclass
class PluginConnection:
    """The simulated kubelet's view of one registered resource."""

    resource: str
    endpoint: str
    registered_options: Any
    """``RegisterRequest.options``."""
    served_options: Any
    """What ``GetDevicePluginOptions`` returned when the kubelet dialled back."""
    client: PluginClient
    devices: list[Any] = field(default_factory=list)
    """The latest complete list from ListAndWatch."""
    updates: int = 0
    """How many lists ListAndWatch has delivered."""
    stream_ended: bool = False
    allocated: set[str] = field(default_factory=set)
    task: asyncio.Task[None] | None = None

    def healthy_ids(self) -> list[str]:
        return [d.ID for d in self.devices if d.health == "Healthy"]

    def health(self) -> dict[str, str]:
        return {d.ID: d.health for d in self.devices}


class KubeletSim:
    """The kubelet's device-plugin side. ``async with KubeletSim(dir) as kubelet: ...``."""

    def __init__(
        self,
        plugins_dir: Path,
        *,
        dial_timeout_s: float = 5.0,
        pod_resources_socket: Path | None = None,
    ) -> None:
        self.plugins_dir = plugins_dir
        self.dial_timeout_s = dial_timeout_s
        self.pod_resources_socket = pod_resources_socket
        self.other_devices: dict[str, list[str]] = {}
        """Resource → device IDs of device plugins that are not simulated here (what
        NVIDIA's plugin would advertise), reported by ``GetAllocatableResources``."""
        self.assignments: dict[str, tuple[str, list[str]]] = {}
        """Pod name → (resource, device IDs) of every allocation still held."""
        self._pod_resources_server: Any = None
        self._allocations = 0
        self.registrations: list[Registration] = []
        self.rejections: list[str] = []
        """Why each refused ``Register`` was refused."""
        self.plugins: dict[str, PluginConnection] = {}
        self._server: Any = None
        self._changed = asyncio.Condition()

    @property
    def socket_path(self) -> Path:
        return self.plugins_dir / KUBELET_SOCKET_NAME

    # ------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> KubeletSim:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Serve ``kubelet.sock`` (creating it, which plugins watch for)."""
        self.plugins_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(_RegistrationServicer(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        logger.info("simulated kubelet serving %s", self.socket_path)
        if self.pod_resources_socket is not None and self._pod_resources_server is None:
            path = self.pod_resources_socket
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            pr_server = grpc.aio.server()
            pr_grpc.add_PodResourcesListerServicer_to_server(_PodResourcesServicer(self), pr_server)
            pr_server.add_insecure_port(f"unix://{path}")
            await pr_server.start()
            self._pod_resources_server = pr_server
            logger.info("simulated kubelet serving PodResources on %s", path)

    async def stop(self) -> None:
        """Stop serving and drop every plugin connection (the kubelet process died)."""
        for conn in list(self.plugins.values()):
            await self._disconnect(conn)
        self.plugins.clear()
        server, self._server = self._server, None
        if server is not None:
            await server.stop(0)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        pr_server, self._pod_resources_server = self._pod_resources_server, None
        if pr_server is not None:
            await pr_server.stop(0)
            if self.pod_resources_socket is not None:
                with contextlib.suppress(FileNotFoundError):
                    self.pod_resources_socket.unlink()

    async def restart(self) -> None:
        """A kubelet restart: stop, clean the directory like the kubelet's
        ``CleanupPluginDirectory`` (everything but the checkpoint), serve again."""
        await self.stop()
        for entry in self.plugins_dir.iterdir():
            if entry.name == CHECKPOINT_NAME or entry.is_dir():
                continue
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
        await self.start()

    # ------------------------------------------------------------- waiting
    async def wait_for(self, predicate: Callable[[], bool], *, timeout_s: float = 5.0) -> None:
        """Wait until ``predicate()`` holds, re-checking on every registration or list."""
        try:
            async with asyncio.timeout(timeout_s), self._changed:
                await self._changed.wait_for(predicate)
        except TimeoutError as exc:
            raise KubeletSimError(f"condition not met within {timeout_s}s") from exc

    async def wait_registered(
        self, resource: str, *, count: int = 1, timeout_s: float = 5.0
    ) -> PluginConnection:
        """Wait for the ``count``-th accepted registration of ``resource`` and its first list."""

        def done() -> bool:
            n = sum(1 for r in self.registrations if r.request.resource_name == resource)
            conn = self.plugins.get(resource)
            return n >= count and conn is not None and conn.updates > 0

        try:
            await self.wait_for(done, timeout_s=timeout_s)
        except KubeletSimError as exc:
            raise KubeletSimError(
                f"{resource} not registered {count} time(s) within {timeout_s}s "
                f"(registrations: {[r.request.resource_name for r in self.registrations]}, "
                f"rejections: {self.rejections})"
            ) from exc
        return self.plugins[resource]

    async def wait_devices(
        self,
        resource: str,
        predicate: Callable[[list[Any]], bool],
        *,
        timeout_s: float = 5.0,
    ) -> list[Any]:
        """Wait until the latest list of ``resource`` satisfies ``predicate``."""

        def done() -> bool:
            conn = self.plugins.get(resource)
            return conn is not None and conn.updates > 0 and predicate(conn.devices)

        await self.wait_for(done, timeout_s=timeout_s)
        return self.plugins[resource].devices

    def allocatable(self, resource: str) -> int:
        """Healthy devices of ``resource``: what the node's ``status.allocatable`` shows."""
        conn = self.plugins.get(resource)
        return len(conn.healthy_ids()) if conn is not None else 0

    # ---------------------------------------------------------- allocation
    async def allocate(self, resource: str, size: int) -> tuple[list[str], Any]:
        """Admit one container asking for ``size`` devices, as the kubelet would.

        Returns the device IDs and the ``ContainerAllocateResponse``."""
        conn = self.plugins.get(resource)
        if conn is None:
            raise KubeletSimError(f"no device plugin registered for {resource}")
        available = [i for i in conn.healthy_ids() if i not in conn.allocated]
        if len(available) < size:
            raise KubeletSimError(
                f"insufficient {resource}: requested {size}, available {len(available)}"
            )
        chosen = available[:size]
        if conn.served_options.get_preferred_allocation_available:
            preferred = await conn.client.preferred_allocation(available, size)
            if len(preferred) != size or not set(preferred) <= set(available):
                raise KubeletSimError(
                    f"plugin's preferred allocation is invalid: {len(preferred)} of {size} "
                    f"devices, {len(set(preferred) - set(available))} not available"
                )
            chosen = preferred
        response = await conn.client.allocate([chosen])
        conn.allocated.update(chosen)
        self._allocations += 1
        self.assignments[f"alloc-{self._allocations}"] = (resource, list(chosen))
        return chosen, response.container_responses[0]

    async def admit_pod(
        self, resource: str, containers: Sequence[tuple[str, str, int]]
    ) -> list[tuple[str, list[str], Any]]:
        """Admit a whole pod the kubelet's way (``../shared/KUBELET-FACTS.md`` section 1).

        ``containers`` are ``(name, kind, units)`` in pod order (init containers
        first; kind ``init``, ``sidecar`` or ``app``). Each container first takes
        the pod's *reusable* devices (left by regular init containers; sorted
        here, the kubelet's order is unspecified), then asks
        ``GetPreferredAllocation`` for its whole size with those in
        ``must_include`` and the free devices plus them in ``available``, then
        calls ``Allocate``. A regular init container's devices become reusable;
        a sidecar's and an app container's leave the reusable set.

        Returns ``(name, ids, ContainerAllocateResponse)`` per container that asked
        for devices. If ``Allocate`` fails, the pod is rejected (its devices are
        released) and :class:`KubeletSimError` carries the plugin's message.
        """
        conn = self.plugins.get(resource)
        if conn is None:
            raise KubeletSimError(f"no device plugin registered for {resource}")
        reusable: list[str] = []
        mine: list[str] = []
        out: list[tuple[str, list[str], Any]] = []
        for name, kind, units in containers:
            if units <= 0:
                continue
            reused = sorted(reusable)[:units]
            reusable = [i for i in reusable if i not in reused]
            chosen = list(reused)
            if len(chosen) < units:
                available = [i for i in conn.healthy_ids() if i not in conn.allocated]
                needed = units - len(chosen)
                if len(available) < needed:
                    self.release(resource, mine)
                    raise KubeletSimError(
                        f"insufficient {resource}: requested {needed}, available {len(available)}"
                    )
                extra = available[:needed]
                if conn.served_options.get_preferred_allocation_available:
                    preferred = await conn.client.preferred_allocation(
                        [*available, *reused], units, must_include=reused
                    )
                    picked = [i for i in preferred if i in set(available)]
                    if set(reused) <= set(preferred) and len(picked) == needed:
                        extra = picked
                chosen += extra
                conn.allocated.update(extra)
                mine += extra
            try:
                response = await conn.client.allocate([chosen])
            except grpc.aio.AioRpcError as exc:
                self.release(resource, mine)
                raise KubeletSimError(
                    f"UnexpectedAdmissionError: Allocate failed for container {name}: "
                    f"{exc.details()}"
                ) from exc
            if kind == "init":
                reusable += chosen
            out.append((name, chosen, response.container_responses[0]))
        return out

    def release(self, resource: str, ids: Sequence[str]) -> None:
        """The container using ``ids`` ended."""
        conn = self.plugins.get(resource)
        if conn is not None:
            conn.allocated.difference_update(ids)
        gone = set(ids)
        for pod, (held_resource, held) in list(self.assignments.items()):
            if held_resource == resource and gone & set(held):
                del self.assignments[pod]

    # ------------------------------------------------------------ internals
    async def _register(self, request: Any) -> str | None:
        """Handle one Register; returns why it was refused, or None."""
        if request.version not in SUPPORTED_VERSIONS:
            return (
                f"requested device plugin version {request.version!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_VERSIONS)}"
            )
        try:
            ResourceName(request.resource_name)
        except ResourceNameError as exc:
            return f"invalid resource name: {exc}"
        if not request.endpoint or "/" in request.endpoint:
            return (
                f"endpoint must be a socket file name in {self.plugins_dir}: {request.endpoint!r}"
            )
        client = PluginClient(self.plugins_dir / request.endpoint)
        try:
            await client.connect(timeout_s=self.dial_timeout_s)
            served = await client.options()
        except (KubeletSimError, grpc.aio.AioRpcError) as exc:
            await client.close()
            return f"failed to dial device plugin {request.endpoint}: {exc}"
        old = self.plugins.pop(request.resource_name, None)
        if old is not None:
            await self._disconnect(old)
        conn = PluginConnection(
            resource=request.resource_name,
            endpoint=request.endpoint,
            registered_options=request.options,
            served_options=served,
            client=client,
        )
        conn.task = asyncio.create_task(
            self._watch(conn), name=f"kubelet-sim-watch-{request.resource_name}"
        )
        async with self._changed:
            self.plugins[request.resource_name] = conn
            self.registrations.append(Registration(request=request, at=time.monotonic()))
            self._changed.notify_all()
        return None

    async def _watch(self, conn: PluginConnection) -> None:
        try:
            async for response in conn.client.list_and_watch():
                async with self._changed:
                    conn.devices = list(response.devices)
                    conn.updates += 1
                    self._changed.notify_all()
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                logger.info("ListAndWatch of %s ended: %s", conn.resource, exc.code().name)
        finally:
            async with self._changed:
                conn.stream_ended = True
                self._changed.notify_all()

    async def _disconnect(self, conn: PluginConnection) -> None:
        if conn.task is not None:
            conn.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await conn.task
        await conn.client.close()


class _PodResourcesServicer:
    """``v1.PodResourcesLister`` over the simulated kubelet's state, in its shapes."""

    def __init__(self, kubelet: KubeletSim) -> None:
        self._kubelet = kubelet

    async def List(self, request: Any, context: Any) -> Any:  # noqa: N802
        response = pr_pb.ListPodResourcesResponse()
        for pod, (resource, ids) in sorted(self._kubelet.assignments.items()):
            entry = response.pod_resources.add(name=pod, namespace="dev")
            container = entry.containers.add(name="main")
            for device_id in ids:
                container.devices.add(resource_name=resource, device_ids=[device_id])
        return response

    async def GetAllocatableResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        response = pr_pb.AllocatableResourcesResponse()
        for resource, conn in sorted(self._kubelet.plugins.items()):
            for device in conn.devices:
                nodes = [node.ID for node in device.topology.nodes]
                if not nodes:
                    response.devices.add(resource_name=resource, device_ids=[device.ID])
                for node_id in nodes:  # one entry per NUMA node, as the kubelet sends
                    entry = response.devices.add(resource_name=resource, device_ids=[device.ID])
                    entry.topology.nodes.add(ID=node_id)
        for resource, ids in sorted(self._kubelet.other_devices.items()):
            for device_id in ids:
                response.devices.add(resource_name=resource, device_ids=[device_id])
        return response

    async def Get(self, request: Any, context: Any) -> Any:  # noqa: N802
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Get is not simulated")


class _RegistrationServicer:
    def __init__(self, kubelet: KubeletSim) -> None:
        self._kubelet = kubelet

    async def Register(self, request: Any, context: Any) -> Any:  # noqa: N802
        refusal = await self._kubelet._register(request)
        if refusal is not None:
            self._kubelet.rejections.append(refusal)
            logger.warning("refused registration of %s: %s", request.resource_name, refusal)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, refusal)
        return pb.Empty()
