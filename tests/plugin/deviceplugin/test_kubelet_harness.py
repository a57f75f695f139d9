"""The plugin as the kubelet sees it: real gRPC over unix sockets, in-process supervisor.

The kubelet side is :mod:`metagpu.kubelet_sim`; GPUs are simulated (or NVML over
the fake driver). Every wait is on a condition with a timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

import plugin.gpu.nvml
from metagpu.kubelet_sim import KubeletSim, KubeletSimError, PluginClient
from plugin.api.config import PluginConfig, ResourceConfig
from plugin.api.resources import ENV_MEMORY_LIMIT_MB, ENV_NVIDIA_VISIBLE_DEVICES, ENV_UNITS
from plugin.api.settings import ConfigError
from plugin.deviceplugin.server import PluginServer
from plugin.deviceplugin.supervisor import Supervisor
from plugin.gpu.backend import GpuBackend, GpuBackendError, GpuEvent
from plugin.gpu.nvml import NvmlBackend
from plugin.gpu.simulated import SimulatedGpus
from tests.plugin.builders import gpus, gpus_file_spec, uuid_for, write_yaml
from tests.plugin.conftest import FAST, kubelet_and_plugin, running_plugin, wait_until
from tests.plugin.gpu.fake_pynvml import FakeGpu, FakePynvml

RESOURCE = "cnvrg.io/metagpu"
SOCKET = "metagpu-metagpu.sock"


def health_by_gpu(devices: list[Any]) -> dict[str, set[str]]:
    result: dict[str, set[str]] = {}
    for d in devices:
        result.setdefault(d.ID.rsplit("::", 1)[0], set()).add(d.health)
    return result


def gpu_is(uuid: str, health: str) -> Any:
    return lambda devices: health_by_gpu(devices).get(uuid) == {health}


async def test_serves_before_registering_and_sends_identical_options(short_tmp_path: Path) -> None:
    async with kubelet_and_plugin(short_tmp_path) as (kubelet, plugin):
        conn = await kubelet.wait_registered(RESOURCE)
        (registration,) = kubelet.registrations
        request = registration.request
        assert request.version == "v1beta1"
        assert request.endpoint == SOCKET  # the basename, not a path
        assert request.resource_name == RESOURCE
        # The kubelet dialled the endpoint during Register and asked for options.
        assert kubelet.rejections == []
        assert conn.registered_options == conn.served_options
        assert conn.served_options.get_preferred_allocation_available
        assert not conn.served_options.pre_start_required
        assert (plugin.directory / SOCKET).is_socket()


async def test_the_harness_refuses_a_plugin_that_registers_before_serving(
    short_tmp_path: Path,
) -> None:
    """The serve-before-register check can fail: the kubelet dials back during Register."""
    from plugin.deviceplugin.servicer import DevicePluginServicer
    from plugin.gpu.health_monitor import HealthBoard
    from plugin.placement.devices import DeviceTable

    async with KubeletSim(short_tmp_path, dial_timeout_s=0.3) as kubelet:
        stop = asyncio.Event()
        table = DeviceTable(RESOURCE, gpus(1), units_per_gpu=2, id_strategy="uuid")  # type: ignore[arg-type]
        servicer = DevicePluginServicer(
            table=table, config=PluginConfig(), board=HealthBoard(), stop=stop
        )
        server = PluginServer(
            servicer, resource=RESOURCE, socket_path=short_tmp_path / SOCKET, stop=stop
        )
        with pytest.raises(Exception, match="failed to dial device plugin"):
            await server.register(kubelet.socket_path, timeout_s=5)
        assert kubelet.registrations == []


async def test_full_list_with_numa_topology(short_tmp_path: Path) -> None:
    async with kubelet_and_plugin(short_tmp_path) as (kubelet, _):
        conn = await kubelet.wait_registered(RESOURCE)
        assert len(conn.devices) == 400
        assert len({d.ID for d in conn.devices}) == 400
        assert all(d.health == "Healthy" for d in conn.devices)
        numa = {d.ID.rsplit("::", 1)[0]: d.topology.nodes[0].ID for d in conn.devices}
        assert numa == {uuid_for(0): 0, uuid_for(1): 0, uuid_for(2): 1, uuid_for(3): 1}
        assert all(len(d.ID) <= 63 for d in conn.devices)


async def test_health_flip_and_recovery(short_tmp_path: Path) -> None:
    config = {"health": {"event_timeout_s": 0.1, "recovery_s": 0.5}}
    async with kubelet_and_plugin(short_tmp_path, config=config) as (kubelet, plugin):
        conn = await kubelet.wait_registered(RESOURCE)
        # Ignored XIDs first: events are applied in order, so when the critical one
        # shows, the ignored ones have been judged already.
        plugin.gpus.emit(GpuEvent(uuid_for(0), "xid", xid=13))
        plugin.gpus.emit(GpuEvent(uuid_for(0), "xid", xid=43))
        plugin.gpus.emit(GpuEvent(uuid_for(2), "xid", xid=79))
        devices = await kubelet.wait_devices(RESOURCE, gpu_is(uuid_for(2), "Unhealthy"))
        assert health_by_gpu(devices) == {
            uuid_for(0): {"Healthy"},
            uuid_for(1): {"Healthy"},
            uuid_for(2): {"Unhealthy"},
            uuid_for(3): {"Healthy"},
        }
        assert len(devices) == 400  # the complete list, not a delta
        assert kubelet.allocatable(RESOURCE) == 300
        updates = conn.updates
        await kubelet.wait_devices(RESOURCE, gpu_is(uuid_for(2), "Healthy"), timeout_s=10)
        assert conn.updates > updates


async def test_recovery_waits_for_a_gpu_that_answers(
    short_tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = {"health": {"event_timeout_s": 0.1, "recovery_s": 0.3}}
    async with kubelet_and_plugin(short_tmp_path, config=config) as (kubelet, plugin):
        await kubelet.wait_registered(RESOURCE)
        plugin.gpus.update(uuid_for(1), fail="usage")  # NVML calls on it fail, like a lost GPU
        plugin.gpus.emit(GpuEvent(uuid_for(1), "gpu_lost"))
        await kubelet.wait_devices(RESOURCE, gpu_is(uuid_for(1), "Unhealthy"))
        with caplog.at_level(logging.WARNING):
            await wait_until(
                lambda: "still not answering" in caplog.text, timeout_s=10, what="a failed probe"
            )
        assert health_by_gpu(kubelet.plugins[RESOURCE].devices)[uuid_for(1)] == {"Unhealthy"}
        plugin.gpus.update(uuid_for(1), fail=None)
        await kubelet.wait_devices(RESOURCE, gpu_is(uuid_for(1), "Healthy"), timeout_s=10)


async def test_discovery_failure_is_advertised_unhealthy(short_tmp_path: Path) -> None:
    spec = gpus_file_spec(gpus(2))
    spec["gpus"][1]["fail"] = "discovery"
    async with kubelet_and_plugin(short_tmp_path, spec=spec) as (kubelet, _):
        conn = await kubelet.wait_registered(RESOURCE)
        assert health_by_gpu(conn.devices) == {uuid_for(0): {"Healthy"}, uuid_for(1): {"Unhealthy"}}


async def test_every_stream_gets_every_change(short_tmp_path: Path) -> None:
    async with kubelet_and_plugin(short_tmp_path) as (kubelet, plugin):
        await kubelet.wait_registered(RESOURCE)
        client = PluginClient(plugin.directory / SOCKET)
        try:
            stream = client.list_and_watch()
            first = await anext(stream)
            assert len(first.devices) == 400
            plugin.gpus.emit(GpuEvent(uuid_for(3), "ecc_double_bit", xid=48))
            second = await asyncio.wait_for(anext(stream), 5)
            assert health_by_gpu(list(second.devices))[uuid_for(3)] == {"Unhealthy"}
            await kubelet.wait_devices(RESOURCE, gpu_is(uuid_for(3), "Unhealthy"))
            await stream.aclose()  # type: ignore[attr-defined]
        finally:
            await client.close()


async def test_kubelet_restart_reregisters_within_two_seconds(short_tmp_path: Path) -> None:
    async with kubelet_and_plugin(short_tmp_path) as (kubelet, plugin):
        await kubelet.wait_registered(RESOURCE)
        plugin.gpus.emit(GpuEvent(uuid_for(1), "xid", xid=79))
        await kubelet.wait_devices(RESOURCE, gpu_is(uuid_for(1), "Unhealthy"))
        old = kubelet.plugins[RESOURCE]
        await kubelet.restart()  # deletes every socket, re-creates kubelet.sock
        restarted_at = time.monotonic()
        assert not (plugin.directory / SOCKET).exists()
        conn = await kubelet.wait_registered(RESOURCE, count=2, timeout_s=5)
        elapsed = kubelet.registrations[-1].at - restarted_at
        assert elapsed < 2.0, f"re-registered after {elapsed:.2f}s"
        assert conn is not old
        assert len(conn.devices) == 400
        # Health survives the restart: the GPU did not get better by itself.
        assert health_by_gpu(conn.devices)[uuid_for(1)] == {"Unhealthy"}
        assert (plugin.directory / SOCKET).is_socket()
        assert old.stream_ended


async def test_kubelet_started_after_the_plugin(short_tmp_path: Path) -> None:
    directory = short_tmp_path / "dp"
    directory.mkdir()
    async with running_plugin(directory) as plugin:
        await wait_until(lambda: plugin.supervisor.state == "waiting-for-kubelet")
        assert not (directory / SOCKET).exists()  # nothing to serve for yet
        async with KubeletSim(directory) as kubelet:
            started = time.monotonic()
            await kubelet.wait_registered(RESOURCE, timeout_s=5)
            assert kubelet.registrations[0].at - started < 2.0


async def test_refused_registration_is_retried_not_fatal(short_tmp_path: Path) -> None:
    class RefusingOnce(KubeletSim):
        refused = False

        async def _register(self, request: Any) -> str | None:
            if not self.refused:
                self.refused = True
                return "resource busy (simulated)"
            return await super()._register(request)

    directory = short_tmp_path / "dp"
    directory.mkdir()
    async with (
        RefusingOnce(directory) as kubelet,
        running_plugin(directory, retry_interval_s=0.2) as plugin,
    ):
        await kubelet.wait_registered(RESOURCE, timeout_s=10)
        assert kubelet.rejections == ["resource busy (simulated)"]
        assert plugin.supervisor.starts >= 2
        assert not plugin.task.done()


async def test_allocation_through_the_kubelet(short_tmp_path: Path) -> None:
    async with kubelet_and_plugin(short_tmp_path) as (kubelet, _):
        await kubelet.wait_registered(RESOURCE)
        ids, response = await kubelet.allocate(RESOURCE, 150)
        assert len(ids) == 150
        assert response.envs[ENV_NVIDIA_VISIBLE_DEVICES] == f"{uuid_for(0)},{uuid_for(1)}"
        assert response.envs[ENV_UNITS] == "150"
        assert response.envs[ENV_MEMORY_LIMIT_MB] == "81920,40960"
        ids, response = await kubelet.allocate(RESOURCE, 50)  # binpack: fills GPU 1
        assert response.envs[ENV_NVIDIA_VISIBLE_DEVICES] == uuid_for(1)


async def test_unknown_ids_are_invalid_argument_over_grpc(short_tmp_path: Path) -> None:
    async with kubelet_and_plugin(short_tmp_path) as (kubelet, _):
        conn = await kubelet.wait_registered(RESOURCE)
        bogus = f"{uuid_for(0)}::100"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await conn.client.allocate([[f"{uuid_for(0)}::1", bogus]])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"unknown device: {bogus}" in (err.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await conn.client.preferred_allocation(["GPU-nope::0"], 1)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown device: GPU-nope::0" in (err.value.details() or "")


async def test_allocate_refuses_an_empty_container_or_a_shared_id_over_grpc(
    short_tmp_path: Path,
) -> None:
    """The kubelet never sends these; a confused or hostile client gets INVALID_ARGUMENT
    naming the container requests, never one share handed to two containers."""
    async with kubelet_and_plugin(short_tmp_path) as (kubelet, _):
        conn = await kubelet.wait_registered(RESOURCE)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await conn.client.allocate([[f"{uuid_for(0)}::1"], []])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "container request #1 names no devices" in (err.value.details() or "")
        shared = f"{uuid_for(0)}::3"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await conn.client.allocate(
                [[shared, f"{uuid_for(0)}::4"], [f"{uuid_for(0)}::5", shared]]
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"device {shared} is requested by container requests #0 and #1" in (
            err.value.details() or ""
        )
        # One ID twice in one container is the same device: still served.
        response = await conn.client.allocate([[shared, shared]])
        assert len(response.container_responses) == 1


async def test_reload_applies_a_new_config_and_rejects_a_bad_one(
    short_tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = short_tmp_path / "dp"
    directory.mkdir()
    configs: list[Any] = []

    def load() -> PluginConfig:
        item = configs.pop(0)
        if isinstance(item, Exception):
            raise item
        assert isinstance(item, PluginConfig)
        return item

    async with KubeletSim(directory) as kubelet, running_plugin(directory, load=load) as plugin:
        await kubelet.wait_registered(RESOURCE)
        base = plugin.supervisor.config
        assert base is not None
        configs.append(ConfigError("units_per_gpu: must be >= 1 (got 0)"))
        with caplog.at_level(logging.ERROR):
            plugin.supervisor.request_reload()
            await wait_until(lambda: "new configuration rejected" in caplog.text)
        assert len(kubelet.registrations) == 1  # untouched
        assert (directory / SOCKET).is_socket()
        configs.append(base.model_copy(update={"units_per_gpu": 10}))
        plugin.supervisor.request_reload()
        conn = await kubelet.wait_registered(RESOURCE, count=2)
        assert len(conn.devices) == 40
        assert len(plugin.backends) == 2  # the node layer was rebuilt


async def test_no_gpus_means_idle_not_exit(short_tmp_path: Path) -> None:
    async with kubelet_and_plugin(short_tmp_path, spec={"gpus": []}) as (kubelet, plugin):
        await wait_until(lambda: plugin.supervisor.state == "idle")
        assert kubelet.registrations == []
        assert not plugin.task.done()
        assert await plugin.stop() == 0


@pytest.mark.parametrize(
    ("fail_on_init_error", "exit_code", "state"),
    [
        pytest.param(True, 1, "stopped", id="crash"),
        pytest.param(False, None, "idle", id="degrade"),
    ],
)
async def test_driver_failure_honours_fail_on_init_error(
    short_tmp_path: Path,
    fail_on_init_error: bool,
    exit_code: int | None,
    state: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(config: PluginConfig) -> GpuBackend:
        raise GpuBackendError("cannot initialise NVML (Driver Not Loaded)")

    async with kubelet_and_plugin(
        short_tmp_path,
        backend_factory=broken,
        config={"fail_on_init_error": fail_on_init_error},
    ) as (kubelet, plugin):
        await wait_until(lambda: plugin.supervisor.state == state)
        if exit_code is not None:
            assert await asyncio.wait_for(plugin.task, 5) == exit_code
        else:
            assert not plugin.task.done()
        assert kubelet.registrations == []
    # Issue 32: the message names the chart value an operator sets, beside the key.
    said = "fail_on_init_error (chart value plugin.failOnInitError) is "
    assert said + str(fail_on_init_error).lower() in caplog.text


async def test_stop_removes_the_socket_and_exits_zero(short_tmp_path: Path) -> None:
    async with kubelet_and_plugin(short_tmp_path) as (kubelet, plugin):
        await kubelet.wait_registered(RESOURCE)
        assert await plugin.stop() == 0
        assert not (plugin.directory / SOCKET).exists()
        assert kubelet.socket_path.is_socket()  # the kubelet's socket is not ours to remove
        await kubelet.wait_for(lambda: kubelet.plugins[RESOURCE].stream_ended)


async def test_two_resources_two_sockets(short_tmp_path: Path) -> None:
    config = {
        "resources": [
            {"name": "cnvrg.io/metagpu", "gpus": [0, 1]},
            {"name": "cnvrg.io/metagpu-a100", "gpus": [uuid_for(2), 3]},
        ]
    }
    async with kubelet_and_plugin(short_tmp_path, config=config) as (kubelet, _):
        a = await kubelet.wait_registered("cnvrg.io/metagpu")
        b = await kubelet.wait_registered("cnvrg.io/metagpu-a100")
        assert (a.endpoint, b.endpoint) == ("metagpu-metagpu.sock", "metagpu-metagpu-a100.sock")
        assert set(health_by_gpu(a.devices)) == {uuid_for(0), uuid_for(1)}
        assert set(health_by_gpu(b.devices)) == {uuid_for(2), uuid_for(3)}


async def test_nvml_backend_over_the_fake_driver(
    short_tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Everything above the driver is real: NVML adapter, health thread, gRPC, kubelet."""
    a, b = "GPU-aaaaaaaa-0000-4000-8000-000000000000", "GPU-bbbbbbbb-0000-4000-8000-000000000000"
    driver = FakePynvml([FakeGpu(a), FakeGpu(b, minor=1, bus_id="00000000:86:00.0")])
    monkeypatch.setattr(plugin.gpu.nvml, "pynvml", driver)
    async with kubelet_and_plugin(
        short_tmp_path, backend_factory=lambda c: NvmlBackend(), config={"gpus_file": None}
    ) as (kubelet, plugin_under_test):
        conn = await kubelet.wait_registered(RESOURCE)
        assert set(health_by_gpu(conn.devices)) == {a, b}
        # The driver delivers events only for registered GPUs, as NVML does.
        await wait_until(lambda: set(driver.registered) == {a, b}, what="event registration")
        driver.xid(b, 31)  # ignored: application page fault
        driver.xid(a, 79)
        devices = await kubelet.wait_devices(RESOURCE, gpu_is(a, "Unhealthy"))
        assert health_by_gpu(devices)[b] == {"Healthy"}
        assert await plugin_under_test.stop() == 0
    assert driver.initialised == 0  # NVML shut down after the health thread stopped


async def test_changed_gpus_file_is_rediscovered_on_restart(short_tmp_path: Path) -> None:
    async with kubelet_and_plugin(short_tmp_path, gpu_count=2) as (kubelet, plugin):
        await kubelet.wait_registered(RESOURCE)
        write_yaml(plugin.gpus_file, gpus_file_spec(gpus(3)))
        await kubelet.restart()
        conn = await kubelet.wait_registered(RESOURCE, count=2)
        assert len(conn.devices) == 300


async def test_wait_registered_reports_what_happened(short_tmp_path: Path) -> None:
    async with KubeletSim(short_tmp_path) as kubelet:
        with pytest.raises(KubeletSimError, match="not registered 1 time"):
            await kubelet.wait_registered(RESOURCE, timeout_s=0.05)


def test_fast_settings_are_valid() -> None:
    PluginConfig.model_validate(FAST)


async def test_kubelet_restart_is_seen_without_inotify(
    short_tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The polling fallback (and the socket check) also re-register within 2 s."""
    import functools

    import plugin.deviceplugin.supervisor
    from plugin.deviceplugin.inotify import DirectoryWatcher

    monkeypatch.setattr(
        plugin.deviceplugin.supervisor,
        "DirectoryWatcher",
        functools.partial(DirectoryWatcher, mode="polling", poll_interval_s=0.25),
    )
    async with kubelet_and_plugin(short_tmp_path) as (kubelet, _):
        await kubelet.wait_registered(RESOURCE)
        await kubelet.restart()
        restarted_at = time.monotonic()
        await kubelet.wait_registered(RESOURCE, count=2, timeout_s=5)
        assert kubelet.registrations[-1].at - restarted_at < 2.0


async def test_missing_then_replaced_plugins_directory(short_tmp_path: Path) -> None:
    """A directory that appears late, or is removed and re-created, is watched anew."""
    import shutil

    directory = short_tmp_path / "dp"
    async with running_plugin(directory, retry_interval_s=0.2) as plugin:
        await wait_until(lambda: plugin.supervisor.starts >= 1)
        directory.mkdir()
        async with KubeletSim(directory) as kubelet:
            await kubelet.wait_registered(RESOURCE, timeout_s=5)
        shutil.rmtree(directory)
        directory.mkdir()
        async with KubeletSim(directory) as kubelet:
            await kubelet.wait_registered(RESOURCE, timeout_s=5)


async def test_a_gpu_healed_by_rediscovery_is_watched_for_events(
    short_tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Event registration follows what is advertised: a GPU that failed discovery
    at start and is described fine after a kubelet restart gets its XIDs seen."""
    a, b = "GPU-aaaaaaaa-0000-4000-8000-000000000000", "GPU-bbbbbbbb-0000-4000-8000-000000000000"
    sick = FakeGpu(b, minor=1, bus_id="00000000:86:00.0", fail={"nvmlDeviceGetName": 999})
    driver = FakePynvml([FakeGpu(a), sick])
    monkeypatch.setattr(plugin.gpu.nvml, "pynvml", driver)
    async with kubelet_and_plugin(
        short_tmp_path, backend_factory=lambda c: NvmlBackend(), config={"gpus_file": None}
    ) as (kubelet, _):
        await kubelet.wait_devices(RESOURCE, gpu_is(b, "Unhealthy"))
        await wait_until(lambda: a in driver.registered, what="GPU a registered")
        assert b not in driver.registered  # it could not even be described
        sick.fail.clear()
        await kubelet.restart()
        await kubelet.wait_registered(RESOURCE, count=2)
        await kubelet.wait_devices(RESOURCE, gpu_is(b, "Healthy"))
        await wait_until(lambda: b in driver.registered, what="the healed GPU registered")
        driver.xid(b, 79)
        await kubelet.wait_devices(RESOURCE, gpu_is(b, "Unhealthy"))


async def _reload_is_rejected(
    plugin_under_test: Any, kubelet: KubeletSim, caplog: pytest.LogCaptureFixture, reason: str
) -> None:
    """SIGHUP, then: rejected with ``reason``, the old config still served."""
    with caplog.at_level(logging.ERROR):
        plugin_under_test.supervisor.request_reload()
        await wait_until(lambda: "new configuration rejected" in caplog.text, what="rejection")
    assert reason in caplog.text
    assert plugin_under_test.supervisor.state == "serving"
    assert (plugin_under_test.directory / SOCKET).is_socket()
    assert len(kubelet.registrations) == 1
    assert len(kubelet.plugins[RESOURCE].devices) == 400
    assert not kubelet.plugins[RESOURCE].stream_ended


async def test_reload_whose_driver_fails_is_rejected_even_when_degrading_is_allowed(
    short_tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``fail_on_init_error: false`` is for the first start; a reload must not
    swap working GPUs for an empty node."""
    opened: list[GpuBackend] = []

    def first_works(config: PluginConfig) -> GpuBackend:
        if opened:
            raise GpuBackendError("cannot initialise NVML (Driver Not Loaded)")
        assert config.gpus_file is not None
        opened.append(SimulatedGpus.from_file(config.gpus_file))
        return opened[0]

    async with kubelet_and_plugin(
        short_tmp_path, backend_factory=first_works, config={"fail_on_init_error": False}
    ) as (kubelet, plugin_under_test):
        await kubelet.wait_registered(RESOURCE)
        await _reload_is_rejected(plugin_under_test, kubelet, caplog, "Driver Not Loaded")
        assert plugin_under_test.supervisor.backend is opened[0]


class TrackedGpus(SimulatedGpus):
    closes = 0

    def close(self) -> None:
        self.closes += 1
        super().close()


async def test_reload_whose_gpu_selection_fails_is_rejected(
    short_tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = short_tmp_path / "dp"
    directory.mkdir()
    configs: list[PluginConfig] = []

    def tracked(config: PluginConfig) -> GpuBackend:
        assert config.gpus_file is not None
        return TrackedGpus.from_file(config.gpus_file)

    async with (
        KubeletSim(directory) as kubelet,
        running_plugin(
            directory, load=lambda: configs.pop(0), backend_factory=tracked
        ) as plugin_under_test,
    ):
        await kubelet.wait_registered(RESOURCE)
        base = plugin_under_test.supervisor.config
        assert base is not None
        twice = base.model_copy(
            update={"resources": [ResourceConfig(name=RESOURCE, gpus=[0, uuid_for(0)])]}
        )
        configs.append(twice)
        await _reload_is_rejected(plugin_under_test, kubelet, caplog, "twice")
        rejected = plugin_under_test.backends[-1]
        assert isinstance(rejected, TrackedGpus)
        # Released in a worker thread right after the rejection is logged.
        await wait_until(lambda: rejected.closes == 1, what="the rejected backend released")
        assert plugin_under_test.supervisor.backend is plugin_under_test.backends[0]


async def test_a_gpu_selected_twice_is_a_config_error_not_retried(
    short_tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = {"resources": [{"name": RESOURCE, "gpus": [1, uuid_for(1)]}]}
    with caplog.at_level(logging.ERROR):
        async with kubelet_and_plugin(short_tmp_path, config=config, retry_interval_s=0.05) as (
            kubelet,
            plugin_under_test,
        ):
            await wait_until(lambda: plugin_under_test.supervisor.state == "misconfigured")
            assert "selects GPU 1" in caplog.text
            assert "not retrying" in caplog.text
            assert "GPU discovery failed" not in caplog.text  # it is not one
            assert kubelet.registrations == []


async def test_turning_health_checks_off_heals_gpus_errors_made_sick(
    short_tmp_path: Path,
) -> None:
    """With checks off nothing probes or recovers: GPUs sick from events would
    stay Unhealthy forever. Discovery failures stay (the GPU is not usable)."""
    spec = gpus_file_spec(gpus(4, numa_nodes=2))
    spec["gpus"][3]["fail"] = "discovery"
    directory = short_tmp_path / "dp"
    directory.mkdir()
    configs: list[PluginConfig] = []
    async with (
        KubeletSim(directory) as kubelet,
        running_plugin(directory, spec=spec, load=lambda: configs.pop(0)) as plugin_under_test,
    ):
        await kubelet.wait_registered(RESOURCE)
        plugin_under_test.gpus.emit(GpuEvent(uuid_for(2), "xid", xid=79))
        await kubelet.wait_devices(RESOURCE, gpu_is(uuid_for(2), "Unhealthy"))
        base = plugin_under_test.supervisor.config
        assert base is not None
        configs.append(
            base.model_copy(update={"health": base.health.model_copy(update={"enabled": False})})
        )
        plugin_under_test.supervisor.request_reload()
        await kubelet.wait_registered(RESOURCE, count=2)
        devices = await kubelet.wait_devices(RESOURCE, gpu_is(uuid_for(2), "Healthy"))
        assert health_by_gpu(devices)[uuid_for(3)] == {"Unhealthy"}


async def test_a_stop_requested_before_run_is_not_lost(short_tmp_path: Path) -> None:
    directory = short_tmp_path / "dp"
    directory.mkdir()
    gpus_file = write_yaml(short_tmp_path / "gpus.yaml", gpus_file_spec(gpus(1)))
    config = PluginConfig.model_validate(
        {**FAST, "device_plugins_dir": str(directory), "gpus_file": str(gpus_file)}
    )
    supervisor = Supervisor(lambda: config, config=config)
    supervisor.request_stop()
    assert await asyncio.wait_for(supervisor.run(handle_signals=False), 15) == 0
