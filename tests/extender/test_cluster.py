"""The extender end to end: real HTTP with upstream-shaped JSON, the ledger cache watching an
API server that speaks real HTTP+JSON (tests.harness.kube_api), and binds creating Bindings.

Everything runs through the real kubernetes-asyncio client and a real aiohttp server; only
the API server and kube-scheduler are stand-ins (the scheduler's requests are the captured
ones in tests/fixtures/scheduler-extender).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from certs.kube import open_api_client
from plugin.api.scheduling import ANNOTATION_ASSIGNED_GPUS, ANNOTATION_GPU_LEDGER, PodAssignment
from plugin.extender.binder import Binder
from plugin.extender.bindings import BindingClient
from plugin.extender.cache import LedgerCache
from plugin.extender.config import ExtenderConfig
from plugin.extender.ledger import NodeView
from plugin.extender.server import NOT_SYNCED, ExtenderState, running_extender
from plugin.extender.service import ExtenderCore
from tests.extender.builders import RESOURCE, ledger, load_fixture, node_object, pod
from tests.harness.kube_api import FakeKubeApi
from tests.webhook.waiting import eventually

FIXTURE_UID = "35400ef0-6855-4140-828c-36f948198c92"


@dataclass
class Extender:
    core: ExtenderCore
    cache: LedgerCache
    url: str
    session: aiohttp.ClientSession

    async def post(self, verb: str, body: Any) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with self.session.post(f"{self.url}/{verb}", data=data) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text

    def free(self, node: str) -> list[int]:
        view = self.core.ledger.view(node)
        assert isinstance(view, NodeView), view
        return [g.free for g in view.gpus]


@asynccontextmanager
async def running(kubeconfig: Path, *, ready: bool = True) -> AsyncIterator[Extender]:
    config = ExtenderConfig(listen="127.0.0.1:0", assume_timeout_s=300)
    core = ExtenderCore(resource=RESOURCE, assume_timeout_s=config.assume_timeout_s)
    async with AsyncExitStack() as stack:
        api, _ = await stack.enter_async_context(open_api_client(kubeconfig=kubeconfig))
        cache = await stack.enter_async_context(LedgerCache(api, core, watch_timeout_s=1))
        if ready:
            await asyncio.wait_for(cache.wait_synced(), 10)
        bindings = await stack.enter_async_context(
            BindingClient(api, connections=config.max_binds_in_flight, timeout_s=5)
        )
        binder = Binder(bindings, core, in_flight=cache.binds_in_flight)
        server = await stack.enter_async_context(
            running_extender(ExtenderState(config, core, cache, binder))
        )
        session = await stack.enter_async_context(aiohttp.ClientSession())
        yield Extender(core, cache, server.url, session)


def cluster(api: FakeKubeApi) -> None:
    """node-a: one 0.2 GPU free; node-b: two GPUs, 60 used on the first; the captured pod q30
    (as the scheduler sent it: one container "main" of 30 units, not bound yet)."""
    api.put(node_object("node-a", ledger([80], node="node-a")))
    api.put(node_object("node-b", ledger([60, 0], node="node-b")))
    captured = load_fixture("filter-30-units-two-nodes.json")["Pod"]
    api.put({"apiVersion": "v1", "kind": "Pod", **captured})


@pytest.fixture
async def extender(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> AsyncIterator[Extender]:
    cluster(kube_api[0])
    async with running(kube_config_env) as ext:
        yield ext


# ------------------------------------------------------------------ the verbs
async def test_captured_filter_request(extender: Extender) -> None:
    status, result = await extender.post("filter", load_fixture("filter-30-units-two-nodes.json"))
    assert status == 200
    assert result == {
        "Nodes": None,
        "NodeNames": ["node-b"],
        "FailedNodes": {"node-a": 'container "main" needs 30 units, 20 free on healthy GPUs'},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


async def test_captured_prioritize_request(extender: Extender) -> None:
    status, result = await extender.post(
        "prioritize", load_fixture("prioritize-30-units-two-nodes.json")
    )
    assert status == 200
    assert [h["Host"] for h in result] == ["node-a", "node-b"]
    scores = {h["Host"]: h["Score"] for h in result}
    assert scores["node-a"] == 0  # does not fit
    assert scores["node-b"] == 9  # binpack: 30 on the GPU with 40 free leaves 0.1 of it


async def test_captured_init_container_filter(extender: Extender) -> None:
    status, result = await extender.post("filter", load_fixture("filter-init-containers.json"))
    assert status == 200
    # The kubelet's reuse trap (issue 27): binpack alone would put warm (30) on node-b's
    # tightest GPU (40 free); proxy (20) and main (50) reuse those 30, and main would need
    # 40 more there. The whole-pod plan puts warm on the empty GPU instead, where proxy and
    # main (70 in all, 30 of them reused) fit, so node-b passes.
    assert result["NodeNames"] == ["node-b"]
    assert list(result["FailedNodes"]) == ["node-a"]
    uid = load_fixture("filter-init-containers.json")["Pod"]["metadata"]["uid"]
    ask = extender.core.remembered_ask(uid)
    assert ask is not None
    decision = extender.core.decide_bind(
        ask, node="node-b", pod_uid=uid, namespace="sched", pod="p", now=0.0
    )
    assert not isinstance(decision, str)
    assert [c.gpus for c in decision.assignment.containers] == [
        {"GPU-node-b-1": 30},
        {"GPU-node-b-1": 20},
        {"GPU-node-b-1": 50},
    ]


async def test_captured_bind_creates_the_binding_with_the_assignment(
    extender: Extender, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    await extender.post("filter", load_fixture("filter-30-units-two-nodes.json"))
    status, result = await extender.post("bind", load_fixture("bind-30-units.json"))
    assert (status, result) == (200, {"Error": ""})
    stored = api.get("v1", "Pod", "q30", "sched")
    assert stored is not None
    assert stored["spec"]["nodeName"] == "node-b"
    assignment = PodAssignment.model_validate_json(
        stored["metadata"]["annotations"][ANNOTATION_ASSIGNED_GPUS]
    )
    assert assignment.node == "node-b"
    assert [c.gpus for c in assignment.containers] == [{"GPU-node-b-0": 30}]
    bindings = [r for r in api.requests if r.subresource == "binding"]
    assert len(bindings) == 1
    assert bindings[0].body["metadata"]["uid"] == FIXTURE_UID
    assert bindings[0].body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "node-b"}
    # Reserved at once; the node reports it late, and it is counted once.
    assert extender.free("node-b") == [10, 100]
    api.put(
        node_object(
            "node-b",
            ledger([90, 0], node="node-b", holder_uids=[FIXTURE_UID, "x"]),
        )
    )
    await eventually(lambda: extender.core.ledger.assumption(FIXTURE_UID) is None)
    assert extender.free("node-b") == [10, 100]


async def test_a_bind_the_api_refuses_leaves_no_reservation_and_no_annotation(
    extender: Extender, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    api.fail_next("create", "pods", status=500, reason="InternalError", message="etcd is down")
    status, result = await extender.post("bind", load_fixture("bind-30-units.json"))
    assert status == 200
    assert "cannot bind pod sched/q30 to node node-b" in result["Error"]
    assert "HTTP 500: etcd is down" in result["Error"]
    assert extender.core.ledger.assumption(FIXTURE_UID) is None
    assert extender.free("node-b") == [40, 100]
    stored = api.get("v1", "Pod", "q30", "sched")
    assert stored is not None
    assert ANNOTATION_ASSIGNED_GPUS not in (stored["metadata"].get("annotations") or {})
    assert not stored["spec"].get("nodeName")


async def test_a_bind_for_a_recreated_pod_is_refused_by_uid(
    extender: Extender, kube_api: tuple[FakeKubeApi, str]
) -> None:
    args = load_fixture("bind-30-units.json") | {"PodUID": "an-older-pod"}
    status, result = await extender.post("bind", args)
    assert status == 200
    assert "UID" in result["Error"]
    assert extender.core.ledger.assumption("an-older-pod") is None


async def test_a_bind_to_a_node_that_no_longer_fits_is_refused_with_the_reason(
    extender: Extender, kube_api: tuple[FakeKubeApi, str]
) -> None:
    args = load_fixture("bind-30-units.json") | {"Node": "node-a"}
    _status, result = await extender.post("bind", args)
    assert result["Error"] == (
        'cannot bind pod sched/q30 to node node-a: container "main" needs 30 units, '
        "20 free on healthy GPUs"
    )
    assert not any(r.subresource == "binding" for r in kube_api[0].requests)


async def test_two_binds_in_flight_for_one_node_never_share_units(
    extender: Extender, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    for n in range(3):
        api.put(pod(70, name=f"big{n}", namespace="sched", uid=f"big-{n}"))
    results = await asyncio.gather(
        *(
            extender.post(
                "bind",
                {
                    "PodName": f"big{n}",
                    "PodNamespace": "sched",
                    "PodUID": f"big-{n}",
                    "Node": "node-b",
                },
            )
            for n in range(3)
        )
    )
    errors = [r[1]["Error"] for r in results]
    assert sum(1 for e in errors if not e) == 1, errors  # node-b has one GPU with 70 free
    assert all("no single GPU has 70 free units" in e for e in errors if e), errors


async def test_pod_deletion_drops_its_reservation(
    extender: Extender, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    await extender.post("bind", load_fixture("bind-30-units.json"))
    assert extender.core.ledger.assumption(FIXTURE_UID) is not None
    api.remove("v1", "Pod", "q30", "sched")
    await eventually(lambda: extender.core.ledger.assumption(FIXTURE_UID) is None)
    assert extender.free("node-b") == [40, 100]


async def test_a_restarted_extender_rebuilds_its_reservations(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> None:
    api, _ = kube_api
    cluster(api)
    async with running(kube_config_env) as first:
        _, result = await first.post("bind", load_fixture("bind-30-units.json"))
        assert result == {"Error": ""}
        before = first.free("node-b")
    # The node has not reported the pod yet; the new process must not double-book.
    api.compact()
    async with running(kube_config_env) as second:
        assert second.free("node-b") == before == [10, 100]
        api.put(pod(40, name="fill", namespace="sched", uid="fill"))
        _, result = await second.post(
            "bind", {"PodName": "fill", "PodNamespace": "sched", "PodUID": "fill", "Node": "node-b"}
        )
        assert result == {"Error": ""}
        assert second.free("node-b") == [10, 60]  # 40 went to the GPU q30 does not hold


async def test_ledger_changes_reach_the_filter_through_the_watch(
    extender: Extender, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    api.put(node_object("node-a", ledger([0], node="node-a")))
    await eventually(lambda: extender.free("node-a") == [100])
    _, result = await extender.post("filter", load_fixture("filter-30-units-two-nodes.json"))
    assert result["NodeNames"] == ["node-a", "node-b"]
    annotations = {ANNOTATION_GPU_LEDGER: "garbage"}
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "node-a", "annotations": annotations},
        }
    )
    await eventually(lambda: isinstance(extender.core.ledger.view("node-a"), str))


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    ("verb", "body", "message"),
    [
        pytest.param("filter", b"{not json", "filter: request body is not JSON", id="not JSON"),
        pytest.param("filter", b"[]", "expected a JSON object", id="not an object"),
        # The standard library raises RecursionError here, not ValueError: a 500 and
        # a traceback for a body any pod can send.
        pytest.param(
            "filter",
            b"[" * 100_000,
            "nested too deeply to be an extender request (more than 1024 levels)",
            id="nested too deeply",
        ),
        pytest.param("prioritize", b"\xff\xfe", "not UTF-8 JSON", id="not UTF-8"),
        pytest.param("filter", b'{"Pod": NaN}', "NaN is not a JSON number", id="NaN is not JSON"),
        pytest.param("filter", b'{"NodeNames": ["a"]}', "Pod: Field required", id="no Pod"),
        pytest.param(
            "prioritize", b'{"Pod": {}, "NodeNames": "a"}', "NodeNames", id="names not a list"
        ),
        pytest.param("bind", b'{"PodName": "p"}', "PodNamespace: Field required", id="bind args"),
    ],
)
async def test_malformed_requests_get_a_clear_400(
    extender: Extender, verb: str, body: bytes, message: str
) -> None:
    status, text = await extender.post(verb, body)
    assert status == 400
    assert message in text


async def test_probes_and_metrics(extender: Extender) -> None:
    await extender.post("filter", load_fixture("filter-30-units-two-nodes.json"))
    async with extender.session.get(f"{extender.url}/readyz") as resp:
        assert resp.status == 200
        assert (await resp.json())["nodes"] == 2
    async with extender.session.get(f"{extender.url}/healthz") as resp:
        assert resp.status == 200
    async with extender.session.get(f"{extender.url}/metrics") as resp:
        text = await resp.text()
    assert 'metagpu_extender_requests_total{outcome="ok",verb="filter"} 1.0' in text
    assert "metagpu_extender_filtered_out_nodes_total 1.0" in text


async def test_before_the_first_list_every_verb_says_not_synced(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> None:
    api, _ = kube_api
    cluster(api)
    api.forbid("list", "nodes")  # the cache cannot list: it retries with backoff
    async with running(kube_config_env, ready=False) as ext:
        _, result = await ext.post("filter", load_fixture("filter-30-units-two-nodes.json"))
        assert result["Error"] == NOT_SYNCED
        _, result = await ext.post("bind", load_fixture("bind-30-units.json"))
        assert result["Error"] == NOT_SYNCED
        async with ext.session.get(f"{ext.url}/readyz") as resp:
            assert resp.status == 503


async def test_the_extender_uses_exactly_the_permissions_it_declares(
    extender: Extender, kube_api: tuple[FakeKubeApi, str]
) -> None:
    from plugin.api.permissions import verb_set
    from plugin.extender.permissions import PERMISSIONS

    api, _ = kube_api
    # No filter first: the bind reads the pod (get), then creates the Binding.
    _, result = await extender.post("bind", load_fixture("bind-30-units.json"))
    assert result == {"Error": ""}
    # Watches are recorded when they end (every second here).
    await eventually(lambda: verb_set(PERMISSIONS) <= api.verbs_used(), timeout_s=15)
    assert api.verbs_used() == verb_set(PERMISSIONS)


async def test_a_request_that_outlives_its_timeout_gets_a_503() -> None:
    from plugin.extender.protocol import ExtenderBindingArgs

    class Stuck:
        ready = True

        async def bind(self, args: ExtenderBindingArgs) -> str:
            await asyncio.sleep(30)
            return ""

    config = ExtenderConfig(listen="127.0.0.1:0", request_timeout_s=0.2)
    core = ExtenderCore(resource=RESOURCE)
    async with (
        running_extender(ExtenderState(config, core, Stuck(), Stuck())) as server,
        aiohttp.ClientSession() as session,
        session.post(f"{server.url}/bind", json=load_fixture("bind-30-units.json")) as resp,
    ):
        assert resp.status == 503
        assert "request_timeout_s" in await resp.text()


async def test_an_assumption_the_node_never_reports_expires(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> None:
    from plugin.extender.metrics import ExtenderMetrics

    api, _ = kube_api
    cluster(api)
    now = [1_000_000.0]
    metrics = ExtenderMetrics()
    core = ExtenderCore(resource=RESOURCE, assume_timeout_s=300)
    async with (
        open_api_client(kubeconfig=kube_config_env) as (client, _),
        LedgerCache(
            client,
            core,
            clock=lambda: now[0],
            watch_timeout_s=1,
            expiry_interval_s=3600,
            on_expired=metrics.expired.inc,
        ) as cache,
        BindingClient(client, connections=4, timeout_s=5) as bindings,
    ):
        await asyncio.wait_for(cache.wait_synced(), 10)
        binder = Binder(bindings, core, clock=lambda: now[0])
        from plugin.extender.protocol import parse_binding

        assert await binder.bind(parse_binding(load_fixture("bind-30-units.json"))) == ""
        assert core.ledger.assumption(FIXTURE_UID) is not None
        now[0] += 299
        cache.expire_now()
        assert core.ledger.assumption(FIXTURE_UID) is not None
        now[0] += 2
        cache.expire_now()
        assert core.ledger.assumption(FIXTURE_UID) is None
        assert metrics.expired._value.get() == 1


async def test_the_metrics_listener_serves_metrics_and_probes_but_no_verb() -> None:
    """metrics_listen may face the pod network (Prometheus scrapes it); the verbs, which can
    bind pods, stay on the loopback listener only."""
    from plugin.extender.protocol import ExtenderBindingArgs

    class Idle:
        ready = True

        async def bind(self, args: ExtenderBindingArgs) -> str:
            raise AssertionError("no bind reaches the extender through its metrics port")

    config = ExtenderConfig(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0")
    core = ExtenderCore(resource=RESOURCE)
    async with (
        running_extender(ExtenderState(config, core, Idle(), Idle())) as server,
        aiohttp.ClientSession() as session,
    ):
        assert server.metrics_url
        assert server.metrics_url != server.url
        async with session.get(f"{server.metrics_url}/metrics") as resp:
            assert resp.status == 200
            assert "metagpu_extender_requests_total" in await resp.text()
        async with session.get(f"{server.metrics_url}/readyz") as resp:
            assert resp.status == 200
        for verb in ("filter", "prioritize", "bind", "preempt"):
            async with session.post(
                f"{server.metrics_url}/{verb}", json=load_fixture("bind-30-units.json")
            ) as resp:
                assert resp.status in (404, 405), verb
        async with session.get(f"{server.url}/metrics") as resp:
            assert resp.status == 200
