"""One owner per GPU, end to end: another resource on the kubelet's PodResources API makes
our units of that GPU Unhealthy through the real ListAndWatch.

Real gRPC everywhere: the PodResources harness (:mod:`tests.harness.podresources`)
answers ``GetAllocatableResources``/``List`` in the kubelet's message shapes, the
supervisor reads it with its real client, and the simulated kubelet
(:mod:`metagpu.kubelet_sim`) receives the device lists.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.harness.podresources import FakePodResources, running_pod_resources
from tests.plugin.builders import uuid_for
from tests.plugin.conftest import kubelet_and_plugin, wait_until

RESOURCE = "cnvrg.io/metagpu"
GPU1 = uuid_for(1)


def health_by_gpu(devices: list[Any]) -> dict[str, set[str]]:
    result: dict[str, set[str]] = {}
    for d in devices:
        result.setdefault(d.ID.rsplit("::", 1)[0], set()).add(d.health)
    return result


def only_gpu1_unhealthy(devices: list[Any]) -> bool:
    health = health_by_gpu(devices)
    return health.get(GPU1) == {"Unhealthy"} and all(
        states == {"Healthy"} for uuid, states in health.items() if uuid != GPU1
    )


def all_healthy(devices: list[Any]) -> bool:
    return all(states == {"Healthy"} for states in health_by_gpu(devices).values())


OTHER_PLUGINS = [
    pytest.param("nvidia.com/gpu", [GPU1], "gpu-uuid", id="whole-gpu-by-uuid"),
    pytest.param("nvidia.com/gpu", ["1"], "gpu-index", id="whole-gpu-by-index"),
    pytest.param(
        "nvidia.com/mig-1g.10gb", [f"MIG-{GPU1}/1/0", f"MIG-{GPU1}/2/0"], "mig-uuid", id="mig-uuid"
    ),
    pytest.param("nvidia.com/mig-1g.10gb", ["1:0", "1:1"], "mig-index", id="mig-index"),
    pytest.param(
        "nvidia.com/gpu.shared",
        [f"{GPU1}::{n}" for n in range(4)],
        "replica",
        id="time-sliced-renamed",
    ),
    pytest.param(
        "nvidia.com/gpu", [f"1::{n}" for n in range(4)], "replica", id="time-sliced-index"
    ),
]


@pytest.mark.parametrize(("resource", "device_ids", "shape"), OTHER_PLUGINS)
async def test_a_gpu_another_resource_advertises_goes_unhealthy_with_the_reason(
    short_tmp_path: Path,
    resource: str,
    device_ids: list[str],
    shape: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    sock = short_tmp_path / "pr.sock"
    podresources = FakePodResources()
    # Our own devices are on the API too (every GPU), and another vendor's device "1":
    # neither is another NVIDIA plugin's claim on a GPU.
    podresources.advertise(RESOURCE, [f"{uuid_for(i)}::{u}" for i in range(4) for u in range(2)])
    podresources.advertise("example.com/fpga", ["1", "0"])
    podresources.advertise(resource, device_ids, numa=0)
    async with (
        running_pod_resources(sock, podresources),
        kubelet_and_plugin(
            short_tmp_path,
            config={"units_per_gpu": 4, "agent": {"pod_resources_socket": str(sock)}},
            ownership_interval_s=0.05,
        ) as (kubelet, plugin),
    ):
        # Checked before registering: the very first list already leaves GPU 1 out.
        conn = await kubelet.wait_registered(RESOURCE)
        assert only_gpu1_unhealthy(conn.devices), health_by_gpu(conn.devices)
        assert kubelet.allocatable(RESOURCE) == 3 * 4
        board = plugin.supervisor.board
        assert board is not None
        reason = board.snapshot().unhealthy[GPU1]
        assert resource in reason
        assert shape in reason
        assert "give this GPU to one plugin only" in reason
        assert "example.com/fpga" not in reason

        # Several more checks: still one log line for the withdrawal.
        watch = plugin.supervisor.ownership
        assert watch is not None
        await watch.wait_checked(watch.checks + 3)
        withdrawn = [r for r in caplog.records if "GPU withdrawn" in r.getMessage()]
        assert len(withdrawn) == 1
        assert resource in withdrawn[0].getMessage()

        # The other plugin lets go: GPU 1 is offered again.
        del podresources.allocatable[resource]
        await kubelet.wait_devices(RESOURCE, all_healthy)
        assert kubelet.allocatable(RESOURCE) == 4 * 4
        assert any("offered again" in r.getMessage() for r in caplog.records)


async def test_a_gpu_another_resource_has_allocated_goes_unhealthy(short_tmp_path: Path) -> None:
    """Allocations count too (a device the other plugin advertised before and still has
    handed out), and the reason says it is held now."""
    sock = short_tmp_path / "pr.sock"
    podresources = FakePodResources()
    podresources.assign("ml", "trainer", "main", "nvidia.com/gpu", [GPU1])
    async with (
        running_pod_resources(sock, podresources),
        kubelet_and_plugin(
            short_tmp_path,
            config={"units_per_gpu": 2, "agent": {"pod_resources_socket": str(sock)}},
            ownership_interval_s=0.05,
        ) as (kubelet, plugin),
    ):
        await kubelet.wait_devices(RESOURCE, only_gpu1_unhealthy)
        board = plugin.supervisor.board
        assert board is not None
        assert "held now by 1 container(s)" in board.snapshot().unhealthy[GPU1]
        podresources.release("ml", "trainer")
        await kubelet.wait_devices(RESOURCE, all_healthy)


async def test_an_unreadable_kubelet_keeps_the_last_answer_and_says_so_once(
    short_tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sock = short_tmp_path / "pr.sock"
    podresources = FakePodResources()
    podresources.advertise("nvidia.com/gpu", [GPU1])
    async with (
        running_pod_resources(sock, podresources),
        kubelet_and_plugin(
            short_tmp_path,
            config={"units_per_gpu": 2, "agent": {"pod_resources_socket": str(sock)}},
            ownership_interval_s=0.05,
        ) as (kubelet, plugin),
    ):
        await kubelet.wait_devices(RESOURCE, only_gpu1_unhealthy)
        watch = plugin.supervisor.ownership
        assert watch is not None
        podresources.fail_with = grpc.StatusCode.UNAVAILABLE
        await watch.wait_checked(watch.checks + 3)
        assert watch.problem is not None
        assert "UNAVAILABLE" in watch.problem
        # A failed read never heals: GPU 1 stays withdrawn.
        assert only_gpu1_unhealthy(kubelet.plugins[RESOURCE].devices)
        errors = [r for r in caplog.records if "cannot check whether" in r.getMessage()]
        assert len(errors) == 1
        podresources.fail_with = None
        await wait_until(lambda: watch.problem is None, what="the check to read again")
