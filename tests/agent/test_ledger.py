"""The node's GPU ledger: built from a snapshot (pure), bounded in size, and published on
the Node by the running agent against the fake API server and the PodResources harness,
only when it changed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from certs.kube import open_api_client
from plugin.agent import pods as pods_module
from plugin.agent.accounting import Allocation, build_snapshot
from plugin.agent.agent import AgentRuntime
from plugin.agent.kube import LedgerPublisher
from plugin.agent.ledger import AGGREGATE_POD_UID, build_ledger, encode_ledger
from plugin.agent.permissions import PERMISSIONS
from plugin.api.config import PluginConfig
from plugin.api.permissions import verb_set
from plugin.api.scheduling import ANNOTATION_GPU_LEDGER, ANNOTATION_LEDGER_REFRESH, NodeLedger
from plugin.gpu.mps import MpsNode, MpsStatus
from tests.agent.builders import A100, gpu, gpu_uuid, index_of, key, pod, pod_uid, reading
from tests.agent.helpers import eventually
from tests.harness.kube_api import FakeKubeApi
from tests.harness.podresources import running_pod_resources

R = "cnvrg.io/metagpu"
U0, U1 = gpu_uuid(0), gpu_uuid(1)


def devices(uuid: str, units: range) -> tuple[str, ...]:
    return tuple(f"{uuid}::{u}" for u in units)


def snapshot_of(allocations: list[Allocation], *, sick: bool = False, pods: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    g1 = gpu(1, unhealthy_reason="XID 79: fell off the bus") if sick else gpu(1)
    return build_snapshot(
        [reading(gpu(0)), reading(g1)],
        allocations,
        {},
        directory=index_of(*(pod(p) for p in pods)),
        units_per_gpu=100,
        gpu_resources={U0: R, U1: R},
        resources=[R],
        taken_at=0.0,
    )


def test_ledger_holds_capacity_health_and_the_kubelets_allocations() -> None:
    snap = snapshot_of(
        [
            Allocation(key("a"), R, devices(U0, range(0, 30))),
            Allocation(key("b", "side"), R, devices(U0, range(30, 50))),
            Allocation(key("b", "side"), "other.io/gpu", ("x::1",)),  # another resource
        ],
        sick=True,
        pods=("a",),
    )
    uids = {("ml", "b"): "uid-b"}
    ledger = build_ledger(
        snap, resource=R, id_strategy="uuid", pod_uid=lambda ns, p: uids.get((ns, p))
    )
    assert ledger.resource == R
    assert ledger.units_per_gpu == 100
    g0, g1 = ledger.gpus
    assert (g0.uuid, g0.index, g0.units, g0.healthy, g0.used) == (U0, 0, 100, True, 50)
    assert [(h.pod_uid, h.pod, h.container, h.units) for h in g0.holders] == [
        (pod_uid("ml/a"), "a", "main", 30),  # from the running container's pod
        ("uid-b", "b", "side", 20),  # from the pod watch
    ]
    assert (g1.healthy, g1.reason, g1.holders) == (False, "XID 79: fell off the bus", ())
    # the extender breaks ties by NUMA node, as the plugin does (place_units)
    assert [g.numa for g in ledger.gpus] == [0, 0]


def test_a_pod_the_watch_has_not_seen_gets_a_placeholder_that_is_no_uid() -> None:
    snap = snapshot_of([Allocation(key("new"), R, devices(U1, range(10)))])
    ledger = build_ledger(snap, resource=R, id_strategy="index", pod_uid=lambda ns, p: None)
    assert [g.uuid for g in ledger.gpus] == ["0", "1"]  # the IDs the plugin advertises
    (holder,) = ledger.gpus[1].holders
    assert holder.pod_uid == "ml/new"


def test_gpus_of_other_resources_are_not_in_the_ledger() -> None:
    snap = build_snapshot(
        [reading(gpu(0)), reading(gpu(1))],
        [],
        {},
        directory=index_of(),
        units_per_gpu=100,
        gpu_resources={U0: R, U1: "other.io/metagpu"},
        resources=[R, "other.io/metagpu"],
        taken_at=0.0,
    )
    ledger = build_ledger(snap, resource=R, id_strategy="uuid", pod_uid=lambda ns, p: None)
    assert [g.uuid for g in ledger.gpus] == [U0]


def many_holders(count: int) -> NodeLedger:
    allocations = [
        Allocation(key(f"pod-{n:04d}", f"c{c}"), R, devices(U0 if n % 2 else U1, range(n, n + 1)))
        for n in range(count)
        for c in range(2)
    ]
    # two containers of one pod on one GPU would share device IDs here; the
    # snapshot only counts them, which is all the size bound cares about
    snap = snapshot_of(allocations)
    return build_ledger(snap, resource=R, id_strategy="uuid", pod_uid=lambda ns, p: f"uid-{p}")


@pytest.mark.parametrize(
    ("max_bytes", "expect"),
    [
        pytest.param(1 << 20, "as is", id="fits-as-is"),
        pytest.param(9000, "per pod", id="merged-per-pod"),
        pytest.param(1024, "aggregate", id="one-holder-per-gpu"),
    ],
)
def test_the_encoded_ledger_stays_under_its_bound_and_keeps_units_exact(
    max_bytes: int, expect: str
) -> None:
    ledger = many_holders(60)
    text = encode_ledger(ledger, max_bytes=max_bytes)
    assert len(text.encode()) <= max_bytes
    back = NodeLedger.model_validate_json(text)
    assert [g.used for g in back.gpus] == [g.used for g in ledger.gpus]
    holders = sum(len(g.holders) for g in back.gpus)
    if expect == "as is":
        assert back == ledger
    elif expect == "per pod":
        assert holders == 60
        assert all("+" in h.container for g in back.gpus for h in g.holders)
    else:
        assert [h.pod_uid for g in back.gpus for h in g.holders] == [AGGREGATE_POD_UID] * 2


def test_a_bound_too_small_for_one_holder_per_gpu_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"raise agent\.ledger_max_bytes"):
        encode_ledger(many_holders(4), max_bytes=100)


# ------------------------------------------------------------ the running agent
@pytest.fixture
async def api(kube_config_env: Path) -> AsyncIterator[client.ApiClient]:
    async with open_api_client() as (api, _source):
        yield api


def node_ledger(fake: FakeKubeApi) -> NodeLedger | None:
    node = fake.get("v1", "Node", "node-a")
    assert node is not None
    text = (node["metadata"].get("annotations") or {}).get(ANNOTATION_GPU_LEDGER)
    return None if text is None else NodeLedger.model_validate_json(text)


def ledger_patches(fake: FakeKubeApi) -> list[dict[str, Any]]:
    return [
        r.body
        for r in fake.requests
        if r.resource == "nodes"
        and r.verb == "patch"
        and ANNOTATION_GPU_LEDGER in json.dumps(r.body)
    ]


async def test_the_publisher_writes_only_changes_and_retries_after_a_failure(
    kube_api: tuple[FakeKubeApi, str], api: client.ApiClient
) -> None:
    fake, _ = kube_api
    fake.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    publisher = LedgerPublisher(api, "node-a", max_bytes=65536, refresh_s=300)
    empty = snapshot_of([])
    first = build_ledger(empty, resource=R, id_strategy="uuid", pod_uid=lambda ns, p: None)
    assert await publisher.publish(first)
    assert node_ledger(fake) == first
    later = first.model_copy(update={"observed_at": "2026-11-25T10:00:00Z"})
    assert not await publisher.publish(later)  # only the time moved: nothing sent
    taken = build_ledger(
        snapshot_of([Allocation(key("a"), R, devices(U0, range(40)))]),
        resource=R,
        id_strategy="uuid",
        pod_uid=lambda ns, p: None,
    )
    fake.fail_next("patch", "nodes", status=500, reason="InternalError", message="etcd")
    assert not await publisher.publish(taken)
    assert await publisher.publish(taken)  # the failed write is not taken as written
    assert node_ledger(fake) == taken
    assert fake.verbs_used() == {("", "nodes", "patch")}  # never a read of the Node


async def test_an_unchanged_ledger_is_rewritten_when_its_refresh_is_due(
    kube_api: tuple[FakeKubeApi, str], api: client.ApiClient
) -> None:
    """The agent promises (annotation metagpu.io/gpu-ledger-refresh-s) to rewrite its ledger
    within refresh_s even when nothing changed, so the extender can tell a ledger whose
    agent is gone; withdrawing the ledger removes the promise too."""
    fake, _ = kube_api
    fake.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    now = [1000.0]
    publisher = LedgerPublisher(api, "node-a", max_bytes=65536, refresh_s=300, clock=lambda: now[0])
    ledger = build_ledger(
        snapshot_of([]), resource=R, id_strategy="uuid", pod_uid=lambda ns, p: None
    )
    assert await publisher.publish(ledger)
    annotations = fake.get("v1", "Node", "node-a")["metadata"]["annotations"]  # type: ignore[index]
    assert annotations[ANNOTATION_LEDGER_REFRESH] == "300"
    now[0] += 299
    later = ledger.model_copy(update={"observed_at": "2026-11-27T10:04:59Z"})
    assert not await publisher.publish(later)
    now[0] += 1
    assert await publisher.publish(later)
    assert node_ledger(fake) == later
    assert await publisher.withdraw()
    annotations = fake.get("v1", "Node", "node-a")["metadata"].get("annotations") or {}  # type: ignore[index]
    assert ANNOTATION_GPU_LEDGER not in annotations
    assert ANNOTATION_LEDGER_REFRESH not in annotations


class Env:
    def __init__(self, base: Path, tmp: Path) -> None:
        self.gpus_file = tmp / "gpus.yaml"
        self.kubelet_sock = base / "kubelet.sock"
        self.socket_dir = base / "run"
        self.gpus_file.write_text(
            yaml.safe_dump(
                {"gpus": [{"uuid": u, "name": A100, "memory_mib": 81920} for u in (U0, U1)]}
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
                    "proc_root": str(self.socket_dir),
                    "interval_s": 0.1,
                    "install_mgctl": False,
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
) -> Env:
    monkeypatch.setattr(pods_module, "WATCH_TIMEOUT_S", 1)
    fake, _ = kube_api
    fake.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    fake.put(pod("a"))
    return Env(short_tmp_path, tmp_path)


async def test_the_agent_publishes_the_ledger_within_a_cycle_and_only_on_change(
    env: Env, kube_api: tuple[FakeKubeApi, str]
) -> None:
    fake, _ = kube_api
    async with running_pod_resources(env.kubelet_sock) as kubelet:
        kubelet.assign("ml", "a", "main", R, devices(U0, range(60)))
        async with AgentRuntime(env.config(), open_api=open_api_client) as rt:
            await eventually(lambda: node_ledger(fake) is not None, what="the ledger is written")
            ledger = node_ledger(fake)
            assert ledger is not None
            assert [(g.uuid, g.used) for g in ledger.gpus] == [(U0, 60), (U1, 0)]
            (holder,) = ledger.gpus[0].holders
            assert (holder.pod_uid, holder.pod, holder.units) == (pod_uid("ml/a"), "a", 60)
            assert ledger.observed_at.endswith("Z")
            written = len(ledger_patches(fake))
            for _ in range(3):
                await rt.agent.next_cycle()
            assert len(ledger_patches(fake)) == written  # nothing changed, nothing written

            kubelet.assign("ml", "b", "main", R, devices(U1, range(70)))
            await eventually(
                lambda: [g.used for g in node_ledger(fake).gpus] == [60, 70],  # type: ignore[union-attr]
                what="the ledger follows a new allocation",
            )
            kubelet.release("ml", "a")
            await eventually(
                lambda: [g.used for g in node_ledger(fake).gpus] == [0, 70],  # type: ignore[union-attr]
                what="the ledger follows a pod that ended",
            )
            assert len(ledger_patches(fake)) == written + 2
            await eventually(
                lambda: any(r.verb == "watch" for r in fake.requests), what="a watch ended"
            )
            assert fake.verbs_used() <= verb_set(PERMISSIONS)


OLD = NodeLedger(resource=R, units_per_gpu=100).model_dump_json()


async def test_with_publishing_off_the_annotation_of_an_earlier_run_is_removed(
    env: Env, kube_api: tuple[FakeKubeApi, str]
) -> None:
    fake, _ = kube_api
    fake.put(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "node-a", "annotations": {ANNOTATION_GPU_LEDGER: OLD}},
        }
    )
    async with running_pod_resources(env.kubelet_sock) as kubelet:
        kubelet.assign("ml", "a", "main", R, devices(U0, range(60)))
        async with AgentRuntime(env.config(publish_ledger=False), open_api=open_api_client) as rt:
            await eventually(lambda: node_ledger(fake) is None, what="the stale ledger is removed")
            for _ in range(3):
                await rt.agent.next_cycle()
            assert len(ledger_patches(fake)) == 1  # removed once, never written


async def test_a_stale_podresources_read_publishes_nothing(
    env: Env, kube_api: tuple[FakeKubeApi, str]
) -> None:
    fake, _ = kube_api
    import grpc

    async with running_pod_resources(env.kubelet_sock) as kubelet:
        kubelet.fail_with = grpc.StatusCode.UNAVAILABLE
        async with AgentRuntime(env.config(), open_api=open_api_client) as rt:
            for _ in range(3):
                await rt.agent.next_cycle()
            assert node_ledger(fake) is None  # not "nothing allocated": unknown
            kubelet.fail_with = None
            await eventually(lambda: node_ledger(fake) is not None, what="written once readable")


def test_the_ledger_says_what_the_node_enforces_and_stays_readable_to_older_extenders() -> None:
    """Issue 28: the extender sends ``fixed`` pods only to nodes whose ledger says they
    cap SMs. A node that enforces nothing writes the ledger as before (no new field), so
    an extender of an earlier release, which refuses unknown fields, still reads it; a
    ledger without the field means nothing is enforced."""
    plain = snapshot_of([])
    text = encode_ledger(
        build_ledger(plain, resource=R, id_strategy="uuid", pod_uid=lambda *_: None)
    )
    assert "enforces" not in json.loads(text)
    assert NodeLedger.model_validate_json(text).enforces == ()

    supervised = replace(plain, mps=MpsNode(mode="supervised", status=MpsStatus(state="up")))
    built = build_ledger(supervised, resource=R, id_strategy="uuid", pod_uid=lambda *_: None)
    assert built.enforces == ("memory", "fixed")
    text = encode_ledger(built)
    assert json.loads(text)["enforces"] == ["memory", "fixed"]
    assert NodeLedger.model_validate_json(text) == built
