"""Preemption for fractions end to end: the extender's HTTP verbs, its caches watching the
in-test API server (tests.harness.kube_api, with the Eviction subresource and budgets), and
its evictions, Events and Bindings.

The cluster of issue 27: one node, two GPUs of 100 units, each 60 held by a low-priority pod
(low-a on GPU 0, low-b on GPU 1). A pod of 70 units fits no single GPU; kube-scheduler counts
80 free units and finds nothing to evict, so the extender preempts itself (the filter path),
or, where the node's total is short, names the victims through ``preemptVerb``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from certs.kube import open_api_client
from plugin.api.permissions import verb_set
from plugin.api.scheduling import (
    ANNOTATION_ASSIGNED_GPUS,
    GpuHolder,
    GpuLedgerEntry,
    NodeLedger,
    PodAssignment,
)
from plugin.extender.binder import Binder
from plugin.extender.bindings import BindingClient
from plugin.extender.cache import LedgerCache
from plugin.extender.config import ExtenderConfig, PreemptionConfig
from plugin.extender.evictor import Evictor
from plugin.extender.metrics import ExtenderMetrics
from plugin.extender.permissions import PERMISSIONS, PREEMPTION
from plugin.extender.server import ExtenderState, running_extender
from plugin.extender.service import ExtenderCore
from tests.extender.builders import RESOURCE, node_object
from tests.harness.kube_api import FakeKubeApi
from tests.webhook.waiting import eventually

NODE = "gpu-1"
NS = "ml"


@dataclass
class Extender:
    core: ExtenderCore
    evictor: Evictor
    metrics: ExtenderMetrics
    url: str
    session: aiohttp.ClientSession

    async def post(self, verb: str, body: Any) -> Any:
        async with self.session.post(f"{self.url}/{verb}", data=json.dumps(body)) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.json()

    async def filter(self, pod: dict[str, Any]) -> Any:
        return await self.post("filter", {"Pod": pod, "NodeNames": [NODE]})

    async def bind(self, pod: dict[str, Any]) -> Any:
        meta = pod["metadata"]
        return await self.post(
            "bind",
            {
                "PodName": meta["name"],
                "PodNamespace": meta["namespace"],
                "PodUID": meta["uid"],
                "Node": NODE,
            },
        )


@asynccontextmanager
async def running(kubeconfig: Path) -> AsyncIterator[Extender]:
    config = ExtenderConfig(
        listen="127.0.0.1:0", preemption=PreemptionConfig(handover_s=0, spare_s=600)
    )
    core = ExtenderCore(resource=RESOURCE, preemption=config.preemption)
    metrics = ExtenderMetrics()
    async with AsyncExitStack() as stack:
        api, _ = await stack.enter_async_context(open_api_client(kubeconfig=kubeconfig))
        cache = await stack.enter_async_context(LedgerCache(api, core, watch_timeout_s=1))
        await asyncio.wait_for(cache.wait_synced(), 10)
        await eventually(lambda: core.budgets_ready)
        bindings = await stack.enter_async_context(
            BindingClient(api, connections=config.max_binds_in_flight, timeout_s=5)
        )
        binder = Binder(bindings, core, in_flight=cache.binds_in_flight)
        evictor = await stack.enter_async_context(Evictor(api, core, metrics, timeout_s=5))
        state = ExtenderState(config, core, cache, binder, metrics, evictor=evictor)
        server = await stack.enter_async_context(running_extender(state))
        session = await stack.enter_async_context(aiohttp.ClientSession())
        yield Extender(core, evictor, metrics, server.url, session)


def a_pod(
    name: str,
    units: int,
    *,
    priority: int,
    node: str | None = None,
    started: str = "",
    never: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "metagpu-scheduler",
        "priority": priority,
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "resources": {"limits": {RESOURCE: str(units)}, "requests": {RESOURCE: str(units)}},
            }
        ],
    }
    if never:
        spec["preemptionPolicy"] = "Never"
    status: dict[str, Any] = {"phase": "Pending"}
    if node:
        spec["nodeName"] = node
        status = {
            "phase": "Running",
            "startTime": started,
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "labels": {"app": name}},
        "spec": spec,
        "status": status,
    }


def node_ledger(holders: Sequence[Sequence[tuple[str, int]]]) -> NodeLedger:
    """GPU i held by the pods ``holders[i]`` ((name, units) each), as the agent reports."""
    return NodeLedger(
        resource=RESOURCE,
        units_per_gpu=100,
        gpus=tuple(
            GpuLedgerEntry(
                uuid=f"GPU-{i}",
                index=i,
                units=100,
                holders=tuple(
                    GpuHolder(pod_uid=f"uid-{n}", namespace=NS, pod=n, container="main", units=u)
                    for n, u in held
                ),
            )
            for i, held in enumerate(holders)
        ),
    )


def budget(name: str, app: str, *, allowed: int) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": NS, "generation": 1},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
        "status": {
            "observedGeneration": 1,
            "disruptionsAllowed": allowed,
            "currentHealthy": 1,
            "desiredHealthy": 1,
            "expectedPods": 1,
        },
    }


def two_low_pods(api: FakeKubeApi) -> None:
    """60 + 60 of priority 0; low-a started first (the more important of equals)."""
    api.put(node_object(NODE, node_ledger([[("low-a", 60)], [("low-b", 60)]])))
    api.put(a_pod("low-a", 60, priority=0, node=NODE, started="2024-01-01T00:00:00Z"))
    api.put(a_pod("low-b", 60, priority=0, node=NODE, started="2024-01-01T00:05:00Z"))


def evictions(api: FakeKubeApi) -> list[str]:
    return [r.name or "" for r in api.requests if r.subresource == "eviction"]


def events(api: FakeKubeApi, reason: str) -> list[dict[str, Any]]:
    return [e for e in api.objects("v1", "Event", NS) if e.get("reason") == reason]


def terminating(api: FakeKubeApi, name: str) -> bool:
    pod = api.get("v1", "Pod", name, NS)
    return pod is not None and bool(pod["metadata"].get("deletionTimestamp"))


@pytest.fixture
async def cluster(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> AsyncIterator[tuple[FakeKubeApi, Extender]]:
    api, _ = kube_api
    two_low_pods(api)
    async with running(kube_config_env) as ext:
        await eventually(lambda: len(ext.core.directory) == 2)
        yield api, ext


# ------------------------------------------------------ the extender's own preemption
async def test_70_against_60_and_60_evicts_exactly_one_and_binds_on_its_gpu(
    cluster: tuple[FakeKubeApi, Extender],
) -> None:
    api, ext = cluster
    high = api.put(a_pod("high", 70, priority=1000))
    result = await ext.filter(high)
    assert result["NodeNames"] == []
    assert "metagpu is preempting 1 lower-priority pod(s) (ml/low-b)" in result["FailedNodes"][NODE]
    assert "GPU-1" in result["FailedNodes"][NODE]
    await ext.evictor.idle()
    assert evictions(api) == ["low-b"]
    assert terminating(api, "low-b")
    assert not terminating(api, "low-a")
    # Events: the victim, with the preemptor as related, and the preemptor.
    (preempted,) = events(api, "Preempted")
    assert preempted["involvedObject"]["name"] == "low-b"
    assert preempted["related"]["name"] == "high"
    assert "Preempted by pod ml/high" in preempted["message"]
    (preempting,) = events(api, "Preempting")
    assert preempting["involvedObject"]["uid"] == "uid-high"
    assert "ml/low-b" in preempting["message"]
    # While low-b terminates, the preemptor waits and no second preemption starts.
    again = await ext.filter(high)
    assert again["NodeNames"] == []
    await ext.evictor.idle()
    assert evictions(api) == ["low-b"]
    # The kubelet finishes low-b: the API deletes it; the agent has not reported yet.
    api.remove("v1", "Pod", "low-b", NS)
    await eventually(lambda: ext.core.directory.get("uid-low-b") is None)
    assert (await ext.filter(high))["NodeNames"] == [NODE]
    assert (await ext.bind(high)) == {"Error": ""}
    stored = api.get("v1", "Pod", "high", NS)
    assert stored is not None
    assert stored["spec"]["nodeName"] == NODE
    placed = PodAssignment.model_validate_json(
        stored["metadata"]["annotations"][ANNOTATION_ASSIGNED_GPUS]
    )
    assert [c.gpus for c in placed.containers] == [{"GPU-1": 70}]
    assert ext.core.ledger.nomination("uid-high") is None  # bound: the assumption holds it
    # Only what the chart grants: the cache's and binder's verbs, and preemption's own.
    used = api.verbs_used()
    assert used <= verb_set(PERMISSIONS) | verb_set(PREEMPTION)
    assert verb_set(PREEMPTION) <= used
    exposition = ext.metrics.exposition().decode()
    assert 'metagpu_extender_evictions_total{outcome="evicted"} 1.0' in exposition
    assert 'metagpu_extender_preemptions_total{outcome="evicted",path="extender"} 1.0' in (
        exposition
    )


async def test_a_budget_that_forbids_disrupting_one_low_pod_makes_the_other_the_victim(
    cluster: tuple[FakeKubeApi, Extender],
) -> None:
    api, ext = cluster
    api.put(budget("keep-low-b", "low-b", allowed=0))
    await eventually(lambda: len(ext.core.budgets) == 1)
    high = api.put(a_pod("high", 70, priority=1000))
    result = await ext.filter(high)
    assert "(ml/low-a)" in result["FailedNodes"][NODE]
    await ext.evictor.idle()
    assert evictions(api) == ["low-a"]
    assert terminating(api, "low-a")
    assert not terminating(api, "low-b")


async def test_a_budget_the_api_enforces_stops_the_preemption_and_spares_that_pod(
    cluster: tuple[FakeKubeApi, Extender],
) -> None:
    """A budget whose spec changed and that its controller has not processed yet: its
    status still allows a disruption, so the extender chooses low-b, but the API server
    answers 429. Nothing else is evicted, the room is released, the pod is told, and the
    next attempt spares low-b."""
    api, ext = cluster
    pending = budget("keep-low-b", "low-b", allowed=1)
    pending["metadata"]["generation"] = 2
    api.put(pending)
    await eventually(lambda: len(ext.core.budgets) == 1)
    high = api.put(a_pod("high", 70, priority=1000))
    await ext.filter(high)
    await ext.evictor.idle()
    assert evictions(api) == ["low-b"]
    assert [r.status for r in api.requests if r.subresource == "eviction"] == [429]
    assert not terminating(api, "low-b")
    assert ext.core.ledger.nomination("uid-high") is None
    (failed,) = events(api, "PreemptionFailed")
    assert (
        "HTTP 429: Cannot evict pod as it would violate the pod's disruption budget."
        in (failed["message"])
    )
    assert 'metagpu_extender_evictions_total{outcome="refused"} 1.0' in (
        ext.metrics.exposition().decode()
    )
    await ext.filter(high)
    await ext.evictor.idle()
    assert evictions(api) == ["low-b", "low-a"]
    assert terminating(api, "low-a")


@pytest.mark.parametrize(
    ("priority", "never"),
    [
        pytest.param(0, False, id="equal-priority"),
        pytest.param(-5, False, id="lower-priority"),
        pytest.param(1000, True, id="preemptionPolicy-Never"),
    ],
)
async def test_no_victim(cluster: tuple[FakeKubeApi, Extender], priority: int, never: bool) -> None:
    api, ext = cluster
    waiting = api.put(a_pod("waiting", 70, priority=priority, never=never))
    result = await ext.filter(waiting)
    assert result["NodeNames"] == []
    assert "preempting" not in result["FailedNodes"][NODE]
    await ext.evictor.idle()
    assert evictions(api) == []
    assert ext.core.ledger.nominations() == []
    preempt = await ext.post(
        "preempt",
        {
            "Pod": waiting,
            "NodeNameToMetaVictims": {
                NODE: {"Pods": [{"UID": "uid-low-a"}, {"UID": "uid-low-b"}], "NumPDBViolations": 0}
            },
        },
    )
    assert preempt == {"NodeNameToMetaVictims": {}}


async def test_the_freed_units_are_not_given_to_a_lower_priority_pod_while_the_preemptor_waits(
    cluster: tuple[FakeKubeApi, Extender],
) -> None:
    api, ext = cluster
    high = api.put(a_pod("high", 70, priority=1000))
    await ext.filter(high)
    await ext.evictor.idle()
    api.remove("v1", "Pod", "low-b", NS)
    # The agent reports GPU 1 empty now.
    api.put(node_object(NODE, node_ledger([[("low-a", 60)], []])))
    await eventually(lambda: [h.pod for h in ext.core.ledger.holdings(NODE)] == ["low-a"])
    third = api.put(a_pod("third", 50, priority=0))
    refused = await ext.filter(third)
    assert refused["NodeNames"] == []
    assert "no single GPU has 50 free units (largest 40" in refused["FailedNodes"][NODE]
    assert "no single GPU has 50 free units" in (await ext.bind(third))["Error"]
    small = api.put(a_pod("small", 30, priority=0))
    assert (await ext.filter(small))["NodeNames"] == [NODE]  # 100 - 70 held = 30 left
    assert (await ext.filter(high))["NodeNames"] == [NODE]
    assert (await ext.bind(high)) == {"Error": ""}
    assert evictions(api) == ["low-b"]  # the third pod preempted nothing (equal priority)


# ------------------------------------------------------------ kube-scheduler's preemption
async def test_preempt_verb_names_the_victim_on_the_right_gpu_and_holds_the_room(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> None:
    """The node's total is short (10 + 40 free): kube-scheduler's dry run picks low-c by
    totals, which frees room on GPU 0 where 70 never fits. The extender answers low-b."""
    api, _ = kube_api
    api.put(node_object(NODE, node_ledger([[("low-a", 60), ("low-c", 30)], [("low-b", 60)]])))
    api.put(a_pod("low-a", 60, priority=0, node=NODE, started="2024-01-01T00:00:00Z"))
    api.put(a_pod("low-b", 60, priority=0, node=NODE, started="2024-01-01T00:05:00Z"))
    api.put(a_pod("low-c", 30, priority=0, node=NODE, started="2024-01-01T00:09:00Z"))
    api.put(a_pod("web", 0, priority=0, node=NODE))
    async with running(kube_config_env) as ext:
        await eventually(lambda: len(ext.core.directory) == 3)
        high = api.put(a_pod("high", 70, priority=1000))
        answer = await ext.post(
            "preempt",
            {
                "Pod": high,
                "NodeNameToMetaVictims": {
                    NODE: {
                        "Pods": [{"UID": "uid-low-c"}, {"UID": "uid-web"}],
                        "NumPDBViolations": 0,
                    },
                    "elsewhere": {"Pods": [{"UID": "x"}], "NumPDBViolations": 0},
                },
            },
        )
        # low-b instead of low-c; web (no GPU units: chosen for CPU) kept; the unknown
        # node dropped rather than answered with no victims.
        assert answer == {
            "NodeNameToMetaVictims": {
                NODE: {"Pods": [{"UID": "uid-low-b"}, {"UID": "uid-web"}], "NumPDBViolations": 0}
            }
        }
        assert evictions(api) == []  # kube-scheduler deletes its victims itself
        # kube-scheduler deletes low-b: the room on GPU 1 is held for high from then on.
        api.remove("v1", "Pod", "low-b", NS)
        await eventually(lambda: ext.core.ledger.nomination("uid-high") is not None)
        held = ext.core.ledger.nomination("uid-high")
        assert held is not None
        assert dict(held.taken) == {"GPU-1": 70}
        third = api.put(a_pod("third", 50, priority=0))
        assert (await ext.filter(third))["NodeNames"] == []
        assert (await ext.filter(high))["NodeNames"] == [NODE]


async def test_a_malformed_preempt_request_is_a_400(
    cluster: tuple[FakeKubeApi, Extender],
) -> None:
    _, ext = cluster
    async with ext.session.post(f"{ext.url}/preempt", data=json.dumps([1])) as resp:
        assert resp.status == 400
        assert "ExtenderPreemptionArgs" in await resp.text()
