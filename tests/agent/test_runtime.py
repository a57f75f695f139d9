"""The whole agent as ``metagpu agent`` runs it: sockets, tasks, API server, kubelet.

Real transports everywhere: simulated GPUs from a YAML file, the PodResources
harness over gRPC, the fake API server over HTTP (pod watch, node labels,
Events), mgctl over the unix socket, /metrics over TCP.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from certs.kube import open_api_client
from plugin.agent import pods as pods_module
from plugin.agent.agent import AgentRuntime
from plugin.agent.permissions import PERMISSIONS
from plugin.api.config import PluginConfig
from plugin.api.permissions import verb_set
from plugin.api.resources import (
    AGENT_SOCKET_NAME,
    ENV_AGENT_SOCKET,
    MGCTL_FILE_NAME,
    NODE_LABEL_GPU_COUNT,
    NODE_LABEL_LARGEST_FREE_UNITS,
)
from tests.agent.builders import A100, gpu_uuid, place_in_container, place_on_host, pod, ref
from tests.agent.helpers import eventually, run_mgctl
from tests.harness.kube_api import FakeKubeApi
from tests.harness.podresources import FakePodResources, running_pod_resources

R = "cnvrg.io/metagpu"
U0, U1 = gpu_uuid(0), gpu_uuid(1)


class Env:
    def __init__(self, base: Path, tmp: Path, fake: FakeKubeApi) -> None:
        self.fake = fake
        self.proc_root = tmp / "proc"
        self.gpus_file = tmp / "gpus.yaml"
        self.kubelet_sock = base / "kubelet.sock"
        self.socket_dir = base / "run"
        self.children: list[asyncio.subprocess.Process] = []

    def write_gpus(self, processes: list[tuple[int, int]]) -> None:
        self.gpus_file.write_text(
            yaml.safe_dump(
                {
                    "live_pids_only": True,
                    "gpus": [
                        {
                            "uuid": U0,
                            "name": A100,
                            "memory_mib": 81920,
                            "processes": [{"pid": p, "used_memory_mib": m} for p, m in processes],
                        },
                        {"uuid": U1, "name": A100, "memory_mib": 81920},
                    ],
                }
            )
        )

    def config(self, **agent: Any) -> PluginConfig:
        return PluginConfig.model_validate(
            {
                "gpus_file": str(self.gpus_file),
                "agent": {
                    "node_name": "node-a",
                    "socket_dir": str(self.socket_dir),
                    "pod_resources_socket": str(self.kubelet_sock),
                    "metrics_listen": "127.0.0.1:0",
                    "proc_root": str(self.proc_root),
                    "interval_s": 0.2,
                    "memory_enforcement": "report",
                }
                | agent,
            }
        )


@pytest.fixture
async def env(
    short_tmp_path: Path,
    tmp_path: Path,
    kube_api: tuple[FakeKubeApi, str],
    kube_config_env: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Env]:
    monkeypatch.setattr(pods_module, "WATCH_TIMEOUT_S", 1)
    fake, _ = kube_api
    fake.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "labels": {}}})
    fake.put(pod("a"))
    fake.put(pod("b"))
    e = Env(short_tmp_path, tmp_path, fake)
    e.proc_root.mkdir()
    try:
        yield e
    finally:
        for c in e.children:
            if c.returncode is None:
                c.kill()
            await c.wait()


async def child(env: Env) -> int:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(120)"
    )
    env.children.append(proc)
    return proc.pid


def labels(fake: FakeKubeApi) -> dict[str, str]:
    node = fake.get("v1", "Node", "node-a")
    assert node is not None
    return dict(node["metadata"].get("labels") or {})


def label_patches(fake: FakeKubeApi) -> int:
    """Patches of the Node's labels (the GPU ledger annotation is written apart)."""
    return sum(
        1
        for r in fake.requests
        if r.resource == "nodes" and r.verb == "patch" and "labels" in r.body["metadata"]
    )


async def test_agent_end_to_end(env: Env) -> None:
    pa, pb = await child(env), await child(env)
    place_in_container(env.proc_root, pa, ref("a"))
    place_in_container(env.proc_root, pb, ref("b"))
    env.write_gpus([(pa, 30000), (pb, 1000)])  # a is over its 25-unit share

    async with running_pod_resources(env.kubelet_sock) as kubelet:
        kubelet.assign("ml", "a", "main", R, [f"{U0}::{u}" for u in range(25)])
        kubelet.assign("ml", "b", "main", R, [f"{U0}::{u}" for u in range(25, 75)])
        async with AgentRuntime(env.config(), open_api=open_api_client, version="1.2.3") as rt:
            agent = rt.agent
            await eventually(
                lambda: (
                    agent.snapshot is not None
                    and len(agent.snapshot.shares) == 2
                    and all(s.container_id for s in agent.snapshot.shares)
                ),
                what="both shares attributed",
            )
            await eventually(
                lambda: labels(env.fake).get(NODE_LABEL_LARGEST_FREE_UNITS) == "100",
                what="labels written",
            )
            assert labels(env.fake)[NODE_LABEL_GPU_COUNT] == "2"
            patches = label_patches(env.fake)
            for _ in range(3):
                await agent.next_cycle()
            assert label_patches(env.fake) == patches  # nothing changed, nothing written

            # a share of GPU 1 comes: GPU 0 has 25 free, GPU 1 now 40
            kubelet.assign("ml", "c", "main", R, [f"{U1}::{u}" for u in range(60)])
            await eventually(
                lambda: labels(env.fake).get(NODE_LABEL_LARGEST_FREE_UNITS) == "40",
                what="largest-free-units follows allocations",
            )
            assert label_patches(env.fake) == patches + 1

            # the overrun was reported on pod a, once (Events are written in the background)
            def events() -> list[tuple[str, str]]:
                found = env.fake.objects("events.k8s.io/v1", "Event", "ml")
                return [(e["reason"], e["regarding"]["name"]) for e in found]

            await eventually(lambda: events() != [], what="the Event is written")
            assert events() == [("GpuMemoryOverLimit", "a")]

            # metrics over HTTP
            url = f"http://127.0.0.1:{rt.metrics_port}/metrics"
            async with aiohttp.ClientSession() as session, session.get(url) as resp:
                text = await resp.text()
            samples = {
                (s.name, s.labels.get("pod"), s.labels.get("gpu_uuid")): s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
            }
            assert samples[("metagpu_container_memory_used_bytes", "a", U0)] == 30000 * 2**20
            assert samples[("metagpu_container_memory_over_limit", "a", U0)] == 1

            # mgctl, the installed program, from container b and from the host
            mgctl = env.socket_dir / MGCTL_FILE_NAME
            sock = {ENV_AGENT_SOCKET: str(env.socket_dir / AGENT_SOCKET_NAME)}
            code, out, err = await run_mgctl(
                mgctl,
                "get",
                "processes",
                "-o",
                "json",
                place=lambda pid: place_in_container(env.proc_root, pid, ref("b")),
                env=sock,
            )
            assert code == 0, err
            assert [p["pid"] for p in json.loads(out)["items"]] == [pb]
            code, out, err = await run_mgctl(
                mgctl,
                "get",
                "processes",
                "-o",
                "json",
                place=lambda pid: place_on_host(env.proc_root, pid),
                env=sock,
            )
            if os.geteuid() == 0:
                assert code == 0, err
                assert {p["pid"] for p in json.loads(out)["items"]} == {pa, pb}
            else:
                assert code == 3, err

            # every verb the agent used is declared, and nothing more
            await eventually(
                lambda: any(r.verb == "watch" for r in env.fake.requests), what="a watch ended"
            )
            assert env.fake.verbs_used() == verb_set(PERMISSIONS)
    assert not (env.socket_dir / AGENT_SOCKET_NAME).exists()  # removed on stop


async def test_restart_reads_allocations_with_nothing_kept(env: Env) -> None:
    env.write_gpus([])
    async with running_pod_resources(env.kubelet_sock) as kubelet:
        kubelet.assign("ml", "a", "main", R, [f"{U0}::{u}" for u in range(30)])
        async with AgentRuntime(env.config(), open_api=open_api_client) as first:
            result = await first.agent.next_cycle()
            assert result.snapshot.gpus[0].units_allocated == 30
        kubelet.assign("ml", "b", "main", R, [f"{U1}::{u}" for u in range(10)])
        async with AgentRuntime(env.config(), open_api=open_api_client) as second:
            result = await second.agent.next_cycle()
            # a brand-new agent: allocations come from the kubelet, not from memory
            assert [g.units_allocated for g in result.snapshot.gpus] == [30, 10]


async def test_degrades_without_kubelet_and_api(env: Env) -> None:
    env.write_gpus([])
    env.fake.forbid("list", "pods")  # RBAC missing
    env.fake.forbid("patch", "nodes")
    async with AgentRuntime(env.config(), open_api=open_api_client) as rt:
        result = await rt.agent.next_cycle()
        assert {"podresources", "pods"} <= result.snapshot.stale
        assert len(result.snapshot.gpus) == 2  # still serving what it knows
        assert rt.agent.problem("podresources") is not None
        assert "does not exist" in (rt.agent.problem("podresources") or "")
        # the kubelet appears: the next cycles read it
        async with running_pod_resources(env.kubelet_sock, FakePodResources()) as kubelet:
            kubelet.assign("ml", "a", "main", R, [f"{U0}::0"])
            await eventually(
                lambda: (
                    rt.agent.snapshot is not None
                    and "podresources" not in rt.agent.snapshot.stale
                    and rt.agent.snapshot.gpus[0].units_allocated == 1
                ),
                what="recovered",
            )
    assert labels(env.fake) == {}  # forbidden: nothing was written


async def test_runs_without_a_node_name(env: Env) -> None:
    env.write_gpus([])
    async with AgentRuntime(env.config(node_name=None), open_api=open_api_client) as rt:
        result = await rt.agent.next_cycle()
        # Not watched is not stale (issue 15, item 7): nothing is failing.
        assert "pods" not in result.snapshot.stale
        assert not result.snapshot.pods_watched
    assert env.fake.requests == []
