"""One resource's gRPC server on its unix socket, and its registration with the kubelet (adapter).

The lifecycle of NVIDIA's ``internal/plugin/server.go`` (``Start``, ``Serve``,
``Register``, ``Stop``):

1. remove a stale socket left by a previous run (``bind`` fails otherwise);
2. create the ``grpc.aio`` server inside the running loop,
   ``add_insecure_port("unix://<dir>/<socket>")`` and start it;
3. dial our own socket with a timeout: proof that we serve before we ask the
   kubelet to connect (it dials back *during* ``Register`` and fails the
   registration if nobody answers);
4. ``Register`` on ``kubelet.sock`` with the socket's *basename* as
   ``endpoint`` (the kubelet joins it to its own directory);
5. stop: set the stop event so ``ListAndWatch`` streams return, stop the
   server with a grace period, and unlink the socket *if it is still ours*
   (same inode and change time): after a kubelet restart the path may already belong to the
   next run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import Any, Final

import grpc

from plugin._pb import deviceplugin_v1beta1_pb2 as pb
from plugin._pb import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from plugin.deviceplugin.servicer import API_VERSION, DevicePluginServicer, plugin_options

# The name it had before plugin/ was split by concern: log lines (text and JSON
# show the logger) and any logging config that names it stay as they were.
logger = logging.getLogger("plugin.server")

KUBELET_SOCKET_NAME: Final = "kubelet.sock"
"""The kubelet's Registration service, in the device-plugins directory."""

FAST_RECONNECT: Final = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
)
"""A kubelet that just re-created its socket may refuse the first connection;
gRPC's default 1 s reconnect backoff would eat half the 2 s re-registration budget."""

UNLIMITED_MESSAGES: Final = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
)
"""16 GPUs × 1000 units make a ~1 MiB ListAndWatchResponse and a
GetPreferredAllocation request of similar size; gRPC's 4 MiB receive default is
too close for comfort."""


class PluginServerError(Exception):
    """The plugin could not serve or register; the supervisor retries later."""


class PluginServer:
    """Serve one :class:`DevicePluginServicer` on ``socket_path`` and register it."""

    def __init__(
        self,
        servicer: DevicePluginServicer,
        *,
        resource: str,
        socket_path: Path,
        stop: asyncio.Event,
        dial_timeout_s: float = 5.0,
    ) -> None:
        self.servicer = servicer
        self.resource = resource
        self.socket_path = socket_path
        self._stop = stop
        self._dial_timeout_s = dial_timeout_s
        self._server: Any = None
        self._identity: tuple[int, int, int] | None = None

    # --------------------------------------------------------------- start
    async def start(self) -> None:
        """Serve on the socket and prove it by dialling it; :class:`PluginServerError` if not."""
        path = self.socket_path
        try:
            if path.is_socket() or path.exists():
                logger.info("removing stale socket %s", path, extra={"resource": self.resource})
                path.unlink()
        except OSError as exc:
            raise PluginServerError(f"cannot remove stale socket {path}: {exc}") from exc
        server = grpc.aio.server(options=UNLIMITED_MESSAGES)
        pb_grpc.add_DevicePluginServicer_to_server(self.servicer, server)
        try:
            server.add_insecure_port(f"unix://{path}")
            await server.start()
        except (RuntimeError, OSError) as exc:
            await server.stop(None)
            raise PluginServerError(f"cannot serve on {path}: {exc}") from exc
        self._server = server
        try:
            self._identity = _identity(path)
        except OSError as exc:
            await self.stop(grace_s=0)
            raise PluginServerError(f"socket {path} vanished right after bind: {exc}") from exc
        try:
            await self._dial_self()
        except PluginServerError:
            await self.stop(grace_s=0)
            raise
        logger.info("serving on %s", path, extra={"resource": self.resource})

    async def _dial_self(self) -> None:
        async with grpc.aio.insecure_channel(f"unix://{self.socket_path}") as channel:
            try:
                await asyncio.wait_for(channel.channel_ready(), self._dial_timeout_s)
            except TimeoutError as exc:
                raise PluginServerError(
                    f"our own socket {self.socket_path} did not answer within "
                    f"{self._dial_timeout_s}s"
                ) from exc

    # ------------------------------------------------------------ register
    async def register(self, kubelet_socket: Path, *, timeout_s: float = 5.0) -> None:
        """Tell the kubelet about us; :class:`PluginServerError` with its answer if it refuses."""
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket_path.name,
            resource_name=self.resource,
            options=plugin_options(),
        )
        async with grpc.aio.insecure_channel(
            f"unix://{kubelet_socket}", options=FAST_RECONNECT
        ) as channel:
            stub = pb_grpc.RegistrationStub(channel)
            try:
                await stub.Register(request, timeout=timeout_s, wait_for_ready=True)
            except grpc.aio.AioRpcError as exc:
                raise PluginServerError(
                    f"kubelet at {kubelet_socket} refused registration of {self.resource}: "
                    f"{exc.code().name}: {exc.details()}"
                ) from exc
        logger.info(
            "registered with the kubelet",
            extra={"resource": self.resource, "endpoint": self.socket_path.name},
        )

    # ---------------------------------------------------------------- state
    def socket_is_ours(self) -> bool:
        """The socket file still exists and is the one we bound (the kubelet deletes
        plugin sockets when it restarts)."""
        if self._identity is None:
            return False
        try:
            return _identity(self.socket_path) == self._identity
        except OSError:
            return False

    # ----------------------------------------------------------------- stop
    async def stop(self, *, grace_s: float | None = 1.0) -> None:
        """End the streams, stop serving, remove our socket. Idempotent."""
        self._stop.set()
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace_s)
        if self.socket_is_ours():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
        self._identity = None
        logger.debug("stopped", extra={"resource": self.resource})


def _identity(path: Path) -> tuple[int, int, int]:
    """Device, inode and change time: a re-created file may reuse the inode number."""
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_ctime_ns)
