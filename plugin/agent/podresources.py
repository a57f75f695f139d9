"""Adapter: which container holds which meta-devices, from the kubelet PodResources API v1.

The kubelet serves ``v1.PodResourcesLister`` on
``/var/lib/kubelet/pod-resources/kubelet.sock``. Its answer comes from the
kubelet's device-manager checkpoint, so it is right after a restart of the
agent, the device plugin or the kubelet itself; the agent keeps nothing of its
own and asks again every cycle (a ``List`` is answered from memory in
milliseconds). The original MetaGPU instead listed every pod in the cluster and
exec'd ``printenv`` into each GPU container.

The only module that speaks this gRPC API; it returns
:class:`~plugin.agent.accounting.Allocation` values and raises
:class:`PodResourcesError` for every failure.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Final

import grpc

from plugin._pb import podresources_v1_pb2 as pb
from plugin._pb import podresources_v1_pb2_grpc as pb_grpc
from plugin.agent.accounting import Allocation
from plugin.agent.containers import ContainerKey
from plugin.placement.ownership import ResourceDevices

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
"""The kubelet's own limit for PodResources responses (``podresources.DefaultMaxMsgSize``)."""


class PodResourcesError(Exception):
    """The kubelet's PodResources API could not be read; the message says why and where."""


class PodResourcesClient:
    """A reconnecting client for ``v1.PodResourcesLister/List``.

    The channel is created on first use inside the running loop and thrown away
    after a failure, so a kubelet restart (which re-creates the socket) is
    picked up by the next call instead of waiting out gRPC's reconnect backoff.
    """

    def __init__(self, socket_path: Path, *, timeout_s: float) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.PodResourcesListerStub | None = None

    async def list_allocations(self) -> tuple[Allocation, ...]:
        """Every container's devices, all resources (the caller filters by name)."""
        if not self.socket_path.exists():
            raise PodResourcesError(
                f"kubelet PodResources socket {self.socket_path} does not exist: mount the "
                "host's /var/lib/kubelet/pod-resources into the agent container"
            )
        stub = self._connect()
        try:
            response = await stub.List(pb.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            await self.close()
            raise PodResourcesError(
                f"kubelet PodResources List on {self.socket_path} failed: "
                f"{exc.code().name}: {exc.details()}"
            ) from exc
        return allocations_from_response(response)

    async def list_allocatable(self) -> tuple[ResourceDevices, ...]:
        """Every device the kubelet knows, of every resource (``GetAllocatableResources``):
        how the agent sees GPUs another device plugin also advertises."""
        if not self.socket_path.exists():
            raise PodResourcesError(
                f"kubelet PodResources socket {self.socket_path} does not exist"
            )
        stub = self._connect()
        try:
            response = await stub.GetAllocatableResources(
                pb.AllocatableResourcesRequest(), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            await self.close()
            raise PodResourcesError(
                f"kubelet PodResources GetAllocatableResources on {self.socket_path} failed: "
                f"{exc.code().name}: {exc.details()}"
            ) from exc
        return allocatable_from_response(response)

    async def close(self) -> None:
        """Close the channel; the next call opens a new one."""
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()

    def _connect(self) -> pb_grpc.PodResourcesListerStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix://{self.socket_path.absolute()}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
            )
            self._stub = pb_grpc.PodResourcesListerStub(self._channel)
        return self._stub


def allocations_from_response(response: pb.ListPodResourcesResponse) -> tuple[Allocation, ...]:
    """The protobuf answer as plain values: one per (container, resource) with devices.

    The kubelet sends one ``ContainerDevices`` per device (per NUMA node), so
    the entries of one container and resource are joined here, each ID once."""
    merged: dict[tuple[ContainerKey, str], dict[str, None]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            key = ContainerKey(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                if devices.device_ids:
                    ids = merged.setdefault((key, devices.resource_name), {})
                    ids.update(dict.fromkeys(devices.device_ids))
    return tuple(
        Allocation(key=key, resource=resource, device_ids=tuple(ids))
        for (key, resource), ids in merged.items()
    )


def allocatable_from_response(
    response: pb.AllocatableResourcesResponse,
) -> tuple[ResourceDevices, ...]:
    """``GetAllocatableResources`` as plain values: every resource's devices, each ID once."""
    merged: dict[str, dict[str, None]] = {}
    for devices in response.devices:
        merged.setdefault(devices.resource_name, {}).update(dict.fromkeys(devices.device_ids))
    return tuple(ResourceDevices(name, tuple(ids)) for name, ids in merged.items())
