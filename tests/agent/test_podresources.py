"""The PodResources client against a real gRPC server on a unix socket (the harness)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from plugin._pb import podresources_v1_pb2 as pb
from plugin._pb import podresources_v1_pb2_grpc as pb_grpc
from plugin.agent.accounting import Allocation
from plugin.agent.containers import ContainerKey
from plugin.agent.podresources import PodResourcesClient, PodResourcesError
from tests.harness.podresources import FakePodResources, running_pod_resources

R = "cnvrg.io/metagpu"


async def test_list_returns_every_containers_devices(short_tmp_path: Path) -> None:
    sock = short_tmp_path / "kubelet.sock"
    async with running_pod_resources(sock) as kubelet:
        kubelet.assign("ml", "train-0", "trainer", R, ["GPU-a::0", "GPU-a::1"])
        kubelet.assign("ml", "train-0", "trainer", "nvidia.com/gpu", ["GPU-b"])
        kubelet.assign("web", "api-1", "app", R, ["GPU-a::7"])
        kubelet.add_pod("kube-system", "coredns", ["coredns"])
        client = PodResourcesClient(sock, timeout_s=5)
        try:
            got = await client.list_allocations()
        finally:
            await client.close()
    assert set(got) == {
        Allocation(ContainerKey("ml", "train-0", "trainer"), R, ("GPU-a::0", "GPU-a::1")),
        Allocation(ContainerKey("ml", "train-0", "trainer"), "nvidia.com/gpu", ("GPU-b",)),
        Allocation(ContainerKey("web", "api-1", "app"), R, ("GPU-a::7",)),
    }
    assert kubelet.calls == ["List"]


async def test_survives_a_kubelet_restart(short_tmp_path: Path) -> None:
    """The socket is re-created by a new kubelet; the client reconnects on the next call
    and sees the kubelet's (checkpointed) state: nothing is kept in the agent's memory."""
    sock = short_tmp_path / "kubelet.sock"
    client = PodResourcesClient(sock, timeout_s=5)
    try:
        async with running_pod_resources(sock) as first:
            first.assign("ml", "a", "main", R, ["GPU-a::0"])
            assert len(await client.list_allocations()) == 1
        with pytest.raises(PodResourcesError, match=f"{sock} does not exist"):
            await client.list_allocations()
        async with running_pod_resources(sock) as second:
            second.assign("ml", "a", "main", R, ["GPU-a::0"])
            second.assign("ml", "b", "main", R, ["GPU-a::1"])
            got = await client.list_allocations()
        assert {a.key.pod for a in got} == {"a", "b"}
    finally:
        await client.close()


async def test_rpc_errors_name_the_socket_and_code(short_tmp_path: Path) -> None:
    sock = short_tmp_path / "kubelet.sock"
    async with running_pod_resources(sock) as kubelet:
        kubelet.fail_with = grpc.StatusCode.UNAVAILABLE
        client = PodResourcesClient(sock, timeout_s=5)
        try:
            with pytest.raises(PodResourcesError) as err:
                await client.list_allocations()
            kubelet.fail_with = None
            assert len(await client.list_allocations()) == 0  # recovers on the next call
        finally:
            await client.close()
    assert "UNAVAILABLE" in str(err.value)
    assert str(sock) in str(err.value)


async def test_missing_socket_says_what_to_mount(short_tmp_path: Path) -> None:
    client = PodResourcesClient(short_tmp_path / "nope.sock", timeout_s=1)
    with pytest.raises(PodResourcesError, match="mount the host's /var/lib/kubelet/pod-resources"):
        await client.list_allocations()


async def test_harness_speaks_the_real_service(short_tmp_path: Path) -> None:
    """A plain generated stub (what any kubelet client uses) talks to the harness."""
    sock = short_tmp_path / "kubelet.sock"
    async with running_pod_resources(sock, FakePodResources()) as kubelet:
        kubelet.advertise(R, ["GPU-a::0", "GPU-a::1"], numa=1)
        kubelet.assign("ml", "a", "main", R, ["GPU-a::0"])
        async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
            stub = pb_grpc.PodResourcesListerStub(channel)
            alloc = await stub.GetAllocatableResources(pb.AllocatableResourcesRequest())
            one = await stub.Get(pb.GetPodResourcesRequest(pod_name="a", pod_namespace="ml"))
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await stub.Get(pb.GetPodResourcesRequest(pod_name="x", pod_namespace="ml"))
    # The kubelet's shape: one ContainerDevices per device, with its NUMA node.
    assert [list(d.device_ids) for d in alloc.devices] == [["GPU-a::0"], ["GPU-a::1"]]
    assert [[n.ID for n in d.topology.nodes] for d in alloc.devices] == [[1], [1]]
    assert one.pod_resources.containers[0].devices[0].device_ids == ["GPU-a::0"]
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_allocatable_joins_the_kubelets_per_device_entries(short_tmp_path: Path) -> None:
    sock = short_tmp_path / "kubelet.sock"
    async with running_pod_resources(sock) as kubelet:
        kubelet.advertise(R, ["GPU-a::0", "GPU-a::1"])
        kubelet.advertise("nvidia.com/gpu", ["GPU-b"], numa=0)
        kubelet.assign("ml", "a", "main", R, ["GPU-a::0", "GPU-a::1"])
        client = PodResourcesClient(sock, timeout_s=5)
        try:
            allocatable = await client.list_allocatable()
            allocations = await client.list_allocations()
        finally:
            await client.close()
    assert {(d.resource_name, d.device_ids) for d in allocatable} == {
        (R, ("GPU-a::0", "GPU-a::1")),
        ("nvidia.com/gpu", ("GPU-b",)),
    }
    assert allocations == (
        Allocation(ContainerKey("ml", "a", "main"), R, ("GPU-a::0", "GPU-a::1")),
    )
