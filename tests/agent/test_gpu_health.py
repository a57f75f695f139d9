"""Plugin and agent agree on GPU health (issue 15, items 5-7), end to end.

The device plugin runs in-process against the simulated kubelet (real gRPC)
and publishes its board into the device-plugins directory; the agent runs as
``metagpu agent`` does (PodResources harness over gRPC, fake API server for
labels, /metrics over TCP) on the same GPUs file. What mgctl prints is rendered
by mgctl's own code from the agent's ``/v1/devices`` document.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

import plugin.gpu.nvml
from certs.kube import open_api_client
from metagpu.kubelet_sim import KubeletSim
from plugin.agent import pods as pods_module
from plugin.agent.agent import AgentRuntime
from plugin.agent.identity import Caller
from plugin.agent.mgctl import render_devices
from plugin.agent.views import device_list
from plugin.api.config import PluginConfig
from plugin.api.resources import (
    AGENT_SOCKET_NAME,
    ENV_AGENT_SOCKET,
    MGCTL_FILE_NAME,
    NODE_LABEL_LARGEST_FREE_UNITS,
)
from plugin.gpu.backend import GpuEvent
from plugin.gpu.health_file import HEALTH_FILE_NAME, read_board
from plugin.gpu.nvml import NvmlBackend
from tests.agent.builders import mirror_this_process, place_on_host, pod
from tests.agent.helpers import eventually, run_mgctl
from tests.harness.kube_api import FakeKubeApi
from tests.harness.podresources import FakePodResources, running_pod_resources
from tests.plugin.builders import gpus, gpus_file_spec, uuid_for, write_yaml
from tests.plugin.conftest import PluginUnderTest, running_plugin
from tests.plugin.gpu.fake_pynvml import FakeGpu, FakePynvml

R = "cnvrg.io/metagpu"
U0, U1 = uuid_for(0), uuid_for(1)
HOST = Caller(pid=1, uid=0, scope="node", container=None, via="host root")


@dataclass
class Node:
    kubelet: KubeletSim
    plugin: PluginUnderTest
    pods: FakePodResources
    config: PluginConfig
    directory: Path


@asynccontextmanager
async def gpu_node(
    root: Path, tmp: Path, *, health: dict[str, Any], node_name: str | None = "node-a"
) -> AsyncIterator[Node]:
    """A node: kubelet, device plugin (2 simulated GPUs), PodResources; the agent's config."""
    directory = root / "dp"
    directory.mkdir()
    (tmp / "proc").mkdir(exist_ok=True)
    mirror_this_process(tmp / "proc")  # the in-process plugin's board is current
    spec = gpus_file_spec(gpus(2))
    async with (
        KubeletSim(directory) as kubelet,
        running_plugin(directory, spec=spec, config={"health": health}) as plugin_under_test,
        running_pod_resources(root / "pr.sock") as pods,
    ):
        config = PluginConfig.model_validate(
            {
                "gpus_file": str(plugin_under_test.gpus_file),
                "device_plugins_dir": str(directory),
                "agent": {
                    "node_name": node_name,
                    "socket_dir": str(root / "run"),
                    "pod_resources_socket": str(root / "pr.sock"),
                    "metrics_listen": "127.0.0.1:0",
                    "proc_root": str(tmp / "proc"),
                    "interval_s": 0.1,
                },
            }
        )
        await kubelet.wait_registered(R)
        yield Node(kubelet, plugin_under_test, pods, config, directory)


@pytest.fixture
def api(kube_api: tuple[FakeKubeApi, str], kube_config_env: Path, monkeypatch: Any) -> FakeKubeApi:
    monkeypatch.setattr(pods_module, "WATCH_TIMEOUT_S", 1)
    fake, _ = kube_api
    fake.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "labels": {}}})
    fake.put(pod("a"))
    fake.put(pod("b"))
    return fake


def node_labels(fake: FakeKubeApi) -> dict[str, str]:
    node = fake.get("v1", "Node", "node-a")
    assert node is not None
    return dict(node["metadata"].get("labels") or {})


async def scrape(port: int | None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as resp,
    ):
        text = await resp.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def sample(samples: dict[Any, float], name: str, **labels: str) -> list[float]:
    """Values of ``name`` whose labels include ``labels``."""
    return [v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items()]


# ---------------------------------------------------------------- item 5: one truth
async def test_the_agent_shows_the_health_the_plugin_advertises(
    short_tmp_path: Path, tmp_path: Path, api: FakeKubeApi
) -> None:
    health = {"event_timeout_s": 0.1, "recovery_s": 3600, "liveness_interval_s": 0}
    async with gpu_node(short_tmp_path, tmp_path, health=health) as node:
        node.pods.assign("ml", "a", "main", R, [f"{U1}::{u}" for u in range(25)])
        node.pods.assign("ml", "b", "main", R, [f"{U0}::{u}" for u in range(50)])
        async with AgentRuntime(node.config, open_api=open_api_client) as rt:
            agent = rt.agent
            await eventually(
                lambda: node_labels(api).get(NODE_LABEL_LARGEST_FREE_UNITS) == "75",
                what="GPU 1's 75 free units labelled while it is healthy",
            )
            # XID 79 on GPU 1: only the plugin sees the event; the agent still reads it fine.
            node.plugin.gpus.emit(GpuEvent(U1, "xid", xid=79))
            await node.kubelet.wait_devices(
                R, lambda d: {x.health for x in d if x.ID.startswith(U1)} == {"Unhealthy"}
            )
            await eventually(
                lambda: (
                    agent.snapshot is not None
                    and (g := agent.snapshot.gpu(U1)) is not None
                    and not g.healthy
                ),
                what="the agent follows the plugin",
            )
            assert agent.snapshot is not None
            gpu1 = agent.snapshot.gpu(U1)
            assert gpu1 is not None
            assert gpu1.problem == "XID 79"
            assert gpu1.health is not None
            assert gpu1.health.check == "xid"
            # Node labels: GPU 1's free units no longer count.
            await eventually(
                lambda: node_labels(api).get(NODE_LABEL_LARGEST_FREE_UNITS) == "50",
                what="largest-free-units without the withdrawn GPU",
            )
            # Metrics: the same state, check and reason.
            samples = await scrape(rt.metrics_port)
            assert sample(samples, "metagpu_gpu_healthy", gpu_uuid=U1) == [0]
            assert sample(samples, "metagpu_gpu_healthy", gpu_uuid=U0) == [1]
            assert sample(
                samples,
                "metagpu_gpu_health_info",
                gpu_uuid=U1,
                state="Unhealthy",
                check="xid",
                reason="XID 79",
            ) == [1]
            # mgctl get devices: the same reason.
            doc = device_list(agent.snapshot, HOST, node="node-a")
            item = next(i for i in doc["items"] if i["uuid"] == U1)
            assert item["health"] | {"since": None} == {
                "state": "Unhealthy",
                "reason": "XID 79",
                "check": "xid",
                "since": None,
                "source": "plugin",
            }
            assert "Unhealthy: XID 79" in render_devices(doc)


# ------------------------------------------------------ item 6: a lost GPU stays listed
async def test_a_lost_gpu_stays_listed_with_its_shares(
    short_tmp_path: Path, tmp_path: Path, api: FakeKubeApi
) -> None:
    health = {"event_timeout_s": 0.1, "recovery_s": 3600, "liveness_interval_s": 0.1}
    async with gpu_node(short_tmp_path, tmp_path, health=health) as node:
        node.pods.assign("ml", "a", "main", R, [f"{U1}::{u}" for u in range(25)])
        spec = gpus_file_spec(gpus(2))
        spec["gpus"][1]["lost"] = True  # falls off the bus; nothing announces it
        write_yaml(node.plugin.gpus_file, spec)
        await node.kubelet.wait_devices(
            R, lambda d: {x.health for x in d if x.ID.startswith(U1)} == {"Unhealthy"}
        )
        # The agent starts only now: it never saw GPU 1 itself, the plugin's board names it.
        async with AgentRuntime(node.config, open_api=open_api_client) as rt:
            agent = rt.agent
            result = await agent.next_cycle()
            snapshot = result.snapshot
            gpu1 = snapshot.gpu(U1)
            assert gpu1 is not None, [g.uuid for g in snapshot.gpus]
            assert (gpu1.index, gpu1.name, gpu1.memory_total_mib) == (
                1,
                "NVIDIA A100-SXM4-80GB",
                81920,
            )
            assert not gpu1.healthy
            assert "GPU lost" in (gpu1.problem or "")
            assert [(s.key.pod, s.units) for s in snapshot.shares if s.gpu_uuid == U1] == [
                ("a", 25)
            ]
            assert not any(g.uuid.startswith("GPU-unknown") for g in snapshot.gpus)
            samples = await scrape(rt.metrics_port)
            assert sample(samples, "metagpu_container_units", pod="a", gpu_uuid=U1) == [25]
            assert sample(samples, "metagpu_gpu_healthy", gpu_uuid=U1) == [0]
            assert sample(
                samples, "metagpu_gpu_liveness_checks_total", gpu_uuid=U1, result="failed"
            ) == [1]
            out = render_devices(device_list(snapshot, HOST, node="node-a"))
            row = next(line for line in out.splitlines() if U1 in line)
            assert "Unhealthy: GPU lost" in row
            assert "unknown" not in out.split("\n\n")[1]
            if os.geteuid() == 0:  # the installed mgctl, as host root (node scope)
                run = short_tmp_path / "run"
                code, out, err = await run_mgctl(
                    run / MGCTL_FILE_NAME,
                    "get",
                    "devices",
                    place=lambda pid: place_on_host(tmp_path / "proc", pid),
                    env={ENV_AGENT_SOCKET: str(run / AGENT_SOCKET_NAME)},
                )
                assert code == 0, err
                gpu_table, share_table = out.split("\n\n")[1:3]
                assert "Unhealthy: GPU lost" in next(x for x in gpu_table.splitlines() if U1 in x)
                assert [line.split()[:3] for line in share_table.splitlines()[1:]] == [
                    ["1", "ml", "a"]
                ]


# --------------------------------------------------- item 7: log noise, mgctl header
async def test_discovery_failure_is_logged_once_and_once_on_recovery(
    short_tmp_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, b = "GPU-aaaaaaaa-0000-4000-8000-000000000000", "GPU-bbbbbbbb-0000-4000-8000-000000000000"
    driver = FakePynvml([FakeGpu(a), FakeGpu(b, minor=1, bus_id="00000000:86:00.0")])
    monkeypatch.setattr(plugin.gpu.nvml, "pynvml", driver)
    driver.gpus[1].fail["nvmlDeviceGetName"] = 999  # every discovery fails on GPU 1
    (tmp_path / "proc").mkdir()
    config = PluginConfig.model_validate(
        {
            "device_plugins_dir": str(short_tmp_path / "dp"),
            "agent": {
                "socket_dir": str(short_tmp_path / "run"),
                "pod_resources_socket": str(short_tmp_path / "pr.sock"),
                "metrics_listen": "127.0.0.1:0",
                "proc_root": str(tmp_path / "proc"),
                "interval_s": 0.1,
            },
        }
    )
    with caplog.at_level(logging.INFO):
        async with (
            running_pod_resources(short_tmp_path / "pr.sock"),
            AgentRuntime(config, open_api=open_api_client, backend=NvmlBackend()) as rt,
        ):
            for _ in range(5):
                result = await rt.agent.next_cycle()
            assert not result.snapshot.gpu(b).healthy  # type: ignore[union-attr]
            driver.gpus[1].fail.clear()
            for _ in range(3):
                result = await rt.agent.next_cycle()
            assert result.snapshot.gpu(b).healthy  # type: ignore[union-attr]
            # mgctl's header: pods are not watched (no node name), which is not "STALE".
            header = render_devices(device_list(result.snapshot, HOST, node=None)).splitlines()[0]
            assert "pods not watched" in header
            assert "STALE" not in header
    failed = [r for r in caplog.records if "GPU discovery failed" in r.getMessage()]
    recovered = [r for r in caplog.records if "GPU discovery works again" in r.getMessage()]
    assert len(failed) == 1, [r.getMessage() for r in failed]
    assert failed[0].levelno == logging.ERROR
    assert len(recovered) == 1


def test_the_board_file_is_absent_until_a_plugin_publishes(tmp_path: Path) -> None:
    assert read_board(tmp_path / HEALTH_FILE_NAME) is None
