"""Binds under load: many at once, slow or failing API servers, the in-flight bound, the
connection pool, and TLS with a rotating service-account token.

The binder posts Bindings over its own aiohttp session (plugin.extender.bindings) rather
than kubernetes-asyncio's generated calls; these tests hold it to what the generated path
guaranteed (docs in plugin/extender/binder.py) and to what it adds (binds in parallel, a
clear answer past the bound). The API servers are loopback aiohttp apps: the harness's
FakeKubeApi where binds must land on stored pods, and a small server below whose Binding
handler can hold requests (a barrier, a gate), for the cases the harness cannot stage.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader

from certs.issue import issue_ca, issue_serving_cert, new_private_key
from certs.kube import open_api_client
from plugin.api.scheduling import ANNOTATION_ASSIGNED_GPUS, PodAssignment
from plugin.extender.binder import Binder
from plugin.extender.bindings import BindingClient
from plugin.extender.config import ExtenderConfig
from plugin.extender.ledger import NodeView
from plugin.extender.protocol import ExtenderBindingArgs
from plugin.extender.server import ExtenderState, running_extender
from plugin.extender.service import ExtenderCore
from tests.extender.builders import RESOURCE, ledger, pod
from tests.harness.kube_api import FakeKubeApi
from tests.webhook.waiting import eventually

TOKEN = "token-1"


def core_with(nodes: dict[str, list[int]]) -> ExtenderCore:
    core = ExtenderCore(resource=RESOURCE)
    for name, used in nodes.items():
        core.ledger.set_node(name, ledger(used, node=name).model_dump_json())
    return core


def free(core: ExtenderCore, node: str) -> list[int]:
    view = core.ledger.view(node)
    assert isinstance(view, NodeView), view
    return [g.free for g in view.gpus]


def args(n: int, node: str = "node-a") -> ExtenderBindingArgs:
    return ExtenderBindingArgs(PodName=f"p{n}", PodNamespace="ns", PodUID=f"uid-{n}", Node=node)


def remember(core: ExtenderCore, n: int, units: int = 30) -> None:
    """The ask a filter call for pod ``n`` leaves behind (kube-scheduler filters first)."""
    core.ask_of(pod(units, name=f"p{n}", namespace="ns", uid=f"uid-{n}"))


# ------------------------------------------------------------------ a Binding endpoint
@dataclass
class BindingEndpoint:
    """``POST pods/{name}/binding`` that can hold each request: until ``barrier`` requests
    have arrived, or until ``gate`` opens. Answers 201 Status as kube-apiserver does."""

    barrier: int = 0
    gate: asyncio.Event | None = None
    arrived: list[tuple[str, str]] = field(default_factory=list)
    """(pod name, Authorization header) of every Binding, in order of arrival."""
    _all_in: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        assert body["kind"] == "Binding"
        self.arrived.append((request.match_info["name"], request.headers.get("Authorization", "")))
        if self.barrier and len(self.arrived) >= self.barrier:
            self._all_in.set()
        if self.barrier:
            await self._all_in.wait()
        if self.gate is not None:
            await self.gate.wait()
        return web.json_response(
            {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}, status=201
        )

    def release(self) -> None:
        """Let every held request answer (test teardown: no handler outlives its test)."""
        self._all_in.set()
        if self.gate is not None:
            self.gate.set()


@asynccontextmanager
async def serving(
    endpoint: BindingEndpoint, *, tls: ssl.SSLContext | None = None
) -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", endpoint.handle)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls).start()
        yield int(runner.addresses[0][1])
    finally:
        endpoint.release()
        await asyncio.shield(runner.cleanup())


@asynccontextmanager
async def plain_client(
    port: int, *, connections: int, timeout_s: float = 5
) -> AsyncIterator[BindingClient]:
    cfg = k8s_client.Configuration(host=f"http://127.0.0.1:{port}")
    cfg.api_key = {"BearerToken": TOKEN}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    async with (
        k8s_client.ApiClient(cfg) as api,
        BindingClient(api, connections=connections, timeout_s=timeout_s) as bindings,
    ):
        yield bindings


# ------------------------------------------------------------------ many binds at once
async def test_concurrent_binds_all_land_with_their_assignments(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> None:
    api, _ = kube_api
    nodes = {f"node-{n}": [0, 0, 0, 0] for n in range(8)}
    core = core_with(nodes)
    count = 64  # 8 per node: 4 GPUs hold 3 pods of 30 units each, 12 per node
    for n in range(count):
        api.put(pod(30, name=f"p{n}", namespace="ns", uid=f"uid-{n}"))
        if n % 2 == 0:
            remember(core, n)  # the others are read from the API server, as after a restart
    requests = [args(n, node=f"node-{n % 8}") for n in range(count)]
    config = ExtenderConfig(listen="127.0.0.1:0")
    async with AsyncExitStack() as stack:
        client, _ = await stack.enter_async_context(open_api_client(kubeconfig=kube_config_env))
        bindings = await stack.enter_async_context(
            BindingClient(client, connections=count, timeout_s=10)
        )
        state = ExtenderState(config, core, _Synced(), Binder(bindings, core, max_in_flight=count))
        server = await stack.enter_async_context(running_extender(state))
        session = await stack.enter_async_context(aiohttp.ClientSession())

        async def post(a: ExtenderBindingArgs) -> Any:
            async with session.post(f"{server.url}/bind", json=a.model_dump()) as resp:
                assert resp.status == 200
                return await resp.json()

        results = await asyncio.gather(*(post(a) for a in requests))

    assert results == [{"Error": ""}] * count
    assert len([r for r in api.requests if r.subresource == "binding"]) == count
    held: dict[tuple[str, str], int] = {}
    for a in requests:
        stored = api.get("v1", "Pod", a.PodName, "ns")
        assert stored is not None
        assert stored["spec"]["nodeName"] == a.Node
        assignment = PodAssignment.model_validate_json(
            stored["metadata"]["annotations"][ANNOTATION_ASSIGNED_GPUS]
        )
        assert assignment.node == a.Node
        [container] = assignment.containers
        assert list(container.gpus.values()) == [30]  # one GPU
        reserved = core.ledger.assumption(a.PodUID)
        assert reserved is not None
        assert reserved.node == a.Node
        for gpu, units in container.gpus.items():
            held[(a.Node, gpu)] = held.get((a.Node, gpu), 0) + units
    assert max(held.values()) <= 100  # no GPU promised twice
    for node in nodes:  # each node's reservations are exactly what was written
        assert sum(free(core, node)) == 400 - 8 * 30


class _Synced:
    ready = True


# ------------------------------------------------------------------ failures drop the reservation
async def test_a_binding_that_times_out_drops_the_reservation() -> None:
    core = core_with({"node-a": [40, 0]})
    remember(core, 1)
    endpoint = BindingEndpoint(gate=asyncio.Event())  # never answers while the test runs
    async with (
        serving(endpoint) as port,
        plain_client(port, connections=4, timeout_s=0.3) as bindings,
    ):
        error = await Binder(bindings, core).bind(args(1))
    assert error == (
        "cannot bind pod ns/p1 to node node-a: creating the Binding failed: timed out after 0.3s"
    )
    assert [name for name, _ in endpoint.arrived] == ["p1"]
    assert core.ledger.assumption("uid-1") is None
    assert free(core, "node-a") == [60, 100]


async def test_a_binding_nobody_answers_drops_the_reservation() -> None:
    core = core_with({"node-a": [40, 0]})
    remember(core, 1)
    async with serving(BindingEndpoint()) as port:
        pass  # closed: the port refuses connections now
    async with plain_client(port, connections=4) as bindings:
        error = await Binder(bindings, core).bind(args(1))
    assert error.startswith("cannot bind pod ns/p1 to node node-a: creating the Binding failed: ")
    assert "ClientConnectorError" in error
    assert core.ledger.assumption("uid-1") is None
    assert free(core, "node-a") == [60, 100]


# ------------------------------------------------------------------ the in-flight bound
async def test_a_bind_past_the_in_flight_bound_is_refused_at_once_and_reserves_nothing() -> None:
    core = core_with({"node-a": [0, 0, 0, 0]})
    for n in range(3):
        remember(core, n)
    endpoint = BindingEndpoint(gate=asyncio.Event())
    async with (
        serving(endpoint) as port,
        plain_client(port, connections=2) as bindings,
    ):
        binder = Binder(bindings, core, max_in_flight=2)
        held = [asyncio.create_task(binder.bind(args(n))) for n in range(2)]
        await eventually(lambda: len(endpoint.arrived) == 2)
        assert binder.running == 2

        error = await asyncio.wait_for(binder.bind(args(2)), 1)  # the gate is still shut

        assert error == (
            "cannot bind pod ns/p2: 2 binds are in flight already, the most this extender "
            "runs at once (max_binds_in_flight 2); the API server is answering slowly, the "
            "scheduler will retry the pod"
        )
        assert core.ledger.assumption("uid-2") is None
        assert endpoint.gate is not None
        endpoint.gate.set()
        assert await asyncio.wait_for(asyncio.gather(*held), 5) == ["", ""]
    assert binder.running == 0
    assert [core.ledger.assumption(f"uid-{n}") is not None for n in range(3)] == [
        True,
        True,
        False,
    ]
    assert free(core, "node-a") == [40, 100, 100, 100]  # binpack: both on the first GPU


# ------------------------------------------------------------------ the connection pool
BARRIER = 32


@pytest.mark.parametrize(
    ("connections", "bound"),
    [
        pytest.param(BARRIER, BARRIER, id="one connection per bind in flight: all bound"),
        pytest.param(4, 0, id="a pool of 4 serialises them: the barrier is never reached"),
    ],
)
async def test_binds_in_flight_reach_the_api_server_together(connections: int, bound: int) -> None:
    """Each Binding is held until all 32 arrived: they complete only if the client sends
    them side by side (a pool of 4 holds the other 28 back until their timeout)."""
    core = core_with({f"node-{n}": [0, 0, 0, 0] for n in range(8)})
    for n in range(BARRIER):
        remember(core, n)
    endpoint = BindingEndpoint(barrier=BARRIER)
    async with (
        serving(endpoint) as port,
        plain_client(port, connections=connections, timeout_s=2) as bindings,
    ):
        binder = Binder(bindings, core, max_in_flight=BARRIER)
        errors = await asyncio.wait_for(
            asyncio.gather(*(binder.bind(args(n, node=f"node-{n % 8}")) for n in range(BARRIER))),
            10,
        )
    assert sum(1 for e in errors if not e) == bound, errors
    assert all("timed out after 2s" in e for e in errors if e), errors
    kept = sum(1 for n in range(BARRIER) if core.ledger.assumption(f"uid-{n}") is not None)
    assert kept == bound


# ------------------------------------------------------------------ TLS and the token
@dataclass
class Pki:
    ca: Path
    cert: Path
    key: Path


def pki(tmp: Path, name: str) -> Pki:
    now = dt.datetime.now(dt.UTC)
    ca = issue_ca(key=new_private_key(), now=now, common_name=f"{name}-ca")
    leaf = issue_serving_cert(ca=ca, key=new_private_key(), now=now, ip_addresses=["127.0.0.1"])
    paths = Pki(tmp / f"{name}-ca.crt", tmp / f"{name}.crt", tmp / f"{name}.key")
    paths.ca.write_bytes(ca.cert_pem)
    paths.cert.write_bytes(leaf.cert_pem)
    paths.key.write_bytes(leaf.key_pem)
    return paths


def server_tls(p: Pki) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(p.cert, p.key)
    return context


@asynccontextmanager
async def in_cluster_client(
    port: int, *, token: Path, ca: Path
) -> AsyncIterator[tuple[BindingClient, InClusterConfigLoader]]:
    """Credentials exactly as a pod gets them: kubernetes-asyncio's in-cluster loader over
    a service-account token file and CA bundle (here in a temp dir, not /var/run/secrets)."""
    loader = InClusterConfigLoader(
        token_filename=str(token),
        cert_filename=str(ca),
        environ={"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)},
    )
    cfg = k8s_client.Configuration()
    loader.load_and_set(cfg)
    async with (
        k8s_client.ApiClient(cfg) as api,
        BindingClient(api, connections=4, timeout_s=5) as bindings,
    ):
        yield bindings, loader


async def test_tls_is_verified_and_a_rotated_token_is_sent(tmp_path: Path) -> None:
    server = pki(tmp_path, "apiserver")
    token = tmp_path / "token"
    token.write_text(TOKEN)
    core = core_with({"node-a": [0, 0]})
    for n in range(2):
        remember(core, n)
    endpoint = BindingEndpoint()
    async with (
        serving(endpoint, tls=server_tls(server)) as port,
        in_cluster_client(port, token=token, ca=server.ca) as (bindings, loader),
    ):
        binder = Binder(bindings, core)
        assert await binder.bind(args(0)) == ""
        # The kubelet rotates the projected token; the loader re-reads it once its minute
        # is up (here: at once), on the next request.
        token.write_text("token-2")
        loader.token_expires_at = dt.datetime.now() - dt.timedelta(seconds=1)
        assert await binder.bind(args(1)) == ""
    assert endpoint.arrived == [("p0", "Bearer token-1"), ("p1", "Bearer token-2")]


async def test_a_server_certificate_from_another_ca_is_refused(tmp_path: Path) -> None:
    trusted, impostor = pki(tmp_path, "apiserver"), pki(tmp_path, "impostor")
    token = tmp_path / "token"
    token.write_text(TOKEN)
    core = core_with({"node-a": [40, 0]})
    remember(core, 1)
    endpoint = BindingEndpoint()
    async with (
        serving(endpoint, tls=server_tls(impostor)) as port,
        in_cluster_client(port, token=token, ca=trusted.ca) as (bindings, _),
    ):
        error = await Binder(bindings, core).bind(args(1))
    assert "creating the Binding failed" in error
    assert "CERTIFICATE_VERIFY_FAILED" in error
    assert endpoint.arrived == []  # no token ever left for the impostor
    assert core.ledger.assumption("uid-1") is None
    assert free(core, "node-a") == [60, 100]
