"""The ``v1beta1.DevicePlugin`` gRPC service for one resource (adapter).

Translation only, as NVIDIA's ``internal/plugin/server.go``: protobuf in →
core types (:mod:`plugin.placement.devices`, :mod:`plugin.placement.allocation`,
:mod:`plugin.deviceplugin.container_spec`) → protobuf out, and domain errors → gRPC codes
(``INVALID_ARGUMENT`` with the offending ID in the message). The kubelet
shows that message in the pod's ``UnexpectedAdmissionError`` event, so it
must say what was wrong.

``GetPreferredAllocation`` answers with the scheduler extender's assignment
when the :class:`~plugin.deviceplugin.assignments.AssignmentBook` has one that
fits the request, else with the placement policy. ``Allocate`` fails closed
(``FAILED_PRECONDITION``, nothing allocated) when a container would get a
fraction split over GPUs and :attr:`PluginConfig.refuses_split_fraction`.

Unhealthy meta-devices in ``Allocate`` are accepted with a warning, as NVIDIA
does: the kubelet never picks an unhealthy device for a new container, so
this only happens when a GPU failed between the kubelet's choice and the call;
failing admission then would only turn a GPU error the container can report
into a pod that never starts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, Final

import grpc

from plugin._pb import deviceplugin_v1beta1_pb2 as pb
from plugin.api.config import PluginConfig
from plugin.api.resources import DeviceId
from plugin.deviceplugin.assignments import AssignmentBook, Match
from plugin.deviceplugin.container_spec import build_container_spec
from plugin.gpu.health_monitor import HealthBoard
from plugin.placement.allocation import AssignedCounts, preferred_allocation
from plugin.placement.devices import HEALTHY, UNHEALTHY, DeviceError, DeviceTable, MetaDevice
from plugin.placement.units import is_fraction_split

# The name it had before plugin/ was split by concern: log lines (text and JSON
# show the logger) and any logging config that names it stay as they were.
logger = logging.getLogger("plugin.servicer")

API_VERSION: Final = "v1beta1"


def plugin_options() -> Any:
    """The options sent in ``RegisterRequest`` and returned by ``GetDevicePluginOptions``:
    one function so the two can never disagree."""
    return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


class DevicePluginServicer:
    """Serves one resource's :class:`DeviceTable`; health comes from the node's board."""

    def __init__(
        self,
        *,
        table: DeviceTable,
        config: PluginConfig,
        board: HealthBoard,
        stop: asyncio.Event,
        book: AssignmentBook | None = None,
    ) -> None:
        self._table = table
        self._book = book
        self._gpu_ids = [str(g.device_id) for g in table.gpus]
        self._config = config
        self._board = board
        self._stop = stop
        self._uuids = table.uuids
        units = table.units_per_gpu
        # table.devices is ordered by GPU, then unit: GPU ``pos`` owns one slice.
        self._per_gpu = [
            (
                gpu.uuid,
                [_device(d, HEALTHY) for d in table.devices[pos * units : (pos + 1) * units]],
                [_device(d, UNHEALTHY) for d in table.devices[pos * units : (pos + 1) * units]],
            )
            for pos, gpu in enumerate(table.gpus)
        ]
        self._listing_cache: dict[frozenset[str], Any] = {}

    @property
    def table(self) -> DeviceTable:
        return self._table

    # ------------------------------------------------------------ the RPCs
    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:  # noqa: N802
        return plugin_options()

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        """The complete list now, then again whenever a GPU of this resource
        changes health, until stopped."""
        logger.info("kubelet opened ListAndWatch", extra={"resource": self._table.resource})
        stopped = asyncio.create_task(self._stop.wait(), name="list-and-watch-stop")
        sent: frozenset[str] | None = None
        try:
            while not self._stop.is_set():
                snapshot = self._board.snapshot()
                sick = frozenset(snapshot.unhealthy) & self._uuids
                if sick != sent:
                    # A change on another resource's GPUs leaves this list as it
                    # was: re-sending it (1 MiB at 16 GPUs x 1000) would be waste.
                    yield self.listing(sick)
                    sent = sick
                changed = asyncio.create_task(
                    self._board.wait_changed(snapshot.version), name="list-and-watch-change"
                )
                try:
                    await asyncio.wait({changed, stopped}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
        finally:
            stopped.cancel()
        logger.debug("ListAndWatch ends: plugin stopping", extra={"resource": self._table.resource})

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:  # noqa: N802
        response = pb.PreferredAllocationResponse()
        for creq in request.container_requests:
            size = creq.allocation_size
            matched: list[Match] = []
            try:
                placement = preferred_allocation(
                    creq.available_deviceIDs,
                    creq.must_include_deviceIDs,
                    size,
                    table=self._table,
                    policy=self._config.allocation_policy,
                    assigned=self._assignment_hook(size, matched),
                )
            except DeviceError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                raise  # unreachable: abort raises
            if self._book is not None and matched and placement.assigned:
                self._book.answered(placement.ids, matched[0].container)
                logger.info(
                    "preferred allocation of %d unit(s) follows the assignment of %s: %s",
                    size,
                    matched[0].container,
                    ", ".join(f"{gpu}×{n}" for gpu, n in placement.units_by_gpu.items()),
                    extra={"resource": self._table.resource},
                )
            self._note_split(
                placement.units_by_gpu,
                split=placement.fraction_split,
                stage="preferred allocation",
            )
            response.container_responses.add(deviceIDs=placement.ids)
        return response

    async def Allocate(self, request: Any, context: Any) -> Any:  # noqa: N802
        # Validate every container before answering any: nothing is half-applied.
        containers: list[list[MetaDevice]] = []
        owner: dict[str, int] = {}
        for position, creq in enumerate(request.container_requests):
            problem = _request_problem(position, creq.devices_ids, owner)
            if problem is not None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
            try:
                containers.append(self._table.lookup_all(creq.devices_ids))
            except DeviceError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                raise  # unreachable: abort raises
        sick = self._board.snapshot().unhealthy
        specs = [build_container_spec(devices, config=self._config) for devices in containers]
        if self._config.refuses_split_fraction:
            for spec in specs:
                units_by_gpu = {s.gpu.device_id: s.units for s in spec.shares}
                if is_fraction_split(
                    units_by_gpu.values(), units_per_gpu=self._table.units_per_gpu
                ):
                    await context.abort(
                        grpc.StatusCode.FAILED_PRECONDITION, self._split_refusal(units_by_gpu)
                    )
        response = pb.AllocateResponse()
        for creq, devices, spec in zip(request.container_requests, containers, specs, strict=True):
            units_by_gpu = {s.gpu.device_id: s.units for s in spec.shares}
            if self._book is not None:
                self._book.allocated(creq.devices_ids, {str(g): n for g, n in units_by_gpu.items()})
            bad = sorted(s.gpu.uuid for s in spec.shares if s.gpu.uuid in sick)
            if bad:
                logger.warning(
                    "allocating meta-devices of unhealthy GPU(s) %s: the kubelet chose them "
                    "before the GPU failed",
                    bad,
                    extra={"resource": self._table.resource},
                )
            self._note_split(
                units_by_gpu,
                split=is_fraction_split(
                    units_by_gpu.values(), units_per_gpu=self._table.units_per_gpu
                ),
                stage="allocation",
            )
            logger.info(
                "allocated %d unit(s) on %s",
                len(devices),
                ", ".join(f"{gpu}×{n}" for gpu, n in units_by_gpu.items()),
                extra={"resource": self._table.resource},
            )
            response.container_responses.append(
                pb.ContainerAllocateResponse(
                    envs=spec.envs,
                    mounts=[
                        pb.Mount(
                            container_path=m.container_path,
                            host_path=m.host_path,
                            read_only=m.read_only,
                        )
                        for m in spec.mounts
                    ],
                )
            )
        return response

    async def PreStartContainer(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.PreStartContainerResponse()

    # ------------------------------------------------------------ helpers
    def listing(self, unhealthy: Iterable[str]) -> Any:
        """The complete ``ListAndWatchResponse`` for a health state (cached per state:
        building 16,000 messages costs tens of milliseconds, a dict hit does not).

        Every meta-device of a GPU in ``unhealthy`` is Unhealthy: the kubelet must
        not place a new share on a GPU that another share already found broken."""
        sick = frozenset(unhealthy) & self._uuids
        cached = self._listing_cache.get(sick)
        if cached is None:
            cached = pb.ListAndWatchResponse()
            for uuid, healthy, unhealthy_devices in self._per_gpu:
                cached.devices.extend(unhealthy_devices if uuid in sick else healthy)
            if len(self._listing_cache) > 64:
                self._listing_cache.clear()
            self._listing_cache[sick] = cached
        return cached

    def _assignment_hook(self, size: int, matched: list[Match]) -> AssignedCounts | None:
        """The ``assigned`` hook of :func:`preferred_allocation`: the book's match for a
        request of ``size`` units (appended to ``matched``), or None without a book."""
        book = self._book
        if book is None:
            return None
        gpu_ids = self._gpu_ids

        def assigned(free: Sequence[int], held: Sequence[int]) -> Sequence[int] | None:
            match = book.match(size, gpu_ids=gpu_ids, free=free, held=held)
            if match is None:
                return None
            matched.append(match)
            return match.take

        return assigned

    def _split_refusal(self, units_by_gpu: Mapping[DeviceId, int]) -> str:
        """The ``Allocate`` error the kubelet puts in the pod's UnexpectedAdmissionError."""
        units = self._table.units_per_gpu
        total = sum(units_by_gpu.values())
        where = " + ".join(f"{n} on GPU {gpu}" for gpu, n in units_by_gpu.items())
        why = (
            "the scheduler extender's view of this node was stale"
            if self._config.placement.extender
            else "no single GPU had enough free units (the node is fragmented)"
        )
        message = (
            f"refusing to split a fraction across GPUs: {total} {self._table.resource} "
            f"units ({total / units:g} GPU) would be {where}, not one GPU; {why}. The pod "
            "is refused so that it is retried instead of running on GPU fragments "
            "(allow_split_fraction: true allows such splits)"
        )
        logger.warning(message, extra={"resource": self._table.resource})
        return message

    def _note_split(self, units_by_gpu: Mapping[DeviceId, int], *, split: bool, stage: str) -> None:
        if not split:
            return
        where = ", ".join(f"{gpu}×{n}" for gpu, n in units_by_gpu.items())
        if not self._config.refuses_split_fraction:
            logger.info("%s splits a fraction across GPUs: %s", stage, where)
        else:
            logger.warning(
                "%s splits a fraction across GPUs (%s): no single GPU has enough free units; "
                "the node is fragmented (Allocate will refuse it: allow_split_fraction)",
                stage,
                where,
                extra={"resource": self._table.resource},
            )


def _device(device: MetaDevice, health: str) -> Any:
    message = pb.Device(ID=device.id, health=health)
    if device.gpu.numa_node is not None:
        message.topology.nodes.add(ID=device.gpu.numa_node)
    return message


def _request_problem(position: int, device_ids: Any, owner: dict[str, int]) -> str | None:
    """Why one container request of an Allocate cannot be served, or None.

    The kubelet never sends a container request without devices, nor one
    device to two containers of one call; a client that does is confused or
    hostile, and an answer would hand one GPU share to two containers. So it is
    refused, naming the container requests by position (the API has no
    container names). ``owner`` collects which request took each ID.
    """
    if not device_ids:
        return (
            f"container request #{position} names no devices; every container request must "
            "name at least one meta-device"
        )
    for device_id in device_ids:
        first = owner.setdefault(device_id, position)
        if first != position:
            shown = device_id if len(device_id) <= 80 else device_id[:80] + "…"
            return (
                f"device {shown} is requested by container requests #{first} and #{position}; "
                "a meta-device can be allocated to one container only"
            )
    return None
