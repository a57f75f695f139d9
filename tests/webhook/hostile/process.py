"""The webhook as a subprocess (its RSS is its own), and raw TLS clients that misbehave.

Loopback only. Addresses other than 127.0.0.1 (``127.0.0.2``) are loopback
too on Linux: the whole 127/8 routes to ``lo``, so "another client" is a
connection whose source address is bound to it.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import resource
import ssl
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from certs.files import BundlePaths
from tests.conftest import REPO_ROOT, load_admission_fixture
from tests.webhook.waiting import eventually

REVIEW = load_admission_fixture("pod-half-gpu.json")


def raise_fd_limit(needed: int) -> None:
    """Raise this process's soft open-file limit to the hard one; skip if that is too low.

    Subprocesses inherit it, so the webhook gets the same limit.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} open files; the hard RLIMIT_NOFILE is {hard}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (``VmRSS`` in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert match, status
    return int(match.group(1)) * 1024


class Webhook:
    """A running ``metagpu webhook`` subprocess: its port, its CA and its output."""

    def __init__(self, proc: asyncio.subprocess.Process, ca_file: Path) -> None:
        self.proc = proc
        self.ca_file = ca_file
        self.port = 0
        self.lines: list[str] = []
        self.output_bytes = 0
        self._readers = [
            asyncio.create_task(self._collect(proc.stdout)),
            asyncio.create_task(self._collect(proc.stderr)),
        ]

    async def _collect(self, stream: asyncio.StreamReader | None) -> None:
        assert stream is not None
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line over the reader's limit: count it, keep it short
                raw = await stream.read(1 << 16)
            if not raw:
                return
            self.output_bytes += len(raw)
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    async def wait_for_line(self, pattern: str, *, timeout_s: float = 30) -> re.Match[str]:
        regex = re.compile(pattern)
        found: list[re.Match[str]] = []

        def seen() -> bool:
            found.extend(m for line in self.lines if (m := regex.search(line)))
            return bool(found) or self.proc.returncode is not None

        await eventually(seen, timeout_s=timeout_s)
        assert found, f"webhook exited without printing {pattern!r}:\n" + self.log()
        return found[0]

    def log(self) -> str:
        return "\n".join(line[:500] for line in self.lines[-80:])

    async def finish(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        await asyncio.gather(*self._readers, return_exceptions=True)


@asynccontextmanager
async def webhook_process(
    tmp_path: Path,
    bundle: BundlePaths,
    *,
    config: dict[str, Any] | None = None,
    log_level: str = "INFO",
    nofile: int | None = None,
) -> AsyncIterator[Webhook]:
    """Start ``metagpu webhook`` with ``config`` (merged over a loopback test config)."""
    data: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "tls": {"cert_file": str(bundle.cert_file), "key_file": str(bundle.key_file)},
        "kubernetes": {"enabled": False},
        "shutdown_timeout_s": 10,
    }
    for key, value in (config or {}).items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = copy.deepcopy(value)
    config_file = tmp_path / f"webhook-{time.monotonic_ns()}.yaml"
    config_file.write_text(yaml.safe_dump(data))
    env = {k: v for k, v in os.environ.items() if not k.startswith("METAGPU_")}
    env.pop("KUBECONFIG", None)

    def limit_files() -> None:  # runs in the child before exec
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "metagpu.cli",
        "webhook",
        "--log-level",
        log_level,
        "--config",
        str(config_file),
        cwd=REPO_ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=limit_files if nofile is not None else None,
        limit=1 << 20,
    )
    hook = Webhook(proc, bundle.ca_file)
    try:
        match = await hook.wait_for_line(r"serving https://127\.0\.0\.1:(\d+)/mutate")
        hook.port = int(match.group(1))
        yield hook
    finally:
        await hook.finish()


def review_bytes(review: dict[str, Any] | None = None) -> bytes:
    return json.dumps(review or REVIEW).encode()


def post_head(length: int, *, path: str = "/mutate") -> bytes:
    """An HTTP/1.1 POST head as the API server sends it."""
    return (
        f"POST {path}?timeout=10s HTTP/1.1\r\nHost: webhook\r\n"
        f"Content-Type: application/json\r\nAccept: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


async def tls_connect(
    hook: Webhook, *, source: str = "127.0.0.1", rcvbuf: int | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TLS connection to the webhook from ``source``, handshake done."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((source, 0))
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", hook.port))
    return await asyncio.open_connection(
        sock=sock, ssl=hook.client_context(), server_hostname="127.0.0.1"
    )


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response (Content-Length bodies): status and body."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    body = await reader.readexactly(length)
    return status, body


async def closed_by_peer(reader: asyncio.StreamReader) -> bool:
    """Wait for the server to close: True on EOF or a reset."""
    try:
        while await reader.read(65536):
            pass
    except (ConnectionError, ssl.SSLError):
        return True
    return True
