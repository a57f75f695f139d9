"""The simulated GPU backend behaves like the driver port says, file-driven and in-process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from plugin.api.settings import ConfigError
from plugin.gpu.backend import GpuBackend, GpuBackendError, GpuEvent, NullBackend
from plugin.gpu.simulated import SimulatedGpus, load_gpus_file

UUID_A = "GPU-0b8a5e3c-1f6e-4a53-9c1e-2d7b8f1a0c01"
UUID_B = "GPU-7d2f9a41-3c8b-4e1d-8f0a-5b6c7d8e9f02"


def gpus_yaml(**overrides: object) -> dict[str, object]:
    data: dict[str, object] = {
        "gpus": [
            {"uuid": UUID_A, "name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "numa_node": 0},
            {
                "uuid": UUID_B,
                "name": "NVIDIA A100-SXM4-80GB",
                "memory_mib": 81920,
                "numa_node": 1,
                "processes": [{"pid": 4242, "used_memory_mib": 2048}],
                "memory_reserved_mib": 512,
                "utilization_percent": 37,
            },
        ]
    }
    data.update(overrides)
    return data


@pytest.fixture
def gpus_file(tmp_path: Path) -> Path:
    path = tmp_path / "gpus.yaml"
    path.write_text(yaml.safe_dump(gpus_yaml()))
    return path


def rewrite(path: Path, data: dict[str, object]) -> None:
    """Replace the file so its (mtime, size) stamp is guaranteed to change."""
    before = path.stat()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data))
    os.utime(tmp, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    tmp.replace(path)


def test_devices_fill_defaults_from_position(gpus_file: Path) -> None:
    backend: GpuBackend = SimulatedGpus.from_file(gpus_file)
    a, b = backend.devices()
    assert (a.index, a.minor_number, a.numa_node) == (0, 0, 0)
    assert (b.index, b.uuid, b.pci_bus_id) == (1, UUID_B, "00000000:11:00.0")
    assert a.unhealthy_reason is None


def test_usage_sums_processes_and_reserved(gpus_file: Path) -> None:
    backend = SimulatedGpus.from_file(gpus_file)
    usage = backend.usage(UUID_B)
    assert usage.memory_used_mib == 2048 + 512
    assert usage.memory_total_mib == 81920
    assert usage.utilization_percent == 37
    assert [p.pid for p in backend.processes(UUID_B)] == [4242]


def test_unknown_gpu_is_a_backend_error(gpus_file: Path) -> None:
    backend = SimulatedGpus.from_file(gpus_file)
    with pytest.raises(GpuBackendError, match="unknown GPU: GPU-nope") as info:
        backend.usage("GPU-nope")
    assert info.value.uuid == "GPU-nope"


def test_appending_an_xid_to_the_file_emits_one_event(gpus_file: Path) -> None:
    backend = SimulatedGpus.from_file(gpus_file)
    assert backend.wait_event(0) is None
    data = gpus_yaml()
    data["gpus"][1]["xids"] = [79]  # type: ignore[index]
    rewrite(gpus_file, data)
    assert backend.wait_event(2.0) == GpuEvent(uuid=UUID_B, kind="xid", xid=79)
    assert backend.wait_event(0.2) is None  # once, not on every poll
    data["gpus"][1]["xids"] = [79, 48]  # type: ignore[index]
    rewrite(gpus_file, data)
    assert backend.wait_event(2.0) == GpuEvent(uuid=UUID_B, kind="xid", xid=48)


def test_a_broken_rewrite_keeps_the_last_good_state(
    gpus_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = SimulatedGpus.from_file(gpus_file)
    before = gpus_file.stat()
    gpus_file.write_text("gpus: [{uuid: nope}]\n")
    os.utime(gpus_file, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    assert len(backend.devices()) == 2
    assert "keeping the last good state" in caplog.text


def test_emit_and_wait_event_in_process(gpus_file: Path) -> None:
    backend = SimulatedGpus.from_file(gpus_file)
    event = GpuEvent(uuid=UUID_A, kind="ecc_double_bit", xid=48)
    backend.emit(event)
    assert backend.wait_event(1.0) == event


def test_wait_event_is_bounded(gpus_file: Path) -> None:
    backend = SimulatedGpus.from_file(gpus_file)
    start = time.monotonic()
    assert backend.wait_event(0.3) is None
    assert time.monotonic() - start < 5  # bounded, with generous slack for a loaded machine


@pytest.mark.parametrize(
    ("fail", "call"),
    [
        pytest.param("usage", "usage", id="usage"),
        pytest.param("processes", "processes", id="processes"),
    ],
)
def test_simulated_failures_raise_backend_errors(gpus_file: Path, fail: str, call: str) -> None:
    backend = SimulatedGpus.from_file(gpus_file)
    backend.update(UUID_A, fail=fail)
    with pytest.raises(GpuBackendError, match="simulated failure"):
        getattr(backend, call)(UUID_A)


def test_discovery_failure_marks_the_gpu_not_the_node(gpus_file: Path) -> None:
    backend = SimulatedGpus.from_file(gpus_file)
    backend.update(UUID_A, fail="discovery")
    a, b = backend.devices()
    assert a.unhealthy_reason
    assert UUID_A in a.unhealthy_reason
    assert b.unhealthy_reason is None


def test_update_is_validated_like_the_file(gpus_file: Path) -> None:
    backend = SimulatedGpus.from_file(gpus_file)
    with pytest.raises(ValueError, match="memory_mib"):
        backend.update(UUID_A, memory_mib=-1)


def test_live_pids_only_hides_exited_processes(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        path = tmp_path / "gpus.yaml"
        data = gpus_yaml(live_pids_only=True)
        data["gpus"][0]["processes"] = [{"pid": child.pid, "used_memory_mib": 100}]  # type: ignore[index]
        path.write_text(yaml.safe_dump(data))
        backend = SimulatedGpus.from_file(path)
        assert [p.pid for p in backend.processes(UUID_A)] == [child.pid]
        child.kill()
        child.wait(timeout=10)
        assert backend.processes(UUID_A) == ()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        pytest.param(
            {"gpus": [{"uuid": "x", "name": "n", "memory_mib": 1}]}, "gpus.0.uuid", id="bad-uuid"
        ),
        pytest.param(
            {"gpus": [{"uuid": UUID_A, "name": "n", "memory_mib": 1}] * 2},
            "uuids must be unique",
            id="duplicate-uuid",
        ),
        pytest.param(
            {"gpus": [{"uuid": UUID_A, "name": "n", "memory_mib": 1, "colour": "red"}]},
            "unknown setting",
            id="typo",
        ),
    ],
)
def test_bad_gpus_files_are_clear(tmp_path: Path, data: dict[str, object], fragment: str) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=fragment) as info:
        load_gpus_file(path)
    assert str(path) in str(info.value)


def test_null_backend_has_no_gpus() -> None:
    backend: GpuBackend = NullBackend()
    assert backend.devices() == ()
    assert backend.wait_event(0) is None
    with pytest.raises(GpuBackendError):
        backend.usage("GPU-x")
