"""Benchmark: what hostile clients cost the webhook in memory (RSS), and what it gives back.

Usage: ``python tests/benchmarks/webhook_connections.py [--quick] [--connections 1500]
[--baseline REF]``

Each server is a ``python -m metagpu.cli webhook`` subprocess (its RSS is its
own), measured through the same floods, one server at a time:

* ``idle``: ``--connections`` TLS connections from ``127.0.0.2`` that finish
  the handshake and never send a byte; RSS per connection is the growth over
  the fresh process divided by the connections held. The budget is raised so
  that every one is held (``max_connections_per_client``), and the header
  timeout so that none is closed while the rest open: what is measured is
  the cost of a held connection, not the budget;
* ``closed``: the RSS two seconds after they are all closed (what is given back);
* ``non-readers``: 8 clients each post a ~3.4 MB review and never read the
  ~4.7 MB answer: the peak RSS while they are held, and the RSS 25 s later,
  once the write timeout (set to 3 s here) has dropped them all.

Servers: ``current`` (this tree), ``current-256k`` (this tree with asyncio's
own 256 KiB read buffer per TLS connection instead of 16 KiB: what the
buffer alone is worth), and with ``--baseline REF`` the webhook as of that git
revision (``git archive``; run on this venv, with its own defaults).

Memory is not noisy the way latency is: one run per server. Printed figures
go to ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import datetime as dt
import json
import os
import re
import resource
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

FIXTURE = ROOT / "tests" / "fixtures" / "admission" / "pod-half-gpu.json"
MIB = 1 << 20
NON_READERS = 8
WRITE_TIMEOUT_S = 3
SETTLE_S = 25
"""Long enough for two turns of four slots to time out and for a debounced malloc_trim."""

BIG_BUFFER_LAUNCHER = (
    "import sys, webhook.connections as c; c.TLSConnection.max_size = 256 * 1024; "
    "from metagpu.cli import main; sys.argv[0] = 'metagpu'; sys.exit(main())"
)


def umbrella_module(tree: Path) -> str:
    """The ``metagpu`` command's module in a source tree of any revision (it moved
    from ``plugin.cli`` to ``metagpu.cli`` when plugin/ was split by concern)."""
    return "metagpu.cli" if (tree / "metagpu" / "cli.py").is_file() else "plugin.cli"


def rss(pid: int) -> int:
    match = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert match
    return int(match.group(1)) * 1024


def big_review() -> bytes:
    review = json.loads(FIXTURE.read_text())
    pod = review["request"]["object"]
    template = pod["spec"]["containers"][0]
    pod["spec"]["containers"] = [{**copy.deepcopy(template), "name": f"c-{i}"} for i in range(7000)]
    pod["metadata"]["annotations"] = {}
    return json.dumps(review).encode()


def start(cmd: list[str], *, cwd: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if match := re.search(r"serving https://127\.0\.0\.1:(\d+)/mutate", line):
            return proc, int(match.group(1))
    proc.kill()
    raise RuntimeError(f"webhook did not start: {cmd}")


async def connect(
    port: int, ctx: ssl.SSLContext, *, rcvbuf: int | None = None
) -> asyncio.StreamWriter:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind(("127.0.0.2", 0))
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    _, writer = await asyncio.open_connection(sock=sock, ssl=ctx, server_hostname="127.0.0.1")
    return writer


async def flood(pid: int, port: int, ca: Path, connections: int, big: bytes) -> dict[str, float]:
    ctx = ssl.create_default_context(cafile=str(ca))
    await asyncio.sleep(1)
    fresh = rss(pid)
    held: list[asyncio.StreamWriter] = []
    for start_at in range(0, connections, 50):
        batch = await asyncio.gather(
            *(connect(port, ctx) for _ in range(min(50, connections - start_at))),
            return_exceptions=True,
        )
        held += [w for w in batch if isinstance(w, asyncio.StreamWriter)]
    await asyncio.sleep(1)
    idle = rss(pid)
    for writer in held:
        writer.transport.abort()
    await asyncio.sleep(2)
    closed = rss(pid)
    head = (
        "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(big)}\r\n\r\n"
    ).encode()
    readers = [await connect(port, ctx, rcvbuf=4096) for _ in range(NON_READERS)]
    for writer in readers:
        writer.write(head + big)
    peak = 0
    settle_at = time.monotonic() + SETTLE_S
    while time.monotonic() < settle_at:  # held, dropped in turns, memory given back
        await asyncio.sleep(0.1)
        peak = max(peak, rss(pid))
    after = rss(pid)
    for writer in readers:
        writer.transport.abort()
    return {
        "fresh": fresh / MIB,
        "held": len(held),
        "idle": idle / MIB,
        "per_conn_kib": (idle - fresh) / max(len(held), 1) / 1024,
        "closed": closed / MIB,
        "non_readers": peak / MIB,
        "after_write_timeout": after / MIB,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 connections, one server (< 60 s)")
    parser.add_argument("--connections", type=int, default=None)
    parser.add_argument("--baseline", metavar="REF", help="also the webhook as of git revision REF")
    args = parser.parse_args()
    connections = args.connections or (300 if args.quick else 1500)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard != resource.RLIM_INFINITY and hard < connections + 500:
        print(f"needs {connections + 500} open files; the hard limit is {hard}")
        return 1
    from certs.files import generate_bundle

    big = big_review()
    env = {k: v for k, v in os.environ.items() if not k.startswith("METAGPU_")}
    ours = {
        **env,
        "METAGPU_WEBHOOK_CONNECTIONS__MAX_CONNECTIONS": str(connections + 100),
        "METAGPU_WEBHOOK_CONNECTIONS__MAX_CONNECTIONS_PER_CLIENT": str(connections + 100),
        "METAGPU_WEBHOOK_CONNECTIONS__HEADER_TIMEOUT_S": "120",
        "METAGPU_WEBHOOK_CONNECTIONS__WRITE_TIMEOUT_S": str(WRITE_TIMEOUT_S),
    }
    with tempfile.TemporaryDirectory(prefix="mg-conn-bench-") as tmp:
        bundle = generate_bundle(
            Path(tmp) / "tls",
            now=dt.datetime.now(dt.UTC),
            dns_names=["localhost"],
            ip_addresses=["127.0.0.1"],
        )
        flags = [
            "webhook",
            "--listen",
            "127.0.0.1:0",
            "--kubernetes",
            "false",
            "--tls-cert",
            str(bundle.cert_file),
            "--tls-key",
            str(bundle.key_file),
        ]
        servers: list[tuple[str, list[str], Path, dict[str, str]]] = [
            ("current", [sys.executable, "-m", "metagpu.cli", *flags], ROOT, ours),
        ]
        if not args.quick:
            servers.append(
                ("current-256k", [sys.executable, "-c", BIG_BUFFER_LAUNCHER, *flags], ROOT, ours)
            )
        if args.baseline:
            tree = Path(tmp) / "baseline"
            tree.mkdir()
            archive = subprocess.run(
                ["git", "archive", "--format=tar", args.baseline],
                cwd=ROOT,
                capture_output=True,
                check=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
            servers.append(
                (
                    f"baseline {args.baseline}",
                    [sys.executable, "-m", umbrella_module(tree), *flags],
                    tree,
                    env,
                )
            )
        print(
            f"webhook connection benchmark: {connections} idle TLS connections from 127.0.0.2, "
            f"then {NON_READERS} clients posting a {len(big) / MIB:.1f} MiB review and never "
            f"reading the answer; RSS in MiB; {os.cpu_count()} CPUs"
        )
        print(
            f"  {'server':<20} {'fresh':>6} {'held':>5} {'idle':>7} {'KiB/conn':>9} "
            f"{'closed':>7} {'non-readers peak':>17} {'25 s later':>11}"
        )
        for name, cmd, cwd, server_env in servers:
            proc, port = start(cmd, cwd=cwd, env=server_env)
            try:
                r = asyncio.run(flood(proc.pid, port, bundle.ca_file, connections, big))
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
            print(
                f"  {name:<20} {r['fresh']:6.0f} {r['held']:5.0f} {r['idle']:7.0f} "
                f"{r['per_conn_kib']:9.1f} {r['closed']:7.0f} {r['non_readers']:17.0f} "
                f"{r['after_write_timeout']:11.0f}"
            )
    print("  (median of one run per server: memory figures do not move like latency does)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
