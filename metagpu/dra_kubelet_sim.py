"""The kubelet's side of a DRA driver, over real unix sockets and the real protos.

``metagpu dev --dra`` registers the DRA plugin with it, and the DRA plugin's tests
(``tests/plugin/dra/``) replay the captured kubelet calls through it; one simulated
kubelet for both, so what the dev prompt shows is what the tests check.

What a kubelet v1.36.2 did (``tests/fixtures/dra/kubelet-*.json``): its plugin watcher
finds ``<driver>-reg.sock`` in ``plugins_registry``, calls ``GetInfo``, accepts
``type: DRAPlugin`` with a ``supported_versions`` entry it knows (``v1.DRAPlugin``,
``v1beta1.DRAPlugin``), dials the ``endpoint``, calls ``NotifyRegistrationStatus``,
and at once opens ``/v1alpha1.DRAResourceHealth/NodeWatchResources`` on the driver
socket. Then ``NodePrepareResources``/``NodeUnprepareResources`` with claim references.

:meth:`DraKubelet.replay` sends a captured call's request and returns the answer as the
capture renders it (proto field names, defaults omitted), so tests compare the two.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Final

import grpc
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.message import Message

from plugin._pb import dra_health_v1alpha1_pb2 as health_pb
from plugin._pb import dra_health_v1alpha1_pb2_grpc as health_grpc
from plugin._pb import dra_v1_pb2 as dra
from plugin._pb import dra_v1_pb2_grpc as dra_grpc
from plugin._pb import pluginregistration_v1_pb2 as reg
from plugin._pb import pluginregistration_v1_pb2_grpc as reg_grpc

KUBELET_VERSIONS: Final = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""What the v1.36 kubelet accepts in ``supported_versions`` (first match in the plugin's order)."""
CALL_TIMEOUT_S: Final = 5.0


class DraKubeletSimError(Exception):
    """What a kubelet would log and give up on; the message says what."""


class RegistrationRefusedError(DraKubeletSimError):
    """The kubelet would not register this plugin; the message says why."""


class HealthStream:
    """One ``NodeWatchResources`` stream; :meth:`next` reads a message as the kubelet does."""

    def __init__(self, call: Any) -> None:
        self._call = call

    async def next(self, *, timeout_s: float = CALL_TIMEOUT_S) -> dict[str, str]:
        """The next message as ``{device_name: HEALTHY|UNHEALTHY|UNKNOWN}``."""
        message = await asyncio.wait_for(self._call.read(), timeout_s)
        if message is grpc.aio.EOF:
            raise DraKubeletSimError("the plugin ended the health stream")
        return {
            d.device.device_name: health_pb.HealthStatus.Name(d.health) for d in message.devices
        }

    async def code(self, *, timeout_s: float = CALL_TIMEOUT_S) -> grpc.StatusCode:
        """How the stream ended (after the plugin stopped, or refused it)."""
        try:
            while await asyncio.wait_for(self._call.read(), timeout_s) is not grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK

    def cancel(self) -> None:
        self._call.cancel()


class DraKubelet:
    """``async with DraKubelet(registry_dir)``; then :meth:`register` and the DRA calls."""

    def __init__(self, registry_dir: Path) -> None:
        self.registry_dir = registry_dir
        self.info: reg.PluginInfo | None = None
        self._channel: grpc.aio.Channel | None = None

    async def __aenter__(self) -> DraKubelet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def register(self, *, timeout_s: float = 5.0) -> dict[str, Any]:
        """Register the plugin whose socket appears in the registry; returns GetInfo's answer
        rendered as captured. Raises :class:`RegistrationRefusedError` as the kubelet would."""
        socket = await self._wait_for_socket(timeout_s)
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(reg.InfoRequest(), timeout=CALL_TIMEOUT_S)
            error = self._check(info)
            if not error:
                endpoint = Path(info.endpoint)
                self._channel = grpc.aio.insecure_channel(f"unix://{endpoint}")
                try:
                    await asyncio.wait_for(self._channel.channel_ready(), CALL_TIMEOUT_S)
                except TimeoutError:
                    error = f"endpoint {endpoint} did not answer"
            await stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=not error, error=error),
                timeout=CALL_TIMEOUT_S,
            )
        if error:
            raise RegistrationRefusedError(error)
        self.info = info
        return _as_dict(info)

    def watch_health(self) -> HealthStream:
        """Open the health stream the kubelet opens right after registering."""
        stub = health_grpc.DRAResourceHealthStub(self._dra_channel())
        return HealthStream(stub.NodeWatchResources(health_pb.NodeWatchResourcesRequest()))

    async def prepare(self, claims: list[dict[str, str]]) -> dict[str, Any]:
        stub = dra_grpc.DRAPluginStub(self._dra_channel())
        request = ParseDict({"claims": claims}, dra.NodePrepareResourcesRequest())
        answer = await stub.NodePrepareResources(request, timeout=CALL_TIMEOUT_S)
        return _as_dict(answer)

    async def unprepare(self, claims: list[dict[str, str]]) -> dict[str, Any]:
        stub = dra_grpc.DRAPluginStub(self._dra_channel())
        request = ParseDict({"claims": claims}, dra.NodeUnprepareResourcesRequest())
        answer = await stub.NodeUnprepareResources(request, timeout=CALL_TIMEOUT_S)
        return _as_dict(answer)

    async def replay(self, call: dict[str, Any]) -> dict[str, Any]:
        """Send a captured ``v1.DRAPlugin`` call's request; the answer as captured."""
        if call["service"] != "v1.DRAPlugin":
            raise DraKubeletSimError(f"not a v1.DRAPlugin call: {call['service']}")
        claims = call["request"]["claims"]
        if call["method"] == "NodePrepareResources":
            return await self.prepare(claims)
        if call["method"] != "NodeUnprepareResources":
            raise DraKubeletSimError(f"not a v1.DRAPlugin method: {call['method']}")
        return await self.unprepare(claims)

    def _dra_channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            raise DraKubeletSimError("no DRA plugin is registered")
        return self._channel

    @staticmethod
    def _check(info: reg.PluginInfo) -> str:
        if info.type != "DRAPlugin":
            return f"plugin type {info.type!r} is not DRAPlugin"
        if not info.name:
            return "no driver name"
        if not any(v in KUBELET_VERSIONS for v in info.supported_versions):
            return f"none of the versions {list(info.supported_versions)} is supported"
        return ""

    async def _wait_for_socket(self, timeout_s: float) -> Path:
        """The real kubelet learns of the socket from fsnotify; polling stands in for it."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = sorted(p for p in self.registry_dir.glob("*.sock") if p.is_socket())
            if found:
                return found[0]
            if time.monotonic() > deadline:
                raise DraKubeletSimError(f"no registration socket in {self.registry_dir}")
            await asyncio.sleep(0.01)


def _as_dict(message: Message) -> dict[str, Any]:
    """A message as the captures render it: proto field names, defaults omitted."""
    rendered: dict[str, Any] = MessageToDict(message, preserving_proto_field_name=True)
    return rendered
