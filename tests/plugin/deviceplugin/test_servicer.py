"""The servicer without transport: real protobuf messages, a fake gRPC context."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from plugin._pb import deviceplugin_v1beta1_pb2 as pb
from plugin.api.config import PlacementConfig, PluginConfig
from plugin.api.resources import ENV_NVIDIA_VISIBLE_DEVICES, ENV_UNITS
from plugin.deviceplugin.servicer import DevicePluginServicer
from plugin.gpu.backend import GpuEvent
from plugin.gpu.health_monitor import HealthBoard
from tests.plugin.builders import gpu, table, uuid_for
from tests.plugin.conftest import wait_until


class AbortedError(Exception):
    """What grpc.aio's ``context.abort`` raises."""


class FakeContext:
    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None
        self.details = ""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        raise AbortedError(details)


def make(
    config: PluginConfig | None = None,
) -> tuple[DevicePluginServicer, HealthBoard, asyncio.Event]:
    config = config or PluginConfig(units_per_gpu=10)
    board = HealthBoard()
    stop = asyncio.Event()
    t = table([gpu(0, numa_node=0), gpu(1, numa_node=1)], units_per_gpu=config.units_per_gpu)
    return DevicePluginServicer(table=t, config=config, board=board, stop=stop), board, stop


def allocate_request(*containers: list[str]) -> Any:
    request = pb.AllocateRequest()
    for ids in containers:
        request.container_requests.add(devices_ids=ids)
    return request


async def test_options_offer_preferred_allocation() -> None:
    servicer, _, _ = make()
    options = await servicer.GetDevicePluginOptions(pb.Empty(), FakeContext())
    assert options.get_preferred_allocation_available
    assert not options.pre_start_required


async def test_allocate_answers_every_container() -> None:
    servicer, _, _ = make()
    a = [f"{uuid_for(0)}::{u}" for u in range(5)]
    b = [f"{uuid_for(1)}::{u}" for u in range(10)]
    response = await servicer.Allocate(allocate_request(a, b), FakeContext())
    first, second = response.container_responses
    assert first.envs[ENV_NVIDIA_VISIBLE_DEVICES] == uuid_for(0)
    assert first.envs[ENV_UNITS] == "5"
    assert second.envs[ENV_NVIDIA_VISIBLE_DEVICES] == uuid_for(1)
    assert [m.container_path for m in first.mounts] == ["/var/run/metagpu"]
    assert first.mounts[0].read_only


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(f"{uuid_for(0)}::10", id="unit-beyond-units-per-gpu"),
        pytest.param(f"{uuid_for(7)}::0", id="gpu-not-on-node"),
        pytest.param("nvidia0", id="not-a-meta-device"),
    ],
)
async def test_allocate_rejects_unknown_ids_and_names_them(bad: str) -> None:
    servicer, _, _ = make()
    context = FakeContext()
    good = [f"{uuid_for(0)}::1"]
    with pytest.raises(AbortedError):
        await servicer.Allocate(allocate_request(good, [f"{uuid_for(0)}::2", bad]), context)
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"unknown device: {bad}" in context.details


async def test_allocate_accepts_unhealthy_devices_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    servicer, board, _ = make()
    board.record(GpuEvent(uuid_for(0), "xid", xid=79))
    with caplog.at_level(logging.WARNING):
        response = await servicer.Allocate(allocate_request([f"{uuid_for(0)}::1"]), FakeContext())
    assert response.container_responses[0].envs[ENV_UNITS] == "1"
    assert "unhealthy GPU(s)" in caplog.text


@pytest.mark.parametrize(
    ("allow", "extender", "refused"),
    [
        pytest.param(True, True, False, id="allowed-even-with-the-extender"),
        pytest.param(None, False, False, id="default-without-extender-allows"),
        pytest.param(None, True, True, id="default-with-extender-refuses"),
        pytest.param(False, False, True, id="false-refuses"),
    ],
)
async def test_a_split_fraction_is_allocated_or_refused_as_configured(
    caplog: pytest.LogCaptureFixture, allow: bool | None, extender: bool, refused: bool
) -> None:
    config = PluginConfig(
        units_per_gpu=10,
        allow_split_fraction=allow,
        placement=PlacementConfig(extender=extender),
    )
    servicer, _, _ = make(config)
    whole = [f"{uuid_for(0)}::{u}" for u in range(2, 10)]  # (no ID in two containers)
    split = [f"{uuid_for(0)}::1", f"{uuid_for(1)}::1", f"{uuid_for(1)}::2"]
    context = FakeContext()
    with caplog.at_level(logging.INFO):
        if refused:
            with pytest.raises(AbortedError):
                await servicer.Allocate(allocate_request(whole, split), context)
        else:
            response = await servicer.Allocate(allocate_request(whole, split), context)
            assert len(response.container_responses) == 2
    if refused:
        # the kubelet shows this in the pod's UnexpectedAdmissionError event
        assert context.code == grpc.StatusCode.FAILED_PRECONDITION
        for part in (f"1 on GPU {uuid_for(0)}", f"2 on GPU {uuid_for(1)}", "3 cnvrg.io/metagpu"):
            assert part in context.details
        assert "allocated" not in caplog.text  # nothing half-applied: not even container 1
    else:
        assert any(
            r.levelno == logging.INFO and "splits a fraction across GPUs" in r.getMessage()
            for r in caplog.records
        )


async def test_preferred_allocation_per_container() -> None:
    servicer, _, _ = make()
    request = pb.PreferredAllocationRequest()
    available = [f"{uuid_for(g)}::{u}" for g in (0, 1) for u in range(10)]
    request.container_requests.add(available_deviceIDs=available, allocation_size=5)
    request.container_requests.add(available_deviceIDs=available, allocation_size=15)
    response = await servicer.GetPreferredAllocation(request, FakeContext())
    assert [len(r.deviceIDs) for r in response.container_responses] == [5, 15]


@pytest.mark.parametrize(
    ("available", "size", "expected"),
    [
        pytest.param(
            [f"{uuid_for(0)}::1"], 2, "allocation_size 2 is more than the 1", id="too-big"
        ),
        pytest.param(["GPU-x::1"], 1, "unknown device: GPU-x::1", id="unknown"),
    ],
)
async def test_preferred_allocation_errors_are_invalid_argument(
    available: list[str], size: int, expected: str
) -> None:
    servicer, _, _ = make()
    request = pb.PreferredAllocationRequest()
    request.container_requests.add(available_deviceIDs=available, allocation_size=size)
    context = FakeContext()
    with pytest.raises(AbortedError):
        await servicer.GetPreferredAllocation(request, context)
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in context.details


async def test_pre_start_container_is_a_no_op() -> None:
    servicer, _, _ = make()
    response = await servicer.PreStartContainer(pb.PreStartContainerRequest(), FakeContext())
    assert response == pb.PreStartContainerResponse()


def health_of(response: Any) -> dict[str, set[str]]:
    by_gpu: dict[str, set[str]] = {}
    for device in response.devices:
        by_gpu.setdefault(device.ID.rsplit("::", 1)[0], set()).add(device.health)
    return by_gpu


async def test_list_and_watch_sends_full_lists_to_every_stream_until_stopped() -> None:
    servicer, board, stop = make()
    streams: list[AsyncIterator[Any]] = [
        servicer.ListAndWatch(pb.Empty(), FakeContext()) for _ in range(2)
    ]
    for stream in streams:
        first = await anext(stream)
        assert len(first.devices) == 20
        assert {d.topology.nodes[0].ID for d in first.devices} == {0, 1}
        assert health_of(first) == {uuid_for(0): {"Healthy"}, uuid_for(1): {"Healthy"}}
    board.record(GpuEvent(uuid_for(1), "xid", xid=79))
    for stream in streams:
        second = await asyncio.wait_for(anext(stream), 5)
        assert len(second.devices) == 20
        assert health_of(second) == {uuid_for(0): {"Healthy"}, uuid_for(1): {"Unhealthy"}}
    stop.set()
    for stream in streams:
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(stream), 5)


async def test_list_and_watch_ignores_other_gpus_health_in_content() -> None:
    servicer, board, _ = make()
    board.record(GpuEvent("GPU-of-another-resource", "gpu_lost"))
    stream = servicer.ListAndWatch(pb.Empty(), FakeContext())
    first = await anext(stream)
    assert health_of(first) == {uuid_for(0): {"Healthy"}, uuid_for(1): {"Healthy"}}
    await stream.aclose()  # type: ignore[attr-defined]


def test_listing_marks_every_meta_device_of_a_sick_gpu() -> None:
    config = PluginConfig(units_per_gpu=10)
    infos = [gpu(0, numa_node=0), gpu(1, numa_node=1), gpu(2, numa_node=None)]
    servicer = DevicePluginServicer(
        table=table(infos, units_per_gpu=10),
        config=config,
        board=HealthBoard(),
        stop=asyncio.Event(),
    )
    response = servicer.listing({uuid_for(1), "GPU-not-ours"})
    assert len(response.devices) == 30
    rows: dict[str, set[tuple[str, tuple[int, ...]]]] = {}
    for device in response.devices:
        numa = tuple(node.ID for node in device.topology.nodes)
        rows.setdefault(device.ID.rsplit("::", 1)[0], set()).add((device.health, numa))
    assert rows == {
        uuid_for(0): {("Healthy", (0,))},
        uuid_for(1): {("Unhealthy", (1,))},
        uuid_for(2): {("Healthy", ())},  # unknown NUMA node: no topology
    }


class CountingBoard(HealthBoard):
    """Records every version a stream starts waiting on, so a test can tell when
    a stream has looked at a change without re-sending."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[int] = []

    async def wait_changed(self, version: int) -> int:
        self.waits.append(version)
        return await super().wait_changed(version)


async def test_list_and_watch_resends_only_when_its_own_gpus_change() -> None:
    board = CountingBoard()
    servicer = DevicePluginServicer(
        table=table([gpu(0), gpu(1)], units_per_gpu=10),
        config=PluginConfig(units_per_gpu=10),
        board=board,
        stop=asyncio.Event(),
    )
    stream = servicer.ListAndWatch(pb.Empty(), FakeContext())
    await anext(stream)
    following = asyncio.ensure_future(anext(stream))
    try:
        board.record(GpuEvent("GPU-of-another-resource", "gpu_lost"))
        await wait_until(
            lambda: following.done() or board.waits[-1:] == [board.version],
            what="the stream to look at the change",
        )
        assert not following.done(), "re-sent an identical list for another resource's GPU"
        board.record(GpuEvent(uuid_for(1), "xid", xid=79))
        second = await asyncio.wait_for(following, 5)
        assert health_of(second) == {uuid_for(0): {"Healthy"}, uuid_for(1): {"Unhealthy"}}
    finally:
        following.cancel()
        await stream.aclose()  # type: ignore[attr-defined]
