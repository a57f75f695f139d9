"""GPU health you can trust (issue 15), as the kubelet sees it: real gRPC over unix sockets.

Each fault is played by the simulated backend the way NVML plays it, or by
the NVML backend over the fake driver (:mod:`tests.plugin.gpu.fake_pynvml`):
a lost GPU, silent loss, damaged memory after an XID, events of a GPU that
can no longer say its UUID.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import grpc
import pytest

import plugin.gpu.nvml
from plugin.api.resources import ENV_NVIDIA_VISIBLE_DEVICES
from plugin.gpu.backend import GpuEvent
from plugin.gpu.health_file import HEALTH_FILE_NAME, read_board
from plugin.gpu.nvml import NvmlBackend
from tests.plugin.builders import gpus, gpus_file_spec, uuid_for, write_yaml
from tests.plugin.conftest import PluginUnderTest, kubelet_and_plugin, wait_until
from tests.plugin.deviceplugin.test_kubelet_harness import RESOURCE, gpu_is, health_by_gpu
from tests.plugin.gpu.fake_pynvml import FakeGpu, FakePynvml

A = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
B = "GPU-bbbbbbbb-0000-4000-8000-000000000000"
C = "GPU-cccccccc-0000-4000-8000-000000000000"

QUIET = {"event_timeout_s": 0.1, "recovery_s": 3600, "liveness_interval_s": 0}
"""No liveness polls and no recovery unless a test asks for them."""


def ids(devices: list[Any]) -> set[str]:
    return {d.ID for d in devices}


def record(plugin_under_test: PluginUnderTest, uuid: str) -> Any:
    board = plugin_under_test.supervisor.board
    assert board is not None
    return board.record_of(uuid)


def nvml_driver(monkeypatch: pytest.MonkeyPatch, *fakes: FakeGpu) -> FakePynvml:
    driver = FakePynvml(list(fakes))
    monkeypatch.setattr(plugin.gpu.nvml, "pynvml", driver)
    return driver


def over_nvml(health: dict[str, Any]) -> dict[str, Any]:
    return {
        "backend_factory": lambda c: NvmlBackend(),
        "config": {"gpus_file": None, "health": health},
    }


# ------------------------------------------------------------------ item 1: identity
async def test_a_gpu_lost_at_a_kubelet_restart_keeps_its_device_ids(short_tmp_path: Path) -> None:
    async with kubelet_and_plugin(short_tmp_path, config={"health": QUIET}) as (kubelet, plugin):
        before = ids((await kubelet.wait_registered(RESOURCE)).devices)
        plugin.gpus.update(uuid_for(1), lost=True)  # NVML: "GPU is lost" for everything
        for restart in (2, 3):  # and again: it stays itself, not healed by rediscovery
            await kubelet.restart()
            conn = await kubelet.wait_registered(RESOURCE, count=restart)
            assert ids(conn.devices) == before
            assert not any(i.startswith("GPU-unknown") for i in ids(conn.devices))
            assert health_by_gpu(conn.devices)[uuid_for(1)] == {"Unhealthy"}
            assert health_by_gpu(conn.devices)[uuid_for(0)] == {"Healthy"}
        lost = record(plugin, uuid_for(1))
        assert (lost.state, lost.check) == ("Unhealthy", "discovery")
        assert "GPU is lost" in lost.reason
        # Allocate names the real GPU, never a made-up one.
        response = await conn.client.allocate([[f"{uuid_for(1)}::0"]])
        assert response.container_responses[0].envs[ENV_NVIDIA_VISIBLE_DEVICES] == uuid_for(1)


async def test_a_gpu_lost_at_a_sighup_keeps_its_device_ids(short_tmp_path: Path) -> None:
    async with kubelet_and_plugin(short_tmp_path, config={"health": QUIET}) as (kubelet, plugin):
        before = ids((await kubelet.wait_registered(RESOURCE)).devices)
        spec = gpus_file_spec(gpus(4, numa_nodes=2))
        spec["gpus"][2]["lost"] = True
        write_yaml(plugin.gpus_file, spec)
        plugin.supervisor.request_reload()  # a new backend, a new discovery
        conn = await kubelet.wait_registered(RESOURCE, count=2)
        assert ids(conn.devices) == before
        assert health_by_gpu(conn.devices)[uuid_for(2)] == {"Unhealthy"}
        assert "GPU is lost" in record(plugin, uuid_for(2)).reason
        response = await conn.client.allocate([[f"{uuid_for(2)}::7"]])
        assert response.container_responses[0].envs[ENV_NVIDIA_VISIBLE_DEVICES] == uuid_for(2)


async def test_a_gpu_never_seen_is_not_advertised_under_a_made_up_name(
    short_tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = gpus_file_spec(gpus(2))
    spec["gpus"][1]["lost"] = True  # lost before the plugin ever saw it
    with caplog.at_level(logging.ERROR):
        async with kubelet_and_plugin(short_tmp_path, spec=spec, config={"health": QUIET}) as (
            kubelet,
            _,
        ):
            conn = await kubelet.wait_registered(RESOURCE)
            assert set(health_by_gpu(conn.devices)) == {uuid_for(0)}
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await conn.client.allocate([["GPU-unknown-index-1::0"]])
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not advertising it under a made-up name" in caplog.text


async def test_a_lost_gpu_keeps_its_device_ids_over_nvml(
    short_tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = nvml_driver(monkeypatch, FakeGpu(A), FakeGpu(B, minor=1, bus_id="00000000:86:00.0"))
    async with kubelet_and_plugin(short_tmp_path, **over_nvml(QUIET)) as (kubelet, plugin):
        before = ids((await kubelet.wait_registered(RESOURCE)).devices)
        driver.lose(B)
        await kubelet.restart()
        conn = await kubelet.wait_registered(RESOURCE, count=2)
        assert ids(conn.devices) == before
        assert health_by_gpu(conn.devices) == {A: {"Healthy"}, B: {"Unhealthy"}}
        lost = record(plugin, B)
        assert "could not get a handle of GPU 1: GPU is lost" in lost.reason
        board = plugin.supervisor.board
        assert board is not None
        assert (board.gpus[B].pci_bus_id, board.gpus[B].minor_number) == ("00000000:86:00.0", 1)


# ------------------------------------------------------------------ item 2: liveness
async def test_a_gpu_that_falls_off_silently_is_withdrawn_by_the_liveness_poll(
    short_tmp_path: Path,
) -> None:
    health = QUIET | {"liveness_interval_s": 0.1}
    async with kubelet_and_plugin(short_tmp_path, config={"health": health}) as (kubelet, plugin):
        await kubelet.wait_registered(RESOURCE)
        plugin.gpus.update(uuid_for(2), lost=True)  # no XID, no event at all
        devices = await kubelet.wait_devices(RESOURCE, gpu_is(uuid_for(2), "Unhealthy"))
        assert health_by_gpu(devices)[uuid_for(0)] == {"Healthy"}
        lost = record(plugin, uuid_for(2))
        assert lost.check == "lost"
        assert "liveness check" in lost.reason
        assert "reset the GPU" in lost.reason
        board = plugin.supervisor.board
        assert board is not None
        counts = board.liveness()
        assert counts[uuid_for(2)].failed == 1  # withdrawn: no more polls, recovery probes it
        assert counts[uuid_for(0)].ok >= 1
        # ... and published for the agent's metrics.
        published = read_board(plugin.directory / HEALTH_FILE_NAME)
        assert published is not None
        by_uuid = published.by_uuid()
        await wait_until(
            lambda: (
                (p := read_board(plugin.directory / HEALTH_FILE_NAME)) is not None
                and p.by_uuid()[uuid_for(2)].liveness_failed == 1
            ),
            what="the failed poll published",
        )
        assert by_uuid[uuid_for(0)].health.state == "Healthy"


# ------------------------------------------------------------ item 3: recovery checks
@pytest.mark.parametrize(
    ("fault", "clear", "reason"),
    [
        pytest.param(
            {"remapped_rows": {"pending": True}},
            {"remapped_rows": {}},
            "row remap pending: reset the GPU",
            id="row-remap-pending",
        ),
        pytest.param(
            {"remapped_rows": {"failure": True, "uncorrectable": 3}},
            {"remapped_rows": {}},
            "row remap failure",
            id="row-remap-failure",
        ),
        pytest.param(
            {"volatile_uncorrected_ecc": 2},
            {"volatile_uncorrected_ecc": 0},
            "2 volatile uncorrectable ECC error(s) since the driver loaded: reset the GPU",
            id="volatile-ecc",
        ),
        pytest.param(
            {"retired_pages_pending": True},
            {"retired_pages_pending": False},
            "retired pages pending: reset the GPU",
            id="retired-pages",
        ),
    ],
)
async def test_recovery_requires_the_memory_checks_to_pass(
    short_tmp_path: Path, fault: dict[str, Any], clear: dict[str, Any], reason: str
) -> None:
    health = QUIET | {"recovery_s": 0.3}
    async with kubelet_and_plugin(short_tmp_path, config={"health": health}) as (kubelet, plugin):
        await kubelet.wait_registered(RESOURCE)
        plugin.gpus.update(uuid_for(0), **fault)
        plugin.gpus.emit(GpuEvent(uuid_for(0), "ecc_double_bit", xid=48))
        await kubelet.wait_devices(RESOURCE, gpu_is(uuid_for(0), "Unhealthy"))
        await wait_until(
            lambda: record(plugin, uuid_for(0)).reason.startswith(reason),
            timeout_s=10,
            what="the recovery check's reason",
        )
        sick = record(plugin, uuid_for(0))
        assert sick.reason.endswith("(after double-bit ECC error (XID 48))")
        # It answered the probe, yet it is still out of service.
        assert health_by_gpu(kubelet.plugins[RESOURCE].devices)[uuid_for(0)] == {"Unhealthy"}
        plugin.gpus.update(uuid_for(0), **clear)  # the operator reset the GPU
        await kubelet.wait_devices(RESOURCE, gpu_is(uuid_for(0), "Healthy"), timeout_s=10)


async def test_a_check_turned_off_or_unsupported_does_not_hold_recovery_back(
    short_tmp_path: Path,
) -> None:
    health = QUIET | {"recovery_s": 0.3, "check_row_remap": False}
    async with kubelet_and_plugin(short_tmp_path, config={"health": health}) as (kubelet, plugin):
        await kubelet.wait_registered(RESOURCE)
        plugin.gpus.update(uuid_for(0), remapped_rows={"pending": True})  # check is off
        plugin.gpus.update(
            uuid_for(1),
            volatile_uncorrected_ecc=None,  # no ECC on this GPU: NOT_SUPPORTED
            retired_pages_pending=None,
            remapped_rows=None,
        )
        plugin.gpus.emit(GpuEvent(uuid_for(0), "xid", xid=79))
        plugin.gpus.emit(GpuEvent(uuid_for(1), "xid", xid=79))
        await kubelet.wait_devices(RESOURCE, gpu_is(uuid_for(1), "Unhealthy"))
        await kubelet.wait_devices(
            RESOURCE,
            lambda d: gpu_is(uuid_for(0), "Healthy")(d) and gpu_is(uuid_for(1), "Healthy")(d),
            timeout_s=10,
        )


async def test_recovery_checks_over_nvml(
    short_tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = nvml_driver(monkeypatch, FakeGpu(A), FakeGpu(B, minor=1, bus_id="00000000:86:00.0"))
    health = QUIET | {"recovery_s": 0.3}
    async with kubelet_and_plugin(short_tmp_path, **over_nvml(health)) as (kubelet, plugin):
        await kubelet.wait_registered(RESOURCE)
        await wait_until(lambda: set(driver.registered) == {A, B}, what="event registration")
        driver.gpus[0].remapped_rows = (0, 1, 1, 0)  # (corrRows, uncRows, isPending, failure)
        driver.double_bit_ecc(A)
        await kubelet.wait_devices(RESOURCE, gpu_is(A, "Unhealthy"))
        await wait_until(
            lambda: record(plugin, A).reason.startswith("row remap pending: reset the GPU"),
            timeout_s=10,
            what="row remap pending",
        )
        assert record(plugin, A).check == "row-remap"
        driver.gpus[0].remapped_rows = (0, 1, 0, 0)  # reset: the remap took effect
        await kubelet.wait_devices(RESOURCE, gpu_is(A, "Healthy"), timeout_s=10)


# ----------------------------------------------------------- item 4: events to their GPU
async def test_an_event_of_a_gpu_that_cannot_say_its_uuid_blames_only_that_gpu(
    short_tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = nvml_driver(
        monkeypatch,
        FakeGpu(A),
        FakeGpu(B, minor=1, bus_id="00000000:86:00.0"),
        FakeGpu(C, minor=2, bus_id="00000000:AF:00.0"),
    )
    async with kubelet_and_plugin(short_tmp_path, **over_nvml(QUIET)) as (kubelet, _):
        await kubelet.wait_registered(RESOURCE)
        await wait_until(lambda: set(driver.registered) == {A, B, C}, what="event registration")
        driver.xid(A, 79)
        driver.lose(A)  # fell off the bus: nvmlDeviceGetUUID(handle) fails now
        driver.xid(C, 79)  # applied after whatever A's event caused
        devices = await kubelet.wait_devices(RESOURCE, gpu_is(C, "Unhealthy"))
        assert health_by_gpu(devices) == {A: {"Unhealthy"}, B: {"Healthy"}, C: {"Unhealthy"}}


async def test_an_event_with_a_truly_unknown_handle_suspects_every_gpu(
    short_tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = nvml_driver(monkeypatch, FakeGpu(A), FakeGpu(B, minor=1, bus_id="00000000:86:00.0"))
    async with kubelet_and_plugin(short_tmp_path, **over_nvml(QUIET)) as (kubelet, plugin):
        await kubelet.wait_registered(RESOURCE)
        await wait_until(lambda: set(driver.registered) == {A, B}, what="event registration")
        driver.unknown_handle_xid(79)
        await kubelet.wait_devices(
            RESOURCE, lambda d: health_by_gpu(d) == {A: {"Unhealthy"}, B: {"Unhealthy"}}
        )
        assert "cannot identify" in record(plugin, B).reason


async def test_the_simulated_backend_plays_an_unknown_handle_like_nvml(
    short_tmp_path: Path,
) -> None:
    async with kubelet_and_plugin(short_tmp_path, config={"health": QUIET}) as (kubelet, plugin):
        await kubelet.wait_registered(RESOURCE)
        plugin.gpus.emit_unidentified()
        devices = await kubelet.wait_devices(
            RESOURCE, lambda d: all(h == {"Unhealthy"} for h in health_by_gpu(d).values())
        )
        assert len(devices) == 400


# ------------------------------------------------------- item 5: the published record
async def test_the_board_file_is_what_list_and_watch_advertises(short_tmp_path: Path) -> None:
    async with kubelet_and_plugin(short_tmp_path, config={"health": QUIET}) as (kubelet, plugin):
        await kubelet.wait_registered(RESOURCE)
        plugin.gpus.emit(GpuEvent(uuid_for(3), "xid", xid=79))
        await kubelet.wait_devices(RESOURCE, gpu_is(uuid_for(3), "Unhealthy"))
        path = plugin.directory / HEALTH_FILE_NAME
        await wait_until(
            lambda: (
                (b := read_board(path)) is not None
                and b.by_uuid()[uuid_for(3)].health.state == "Unhealthy"
            ),
            what="the board file",
        )
        document = json.loads(path.read_text())
        assert document["kind"] == "GpuHealthBoard"
        item = next(g for g in document["gpus"] if g["uuid"] == uuid_for(3))
        assert (item["state"], item["check"], item["reason"]) == ("Unhealthy", "xid", "XID 79")
        assert item["since"] > 0
        states = {g["uuid"]: g["state"] for g in document["gpus"]}
        advertised = {
            u: h.pop() for u, h in health_by_gpu(kubelet.plugins[RESOURCE].devices).items()
        }
        assert states == advertised
