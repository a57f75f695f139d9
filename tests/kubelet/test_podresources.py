"""The shared PodResources client against a real gRPC server on a unix socket (the harness)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from plugin._pb import podresources_v1_pb2 as pb
from plugin._pb import podresources_v1_pb2_grpc as pb_grpc
from plugin.kubelet.podresources import PodResourcesClient, PodResourcesError
from tests.harness.podresources import FakePodResources, running_pod_resources

R = "cnvrg.io/metagpu"


def client_for(sock: Path, *, timeout_s: float = 5) -> PodResourcesClient:
    return PodResourcesClient(sock, timeout_s=timeout_s, mount_into="the test container")


async def test_answers_are_the_kubelets_messages_as_sent(short_tmp_path: Path) -> None:
    """No interpretation here: one ``ContainerDevices`` per device, as the kubelet sends."""
    sock = short_tmp_path / "kubelet.sock"
    async with running_pod_resources(sock) as kubelet:
        kubelet.advertise(R, ["GPU-a::0", "GPU-a::1"], numa=1)
        kubelet.assign("ml", "train-0", "trainer", R, ["GPU-a::0"])
        kubelet.add_pod("kube-system", "coredns", ["coredns"])
        client = client_for(sock)
        try:
            allocatable = await client.get_allocatable_resources()
            listed = await client.list()
        finally:
            await client.close()
    assert [(d.resource_name, list(d.device_ids)) for d in allocatable.devices] == [
        (R, ["GPU-a::0"]),
        (R, ["GPU-a::1"]),
    ]
    assert [[n.ID for n in d.topology.nodes] for d in allocatable.devices] == [[1], [1]]
    assert [(p.namespace, p.name) for p in listed.pod_resources] == [
        ("kube-system", "coredns"),
        ("ml", "train-0"),
    ]
    assert list(listed.pod_resources[1].containers[0].devices[0].device_ids) == ["GPU-a::0"]
    assert kubelet.calls == ["GetAllocatableResources", "List"]


async def test_survives_a_kubelet_restart(short_tmp_path: Path) -> None:
    """The socket is re-created by a new kubelet; the client reconnects on the next call
    and sees the kubelet's (checkpointed) state: nothing is kept in the caller's memory."""
    sock = short_tmp_path / "kubelet.sock"
    client = client_for(sock)
    try:
        async with running_pod_resources(sock) as first:
            first.assign("ml", "a", "main", R, ["GPU-a::0"])
            assert len((await client.list()).pod_resources) == 1
        with pytest.raises(PodResourcesError, match=f"{sock} does not exist"):
            await client.list()
        async with running_pod_resources(sock) as second:
            second.assign("ml", "a", "main", R, ["GPU-a::0"])
            second.assign("ml", "b", "main", R, ["GPU-a::1"])
            got = await client.list()
        assert {p.name for p in got.pod_resources} == {"a", "b"}
    finally:
        await client.close()


@pytest.mark.parametrize("rpc", ["List", "GetAllocatableResources"])
async def test_rpc_errors_name_the_call_socket_and_code(short_tmp_path: Path, rpc: str) -> None:
    sock = short_tmp_path / "kubelet.sock"
    async with running_pod_resources(sock) as kubelet:
        kubelet.fail_with = grpc.StatusCode.UNAVAILABLE
        client = client_for(sock)
        call = client.list if rpc == "List" else client.get_allocatable_resources
        try:
            with pytest.raises(PodResourcesError) as err:
                await call()
            kubelet.fail_with = None
            await call()  # recovers on the next call
        finally:
            await client.close()
    assert str(err.value) == (
        f"kubelet PodResources {rpc} on {sock} failed: UNAVAILABLE: injected failure"
    )


async def test_a_wedged_kubelet_costs_one_timeout(short_tmp_path: Path) -> None:
    sock = short_tmp_path / "kubelet.sock"
    async with running_pod_resources(sock) as kubelet:
        kubelet.hold = asyncio.Event()
        client = client_for(sock, timeout_s=0.2)
        try:
            with pytest.raises(PodResourcesError, match=r"List on .* failed: DEADLINE_EXCEEDED"):
                await asyncio.wait_for(client.list(), timeout=10)
            kubelet.hold.set()
            assert len((await client.list()).pod_resources) == 0  # the next call is answered
            assert kubelet.calls == ["List", "List"]
        finally:
            kubelet.hold.set()
            await client.close()


@pytest.mark.parametrize("rpc", ["List", "GetAllocatableResources"])
async def test_missing_socket_says_what_to_mount_where(short_tmp_path: Path, rpc: str) -> None:
    client = client_for(short_tmp_path / "nope.sock", timeout_s=1)
    call = client.list if rpc == "List" else client.get_allocatable_resources
    with pytest.raises(
        PodResourcesError,
        match="mount the host's /var/lib/kubelet/pod-resources into the test container",
    ):
        await call()


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
