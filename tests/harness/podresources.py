"""A fake kubelet PodResources API v1: a real gRPC server on a unix socket.

It speaks the real ``v1.PodResourcesLister`` messages (the stubs generated from
``plugin/proto/podresources_v1.proto``), so the agent's client is tested over
the same wire as against a kubelet. The state is what the kubelet's device
manager would hold: which pod/container has which device IDs of which
resource. Tests change it with :meth:`FakePodResources.assign`,
:meth:`FakePodResources.advertise` and :meth:`FakePodResources.release`, and
can make calls fail (:attr:`FakePodResources.fail_with`) or hang like a wedged
kubelet (:attr:`FakePodResources.hold`).

Message shapes are the kubelet's own (``pkg/kubelet/apis/podresources/server_v1.go``
and ``containerDevicesFromResourceDeviceInstances`` in
``pkg/kubelet/cm/container_manager_linux.go``): both ``List`` and
``GetAllocatableResources`` send **one** ``ContainerDevices`` per device, with
that device's NUMA node in ``topology`` (one entry per NUMA node), or without
``topology`` when the plugin reported none. A client that assumed one entry
per resource would miscount against a real kubelet.

Claims (DRA) are reported as the kubelet's ``GetDynamicResources``
(``pkg/kubelet/cm/container_manager_linux.go``) builds them from the answers of
the drivers' ``NodePrepareResources`` it keeps: per claim one ``DynamicResource``
(claim name and namespace), per prepared device one ``ClaimResource`` (driver,
pool, device, CDI devices). Its quirk is kept too: the ``cdi_devices`` of one
driver's devices in a claim are appended to one list, so the second device's entry
also carries the first device's CDI IDs. Tests hand in what the DRA plugin answered
(:meth:`FakePodResources.assign_claim`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc

from plugin._pb import podresources_v1_pb2 as pb
from plugin._pb import podresources_v1_pb2_grpc as pb_grpc


class PreparedDevice(Protocol):
    """One device of a driver's ``NodePrepareResources`` answer (``v1.Device``, or the
    DRA plugin's :class:`plugin.dra.prepare.PreparedDevice`): what the kubelet keeps."""

    @property
    def pool_name(self) -> str: ...

    @property
    def device_name(self) -> str: ...

    @property
    def cdi_device_ids(self) -> Iterable[str]: ...


@dataclass
class _Container:
    devices: dict[str, list[str]] = field(default_factory=dict)  # resource -> ids
    claims: dict[tuple[str, str], pb.DynamicResource] = field(default_factory=dict)
    """(claim namespace, claim name) -> the claim as the kubelet reports it."""


class FakePodResources(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """Servicer with mutable state; one per test (or module)."""

    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], dict[str, _Container]] = {}
        self.allocatable: dict[str, list[str]] = {}
        """Resource → device IDs the kubelet knows (every device plugin's, not only ours)."""
        self.numa: dict[str, int] = {}
        """Device ID → NUMA node, for the devices whose plugin reported topology."""
        self.calls: list[str] = []
        self.fail_with: grpc.StatusCode | None = None
        self.hold: asyncio.Event | None = None
        """When set, ``List`` and ``GetAllocatableResources`` wait for it before
        answering: a wedged kubelet, for the caller's deadline to run out on."""

    # ------------------------------------------------------ test-side API
    def assign(
        self, namespace: str, pod: str, container: str, resource: str, device_ids: Sequence[str]
    ) -> None:
        """Give ``container`` these device IDs of ``resource`` (replacing earlier ones)."""
        containers = self._pods.setdefault((namespace, pod), {})
        containers.setdefault(container, _Container()).devices[resource] = list(device_ids)

    def assign_claim(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        claim_namespace: str,
        claim_name: str,
        driver: str,
        devices: Sequence[PreparedDevice],
    ) -> None:
        """``container`` references a claim that ``driver`` prepared with ``devices``
        (replacing an earlier entry of the same claim). One driver per claim, as
        metagpu's claims have; the kubelet would list each driver's devices in turn."""
        claim = pb.DynamicResource(claim_name=claim_name, claim_namespace=claim_namespace)
        cdi: list[str] = []  # one list across the driver's devices, as the kubelet does
        for device in devices:
            cdi.extend(device.cdi_device_ids)
            claim.claim_resources.add(
                cdi_devices=[pb.CDIDevice(name=n) for n in cdi],
                driver_name=driver,
                pool_name=device.pool_name,
                device_name=device.device_name,
            )
        containers = self._pods.setdefault((namespace, pod), {})
        entry = containers.setdefault(container, _Container())
        entry.claims[(claim_namespace, claim_name)] = claim

    def advertise(
        self, resource: str, device_ids: Sequence[str], *, numa: int | None = None
    ) -> None:
        """A device plugin registered ``resource`` with these devices (replacing earlier
        ones), as ``GetAllocatableResources`` will report them."""
        self.allocatable[resource] = list(device_ids)
        if numa is not None:
            self.numa.update(dict.fromkeys(device_ids, numa))

    def add_pod(self, namespace: str, pod: str, containers: Sequence[str]) -> None:
        """A pod whose containers hold no devices (the kubelet lists those too)."""
        entry = self._pods.setdefault((namespace, pod), {})
        for name in containers:
            entry.setdefault(name, _Container())

    def release(self, namespace: str, pod: str) -> None:
        """The pod ended: its devices go back to the pool."""
        self._pods.pop((namespace, pod), None)

    # ------------------------------------------------------------ servicer
    async def List(
        self, request: pb.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        self.calls.append("List")
        if self.hold is not None:
            await self.hold.wait()
        if self.fail_with is not None:
            await context.abort(self.fail_with, "injected failure")
        response = pb.ListPodResourcesResponse()
        for (namespace, name), containers in sorted(self._pods.items()):
            pod = response.pod_resources.add(name=name, namespace=namespace)
            for cname, container in containers.items():
                c = pod.containers.add(name=cname)
                for resource, ids in container.devices.items():
                    self._add_devices(c.devices, resource, ids)
                c.dynamic_resources.extend(container.claims.values())
        return response

    async def GetAllocatableResources(
        self, request: pb.AllocatableResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocatableResourcesResponse:
        self.calls.append("GetAllocatableResources")
        if self.hold is not None:
            await self.hold.wait()
        if self.fail_with is not None:
            await context.abort(self.fail_with, "injected failure")
        response = pb.AllocatableResourcesResponse()
        for resource, ids in self.allocatable.items():
            self._add_devices(response.devices, resource, ids)
        return response

    def _add_devices(self, field: Any, resource: str, ids: Sequence[str]) -> None:
        """One ``ContainerDevices`` per device, as the kubelet sends them."""
        for device_id in ids:
            entry = field.add(resource_name=resource, device_ids=[device_id])
            numa = self.numa.get(device_id)
            if numa is not None:
                entry.topology.nodes.add(ID=numa)

    async def Get(
        self, request: pb.GetPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetPodResourcesResponse:
        self.calls.append("Get")
        containers = self._pods.get((request.pod_namespace, request.pod_name))
        if containers is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"pod {request.pod_name} not found in {request.pod_namespace}",
            )
        response = pb.GetPodResourcesResponse()
        response.pod_resources.name = request.pod_name
        response.pod_resources.namespace = request.pod_namespace
        for cname, container in (containers or {}).items():
            c = response.pod_resources.containers.add(name=cname)
            for resource, ids in container.devices.items():
                self._add_devices(c.devices, resource, ids)
            c.dynamic_resources.extend(container.claims.values())
        return response


@contextlib.asynccontextmanager
async def running_pod_resources(
    socket_path: Path, servicer: FakePodResources | None = None
) -> AsyncIterator[FakePodResources]:
    """Serve ``servicer`` on ``socket_path`` until the block exits (then remove the socket)."""
    servicer = servicer or FakePodResources()
    _remove(socket_path)
    server = grpc.aio.server()
    pb_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    try:
        yield servicer
    finally:
        await asyncio.shield(server.stop(grace=0.2))
        _remove(socket_path)


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
