"""The agent sees the whole GPU: another resource's claim on a GPU metagpu serves, end to end.

Real transports as in :mod:`tests.agent.test_runtime`: the PodResources harness
answers ``GetAllocatableResources`` and ``List`` over gRPC in the kubelet's
message shapes, Events go to the fake API server, metrics are scraped over HTTP
and mgctl runs as a real process against the agent's socket.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from certs.kube import open_api_client
from plugin.agent.agent import AgentRuntime
from plugin.agent.permissions import PERMISSIONS
from plugin.api.permissions import verb_set
from plugin.api.resources import (
    AGENT_SOCKET_NAME,
    ENV_AGENT_SOCKET,
    MGCTL_FILE_NAME,
    NODE_LABEL_LARGEST_FREE_UNITS,
)
from tests.agent.builders import place_on_host
from tests.agent.helpers import eventually, run_mgctl
from tests.agent.test_runtime import U0, U1, Env, env, labels  # noqa: F401 - env is a fixture
from tests.harness.podresources import running_pod_resources

R = "cnvrg.io/metagpu"

SHAPES = [
    pytest.param("nvidia.com/gpu", [U1], id="whole-gpu-by-uuid"),
    pytest.param("nvidia.com/gpu", ["1"], id="whole-gpu-by-index"),
    pytest.param("nvidia.com/mig-1g.10gb", ["1:0"], id="mig-index"),
    pytest.param("nvidia.com/gpu.shared", [f"{U1}::2"], id="time-sliced-replica"),
]


def node_events(e: Env) -> list[dict[str, Any]]:
    return [
        ev
        for ev in e.fake.objects("events.k8s.io/v1", "Event", "default")
        if ev["regarding"]["kind"] == "Node"
    ]


async def scrape(port: int | None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    url = f"http://127.0.0.1:{port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        text = await resp.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def value(samples: dict[Any, float], name: str, **want: str) -> list[float]:
    return [
        v
        for (n, lbls), v in samples.items()
        if n == name and all(dict(lbls).get(k) == w for k, w in want.items())
    ]


@pytest.mark.parametrize(("other", "device_ids"), SHAPES)
async def test_a_gpu_another_resource_holds_has_no_free_units_and_its_shares_conflict(
    env: Env,  # noqa: F811 - the fixture
    other: str,
    device_ids: list[str],
) -> None:
    env.write_gpus([])
    async with running_pod_resources(env.kubelet_sock) as kubelet:
        kubelet.advertise(R, [f"{u}::{n}" for u in (U0, U1) for n in range(100)])
        kubelet.advertise(other, device_ids)
        # Pod a got 25 units of GPU 1 from metagpu; pod x got GPU 1 from the other plugin.
        kubelet.assign("ml", "a", "main", R, [f"{U1}::{n}" for n in range(25)])
        kubelet.assign("ml", "b", "main", R, [f"{U0}::{n}" for n in range(50)])
        kubelet.assign("team", "x", "cuda", other, device_ids)
        async with AgentRuntime(env.config(), open_api=open_api_client) as rt:
            agent = rt.agent
            result = await agent.next_cycle()
            snapshot = result.snapshot
            gpu1, gpu0 = snapshot.gpu(U1), snapshot.gpu(U0)
            assert gpu1 is not None
            assert gpu0 is not None
            assert gpu1.units_allocated == 25
            assert gpu1.units_free == 0  # held by another resource: nothing is free
            assert gpu0.units_free == 50
            assert [c.describe() for c in snapshot.conflicts] == [
                f"ml/a/main holds 25 unit(s) of {R} on GPU 1 ({U1}), which team/x/cuda "
                f"({other} {device_ids[0]}) also holds"
            ]

            # Node labels never call GPU 1 free: the largest free share is GPU 0's.
            await eventually(
                lambda: labels(env.fake).get(NODE_LABEL_LARGEST_FREE_UNITS) == "50",
                what="largest-free-units ignores the contested GPU",
            )

            # One Event on the Node, naming the other resource and both pods.
            await eventually(lambda: node_events(env) != [], what="the Node Event")
            for _ in range(3):
                await agent.next_cycle()
            (event,) = node_events(env)
            assert event["reason"] == "GpuOwnershipConflict"
            assert event["type"] == "Warning"
            assert event["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": "node-a"}
            assert other in event["note"]
            assert "ml/a/main" in event["note"]
            assert "team/x/cuda" in event["note"]

            # Metrics count it.
            samples = await scrape(rt.metrics_port)
            assert value(samples, "metagpu_gpu_units_free", gpu_uuid=U1) == [0]
            assert value(samples, "metagpu_gpu_units_free", gpu_uuid=U0) == [50]
            assert value(
                samples, "metagpu_gpu_foreign_claim", gpu_uuid=U1, other_resource=other
            ) == [1]
            assert value(samples, "metagpu_gpu_foreign_claim", gpu_uuid=U0) == []
            assert value(
                samples,
                "metagpu_share_conflict",
                pod="a",
                gpu_uuid=U1,
                other_resource=other,
                other_namespace="team",
                other_pod="x",
                other_container="cuda",
            ) == [25]

            # mgctl shows it, both pods named, in the table and in JSON.
            mgctl = env.socket_dir / MGCTL_FILE_NAME
            sock = {ENV_AGENT_SOCKET: str(env.socket_dir / AGENT_SOCKET_NAME)}
            host = lambda pid: place_on_host(env.proc_root, pid)  # noqa: E731
            code, out, err = await run_mgctl(mgctl, "get", "devices", place=host, env=sock)
            assert code == 0, err
            assert f"Withdrawn: also {other}" in out
            assert (
                f"CONFLICT: ml/a/main holds 25 unit(s); team/x/cuda holds it through {other}"
                in (out)
            )
            code, out, err = await run_mgctl(
                mgctl, "get", "devices", "-o", "json", place=host, env=sock
            )
            assert code == 0, err
            doc = {g["uuid"]: g for g in json.loads(out)["items"]}
            assert doc[U1]["unitsFree"] == 0
            assert doc[U1]["otherOwner"]["resources"] == [other]
            assert doc[U1]["otherOwner"]["conflicts"][0]["otherPod"] == "x"
            assert doc[U0]["otherOwner"] is None

            # The other plugin lets go: GPU 1 is free again, and the Node is told once.
            kubelet.release("team", "x")
            del kubelet.allocatable[other]
            await eventually(
                lambda: labels(env.fake).get(NODE_LABEL_LARGEST_FREE_UNITS) == "75",
                what="GPU 1's free units come back",
            )
            await eventually(lambda: len(node_events(env)) == 2, what="the resolved Event")
            assert sorted(e["reason"] for e in node_events(env)) == [
                "GpuOwnershipConflict",
                "GpuOwnershipResolved",
            ]
            assert env.fake.verbs_used() <= verb_set(PERMISSIONS)


async def test_a_gpu_metagpu_does_not_serve_is_no_conflict(env: Env) -> None:  # noqa: F811
    """Layout (b): NVIDIA's plugin serves GPU 1, metagpu only GPU 0. GPU 1 shows who
    serves it, but no Event, no conflict and no withdrawn units: that is the layout."""
    env.write_gpus([])
    config = env.config().model_copy(
        update={"resources": [env.config().resources[0].model_copy(update={"gpus": [0]})]}
    )
    async with running_pod_resources(env.kubelet_sock) as kubelet:
        kubelet.advertise(R, [f"{U0}::{n}" for n in range(100)])
        kubelet.advertise("nvidia.com/gpu", [U1])
        kubelet.assign("team", "x", "cuda", "nvidia.com/gpu", [U1])
        async with AgentRuntime(config, open_api=open_api_client) as rt:
            await rt.agent.next_cycle()
            result = await rt.agent.next_cycle()
    gpu1 = result.snapshot.gpu(U1)
    assert gpu1 is not None
    assert gpu1.claim is not None
    assert not gpu1.contested
    assert result.snapshot.conflicts == ()
    assert node_events(env) == []
