"""Adapter: the kubelet's PodResources API v1 over its unix socket, for any component.

The kubelet serves ``v1.PodResourcesLister`` on
``/var/lib/kubelet/pod-resources/kubelet.sock``. Its answers come from the
kubelet's device-manager checkpoint, so they are right after a restart of the
kubelet or of whoever asks; callers keep nothing of their own and ask again.
Two components read it: the node agent (which container holds which
meta-devices, :mod:`plugin.agent.podresources`) and the device plugin (which
GPUs another device plugin also serves, :mod:`plugin.deviceplugin.podresources`).
This module is what they share: the connection, the calls with their timeout,
and one error type whose message says what failed and where. It returns the
protobuf answers as they are; what they mean is each component's business, so
the two never import each other.

A channel is opened on first use inside the running loop and thrown away
after a failure, so a restarted kubelet (which re-creates the socket) is
picked up by the next call rather than after gRPC's reconnect backoff.
"""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path
from typing import Final, TypeVar

import grpc

from plugin._pb import podresources_v1_pb2 as pb
from plugin._pb import podresources_v1_pb2_grpc as pb_grpc

T = TypeVar("T")

MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
"""The kubelet's own limit for PodResources responses (``podresources.DefaultMaxMsgSize``)."""


class PodResourcesError(Exception):
    """The kubelet's PodResources API could not be read; the message says why and where."""


class PodResourcesClient:
    """A reconnecting client for ``List`` and ``GetAllocatableResources``.

    ``mount_into`` names the caller's container (``"the agent container"``) for
    the message that says what to mount when the socket is missing.
    """

    def __init__(self, socket_path: Path, *, timeout_s: float, mount_into: str) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self.mount_into = mount_into
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.PodResourcesListerStub | None = None

    async def list(self) -> pb.ListPodResourcesResponse:
        """``List``: every container's devices, of every resource."""
        stub = self._connect()
        request = pb.ListPodResourcesRequest()
        response: pb.ListPodResourcesResponse = await self._answer(
            "List", stub.List(request, timeout=self.timeout_s)
        )
        return response

    async def get_allocatable_resources(self) -> pb.AllocatableResourcesResponse:
        """``GetAllocatableResources``: every device the kubelet knows, of every resource."""
        stub = self._connect()
        request = pb.AllocatableResourcesRequest()
        response: pb.AllocatableResourcesResponse = await self._answer(
            "GetAllocatableResources", stub.GetAllocatableResources(request, timeout=self.timeout_s)
        )
        return response

    async def close(self) -> None:
        """Close the channel; the next call opens a new one."""
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()

    def _connect(self) -> pb_grpc.PodResourcesListerStub:
        # Checked on every call, not only when connecting, so that a missing
        # socket is reported as what to mount rather than as gRPC's UNAVAILABLE.
        if not self.socket_path.exists():
            raise PodResourcesError(
                f"kubelet PodResources socket {self.socket_path} does not exist: mount the "
                f"host's /var/lib/kubelet/pod-resources into {self.mount_into}"
            )
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix://{self.socket_path.absolute()}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
            )
            self._stub = pb_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    async def _answer(self, rpc: str, call: Awaitable[T]) -> T:
        """Await ``call``; on failure drop the channel (the kubelet may be restarting)
        and raise :class:`PodResourcesError` naming the call, the socket and the code."""
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            await self.close()
            raise PodResourcesError(
                f"kubelet PodResources {rpc} on {self.socket_path} failed: "
                f"{exc.code().name}: {exc.details()}"
            ) from exc
