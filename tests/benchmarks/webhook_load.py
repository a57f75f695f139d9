"""Benchmark: the webhook's ``/mutate`` under keep-alive HTTPS load, against aiohttp's floor.

Usage: ``python tests/benchmarks/webhook_load.py [--quick] [--connections 64]``

Three processes, so that no two of them share an event loop:

* the real webhook, started as ``python -m metagpu.cli webhook`` (one worker,
  no cluster, its default INFO logging), serving a generated certificate;
* the floor: a bare aiohttp app on the same TLS set-up (the same
  ``ReloadingTLS`` context, the same AppRunner options) whose handler reads the
  body and returns a constant AdmissionReview of the same size as the real
  answer; everything the webhook does beyond that is what ``/mutate`` costs;
* the load client: 64 keep-alive TLS connections (``--connections``) on one
  asyncio loop, each a tiny ``asyncio.Protocol`` replaying one prebuilt request
  (the captured half-GPU pod, ~5 KB) as soon as the previous answer is in, so
  the client spends as little CPU per request as Python allows.

Each round measures the floor, then the webhook (after a warm-up that opens
every connection and lets the caches fill); the figures are medians over
rounds. Printed: throughput, p50 and p99 latency for each, and the ratio.
Targets (issue 2): throughput >= 70% of the floor's, p99 < 10 ms.

``--breakdown`` also starts one floor per step of ``/mutate``'s own work,
each doing that step and the ones before it the way the webhook does them,
in batches (``batch``: the handler queues the body through
``webhook.batching.Batcher`` and the batch answers the constant; ``parse``:
+ ``orjson.loads`` of the body; ``decode``: + the envelope checks;
``rules``: + classifying and the rules; ``encode``: + encoding the answer,
which it sends; ``metrics``: + the namespace lookup and the metrics), and
prints what each step adds to the server's CPU per request under the same
load: the figures ``docs/benchmarks.md`` explains. A step costs more there
than in a loop of its own, because TLS and aiohttp's work for the other
connections runs between two batches and evicts the step's code and data.

``--baseline REF`` also starts the webhook as it was at git revision ``REF``
(its tree exported with ``git archive`` and run with this venv) and measures
it in every round next to the current one, so a change's cost is a same-run
ratio rather than a comparison with figures from another day.

A missed target is printed as MISS and the exit code stays 0: these are
figures on a shared, noisy machine, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks._stats import percentile  # noqa: E402 - after the path is set

FIXTURE = ROOT / "tests" / "fixtures" / "admission" / "pod-half-gpu.json"
TARGET_RATIO = 0.70
TARGET_P99_MS = 10.0


# ------------------------------------------------------------------ client
@dataclass
class ClientResult:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int
    answered: int = 0
    """Every answer, warm-up included: the denominator of the server's CPU per request."""
    server_cpu_s: float = float("nan")

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def cpu_us_per_request(self) -> float:
        return self.server_cpu_s / self.answered * 1e6 if self.answered else float("nan")


class _Connection(asyncio.Protocol):
    """One keep-alive connection replaying ``request``; records each answer's latency."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.buf = bytearray()
        self.need = -1
        self.sent_at = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._send()

    def _send(self) -> None:
        assert self.transport is not None
        self.sent_at = time.perf_counter()
        self.transport.write(self.run.request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            if self.need < 0:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(self.buf[:end])
                match = re.search(rb"\r\ncontent-length: *(\d+)", head, re.IGNORECASE)
                length = int(match.group(1)) if match else 0
                if not head.startswith(b"HTTP/1.1 200"):
                    self.run.errors += 1
                self.need = end + 4 + length
            if len(self.buf) < self.need:
                return
            body = bytes(self.buf[self.need - 20 : self.need])
            del self.buf[: self.need]
            self.need = -1
            now = time.perf_counter()
            if not body.endswith(b"}}"):
                self.run.errors += 1
            self.run.answered += 1
            if now >= self.run.measure_from:
                self.run.latencies.append(now - self.sent_at)
            if now < self.run.stop_at:
                self._send()
            else:
                assert self.transport is not None
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if time.perf_counter() < self.run.stop_at:
            self.run.errors += 1
        self.run.closed += 1
        if self.run.closed == self.run.connections:
            self.run.done.set()


class _Run:
    def __init__(
        self, request: bytes, connections: int, warmup_s: float, duration_s: float
    ) -> None:
        now = time.perf_counter()
        self.request = request
        self.connections = connections
        self.measure_from = now + warmup_s
        self.stop_at = self.measure_from + duration_s
        self.latencies: list[float] = []
        self.errors = 0
        self.answered = 0
        self.closed = 0
        self.done = asyncio.Event()


async def client_main(args: argparse.Namespace, body: bytes) -> None:
    ctx = ssl.create_default_context(cafile=args.ca)
    request = (
        f"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1:{args.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    loop = asyncio.get_running_loop()
    run = _Run(request, args.connections, args.warmup, args.duration)
    for _ in range(args.connections):
        await loop.create_connection(
            lambda: _Connection(run), "127.0.0.1", args.port, ssl=ctx, server_hostname="127.0.0.1"
        )
    await asyncio.wait_for(run.done.wait(), args.warmup + args.duration + 30)
    lat = run.latencies
    result = {
        "requests": len(lat),
        "seconds": args.duration,
        "p50_ms": percentile(lat, 50) * 1000 if lat else float("nan"),
        "p99_ms": percentile(lat, 99) * 1000 if lat else float("nan"),
        "errors": run.errors,
        "answered": run.answered,
    }
    print(json.dumps(result), flush=True)


# ------------------------------------------------------------------- floor
STEPS = ("batch", "parse", "decode", "rules", "encode", "metrics")
"""``--breakdown`` floors, each doing ``/mutate``'s work up to and including that step."""
STEP_LABELS = {
    "batch": "+ queuing through the batcher (webhook.batching)",
    "parse": "+ orjson.loads of the body",
    "decode": "+ the envelope checks (decode_review)",
    "rules": "+ classify and the rules (admit)",
    "encode": "+ encoding the answer (encode_response)",
    "metrics": "+ namespace lookup and metrics",
}


async def floor_main(args: argparse.Namespace) -> None:
    """The framework's floor: same TLS, same runner options, a constant answer.

    With ``--step``, the handler also does ``/mutate``'s work up to that step
    (:data:`STEPS`), so the difference between two floors is what one step
    costs the server under load.
    """
    import orjson
    from aiohttp import web

    from certs.tls import ReloadingTLS
    from webhook.admission import admit, classify, namespace_to_look_up
    from webhook.batching import Batcher
    from webhook.config import WebhookConfig
    from webhook.metrics import WebhookMetrics
    from webhook.namespaces import StaticNamespaces
    from webhook.review import build_response, decode_review, encode_response, encode_review
    from webhook.rules import RuleSettings, mutate_pod

    settings = RuleSettings.from_config(WebhookConfig())
    review = json.loads(FIXTURE.read_text())
    decision = mutate_pod(review["request"]["object"], settings=settings)
    answer = encode_review(build_response(review["request"]["uid"], decision))
    step = STEPS.index(args.step) + 1 if args.step else 0
    metrics = WebhookMetrics()
    namespaces = StaticNamespaces(metrics)

    def constant() -> web.Response:
        return web.Response(body=answer, content_type="application/json")

    def work(body: bytes) -> web.Response:
        """``/mutate``'s work up to ``step``, run in batches as the webhook runs it."""
        started = time.perf_counter()
        if step == 1:
            return constant()
        if step == 2:
            orjson.loads(body)
            return constant()
        checked = decode_review(body)
        if step == 3:
            return constant()
        target = classify(checked)
        made = admit(checked, settings=settings, target=target)
        if step == 4:
            return constant()
        encoded = encode_response(checked["uid"], made)
        if step == 6:
            namespaces.cached(namespace_to_look_up(checked, target=target) or "")
            metrics.observe("allowed-mutated", target, time.perf_counter() - started)
        return web.Response(body=encoded, content_type="application/json")

    batcher = Batcher(work)

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        if not step:
            return constant()
        return await batcher.submit(body)

    tls = ReloadingTLS(Path(args.cert), Path(args.key))
    app = web.Application(client_max_size=4 << 20)
    app.router.add_post("/mutate", handle)
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.server_context)
    await site.start()
    port = runner.addresses[0][1]
    print(f"floor: serving https://127.0.0.1:{port}/mutate", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()


# ------------------------------------------------------------- coordinator
DRA_ENV: dict[str, str] = {
    "METAGPU_WEBHOOK_MODE": "dra",
    "METAGPU_WEBHOOK_DRA__GPU_MEMORY_MIB": "81920",
    "METAGPU_WEBHOOK_DRA__CONTROLLER": "false",
}
"""DRA mode for ``--dra``: an 80 GiB GPU, no claim-template controller (no cluster here)."""


def start_server(
    cmd: list[str], pattern: str, *, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **env} if env else None,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        match = re.search(pattern, line)
        if match:
            return proc, int(match.group(1))
    proc.kill()
    raise RuntimeError(f"server did not start: {' '.join(cmd)}")


def start_baseline(
    ref: str, tmp: Path, cert_file: Path, key_file: Path
) -> tuple[str, subprocess.Popen[str], int]:
    """The webhook as of git revision ``ref``, from its exported tree, on this venv."""
    tree = tmp / "baseline"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    proc, port = start_server(
        [
            sys.executable,
            "-m",
            # metagpu.cli since plugin/ was split by concern; plugin.cli before
            "metagpu.cli" if (tree / "metagpu" / "cli.py").is_file() else "plugin.cli",
            "webhook",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            str(cert_file),
            "--tls-key",
            str(key_file),
            "--kubernetes",
            "false",
        ],
        r"serving https://127\.0\.0\.1:(\d+)/mutate",
        cwd=tree,
    )
    return "baseline", proc, port


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    server_pid: int,
    port: int,
    ca: Path,
    body: Path,
    args: argparse.Namespace,
    *,
    connections: int | None = None,
    duration_s: float | None = None,
) -> ClientResult:
    """One client run against one server, with the server's CPU time over that run.

    CPU per request is the figure to trust on a shared machine: throughput moves
    with whatever else runs there, the CPU a request costs hardly does.
    """
    cpu_before = cpu_seconds(server_pid)
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--role",
            "client",
            "--port",
            str(port),
            "--ca",
            str(ca),
            "--body",
            str(body),
            "--connections",
            str(connections or args.connections),
            "--warmup",
            str(args.warmup),
            "--duration",
            str(duration_s or args.duration),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=args.warmup + args.duration + 60,
    )
    result = ClientResult(**json.loads(out.stdout.strip().splitlines()[-1]))
    result.server_cpu_s = cpu_seconds(server_pid) - cpu_before
    return result


def coordinate(args: argparse.Namespace) -> int:
    from certs.files import generate_bundle

    with tempfile.TemporaryDirectory(prefix="mg-bench-") as tmp:
        bundle = generate_bundle(
            Path(tmp),
            now=dt.datetime.now(dt.UTC),
            dns_names=["localhost"],
            ip_addresses=["127.0.0.1"],
        )
        body = Path(tmp) / "review.json"
        body.write_text(json.dumps(json.loads(FIXTURE.read_text()), separators=(",", ":")))
        env_cmd = [sys.executable]
        webhook_cmd = [
            *env_cmd,
            "-m",
            "metagpu.cli",
            "webhook",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            str(bundle.cert_file),
            "--tls-key",
            str(bundle.key_file),
            "--kubernetes",
            "false",
        ]
        serving = r"serving https://127\.0\.0\.1:(\d+)/mutate"
        webhook, webhook_port = start_server(webhook_cmd, serving)
        servers: list[tuple[str, subprocess.Popen[str], int]] = []
        try:
            if args.dra:
                # The same review through DRA mode: the fraction becomes a ResourceClaim
                # (webhook/dra.py), what a pod's creation costs there.
                proc, port = start_server(
                    webhook_cmd,
                    serving,
                    env=DRA_ENV,
                )
                servers.append(("dra", proc, port))
            if args.baseline:
                servers.append(
                    start_baseline(args.baseline, Path(tmp), bundle.cert_file, bundle.key_file)
                )
            for step in ("", *(STEPS if args.breakdown else ())):
                proc, port = start_server(
                    [
                        *env_cmd,
                        __file__,
                        "--role",
                        "floor",
                        "--cert",
                        str(bundle.cert_file),
                        "--key",
                        str(bundle.key_file),
                        *(["--step", step] if step else []),
                    ],
                    r"floor: serving https://127\.0\.0\.1:(\d+)/mutate",
                )
                servers.append((f"+{step}" if step else "floor", proc, port))
        except BaseException:
            for _, proc, _ in servers:
                proc.kill()
            webhook.kill()
            raise
        servers.append(("mutate", webhook, webhook_port))
        floor, floor_port = next((p, port) for name, p, port in servers if name == "floor")
        print(
            f"webhook load benchmark ({'quick' if args.quick else 'full'}): "
            f"{args.connections} keep-alive HTTPS connections, {body.stat().st_size}-byte review "
            f"(pod-half-gpu), {args.rounds} round(s) of {args.duration:g}s after {args.warmup:g}s "
            f"warm-up; server and client in separate processes; {os.cpu_count()} CPUs"
        )
        results: dict[str, list[ClientResult]] = {name: [] for name, _, _ in servers}
        try:
            for i in range(args.rounds):
                for name, proc, port in servers:
                    r = measure(proc.pid, port, bundle.ca_file, body, args)
                    results[name].append(r)
                    print(
                        f"  round {i + 1} {name:<8} {r.rps:8.0f} req/s  p50 {r.p50_ms:6.2f} ms  "
                        f"p99 {r.p99_ms:6.2f} ms  server CPU {r.cpu_us_per_request:5.0f} us/req  "
                        f"errors {r.errors}"
                    )
            # One connection: the latency of a single review with no queue in front of it,
            # which is what the API server sees when it is not flooding one webhook pod.
            single: dict[str, ClientResult] = {}
            for name, proc, port in (
                ("floor", floor, floor_port),
                ("mutate", webhook, webhook_port),
            ):
                single[name] = measure(
                    proc.pid,
                    port,
                    bundle.ca_file,
                    body,
                    args,
                    connections=1,
                    duration_s=min(args.duration, 1.0 if args.quick else 5.0),
                )
        finally:
            for _, proc, _ in servers:
                proc.send_signal(signal.SIGTERM)
            for _, proc, _ in servers:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()

    def med(name: str, attr: str) -> float:
        return float(statistics.median(float(getattr(r, attr)) for r in results[name]))

    print("\nmedians:")
    for name, label in (
        ("floor", "floor: bare aiohttp, constant answer"),
        ("mutate", "POST /mutate (real rules)"),
    ):
        print(
            f"  {label:<38} {med(name, 'rps'):8.0f} req/s  p50 {med(name, 'p50_ms'):6.2f} ms  "
            f"p99 {med(name, 'p99_ms'):6.2f} ms  server CPU {med(name, 'cpu_us_per_request'):5.0f} "
            "us/req"
        )
    ratio = med("mutate", "rps") / med("floor", "rps")
    cpu_ratio = med("floor", "cpu_us_per_request") / med("mutate", "cpu_us_per_request")
    p99 = med("mutate", "p99_ms")
    errors = sum(r.errors for rs in results.values() for r in rs)
    verdict = "PASS" if ratio >= TARGET_RATIO else "MISS"
    print(f"  throughput ratio mutate/floor: {ratio:.0%} (target >= {TARGET_RATIO:.0%}): {verdict}")
    print(f"  capacity ratio from server CPU per request (floor/mutate): {cpu_ratio:.0%}")
    print(
        f"  /mutate p99: {p99:.2f} ms (target < {TARGET_P99_MS:g} ms): "
        f"{'PASS' if p99 < TARGET_P99_MS else 'MISS'}"
    )
    print(f"  failed requests: {errors}")
    if args.baseline:
        base = f"baseline ({args.baseline})"
        print(
            f"  {base:<38} {med('baseline', 'rps'):8.0f} req/s  p50 "
            f"{med('baseline', 'p50_ms'):6.2f} ms  p99 {med('baseline', 'p99_ms'):6.2f} ms  "
            f"server CPU {med('baseline', 'cpu_us_per_request'):5.0f} us/req"
        )
        print(
            f"  mutate/baseline: throughput {med('mutate', 'rps') / med('baseline', 'rps'):.2f}, "
            f"p50 {med('mutate', 'p50_ms') / med('baseline', 'p50_ms'):.2f}, "
            f"p99 {med('mutate', 'p99_ms') / med('baseline', 'p99_ms'):.2f}, server CPU/req "
            f"{med('mutate', 'cpu_us_per_request') / med('baseline', 'cpu_us_per_request'):.2f}"
        )
        # Each round measures both back to back, so a round's ratio sees the same load
        # on a shared machine; their median is the figure to trust.
        paired = [
            (m.cpu_us_per_request / b.cpu_us_per_request, m.p50_ms / b.p50_ms)
            for m, b in zip(results["mutate"], results["baseline"], strict=True)
        ]
        print(
            "  mutate/baseline, median of per-round ratios: server CPU/req "
            f"{statistics.median(c for c, _ in paired):.2f}, p50 "
            f"{statistics.median(p for _, p in paired):.2f} "
            f"(rounds: {', '.join(f'{c:.2f}' for c, _ in paired)})"
        )
    if args.dra:
        print(
            f"  {'POST /mutate, DRA mode (claims)':<38} {med('dra', 'rps'):8.0f} req/s  p50 "
            f"{med('dra', 'p50_ms'):6.2f} ms  p99 {med('dra', 'p99_ms'):6.2f} ms  "
            f"server CPU {med('dra', 'cpu_us_per_request'):5.0f} us/req"
        )
        paired_dra = [
            (d.cpu_us_per_request / m.cpu_us_per_request, d.rps / f.rps)
            for d, m, f in zip(results["dra"], results["mutate"], results["floor"], strict=True)
        ]
        print(
            "  DRA mode, median of per-round ratios: server CPU/req vs device-plugin mode "
            f"{statistics.median(c for c, _ in paired_dra):.2f}, throughput vs floor "
            f"{statistics.median(t for _, t in paired_dra):.0%}"
        )
    if args.breakdown:
        print("\nwhere /mutate's server CPU goes (each step done through a floor's batcher):")
        previous = med("floor", "cpu_us_per_request")
        for name, label in (
            *((f"+{step}", STEP_LABELS[step]) for step in STEPS),
            ("mutate", "the webhook itself (its handler and app)"),
        ):
            cpu = med(name, "cpu_us_per_request")
            print(f"  {label:<52} {cpu:5.0f} us/req  ({cpu - previous:+4.0f})")
            previous = cpu
    print("\none connection (no queueing; the latency of one review):")
    for name, label in (("floor", "floor"), ("mutate", "POST /mutate")):
        r = single[name]
        print(
            f"  {label:<14} {r.rps:7.0f} req/s  p50 {r.p50_ms:6.2f} ms  p99 {r.p99_ms:6.2f} ms  "
            f"server CPU {r.cpu_us_per_request:5.0f} us/req"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short round (< 15 s)")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--duration", type=float, default=None, help="measured seconds per figure")
    parser.add_argument("--warmup", type=float, default=None)
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also measure a floor per step of /mutate's work (what each step costs)",
    )
    parser.add_argument(
        "--baseline", metavar="REF", help="also measure the webhook as of git revision REF"
    )
    parser.add_argument(
        "--dra",
        action="store_true",
        help="also measure the webhook in DRA mode (the share becomes a ResourceClaim)",
    )
    parser.add_argument("--role", choices=("coordinator", "client", "floor"), default="coordinator")
    parser.add_argument("--step", choices=STEPS, help="floor role: do /mutate's work up to here")
    parser.add_argument("--port", type=int)
    parser.add_argument("--ca")
    parser.add_argument("--body")
    parser.add_argument("--cert")
    parser.add_argument("--key")
    args = parser.parse_args()
    if args.role == "client":
        asyncio.run(client_main(args, Path(args.body).read_bytes()))
        return 0
    if args.role == "floor":
        asyncio.run(floor_main(args))
        return 0
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.duration = args.duration or (1.5 if args.quick else 10.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if args.quick else 2.0)
    return coordinate(args)


if __name__ == "__main__":
    raise SystemExit(main())
