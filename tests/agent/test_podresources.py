"""The agent's PodResources reading (allocations, allocatable devices) over the harness.

The shared reader's own behaviour (reconnects, errors, timeouts) is tested in
``tests/kubelet/test_podresources.py``; this file checks the agent's terms.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from plugin.agent.accounting import Allocation
from plugin.agent.containers import ContainerKey
from plugin.agent.podresources import PodResourcesReader
from plugin.kubelet.podresources import PodResourcesError
from tests.harness.podresources import running_pod_resources

R = "cnvrg.io/metagpu"


async def test_list_returns_every_containers_devices(short_tmp_path: Path) -> None:
    sock = short_tmp_path / "kubelet.sock"
    async with running_pod_resources(sock) as kubelet:
        kubelet.assign("ml", "train-0", "trainer", R, ["GPU-a::0", "GPU-a::1"])
        kubelet.assign("ml", "train-0", "trainer", "nvidia.com/gpu", ["GPU-b"])
        kubelet.assign("web", "api-1", "app", R, ["GPU-a::7"])
        kubelet.add_pod("kube-system", "coredns", ["coredns"])
        reader = PodResourcesReader(sock, timeout_s=5)
        try:
            got = await reader.list_allocations()
        finally:
            await reader.close()
    assert set(got) == {
        Allocation(ContainerKey("ml", "train-0", "trainer"), R, ("GPU-a::0", "GPU-a::1")),
        Allocation(ContainerKey("ml", "train-0", "trainer"), "nvidia.com/gpu", ("GPU-b",)),
        Allocation(ContainerKey("web", "api-1", "app"), R, ("GPU-a::7",)),
    }
    assert kubelet.calls == ["List"]


async def test_missing_socket_says_what_to_mount(short_tmp_path: Path) -> None:
    reader = PodResourcesReader(short_tmp_path / "nope.sock", timeout_s=1)
    with pytest.raises(
        PodResourcesError,
        match="mount the host's /var/lib/kubelet/pod-resources into the agent container",
    ):
        await reader.list_allocations()
    with pytest.raises(PodResourcesError, match="into the agent container"):
        await reader.list_allocatable()


async def test_allocatable_joins_the_kubelets_per_device_entries(short_tmp_path: Path) -> None:
    sock = short_tmp_path / "kubelet.sock"
    async with running_pod_resources(sock) as kubelet:
        kubelet.advertise(R, ["GPU-a::0", "GPU-a::1"])
        kubelet.advertise("nvidia.com/gpu", ["GPU-b"], numa=0)
        kubelet.assign("ml", "a", "main", R, ["GPU-a::0", "GPU-a::1"])
        reader = PodResourcesReader(sock, timeout_s=5)
        try:
            allocatable = await reader.list_allocatable()
            allocations = await reader.list_allocations()
        finally:
            await reader.close()
    assert {(d.resource_name, d.device_ids) for d in allocatable} == {
        (R, ("GPU-a::0", "GPU-a::1")),
        ("nvidia.com/gpu", ("GPU-b",)),
    }
    assert allocations == (
        Allocation(ContainerKey("ml", "a", "main"), R, ("GPU-a::0", "GPU-a::1")),
    )
