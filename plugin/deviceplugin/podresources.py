"""Adapter: what every device plugin on the node advertises and has handed out (PodResources v1).

The device plugin's own reader of the kubelet's ``v1.PodResourcesLister``
(``/var/lib/kubelet/pod-resources/kubelet.sock``): ``GetAllocatableResources``
for every resource's devices and ``List`` for every container's. It answers
in the upstream-shaped values of :mod:`plugin.placement.ownership`, so the
ownership check never sees protobuf. The node agent has its own client
(:mod:`plugin.agent.podresources`); the two components never import each
other.

A channel is opened on first use inside the running loop and thrown away
after a failure, so a restarted kubelet (a new socket) is picked up on the
next read rather than after gRPC's reconnect backoff.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc

from plugin._pb import podresources_v1_pb2 as pb
from plugin._pb import podresources_v1_pb2_grpc as pb_grpc
from plugin.placement.ownership import AssignedDevices, ResourceDevices

MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
"""The kubelet's own limit for PodResources responses (``podresources.DefaultMaxMsgSize``)."""


class PodResourcesError(Exception):
    """The kubelet's PodResources API could not be read; the message says why and where."""


@dataclass(frozen=True)
class NodeDevices:
    """One reading: every resource's devices, and every container's."""

    allocatable: tuple[ResourceDevices, ...]
    assigned: tuple[AssignedDevices, ...]


class PodResourcesReader:
    """Reads :class:`NodeDevices` from the kubelet; one instance per plugin process."""

    def __init__(self, socket_path: Path, *, timeout_s: float) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.PodResourcesListerStub | None = None

    async def read(self) -> NodeDevices:
        """Both calls, allocatable first (a device assigned in between is then in both)."""
        if not self.socket_path.exists():
            raise PodResourcesError(
                f"kubelet PodResources socket {self.socket_path} does not exist: mount the "
                "host's /var/lib/kubelet/pod-resources into the device plugin container"
            )
        stub = self._connect()
        rpc = "GetAllocatableResources"
        try:
            allocatable = await stub.GetAllocatableResources(
                pb.AllocatableResourcesRequest(), timeout=self.timeout_s
            )
            rpc = "List"
            listed = await stub.List(pb.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            await self.close()
            raise PodResourcesError(
                f"kubelet PodResources {rpc} on {self.socket_path} failed: "
                f"{exc.code().name}: {exc.details()}"
            ) from exc
        return NodeDevices(
            allocatable=tuple(
                ResourceDevices(d.resource_name, tuple(d.device_ids)) for d in allocatable.devices
            ),
            assigned=tuple(
                AssignedDevices(
                    pod.namespace, pod.name, c.name, d.resource_name, tuple(d.device_ids)
                )
                for pod in listed.pod_resources
                for c in pod.containers
                for d in c.devices
            ),
        )

    async def close(self) -> None:
        """Close the channel; the next read opens a new one."""
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
