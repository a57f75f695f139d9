"""The NVML backend against a narrow fake ``pynvml`` (the driver is the edge we cannot have)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

import plugin.gpu.nvml
from plugin.gpu.backend import GpuBackend, GpuBackendError, GpuEvent, GpuProcess
from plugin.gpu.nvml import NvmlBackend
from tests.plugin.gpu import fake_pynvml as fake
from tests.plugin.gpu.fake_pynvml import FakeGpu, FakePynvml

A = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
B = "GPU-bbbbbbbb-0000-4000-8000-000000000000"


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """A fake /sys/bus/pci/devices with NUMA nodes for two bus ids."""
    for bus, node in (("0000:3b:00.0", "1"), ("0000:86:00.0", "-1")):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "numa_node").write_text(node + "\n")
    return tmp_path


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakePynvml:
    driver = FakePynvml(
        [
            FakeGpu(A, minor=0, bus_id="00000000:3B:00.0"),
            FakeGpu(
                B,
                name="Tesla V100-SXM2-16GB",
                memory_mib=16160,
                minor=1,
                bus_id="00000000:86:00.0",
                mig_mode=None,
            ),
        ]
    )
    monkeypatch.setattr(plugin.gpu.nvml, "pynvml", driver)
    return driver


@pytest.fixture
def backend(nvml: FakePynvml, sysfs: Path) -> Iterator[NvmlBackend]:
    b = NvmlBackend(sysfs_pci_root=sysfs)
    yield b
    b.close()


def test_discovery(backend: NvmlBackend) -> None:
    a, b = backend.devices()
    assert (a.index, a.uuid, a.name, a.memory_mib, a.minor_number) == (
        0,
        A,
        "NVIDIA A100-SXM4-80GB",
        81920,
        0,
    )
    assert a.pci_bus_id == "00000000:3B:00.0"
    assert a.numa_node == 1
    assert not a.mig_enabled
    assert a.unhealthy_reason is None
    assert (b.name, b.memory_mib, b.numa_node, b.mig_enabled) == (
        "Tesla V100-SXM2-16GB",
        16160,
        None,
        False,
    )
    assert backend.driver_version == "550.54.15"


def test_mig_mode_is_reported(nvml: FakePynvml, sysfs: Path) -> None:
    nvml.gpus[0].mig_mode = fake.NVML_DEVICE_MIG_ENABLE
    backend = NvmlBackend(sysfs_pci_root=sysfs)
    try:
        assert [g.mig_enabled for g in backend.devices()] == [True, False]
    finally:
        backend.close()


def test_mig_devices_are_listed_by_uuid(nvml: FakePynvml, sysfs: Path) -> None:
    """Another plugin names MIG devices by these UUIDs; empty slots are skipped."""
    nvml.gpus[0].mig_mode = fake.NVML_DEVICE_MIG_ENABLE
    nvml.gpus[0].mig_slots = ["MIG-aaaa-1", None, "MIG-aaaa-3"]
    nvml.gpus[1].mig_slots = ["MIG-never-read"]  # MIG off: not asked
    backend = NvmlBackend(sysfs_pci_root=sysfs)
    try:
        assert [g.mig_devices for g in backend.devices()] == [("MIG-aaaa-1", "MIG-aaaa-3"), ()]
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        pytest.param("nvmlDeviceGetHandleByIndex", "could not get a handle of GPU 1", id="handle"),
        pytest.param("nvmlDeviceGetUUID", "could not read the UUID of GPU 1", id="uuid"),
        pytest.param("nvmlDeviceGetMemoryInfo", "could not read the memory size", id="memory"),
        pytest.param("nvmlDeviceGetPciInfo", "could not read the PCI bus id", id="pci"),
        pytest.param("nvmlDeviceGetMigMode", "could not read the MIG mode", id="mig"),
    ],
)
def test_a_gpu_that_cannot_be_described_is_unhealthy_not_fatal(
    nvml: FakePynvml,
    backend: NvmlBackend,
    function: str,
    expected: str,
) -> None:
    nvml.gpus[1].fail[function] = fake.NVML_ERROR_GPU_IS_LOST
    good, bad = backend.devices()
    assert good.unhealthy_reason is None
    assert bad.index == 1
    assert bad.unhealthy_reason is not None
    assert expected in bad.unhealthy_reason
    assert "GPU is lost" in bad.unhealthy_reason
    # Before the UUID is read the UUID is a placeholder, and says so (issue 15).
    assert bad.identity_known == (
        function not in ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID")
    )


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        pytest.param(fake.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded", id="no-driver"),
        pytest.param(fake.NVML_ERROR_UNKNOWN, "Unknown Error", id="unknown"),
    ],
)
def test_init_failure_is_a_backend_error(
    monkeypatch: pytest.MonkeyPatch, code: int, expected: str
) -> None:
    monkeypatch.setattr(plugin.gpu.nvml, "pynvml", FakePynvml([], init_error=code))
    with pytest.raises(GpuBackendError) as err:
        NvmlBackend()
    assert expected in str(err.value)
    assert "runtimeClassName" in str(err.value)


def test_count_failure_is_a_backend_error(nvml: FakePynvml, backend: NvmlBackend) -> None:
    nvml.count_error = fake.NVML_ERROR_UNKNOWN
    with pytest.raises(GpuBackendError, match="could not count GPUs: Unknown Error"):
        backend.devices()


def test_processes_and_usage(nvml: FakePynvml, backend: NvmlBackend) -> None:
    nvml.gpus[0].processes = [(4242, 2048 << 20), (4343, None)]
    nvml.gpus[0].process_utilization = {4242: 55}
    assert backend.processes(A) == (
        GpuProcess(pid=4242, used_memory_mib=2048, utilization_percent=55),
        GpuProcess(pid=4343, used_memory_mib=0, utilization_percent=None),
    )
    usage = backend.usage(A)
    assert (usage.memory_used_mib, usage.memory_total_mib, usage.utilization_percent) == (
        1024,
        81920,
        37,
    )


def test_unsupported_utilisation_is_none(nvml: FakePynvml, backend: NvmlBackend) -> None:
    nvml.gpus[1].utilization = None
    assert backend.usage(B).utilization_percent is None
    assert backend.processes(B) == ()


@pytest.mark.parametrize(
    ("call", "function"),
    [
        pytest.param("usage", "nvmlDeviceGetMemoryInfo", id="usage-memory"),
        pytest.param("usage", "nvmlDeviceGetUtilizationRates", id="usage-utilisation"),
        pytest.param("processes", "nvmlDeviceGetComputeRunningProcesses", id="processes"),
        pytest.param("usage", "nvmlDeviceGetHandleByUUID", id="handle"),
    ],
)
def test_reading_a_lost_gpu_raises_backend_error_naming_it(
    nvml: FakePynvml, backend: NvmlBackend, call: str, function: str
) -> None:
    nvml.gpus[0].fail[function] = fake.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(GpuBackendError) as err:
        getattr(backend, call)(A)
    assert err.value.uuid == A
    assert "GPU is lost" in str(err.value)


def test_unknown_gpu_is_a_backend_error(backend: NvmlBackend) -> None:
    with pytest.raises(GpuBackendError, match="GPU-nope"):
        backend.usage("GPU-nope")


def test_events_are_registered_and_translated(nvml: FakePynvml, backend: NvmlBackend) -> None:
    backend.watch_events([A, B])
    assert backend.wait_event(0.01) is None  # registers, then times out
    assert nvml.wait_timeouts_ms == [10]
    critical = fake.nvmlEventTypeXidCriticalError | fake.nvmlEventTypeDoubleBitEccError
    assert nvml.registered == {A: critical, B: critical}
    nvml.xid(B, 79)
    nvml.double_bit_ecc(A)
    assert backend.wait_event(1) == GpuEvent(uuid=B, kind="xid", xid=79)
    assert backend.wait_event(1) == GpuEvent(uuid=A, kind="ecc_double_bit", xid=48)


def test_only_watched_gpus_are_registered_without_a_second_discovery(
    nvml: FakePynvml, backend: NvmlBackend
) -> None:
    backend.watch_events([B])
    assert backend.wait_event(0.01) is None
    assert set(nvml.registered) == {B}
    assert "nvmlDeviceGetCount" not in nvml.calls  # the watched UUIDs are enough


def test_gpus_watched_later_are_registered_on_the_next_wait(
    nvml: FakePynvml, backend: NvmlBackend
) -> None:
    """A rediscovery (every kubelet restart) can add or heal GPUs: they must get
    an event watch too, not only the GPUs of the first wait."""
    backend.watch_events([A])
    assert backend.wait_event(0.01) is None
    assert set(nvml.registered) == {A}
    backend.watch_events([A, B])
    assert backend.wait_event(0.01) is None
    assert set(nvml.registered) == {A, B}
    nvml.xid(B, 79)
    assert backend.wait_event(1) == GpuEvent(uuid=B, kind="xid", xid=79)


def test_a_failing_gpu_count_cannot_leave_the_event_set_empty(
    nvml: FakePynvml, backend: NvmlBackend
) -> None:
    """Registration used to re-run discovery after creating the event set; when
    that failed, the empty set was kept and no GPU was ever registered."""
    nvml.count_error = fake.NVML_ERROR_UNKNOWN
    backend.watch_events([A, B])
    for _ in range(2):
        with contextlib.suppress(GpuBackendError):
            backend.wait_event(0.01)
        nvml.count_error = None
    assert set(nvml.registered) == {A, B}


def test_a_failed_event_set_creation_is_retried(nvml: FakePynvml, backend: NvmlBackend) -> None:
    """The failure used to leave an empty event set behind for good: no GPU was
    ever registered again, so no XID was ever seen."""
    nvml.event_set_error = fake.NVML_ERROR_UNKNOWN
    backend.watch_events([A, B])
    with pytest.raises(GpuBackendError, match="could not create an event set: Unknown Error"):
        backend.wait_event(0.01)
    nvml.event_set_error = None
    for _ in range(2):  # the retry comes after one bounded wait, never at once
        assert backend.wait_event(0.01) is None
    assert set(nvml.registered) == {A, B}


def test_event_registration_not_supported_keeps_the_gpu_healthy(
    nvml: FakePynvml, backend: NvmlBackend, caplog: pytest.LogCaptureFixture
) -> None:
    nvml.gpus[1].register_error = fake.NVML_ERROR_NOT_SUPPORTED
    backend.watch_events([A, B])
    with caplog.at_level(logging.WARNING):
        assert backend.wait_event(0.01) is None
        assert backend.wait_event(0.01) is None
    assert caplog.text.count("too old to support health checking") == 1  # not every round
    assert set(nvml.registered) == {A}


def test_event_registration_failure_marks_that_gpu_and_is_retried(
    nvml: FakePynvml, backend: NvmlBackend
) -> None:
    nvml.gpus[1].register_error = fake.NVML_ERROR_UNKNOWN
    backend.watch_events([A, B])
    event = backend.wait_event(0.01)
    assert event is not None
    assert (event.uuid, event.kind) == (B, "backend_error")
    assert "cannot register for health events: Unknown Error" in event.detail
    assert backend.wait_event(0.01) is None  # one real wait before the retry: no spinning
    assert nvml.wait_timeouts_ms == [10]
    nvml.gpus[1].register_error = None
    assert backend.wait_event(0.01) is None
    assert set(nvml.registered) == {A, B}


@pytest.mark.parametrize("watched", [pytest.param([A, B], id="gpus"), pytest.param([], id="none")])
def test_a_failed_wait_raises_so_the_caller_backs_off(
    nvml: FakePynvml, backend: NvmlBackend, watched: list[str]
) -> None:
    """Returning queued events instead made a broken driver spin a core: the
    monitor's back-off only runs on an exception."""
    backend.watch_events([A, B])
    assert backend.wait_event(0.01) is None
    backend.watch_events(watched)
    nvml.wait_fails(fake.NVML_ERROR_UNKNOWN)
    with pytest.raises(
        GpuBackendError, match="waiting for NVML events failed: Unknown Error"
    ) as err:
        backend.wait_event(1)
    assert err.value.uuid is None  # every watched GPU is suspect


def test_an_event_of_a_lost_gpu_blames_that_gpu_only(
    nvml: FakePynvml, backend: NvmlBackend
) -> None:
    """Issue 15 item 4: the handle was registered for A; that A can no longer say
    its UUID (fallen off the bus) must not make B suspect too."""
    backend.watch_events([A, B])
    assert backend.wait_event(0.01) is None
    nvml.xid(A, 79)
    nvml.lose(A)
    assert backend.wait_event(1) == GpuEvent(uuid=A, kind="xid", xid=79)


def test_an_event_with_an_unknown_handle_suspects_every_gpu(
    nvml: FakePynvml, backend: NvmlBackend
) -> None:
    backend.watch_events([A, B])
    assert backend.wait_event(0.01) is None
    nvml.unknown_handle_xid(79)
    with pytest.raises(GpuBackendError, match="cannot identify") as err:
        backend.wait_event(1)
    assert err.value.uuid is None  # the monitor marks every watched GPU


def test_memory_health_reads_what_the_gpu_supports(nvml: FakePynvml, backend: NvmlBackend) -> None:
    nvml.gpus[0].volatile_uncorrected_ecc = 2
    nvml.gpus[0].remapped_rows = (1, 3, 1, 0)
    nvml.gpus[0].retired_pages_pending = None  # Ampere: no page retirement
    a = backend.memory_health(A)
    assert a.volatile_uncorrected_ecc == 2
    assert a.remapped_rows is not None
    assert (a.remapped_rows.pending, a.remapped_rows.failure) == (True, False)
    assert a.remapped_rows.uncorrectable == 3
    assert a.retired_pages_pending is None
    nvml.gpus[1].volatile_uncorrected_ecc = None
    nvml.gpus[1].remapped_rows = None  # Volta: no row remapper
    nvml.gpus[1].retired_pages_pending = fake.NVML_FEATURE_ENABLED
    b = backend.memory_health(B)
    assert (b.volatile_uncorrected_ecc, b.remapped_rows, b.retired_pages_pending) == (
        None,
        None,
        True,
    )


def test_a_lost_gpu_fails_liveness_and_says_lost(nvml: FakePynvml, backend: NvmlBackend) -> None:
    backend.check_alive(A)
    nvml.lose(A)
    with pytest.raises(GpuBackendError, match="GPU is lost") as err:
        backend.check_alive(A)
    assert err.value.lost
    assert err.value.uuid == A
    with pytest.raises(GpuBackendError) as err:
        backend.memory_health(A)
    assert err.value.lost
    backend.check_alive(B)
    a, b = backend.devices()
    assert not a.identity_known
    assert b.identity_known


def test_with_nothing_watched_the_wait_idles_until_gpus_come(
    nvml: FakePynvml, backend: NvmlBackend
) -> None:
    assert backend.wait_event(0.01) is None
    assert nvml.wait_timeouts_ms == []  # no event set to wait on
    assert "nvmlEventSetCreate" not in nvml.calls


def test_close_frees_and_shuts_down_once(nvml: FakePynvml, sysfs: Path) -> None:
    backend = NvmlBackend(sysfs_pci_root=sysfs)
    backend.watch_events([A])
    backend.wait_event(0.01)
    backend.close()
    backend.close()
    assert nvml.event_sets_freed == 1
    assert nvml.initialised == 0
    assert backend.wait_event(1) is None


def test_nvml_backend_is_a_gpu_backend(backend: NvmlBackend) -> None:
    port: GpuBackend = backend  # mypy checks the protocol
    assert port.kind == "nvml"
