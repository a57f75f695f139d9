"""The kubelet-facing gRPC services of the DRA plugin (adapter): registration and v1.DRAPlugin.

Protobuf in, core calls, protobuf out; nothing here decides anything. Shapes follow the
captured kubelet v1.36.2 calls (``../shared/fixtures/dra/kubelet-*.json``):

* ``pluginregistration.Registration`` on the registry socket: ``GetInfo`` answers
  ``{type: DRAPlugin, name: <driver>, endpoint: <dra.sock>, supported_versions:
  [v1.DRAPlugin]}``; ``NotifyRegistrationStatus`` tells us whether the kubelet took it.
* ``v1.DRAPlugin`` on the driver socket: requests carry only claim references; every
  claim gets an entry keyed by its UID, with the devices or an ``error`` (the kubelet
  shows that text in the pod's ``FailedPrepareDynamicResources`` event). A per-claim
  failure never fails the call, so the other claims of the pod still get their answer.

* ``v1alpha1.DRAResourceHealth`` on the driver socket: the device list with each
  GPU's health, again after every change (:mod:`plugin.dra.device_health`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Final

from plugin._pb import dra_health_v1alpha1_pb2 as health_pb
from plugin._pb import dra_v1_pb2 as dra
from plugin._pb import pluginregistration_v1_pb2 as reg
from plugin.dra.claims import ClaimError, ClaimRef
from plugin.dra.device_health import DeviceHealthEntry
from plugin.dra.prepare import PreparedDevice, Preparer

logger = logging.getLogger(__name__)

PLUGIN_TYPE: Final = "DRAPlugin"
SUPPORTED_VERSIONS: Final = ("v1.DRAPlugin",)
"""The kubelet takes the first it knows; v1beta1 is not served (only v1 was captured)."""

ReadClaim = Callable[[ClaimRef], Awaitable[Mapping[str, Any]]]
"""Reads a claim from the API server; raises ClaimError (ClaimNotFoundError when gone)."""


class RegistrationServicer:
    """What the kubelet's plugin watcher asks on ``<registry>/<driver>-reg.sock``."""

    def __init__(self, *, driver: str, endpoint: Path) -> None:
        self._driver = driver
        self._endpoint = endpoint
        self.registered = asyncio.Event()
        self.last_error = ""

    async def GetInfo(  # noqa: N802 - gRPC method name
        self, request: reg.InfoRequest, context: Any
    ) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=self._driver,
            endpoint=str(self._endpoint),
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    async def NotifyRegistrationStatus(  # noqa: N802 - gRPC method name
        self, request: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            self.last_error = ""
            self.registered.set()
            logger.info("registered with the kubelet", extra={"driver": self._driver})
        else:
            self.last_error = request.error
            self.registered.clear()
            logger.error(
                "the kubelet refused the registration",
                extra={"driver": self._driver, "error": request.error},
            )
        return reg.RegistrationStatusResponse()


class DraServicer:
    """``v1.DRAPlugin``: prepare and unprepare claims through :class:`Preparer`."""

    def __init__(self, preparer: Preparer, read_claim: ReadClaim, *, timeout_s: float) -> None:
        self._preparer = preparer
        self._read_claim = read_claim
        self._timeout_s = timeout_s
        self._lock = asyncio.Lock()
        """One prepare or unprepare at a time touches the CDI files (the claim reads
        before it run concurrently): the Go helper serializes calls the same way."""

    async def NodePrepareResources(  # noqa: N802 - gRPC method name
        self,
        request: dra.NodePrepareResourcesRequest,
        context: Any,
    ) -> dra.NodePrepareResourcesResponse:
        refs = [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]
        answers = await asyncio.gather(*(self._prepare(ref) for ref in refs))
        response = dra.NodePrepareResourcesResponse()
        for ref, answer in zip(refs, answers, strict=True):
            entry = response.claims[ref.uid]
            if isinstance(answer, str):
                entry.error = answer
            else:
                entry.devices.extend(_device(d) for d in answer)
        return response

    async def NodeUnprepareResources(  # noqa: N802 - gRPC method name
        self,
        request: dra.NodeUnprepareResourcesRequest,
        context: Any,
    ) -> dra.NodeUnprepareResourcesResponse:
        response = dra.NodeUnprepareResourcesResponse()
        async with self._lock:
            for c in request.claims:
                ref = ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid)
                entry = response.claims[ref.uid]  # present even when empty: "done"
                try:
                    self._preparer.unprepare(ref)
                except ClaimError as exc:
                    entry.error = str(exc)
        return response

    async def _prepare(self, ref: ClaimRef) -> tuple[PreparedDevice, ...] | str:
        """The claim's devices, or the error text for its entry."""
        try:
            async with asyncio.timeout(self._timeout_s):
                claim = await self._read_claim(ref)
                async with self._lock:
                    return self._preparer.prepare(ref, claim)
        except ClaimError as exc:
            logger.warning("claim not prepared: %s", exc, extra={"claim": str(ref)})
            return str(exc)
        except TimeoutError:
            return f"claim {ref}: not prepared within {self._timeout_s:g}s"
        except Exception as exc:  # a transport error reading the claim, or a bug
            logger.exception("preparing a claim failed", extra={"claim": str(ref)})
            return f"claim {ref}: {type(exc).__name__}: {exc}"


def _device(device: PreparedDevice) -> dra.Device:
    message = dra.Device(
        request_names=list(device.request_names),
        pool_name=device.pool_name,
        device_name=device.device_name,
        cdi_device_ids=list(device.cdi_device_ids),
    )
    if device.share_id is not None:
        message.share_id = device.share_id
    return message


class HealthServicer:
    """``v1alpha1.DRAResourceHealth``: the complete device list now and after each change.

    Each stream has its own one-slot queue, so a slow stream never holds up the others
    and a burst of changes costs one message: the latest state is read when it is sent.
    """

    def __init__(self, snapshot: Callable[[], tuple[DeviceHealthEntry, ...]]) -> None:
        self._snapshot = snapshot
        self._streams: set[asyncio.Queue[bool]] = set()

    def notify(self) -> None:
        """Something may have changed; every stream re-reads and sends if it did."""
        for queue in self._streams:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(True)

    def close(self) -> None:
        """End every stream (before the server stops, so stopping needs no grace)."""
        for queue in self._streams:
            if queue.full():
                queue.get_nowait()  # a pending "changed" is moot now
            queue.put_nowait(False)

    async def NodeWatchResources(  # noqa: N802 - gRPC method name
        self, request: health_pb.NodeWatchResourcesRequest, context: Any
    ) -> AsyncIterator[health_pb.NodeWatchResourcesResponse]:
        queue: asyncio.Queue[bool] = asyncio.Queue(maxsize=1)
        self._streams.add(queue)
        logger.info("the kubelet watches device health")
        try:
            sent: tuple[DeviceHealthEntry, ...] | None = None
            while True:
                entries = self._snapshot()
                if entries != sent:
                    yield _health_response(entries)
                    sent = entries
                if not await queue.get():
                    return
        finally:
            self._streams.discard(queue)


def _health_response(
    entries: tuple[DeviceHealthEntry, ...],
) -> health_pb.NodeWatchResourcesResponse:
    return health_pb.NodeWatchResourcesResponse(
        devices=[
            health_pb.DeviceHealth(
                device=health_pb.DeviceIdentifier(pool_name=e.pool, device_name=e.device),
                health=health_pb.HEALTHY if e.healthy else health_pb.UNHEALTHY,
                last_updated_time=e.last_updated_s,
            )
            for e in entries
        ]
    )
