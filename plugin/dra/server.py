"""The DRA plugin's two unix sockets (adapter; grpc.aio): serve, prove, stop, clean up.

Unlike a device plugin, a DRA driver does not call the kubelet to register: it serves
``pluginregistration.Registration`` on a socket in the kubelet's ``plugins_registry``
directory, and the kubelet's plugin watcher dials it (``GetInfo``, then
``NotifyRegistrationStatus``) and then dials the ``endpoint`` it was given. So the
driver socket serves first, and the registration socket appears only once the driver
socket answers: the kubelet never learns of an endpoint that is not there yet.

Stopping removes the registration socket first (the kubelet deregisters the driver
and, 30 s later, deletes its slices: captured), then the driver socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import grpc

from plugin._pb import dra_health_v1alpha1_pb2_grpc as health_grpc
from plugin._pb import dra_v1_pb2_grpc as dra_grpc
from plugin._pb import pluginregistration_v1_pb2_grpc as reg_grpc
from plugin.dra.servicer import DraServicer, HealthServicer, RegistrationServicer

logger = logging.getLogger(__name__)

DIAL_TIMEOUT_S: Final = 5.0


class DraServerError(Exception):
    """A socket could not be served; the message names it."""


class DraServer:
    """``async with DraServer(...)``: both sockets serve inside, neither exists after."""

    def __init__(
        self,
        dra: DraServicer,
        registration: RegistrationServicer,
        health: HealthServicer,
        *,
        socket_path: Path,
        registration_path: Path,
        grace_s: float,
    ) -> None:
        self._dra = dra
        self._registration = registration
        self._health = health
        self.socket_path = socket_path
        self.registration_path = registration_path
        self._grace_s = grace_s
        self._servers: list[tuple[Any, Path]] = []

    async def __aenter__(self) -> DraServer:
        try:
            await self._serve(
                self.socket_path,
                [
                    (dra_grpc.add_DRAPluginServicer_to_server, self._dra),
                    (health_grpc.add_DRAResourceHealthServicer_to_server, self._health),
                ],
            )
            await self._serve(
                self.registration_path,
                [(reg_grpc.add_RegistrationServicer_to_server, self._registration)],
            )
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.shield(self.stop())

    async def _serve(self, path: Path, services: list[tuple[Any, object]]) -> None:
        _clear_socket(path)
        server = grpc.aio.server()
        for add, servicer in services:
            add(servicer, server)
        try:
            server.add_insecure_port(f"unix://{path}")
            await server.start()
        except (RuntimeError, OSError) as exc:
            await server.stop(None)
            raise DraServerError(f"cannot serve on {path}: {exc}") from exc
        self._servers.append((server, path))
        async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
            try:
                await asyncio.wait_for(channel.channel_ready(), DIAL_TIMEOUT_S)
            except TimeoutError as exc:
                raise DraServerError(
                    f"our own socket {path} did not answer within {DIAL_TIMEOUT_S}s"
                ) from exc
        logger.info("serving", extra={"socket": str(path)})

    async def stop(self) -> None:
        """Registration socket first, then the driver socket; idempotent."""
        self._health.close()  # open health streams end now, not after the grace
        while self._servers:
            server, path = self._servers.pop()
            _remove(path)
            await server.stop(self._grace_s)


def _clear_socket(path: Path) -> None:
    """Create the socket's directory and remove a stale socket a crash left behind."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_socket() or path.exists():
            logger.info("removing stale socket", extra={"socket": str(path)})
            path.unlink()
    except OSError as exc:
        raise DraServerError(f"cannot prepare socket {path}: {exc}") from exc


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
