"""The NVML backend against the real driver; skipped where NVML does not initialise."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from plugin.gpu.backend import GpuBackendError
from plugin.gpu.nvml import NvmlBackend

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def backend() -> Iterator[NvmlBackend]:
    try:
        b = NvmlBackend()
    except GpuBackendError as exc:
        pytest.skip(f"no usable NVIDIA driver: {exc}")
    yield b
    b.close()


def test_real_discovery(backend: NvmlBackend) -> None:
    infos = backend.devices()
    assert infos, "NVML initialised but reports no GPUs"
    for info in infos:
        assert info.unhealthy_reason is None, info.unhealthy_reason
        assert info.uuid.startswith(("GPU-", "MIG-"))
        assert info.memory_mib > 0
        assert info.pci_bus_id.count(":") == 2
        assert info.numa_node is None or info.numa_node >= 0


def test_real_usage_and_processes(backend: NvmlBackend) -> None:
    uuid = backend.devices()[0].uuid
    usage = backend.usage(uuid)
    assert 0 <= usage.memory_used_mib <= usage.memory_total_mib
    for proc in backend.processes(uuid):
        assert proc.pid > 0


def test_real_event_wait_is_bounded(backend: NvmlBackend) -> None:
    # Register the GPUs for events first: without that the wait never reaches NVML.
    backend.watch_events([info.uuid for info in backend.devices()])
    # No XID is expected on a healthy GPU: the waits must time out, not hang.
    for _ in range(2):  # the first registers, the second waits on what it registered
        event = backend.wait_event(0.2)
        assert event is None or event.uuid


def test_real_compute_mode_set_and_restored(backend: NvmlBackend) -> None:
    """What the supervised MPS daemon does to a GPU (plugin.gpu.mps_supervisor)."""
    uuid = backend.devices()[0].uuid
    before = backend.compute_mode(uuid)
    try:
        backend.set_compute_mode(uuid, "Exclusive_Process")
    except GpuBackendError as exc:
        pytest.skip(f"the compute mode cannot be set here: {exc}")
    try:
        assert backend.compute_mode(uuid) == "Exclusive_Process"
    finally:
        backend.set_compute_mode(uuid, before)
    assert backend.compute_mode(uuid) == before
