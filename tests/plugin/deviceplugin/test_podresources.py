"""The device plugin's PodResources reading (NodeDevices) over the harness.

The shared client's own behaviour (reconnects, errors, timeouts) is tested in
``tests/kubelet/test_podresources.py``; this file checks the device plugin's terms.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from plugin.deviceplugin.podresources import NodeDevices, PodResourcesReader
from plugin.kubelet.podresources import PodResourcesError
from plugin.placement.ownership import AssignedDevices, ResourceDevices
from tests.harness.podresources import running_pod_resources

R = "cnvrg.io/metagpu"


async def test_read_gives_every_entry_as_the_kubelet_sent_it(short_tmp_path: Path) -> None:
    """Entry for entry (one per device): the ownership core joins them, not the reader."""
    sock = short_tmp_path / "kubelet.sock"
    async with running_pod_resources(sock) as kubelet:
        kubelet.advertise(R, ["GPU-a::0", "GPU-a::1"])
        kubelet.advertise("nvidia.com/gpu", ["GPU-b"], numa=0)
        kubelet.assign("ml", "a", "main", "nvidia.com/gpu", ["GPU-b"])
        kubelet.add_pod("kube-system", "coredns", ["coredns"])
        reader = PodResourcesReader(sock, timeout_s=5)
        try:
            got = await reader.read()
        finally:
            await reader.close()
    assert got == NodeDevices(
        allocatable=(
            ResourceDevices(R, ("GPU-a::0",)),
            ResourceDevices(R, ("GPU-a::1",)),
            ResourceDevices("nvidia.com/gpu", ("GPU-b",)),
        ),
        assigned=(AssignedDevices("ml", "a", "main", "nvidia.com/gpu", ("GPU-b",)),),
    )
    assert kubelet.calls == ["GetAllocatableResources", "List"]


async def test_missing_socket_says_to_mount_it_into_the_device_plugin(
    short_tmp_path: Path,
) -> None:
    reader = PodResourcesReader(short_tmp_path / "nope.sock", timeout_s=1)
    with pytest.raises(PodResourcesError, match="into the device plugin container"):
        await reader.read()
