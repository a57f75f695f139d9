"""Benchmark: the scheduler extender's filter + prioritize as kube-scheduler feels them, over HTTP.

Usage: ``python tests/benchmarks/extender_http.py [--quick]``

The cluster of ``tests/benchmarks/extender.py`` (1,000 nodes × 8 GPUs × 100
units, seeded, about half the units in use), served by the real extender app
(:func:`plugin.extender.server.running_extender` over an
:class:`~plugin.extender.service.ExtenderCore`, its cache synced) on loopback,
and called the way kube-scheduler calls it: ``POST /filter`` then
``POST /prioritize`` with the same ``ExtenderArgs`` body
(``{"Pod": ..., "Nodes": null, "NodeNames": [...]}``, compact JSON as Go's
encoder writes it; kube-scheduler sends prioritize only the nodes that passed,
here it gets the same names, as the in-process benchmark's ``decide_ms`` does)
on one keep-alive HTTP/1.1 connection, as Go's ``net/http`` Transport keeps
one. Measured per pod: the two round trips, from writing the filter request to
the last byte of the prioritize answer, in milliseconds. Over the node names
kube-scheduler sends: all 1,000 (``percentageOfNodesToScore: 100``) and 420
(its adaptive default at 1,000 nodes). One node's ledger changes before every
pod (the last bind's node reported), through a side channel that is not timed.

Workloads, named as in ``extender.py``:

* *repeated ask*: every pod asks 70 units, as the previous one did (the pods
  of one Deployment or Job): the kept answer is patched on the changed node;
* *new ask*: every pod asks a number of units no earlier pod asked, so no
  answer can be reused;
* *sidecar + init of 1.5 GPUs + app, new*: a native sidecar of 10 units, an
  init container of 1.5 GPUs reused by the app, a new ask (the costliest of
  the closed forms).

Baseline, same run, same process, same event loop, same bodies (the repeated
ask's and the new ask's): a minimal extender in aiohttp that reads the body
and answers that every node passes (filter) and scores 0 (prioritize), in the
upstream shapes, with the extender's own JSON reader and writer
(:mod:`plugin.api.jsonwire`). It is what any extender costs here before it
decides anything: the HTTP parsing and writing, the JSON in and out of 1,000
names, the event loop, the client. The ratio of each figure's p50 to the
baseline's, and the difference, are what the extender's own work adds
(validating the request, reading the pod, deciding, refusal words, and the
larger filter answers that refusals make).
Also printed: the answers' sizes, and the extender's own time in its handlers
(its ``metagpu_extender_request_duration_seconds`` histogram, read after each
pod through the side channel), so the round trip can be split into the
handlers' work and the rest (aiohttp, the loop, the kernel, the client).

Why a child process: kube-scheduler is another process, so the server must
not share the client's GIL or event loop; the child (forked) builds the
cluster, freezes its heap as the extender's CLI does after start-up, and
serves the extender, the baseline and the side channel on three loopback
ports. Why a raw client: aiohttp's client would add its own parsing to every
figure; here each request's bytes are built before the clock starts, and the
client reads the status line, the headers and exactly ``Content-Length`` bytes
(chunked answers are read too). Every answer is checked after its clock
stopped (status 200, the upstream shape, one entry per node name), so a broken
server cannot produce fast-looking numbers. The client is Python, not Go: its
own cost (tens of microseconds a request) is in every figure, the baseline's
included, and cancels in the difference.

No numeric target: issue 14's 5 ms for filter + prioritize is the in-process
figure (``extender.py``); this one is what users feel, the same work plus
HTTP and JSON, and is printed for reading against the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import multiprocessing
import random
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiohttp import web

from plugin.api import jsonwire
from plugin.extender.config import ExtenderConfig
from plugin.extender.protocol import ExtenderBindingArgs
from plugin.extender.server import ExtenderState, running_extender
from plugin.extender.service import ExtenderCore
from tests.benchmarks.extender import (
    GPUS,
    NODES,
    SAMPLED,
    UNITS,
    cluster,
    node_ledger,
    pod,
    row,
)

HOST = "127.0.0.1"
JSON = "application/json"
COMMON_SIZES = (20, 30, 50, 70, 90, 150)
"""The sizes extender.py's pods ask; a new ask never uses one of them (nor 70)."""
START_TIMEOUT_S = 90.0
"""The child builds the cluster (a few seconds) before it listens."""
WARM_UP = 5
"""Untimed requests on each connection first (the loop's and aiohttp's first-call costs)."""
DURATION = "metagpu_extender_request_duration_seconds_sum"


class BenchmarkError(RuntimeError):
    """The server answered something other than what the benchmark expects."""


class Served(NamedTuple):
    """What the child sends once it listens."""

    extender: int
    baseline: int
    control: int
    names: list[str]


# ------------------------------------------------------------------ server (child)
class _Synced:
    """The ledger cache, as the extender sees it once the first list is in."""

    ready = True


class _NoBind:
    async def bind(self, args: ExtenderBindingArgs) -> str:
        return "bind is not measured by this benchmark"


async def _baseline_filter(request: web.Request) -> web.Response:
    names = _names(await request.read())
    answer: dict[str, object] = {
        "Nodes": None,
        "NodeNames": names,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    return web.Response(body=jsonwire.dumps(answer), content_type=JSON)


async def _baseline_prioritize(request: web.Request) -> web.Response:
    names = _names(await request.read())
    return web.Response(
        body=jsonwire.dumps([{"Host": n, "Score": 0} for n in names]), content_type=JSON
    )


def _names(body: bytes) -> list[str]:
    args = jsonwire.loads(body, what="an extender request")
    assert isinstance(args, dict)
    names: list[str] = args["NodeNames"]
    return names


def baseline_app() -> web.Application:
    """The plain extender: every node passes, every score 0."""
    app = web.Application()
    app.router.add_post("/filter", _baseline_filter)
    app.router.add_post("/prioritize", _baseline_prioritize)
    return app


def control_app(state: ExtenderState, names: list[str], rnd: random.Random) -> web.Application:
    """The side channel (not timed): one node's ledger changed, the kept answers dropped,
    and the time the extender's handlers have spent so far."""
    core = state.core

    def handled() -> web.Response:
        sums = {
            verb: state.metrics.registry.get_sample_value(DURATION, {"verb": verb}) or 0.0
            for verb in ("filter", "prioritize")
        }
        return web.Response(text=json.dumps(sums), content_type=JSON)

    async def churn(request: web.Request) -> web.Response:
        changed = rnd.choice(names)  # the last bind's node reported
        core.ledger.set_node(changed, node_ledger(rnd, changed))
        return handled()

    async def served(request: web.Request) -> web.Response:
        return handled()

    async def reset(request: web.Request) -> web.Response:
        # nothing carried over from the other node count (extender.py resets its memo)
        core.forget_answers()
        return handled()

    app = web.Application()
    app.router.add_post("/bench/churn", churn)
    app.router.add_get("/bench/handled", served)
    app.router.add_post("/bench/reset", reset)
    return app


async def _start(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, HOST, 0).start()
    return runner, int(runner.addresses[0][1])


async def _serve(
    conn: Connection[Any, Any], core: ExtenderCore, names: list[str], rnd: random.Random
) -> None:
    config = ExtenderConfig(listen=f"{HOST}:0")
    state = ExtenderState(config, core, _Synced(), _NoBind())
    async with running_extender(state) as server:
        base_runner, base_port = await _start(baseline_app())
        control_runner, control_port = await _start(control_app(state, names, rnd))
        try:
            port = int(server.url.rsplit(":", 1)[1])
            conn.send(Served(port, base_port, control_port, names))
            # until the parent says stop, or dies (its end closes: EOFError)
            await asyncio.to_thread(_until_parent_done, conn)
        finally:
            await control_runner.cleanup()
            await base_runner.cleanup()


def _until_parent_done(conn: Connection[Any, Any]) -> None:
    with contextlib.suppress(EOFError, OSError):
        conn.recv()


def serve_child(conn: Connection[Any, Any], parent_end: Connection[Any, Any]) -> None:
    """The child's body: build the cluster, then serve until the parent is done."""
    parent_end.close()  # forked: only the parent may hold it, so its exit reads as EOF here
    try:
        core, names, rnd = cluster()
        # The cluster lives as long as the process, as the extender's cache does; the
        # extender's CLI freezes the start-up heap the same way.
        gc.collect()
        gc.freeze()
        asyncio.run(_serve(conn, core, names, rnd))
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(traceback.format_exc())  # the parent prints it
        raise SystemExit(1) from None


# ------------------------------------------------------------------ client (parent)
class Reply(NamedTuple):
    status: int
    body: bytes


class KeepAlive:
    """One keep-alive HTTP/1.1 connection, as Go's Transport keeps one per host."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._closed = b""
        """The status line of the answer after which the server closed the connection."""

    async def __aenter__(self) -> KeepAlive:
        self._reader, self._writer = await asyncio.open_connection(HOST, self.port)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()

    def request(self, path: str, body: bytes = b"", method: str = "POST") -> bytes:
        """The request's bytes, headers as Go's client writes them for a JSON POST."""
        head = (
            f"{method} {path} HTTP/1.1\r\n"
            f"Host: {HOST}:{self.port}\r\n"
            "User-Agent: Go-http-client/1.1\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Content-Type: application/json\r\n"
            "Accept-Encoding: gzip\r\n"
            "\r\n"
        )
        return head.encode("ascii") + body

    async def exchange(self, raw: bytes) -> Reply:
        """Send one prebuilt request; read the status, the headers and the whole body."""
        reader, writer = self._reader, self._writer
        if reader is None or writer is None:
            raise BenchmarkError("connection not open")
        if self._closed:
            raise BenchmarkError(f"the server closed the connection after {self._closed!r}")
        writer.write(raw)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].split(b"\r\n")
        version, status, _ = (*lines[0].split(b" ", 2), b"")[:3]
        if version != b"HTTP/1.1":
            raise BenchmarkError(f"not an HTTP/1.1 answer: {lines[0]!r}")
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if headers.get(b"connection", b"").lower() == b"close":
            self._closed = lines[0]  # the answer is read: the caller sees its status first
        if b"content-length" in headers:
            body = await reader.readexactly(int(headers[b"content-length"]))
        elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = await self._chunked(reader)
        else:
            raise BenchmarkError(f"answer with neither Content-Length nor chunks: {head!r}")
        return Reply(int(status), body)

    @staticmethod
    async def _chunked(reader: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                    pass
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            if await reader.readexactly(2) != b"\r\n":
                raise BenchmarkError("malformed chunk")


def _json(reply: Reply, what: str) -> Any:
    if reply.status != 200:
        raise BenchmarkError(f"{what}: HTTP {reply.status}: {reply.body[:300]!r}")
    try:
        return json.loads(reply.body)
    except ValueError as exc:
        raise BenchmarkError(f"{what}: answer is not JSON: {exc}") from exc


def check_filter(reply: Reply, names: list[str], what: str, *, all_pass: bool = False) -> None:
    """An ExtenderFilterResult with a verdict for every node name, no error."""
    answer = _json(reply, what)
    if not isinstance(answer, dict) or answer.get("Error") != "":
        raise BenchmarkError(f"{what}: not a filter result without error: {reply.body[:300]!r}")
    passed = answer.get("NodeNames") or []
    failed = answer.get("FailedNodes") or {}
    unresolvable = answer.get("FailedAndUnresolvableNodes") or {}
    judged = [*passed, *failed, *unresolvable]
    if sorted(judged) != sorted(names):
        raise BenchmarkError(f"{what}: {len(judged)} verdicts for {len(names)} node names")
    if all_pass and len(passed) != len(names):
        raise BenchmarkError(f"{what}: {len(passed)} of {len(names)} nodes passed")


def check_prioritize(reply: Reply, names: list[str], what: str) -> None:
    """A HostPriorityList with one score (0..10) for every node name."""
    answer = _json(reply, what)
    if not isinstance(answer, list) or [p.get("Host") for p in answer] != names:
        raise BenchmarkError(f"{what}: not one priority per node name: {reply.body[:300]!r}")
    if not all(isinstance(p.get("Score"), int) and 0 <= p["Score"] <= 10 for p in answer):
        raise BenchmarkError(f"{what}: a score outside 0..10")


@dataclass
class Figure:
    """The samples of one workload against one server."""

    label: str
    total: list[float] = field(default_factory=list)
    handled: list[float] = field(default_factory=list)
    filter_bytes: list[int] = field(default_factory=list)
    prioritize_bytes: list[int] = field(default_factory=list)

    @property
    def p50(self) -> float:
        return statistics.median(self.total)


class Bench:
    """The three connections and what every pod does on them."""

    def __init__(self, extender: KeepAlive, baseline: KeepAlive, control: KeepAlive) -> None:
        self.extender, self.baseline, self.control = extender, baseline, control
        self._churn = control.request("/bench/churn")
        self._handled = control.request("/bench/handled", method="GET")
        self._reset = control.request("/bench/reset")

    async def _side(self, raw: bytes) -> float:
        """One side-channel call: the handlers' time so far (seconds, both verbs)."""
        sums = _json(await self.control.exchange(raw), "side channel")
        return float(sums["filter"]) + float(sums["prioritize"])

    async def reset(self) -> None:
        await self._side(self._reset)

    async def pod(
        self, figure: Figure, server: KeepAlive, body: bytes, names: list[str], *, base: bool
    ) -> None:
        """One node changed, then filter + prioritize for one pod, timed; then the checks."""
        filter_raw = server.request("/filter", body)
        prioritize_raw = server.request("/prioritize", body)
        before = await self._side(self._churn)
        start = time.perf_counter()
        filtered = await server.exchange(filter_raw)
        prioritized = await server.exchange(prioritize_raw)
        figure.total.append((time.perf_counter() - start) * 1000)
        if not base:
            figure.handled.append((await self._side(self._handled) - before) * 1000)
        check_filter(filtered, names, f"{figure.label}: filter", all_pass=base)
        check_prioritize(prioritized, names, f"{figure.label}: prioritize")
        figure.filter_bytes.append(len(filtered.body))
        figure.prioritize_bytes.append(len(prioritized.body))


def body_of(the_pod: dict[str, object], names: list[str]) -> bytes:
    """ExtenderArgs as kube-scheduler encodes it: Go's field order, compact, nodeCacheCapable."""
    args = {"Pod": the_pod, "Nodes": None, "NodeNames": names}
    return json.dumps(args, separators=(",", ":")).encode()


def fresh_units(k: int) -> int:
    """Units no earlier pod asked (1..rounds, never a common size), as in extender.py."""
    return 1 + k if 1 + k not in COMMON_SIZES else 1000 + k


def sizes(figure: Figure) -> str:
    return (
        f"filter {statistics.median(figure.filter_bytes):,.0f}, "
        f"prioritize {statistics.median(figure.prioritize_bytes):,.0f}"
    )


async def run(served: Served, rounds: int) -> None:
    names = served.names
    async with (
        KeepAlive(served.extender) as extender,
        KeepAlive(served.baseline) as baseline,
        KeepAlive(served.control) as control,
    ):
        bench = Bench(extender, baseline, control)
        warm = Figure("warm-up")
        for i in range(WARM_UP):
            body = body_of(pod(70, name="warm", uid=f"warm{i}"), names)
            await bench.pod(warm, baseline, body, names, base=True)
            await bench.pod(warm, extender, body, names, base=False)
        for count in (NODES, SAMPLED):
            candidates = names[:count]
            await bench.reset()
            base_repeated = Figure("baseline: plain extender, repeated-ask body")
            base_fresh = Figure("baseline: plain extender, new-ask body")
            repeated = Figure("repeated ask (one node changed per pod)")
            fresh = Figure("new ask (no earlier answer to reuse)")
            chain = Figure("sidecar + init of 1.5 GPUs + app, new")
            request_bytes: list[int] = []
            for k in range(rounds):
                units = fresh_units(k)
                repeated_body = body_of(pod(70, name="worker", uid=f"r{count}-{k}"), candidates)
                fresh_name = f"job{count}-{k}"
                fresh_body = body_of(pod(units, name=fresh_name, uid=fresh_name), candidates)
                chain_name = f"xjob{count}-{k}"
                chain_body = body_of(
                    pod(
                        150 + units,
                        name=chain_name,
                        uid=chain_name,
                        init_units=150,
                        sidecar_units=10,
                    ),
                    candidates,
                )
                request_bytes.append(len(repeated_body))
                await bench.pod(base_repeated, baseline, repeated_body, candidates, base=True)
                await bench.pod(base_fresh, baseline, fresh_body, candidates, base=True)
                await bench.pod(repeated, extender, repeated_body, candidates, base=False)
                await bench.pod(fresh, extender, fresh_body, candidates, base=False)
                await bench.pod(chain, extender, chain_body, candidates, base=False)
            report(
                count,
                statistics.median(request_bytes),
                base_repeated,
                base_fresh,
                [(repeated, base_repeated), (fresh, base_fresh), (chain, base_fresh)],
            )


def report(
    count: int,
    request_bytes: float,
    base_repeated: Figure,
    base_fresh: Figure,
    measured: list[tuple[Figure, Figure]],
) -> None:
    print(
        f"filter + prioritize over HTTP, {count} node names "
        f"(request {request_bytes:,.0f} bytes, sent twice per pod):"
    )
    print(row(base_repeated.label, base_repeated.total))
    print(row(base_fresh.label, base_fresh.total))
    for figure, _ in measured:
        print(row(figure.label, figure.total))
    print(
        "  ratios to the baseline (p50; the sidecar shape against the new-ask body's): "
        + ", ".join(
            f"{figure.label.split(' (')[0]} {figure.p50 / base.p50:.1f}x "
            f"(+{figure.p50 - base.p50:.3f} ms)"
            for figure, base in measured
        )
    )
    print(
        "  the extender's handlers (its own duration histogram, filter + prioritize, p50): "
        + ", ".join(
            f"{figure.label.split(' (')[0]} {statistics.median(figure.handled):.3f} ms "
            f"of {figure.p50:.3f}"
            for figure, _ in measured
        )
    )
    print("  answers (p50 bytes):")
    print(f"    baseline: {sizes(base_repeated)}")
    for figure, _ in measured:
        print(f"    {figure.label}: {sizes(figure)}")


# ------------------------------------------------------------------ main
def measure(quick: bool) -> int:
    rounds = 30 if quick else 300
    print(
        f"extender over HTTP benchmark ({'quick' if quick else 'full'}: {rounds} pods per "
        f"figure; {NODES} nodes x {GPUS} GPUs x {UNITS} units; server in a child process, "
        "one keep-alive HTTP/1.1 connection per server on loopback)"
    )
    context = multiprocessing.get_context("fork")
    parent_end, child_end = context.Pipe()
    child = context.Process(
        target=serve_child, args=(child_end, parent_end), name="extender-server", daemon=True
    )
    child.start()
    child_end.close()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not parent_end.poll(0.1):
            if not child.is_alive() or time.monotonic() > deadline:
                raise BenchmarkError(f"the server process did not start (exit {child.exitcode})")
        message = parent_end.recv()
        if not isinstance(message, Served):
            raise BenchmarkError(f"the server process failed:\n{message}")
        # The client's heap is as long-lived as the server's: no full passes over it mid-figure.
        gc.collect()
        gc.freeze()
        asyncio.run(run(message, rounds))
    except BenchmarkError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        with contextlib.suppress(OSError):
            parent_end.send("stop")
        parent_end.close()
        child.join(10)
        if child.is_alive():
            child.terminate()
            child.join(5)
        if child.is_alive():
            child.kill()
            child.join()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds; finishes in seconds")
    args = parser.parse_args()
    return measure(args.quick)


if __name__ == "__main__":
    raise SystemExit(main())
