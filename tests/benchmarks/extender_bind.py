"""Benchmark: binds per second and bind latency through the extender's ``POST /bind``.

Usage: ``python tests/benchmarks/extender_bind.py [--quick] [--reps N] [--breakdown]``

What kube-scheduler feels when it binds a burst of pods through the extender
(``bindVerb``): it binds every pod in a goroutine of its own, so many binds
are in flight at once. Here 16, 32 and 64 at once, each one ``POST /bind``
(an ``ExtenderBindingArgs``) to the real extender app
(:func:`plugin.extender.server.running_extender` over an
:class:`~plugin.extender.service.ExtenderCore` and the real
:class:`~plugin.extender.binder.Binder`), which decides the GPUs, reserves
them and POSTs the Binding to a loopback API server. Measured per figure:
binds per second (binds / wall time, the median of the repetitions), each
bind's latency from writing ``/bind`` to the last byte of its answer (p50 and
p99 over every repetition), and the CPU time each process spent per bind
(the extender's and the API server's, read through untimed side channels, and
this client's). The extender's CPU per bind is the steadiest figure on a
shared VM: binds per second move with whatever else the two cores run, the
CPU a bind takes much less so.

Three processes, as in a cluster: this one stands in for kube-scheduler (an
aiohttp client with one connection per bind in flight, as Go's transport
opens them), a child serves the extender, another child the API server.

The API server is a minimal aiohttp app written here, not
``tests/harness/kube_api.py``: that harness stores every object, deep-copies
the pod on a bind, records every request and wakes its watchers, several
times the cost of the extender's side, and its memory grows with every
request. This one checks each Binding as the real one would refuse it
(``kind``, name, UID precondition present, target node, the assignment
annotation, the bearer token), counts it, and answers what kube-apiserver
answers: 201 with a ``Status`` of Success.

The cluster: 1,000 nodes × 8 GPUs × 100 units, 0-60 units used on each GPU
(seeded), so a pod of 30 units fits anywhere; the pods of a figure go to the
nodes in turn (at most one per node), their asks remembered as a filter call
would leave them (``nodeCacheCapable``: the filter carries the pod, so bind
reads nothing), and every reservation is dropped between figures (untimed),
as the node agents' reports would. Logging is on, as in production (INFO,
JSON), into ``/dev/null``: every bind writes one line.

Paths, same run, same bodies, interleaved (each repetition runs every path
at every in-flight count, so a neighbour's burst on the shared VM touches
them alike):

* **floor**: this process's aiohttp client POSTs the same Bindings straight
  to the API server (what kube-scheduler's own binder does without the
  extender): the least a bind costs here, HTTP to the API server and back;
* **before**: the extender, its Binder posting through kubernetes-asyncio's
  generated ``CoreV1Api.create_namespaced_pod_binding`` (the path until
  this benchmark was written; its body decoded back into the dict that path
  took, a few microseconds);
* **after**: the extender as it is, the Binding encoded once and posted over
  :class:`plugin.extender.bindings.BindingClient`'s session;
* with ``--breakdown``, **bytes over the generated client's session**: the
  after path's request, sent through kubernetes-asyncio's own session
  (``trust_env=True``: aiohttp looks up netrc and the proxy environment in
  the thread pool on every request), to split the before path's cost into
  that session's thread hops and the generated code's own work.

The ratios (binds per second of a path over the floor's) compare with the
issue's ratio only loosely: the extender path adds a hop (kube-scheduler to
the extender) that a cluster has too, and kube-scheduler, the API server and
etcd do far more per pod there than here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import multiprocessing
import os
import random
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final, NamedTuple, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp
from aiohttp import web
from kubernetes_asyncio import client as k8s_client

from plugin.api import jsonwire
from plugin.api.logs import configure_logging
from plugin.api.scheduling import ANNOTATION_ASSIGNED_GPUS
from plugin.extender.binder import Binder, BindingApi
from plugin.extender.bindings import BindingClient
from plugin.extender.config import ExtenderConfig
from plugin.extender.server import ExtenderState, running_extender
from plugin.extender.service import ExtenderCore
from tests.benchmarks._stats import percentile
from tests.extender.builders import RESOURCE, ledger

HOST: Final = "127.0.0.1"
JSON: Final = "application/json"
TOKEN: Final = "bench-token"
NODES, GPUS, UNITS, ASK = 1000, 8, 100, 30
IN_FLIGHT: Final = (16, 32, 64)
START_TIMEOUT_S: Final = 90.0
CALL_TIMEOUT_S: Final = 30.0
"""Bound on one bind seen from the client; a figure with any bind slower than this fails."""
NAMESPACE: Final = "bench"
STATUS_CREATED: Final = jsonwire.dumps(
    {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
)
BOUND: Final = jsonwire.dumps({"Error": ""})


class BenchmarkError(RuntimeError):
    """A server answered something other than what the benchmark expects."""


class Served(NamedTuple):
    """What a child sends once it listens: its ports by name."""

    ports: dict[str, int]


# ------------------------------------------------------------------ the API server (child)
def _status(code: int, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
    return web.Response(status=code, body=jsonwire.dumps(body), content_type=JSON)


def api_app() -> web.Application:
    """``POST pods/{name}/binding`` checked and counted, and the side channel."""
    count = [0]

    async def binding(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return _status(401, "Unauthorized")
        try:
            body = jsonwire.loads(await request.read(), what="a Binding")
        except jsonwire.JsonBodyError as exc:
            return _status(400, str(exc))
        if not isinstance(body, dict) or body.get("kind") != "Binding":
            return _status(400, "request body must be a Binding")
        meta = body.get("metadata") or {}
        if meta.get("name") != request.match_info["name"] or not meta.get("uid"):
            return _status(400, "the Binding's name or UID is missing or not the URL's")
        if ANNOTATION_ASSIGNED_GPUS not in (meta.get("annotations") or {}):
            return _status(400, "the Binding carries no GPU assignment")
        if not (body.get("target") or {}).get("name"):
            return _status(422, "target.name: Required value")
        count[0] += 1
        return web.Response(status=201, body=STATUS_CREATED, content_type=JSON)

    async def cpu(request: web.Request) -> web.Response:
        return web.json_response({"cpu_s": time.process_time(), "bindings": count[0]})

    app = web.Application()
    app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", binding)
    app.router.add_get("/bench/cpu", cpu)
    return app


async def _serve_api(conn: Connection[Any, Any]) -> None:
    runner, port = await _start(api_app())
    try:
        conn.send(Served({"api": port}))
        await asyncio.to_thread(_until_parent_done, conn)
    finally:
        await runner.cleanup()


# ------------------------------------------------------------------ the extender (child)
class _Synced:
    """The ledger cache, as the extender sees it once the first list is in."""

    ready = True


class GeneratedClient:
    """The binder's API calls before: kubernetes-asyncio's generated ``CoreV1Api``."""

    def __init__(self, api: k8s_client.ApiClient, *, timeout_s: float) -> None:
        self._v1 = k8s_client.CoreV1Api(api)
        self.timeout_s = timeout_s

    async def create_binding(self, *, namespace: str, name: str, body: bytes) -> tuple[int, bytes]:
        pending = self._v1.create_namespaced_pod_binding(
            name,
            namespace,
            json.loads(body),  # the dict the old binder passed
            _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(total=self.timeout_s),
        )
        resp = cast(aiohttp.ClientResponse, await pending)  # _preload_content=False
        try:
            return resp.status, await resp.read()
        finally:
            resp.release()

    async def read_pod(self, *, namespace: str, name: str) -> tuple[int, bytes]:
        raise BenchmarkError("every ask is remembered here: no pod is read")


class GeneratedSession:
    """The after path's request, sent through kubernetes-asyncio's own session (trust_env)."""

    def __init__(self, api: k8s_client.ApiClient, *, timeout_s: float) -> None:
        self._api = api
        self._session: aiohttp.ClientSession = api.rest_client.pool_manager
        self._base = (api.configuration.host or "").rstrip("/")
        self.timeout_s = timeout_s

    async def create_binding(self, *, namespace: str, name: str, body: bytes) -> tuple[int, bytes]:
        headers = dict(self._api.default_headers)
        headers |= {"Accept": JSON, "Content-Type": JSON}
        await self._api.update_params_for_auth(headers, [], ["BearerToken"])
        url = f"{self._base}/api/v1/namespaces/{namespace}/pods/{name}/binding"
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with self._session.post(url, data=body, headers=headers, timeout=timeout) as resp:
            return resp.status, await resp.read()

    async def read_pod(self, *, namespace: str, name: str) -> tuple[int, bytes]:
        raise BenchmarkError("every ask is remembered here: no pod is read")


def cluster(seed: int = 27) -> tuple[ExtenderCore, list[str]]:
    """1,000 nodes × 8 GPUs, 0-60 units used on each: a pod of 30 fits on every node."""
    rnd = random.Random(seed)
    core = ExtenderCore(resource=RESOURCE)
    names = [f"node-{n:04d}" for n in range(NODES)]
    for name in names:
        used = [rnd.choice(range(0, 61, 10)) for _ in range(GPUS)]
        core.ledger.set_node(name, ledger(used, units=UNITS, node=name).model_dump_json())
    core.warm()
    return core, names


def the_pod(name: str, uid: str) -> dict[str, object]:
    units = str(ASK)
    return {
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid},
        "spec": {
            "schedulerName": "metagpu-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {RESOURCE: units}, "requests": {RESOURCE: units}},
                }
            ],
        },
    }


def control_app(core: ExtenderCore, names: list[str]) -> web.Application:
    """Side channel (untimed): pods whose asks a filter call left, dropped reservations, CPU."""

    async def pods(request: web.Request) -> web.Response:
        ask = await request.json()
        tag, count = str(ask["tag"]), int(ask["count"])
        made = []
        for i in range(count):
            name, uid = f"{tag}-{i}", f"uid-{tag}-{i}"
            core.ask_of(the_pod(name, uid))  # as the filter call before the bind does
            made.append((name, uid, names[i % len(names)]))
        return web.json_response(made)

    async def reset(request: web.Request) -> web.Response:
        dropped = 0
        for assumption in core.ledger.assumed():
            core.ledger.forget(assumption.pod_uid)
            dropped += 1
        return web.json_response({"dropped": dropped})

    async def cpu(request: web.Request) -> web.Response:
        return web.json_response({"cpu_s": time.process_time()})

    app = web.Application()
    app.router.add_post("/bench/pods", pods)
    app.router.add_post("/bench/reset", reset)
    app.router.add_get("/bench/cpu", cpu)
    return app


async def _serve_extender(conn: Connection[Any, Any], api_port: int) -> None:
    core, names = cluster()
    # The cluster lives as long as the process, as the extender's cache does; the
    # extender freezes its start-up heap the same way.
    gc.collect()
    gc.freeze()
    config = ExtenderConfig(listen=f"{HOST}:0")
    cfg = k8s_client.Configuration(host=f"http://{HOST}:{api_port}")
    cfg.api_key = {"BearerToken": TOKEN}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    limit = config.max_binds_in_flight
    async with (
        k8s_client.ApiClient(cfg) as api,
        BindingClient(api, connections=limit, timeout_s=config.api_timeout_s) as bindings,
    ):
        apis: dict[str, BindingApi] = {
            "after": bindings,
            "before": GeneratedClient(api, timeout_s=config.api_timeout_s),
            "session": GeneratedSession(api, timeout_s=config.api_timeout_s),
        }
        async with contextlib.AsyncExitStack() as stack:
            ports: dict[str, int] = {}
            for label, calls in apis.items():
                binder = Binder(calls, core, max_in_flight=limit)
                state = ExtenderState(config, core, _Synced(), binder)
                server = await stack.enter_async_context(running_extender(state))
                ports[label] = int(server.url.rsplit(":", 1)[1])
            runner, ports["control"] = await _start(control_app(core, names))
            stack.push_async_callback(runner.cleanup)
            conn.send(Served(ports))
            await asyncio.to_thread(_until_parent_done, conn)


# ------------------------------------------------------------------ children's plumbing
async def _start(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, HOST, 0).start()
    return runner, int(runner.addresses[0][1])


def _until_parent_done(conn: Connection[Any, Any]) -> None:
    with contextlib.suppress(EOFError, OSError):
        conn.recv()


def child_main(
    conn: Connection[Any, Any], parent_end: Connection[Any, Any], role: str, api_port: int
) -> None:
    """A child's body: serve its role until the parent is done (its pipe end closes)."""
    parent_end.close()  # forked: only the parent may hold it, so its exit reads as EOF here
    try:
        with open(os.devnull, "w") as sink:  # a stream for the log handler
            configure_logging(level="INFO", fmt="json", stream=sink)
            if role == "api":
                asyncio.run(_serve_api(conn))
            else:
                asyncio.run(_serve_extender(conn, api_port))
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(traceback.format_exc())  # the parent prints it
        raise SystemExit(1) from None


@dataclass
class Child:
    process: multiprocessing.process.BaseProcess
    pipe: Connection[Any, Any]
    ports: dict[str, int]


def start_child(role: str, api_port: int = 0) -> Child:
    context = multiprocessing.get_context("fork")
    parent_end, child_end = context.Pipe()
    process = context.Process(
        target=child_main, args=(child_end, parent_end, role, api_port), name=role, daemon=True
    )
    process.start()
    child_end.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not parent_end.poll(0.1):
        if not process.is_alive() or time.monotonic() > deadline:
            raise BenchmarkError(f"the {role} process did not start (exit {process.exitcode})")
    message = parent_end.recv()
    if not isinstance(message, Served):
        raise BenchmarkError(f"the {role} process failed:\n{message}")
    return Child(process, parent_end, message.ports)


def stop_child(child: Child) -> None:
    with contextlib.suppress(OSError):
        child.pipe.send("stop")
    child.pipe.close()
    child.process.join(10)
    if child.process.is_alive():
        child.process.terminate()
        child.process.join(5)
    if child.process.is_alive():
        child.process.kill()
        child.process.join()


# ------------------------------------------------------------------ the client (this process)
@dataclass
class Figure:
    """One path at one in-flight count, over every repetition."""

    path: str
    in_flight: int
    latency_ms: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    extender_cpu_us: list[float] = field(default_factory=list)
    api_cpu_us: list[float] = field(default_factory=list)
    client_cpu_us: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)


Request = tuple[str, bytes]
"""A URL and the body to POST there."""


async def drive(
    session: aiohttp.ClientSession,
    requests: list[Request],
    in_flight: int,
    check: Callable[[int, bytes], str],
) -> tuple[list[float], float]:
    """POST every request, ``in_flight`` at once; each one's milliseconds, and the wall time.

    Each answer is checked after its clock stopped; any wrong answer fails the figure.
    """
    pending: Iterator[Request] = iter(requests)
    latencies: list[float] = []
    problems: list[str] = []
    headers = {"Content-Type": JSON, "Accept": JSON, "Authorization": f"Bearer {TOKEN}"}
    timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)

    async def worker() -> None:
        for url, body in pending:
            start = time.perf_counter()
            async with session.post(url, data=body, headers=headers, timeout=timeout) as resp:
                answer = await resp.read()
            latencies.append((time.perf_counter() - start) * 1000)
            problem = check(resp.status, answer)
            if problem:
                problems.append(problem)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    wall = time.perf_counter() - start
    if problems:
        raise BenchmarkError(f"{len(problems)} wrong answers, the first: {problems[0]}")
    return latencies, wall


def check_bound(status: int, body: bytes) -> str:
    return "" if (status, body) == (200, BOUND) else f"/bind: HTTP {status}: {body[:300]!r}"


def check_created(status: int, body: bytes) -> str:
    return "" if status == 201 else f"Binding: HTTP {status}: {body[:300]!r}"


def binding_body(name: str, uid: str, node: str) -> bytes:
    """The Binding the extender writes for this pod (a fixed assignment of its size)."""
    assignment = jsonwire.dumps(
        {
            "node": node,
            "containers": [{"container": "main", "gpus": {f"GPU-{node}-0": ASK}}],
        }
    ).decode()
    return jsonwire.dumps(
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "uid": uid,
                "annotations": {ANNOTATION_ASSIGNED_GPUS: assignment},
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
    )


class Bench:
    def __init__(self, api: Child, extender: Child) -> None:
        self.api, self.extender = api, extender
        self.sessions: dict[str, aiohttp.ClientSession] = {}
        self._tags = 0

    def url(self, child: Child, port: str, path: str) -> str:
        return f"http://{HOST}:{child.ports[port]}{path}"

    async def side(self, method: str, url: str, body: object = None) -> Any:
        session = self.sessions["side"]
        async with session.request(method, url, json=body) as resp:
            if resp.status != 200:
                raise BenchmarkError(f"side channel {url}: HTTP {resp.status}")
            return await resp.json()

    async def cpu(self) -> tuple[float, float]:
        ext = await self.side("GET", self.url(self.extender, "control", "/bench/cpu"))
        api = await self.side("GET", self.url(self.api, "api", "/bench/cpu"))
        return float(ext["cpu_s"]), float(api["cpu_s"])

    async def pods(self, count: int) -> list[tuple[str, str, str]]:
        self._tags += 1
        made = await self.side(
            "POST",
            self.url(self.extender, "control", "/bench/pods"),
            {"tag": f"p{self._tags}", "count": count},
        )
        return [(str(a), str(b), str(c)) for a, b, c in made]

    async def run(self, path: str, in_flight: int, count: int, figure: Figure | None) -> None:
        """One repetition of one path: ``count`` binds, ``in_flight`` at once."""
        pods = await self.pods(count)
        if path == "floor":
            base = self.url(self.api, "api", f"/api/v1/namespaces/{NAMESPACE}/pods")
            requests = [(f"{base}/{n}/binding", binding_body(n, u, node)) for n, u, node in pods]
            check = check_created
        else:
            url = self.url(self.extender, path, "/bind")
            requests = [
                (
                    url,
                    jsonwire.dumps(
                        {"PodName": n, "PodNamespace": NAMESPACE, "PodUID": u, "Node": node}
                    ),
                )
                for n, u, node in pods
            ]
            check = check_bound
        cpu_before = await self.cpu()
        client_before = time.process_time()
        latencies, wall = await drive(self.sessions[path], requests, in_flight, check)
        client_cpu = time.process_time() - client_before
        cpu_after = await self.cpu()
        await self.side("POST", self.url(self.extender, "control", "/bench/reset"))
        if figure is not None:
            figure.latency_ms += latencies
            figure.rates.append(count / wall)
            figure.extender_cpu_us.append((cpu_after[0] - cpu_before[0]) / count * 1e6)
            figure.api_cpu_us.append((cpu_after[1] - cpu_before[1]) / count * 1e6)
            figure.client_cpu_us.append(client_cpu / count * 1e6)


LABELS: Final = {
    "floor": "floor: aiohttp client -> API server",
    "before": "extender, before (kubernetes-asyncio)",
    "session": "extender, bytes over k8s-asyncio's session",
    "after": "extender, after (BindingClient)",
}


def report(figures: list[Figure], in_flight: int) -> None:
    print(f"\n{in_flight} binds in flight:")
    print(
        f"  {'path':44} {'binds/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'ext CPU/bind':>13} {'API CPU/bind':>13} {'client CPU':>11} {'vs floor':>9}"
    )
    floor = next(f for f in figures if f.path == "floor")
    for f in figures:
        ext = "" if f.path == "floor" else f"{statistics.median(f.extender_cpu_us):,.0f} us"
        print(
            f"  {LABELS[f.path]:44} {f.rate:8,.0f} {percentile(f.latency_ms, 50):7.2f} "
            f"{percentile(f.latency_ms, 99):7.2f} {ext:>13} "
            f"{statistics.median(f.api_cpu_us):10,.0f} us "
            f"{statistics.median(f.client_cpu_us):8,.0f} us {f.rate / floor.rate:9.2f}"
        )
    rates = {f.path: f.rate for f in figures}
    if "before" in rates and "after" in rates:
        print(f"  after / before: {rates['after'] / rates['before']:.2f}x binds per second")


async def measure_all(
    api: Child, extender: Child, *, reps: int, count: int, counts: tuple[int, ...], paths: list[str]
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        bench = Bench(api, extender)
        for name in ("side", *paths):
            connector = aiohttp.TCPConnector(limit=max(counts))
            bench.sessions[name] = await stack.enter_async_context(
                aiohttp.ClientSession(connector=connector, trust_env=False)
            )
        for path in paths:  # open every connection, first calls' costs out of the figures
            await bench.run(path, max(counts), max(counts) * 2, None)
        figures = {(p, n): Figure(p, n) for p in paths for n in counts}
        for rep in range(reps):
            order = paths if rep % 2 == 0 else paths[::-1]
            for n in counts:
                for path in order:
                    await bench.run(path, n, count, figures[(path, n)])
            print(f"  repetition {rep + 1}/{reps} done", flush=True)
        for n in counts:
            report([figures[(p, n)] for p in paths], n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short repetition")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    parser.add_argument(
        "--breakdown", action="store_true", help="also the after path's bytes over k8s' session"
    )
    args = parser.parse_args()
    reps, count, counts = (1, 200, (16,)) if args.quick else (args.reps, NODES, IN_FLIGHT)
    paths = ["floor", "before", *(["session"] if args.breakdown else []), "after"]
    print(
        f"extender bind benchmark ({'quick' if args.quick else 'full'}: {reps} repetitions of "
        f"{count} binds per path and in-flight count; {NODES} nodes x {GPUS} GPUs; "
        "extender and API server in child processes, loopback HTTP/1.1)"
    )
    children: list[Child] = []
    try:
        api = start_child("api")
        children.append(api)
        extender = start_child("extender", api.ports["api"])
        children.append(extender)
        gc.collect()
        gc.freeze()
        asyncio.run(measure_all(api, extender, reps=reps, count=count, counts=counts, paths=paths))
    except BenchmarkError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        for child in reversed(children):
            stop_child(child)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
