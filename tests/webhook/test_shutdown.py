"""SIGTERM: ``metagpu webhook`` finishes the request in flight, then exits 0 within its timeout.

The webhook runs as a real subprocess (``python -m metagpu.cli webhook``). The
in-flight request is made deterministic with the one thing a handler awaits:
the namespace lookup. The webhook's kubeconfig points at a fake API server in
the test that accepts the namespace GET and never answers, so the handler is
provably mid-request (the GET has arrived) when SIGTERM is sent; it completes
when the lookup times out, with the config defaults and a warning.

A request whose *body* is still arriving at SIGTERM is read and answered too:
``tests/webhook/hostile/test_shutdown_upload.py``.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import ssl
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from certs.files import BundlePaths
from tests.conftest import REPO_ROOT, load_admission_fixture
from tests.webhook.conftest import client_context, webhook_config
from tests.webhook.http import ReviewClient
from tests.webhook.waiting import eventually
from webhook.server import running_webhook

SHUTDOWN_TIMEOUT_S = 5


class Process:
    """A ``metagpu webhook`` subprocess with its stdout/stderr collected line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._readers = [
            asyncio.create_task(self._collect(proc.stdout)),
            asyncio.create_task(self._collect(proc.stderr)),
        ]

    async def _collect(self, stream: asyncio.StreamReader | None) -> None:
        assert stream is not None
        async for raw in stream:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    async def wait_for_line(self, pattern: str, *, timeout_s: float = 20) -> re.Match[str]:
        regex = re.compile(pattern)
        found: list[re.Match[str]] = []

        def seen() -> bool:
            found.extend(m for line in self.lines if (m := regex.search(line)))
            return bool(found) or self.proc.returncode is not None

        await eventually(seen, timeout_s=timeout_s)
        assert found, f"process exited without printing {pattern!r}:\n" + "\n".join(self.lines)
        return found[0]

    async def finish(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        await asyncio.gather(*self._readers, return_exceptions=True)


class HangingApi:
    """Accepts Kubernetes API requests and never answers; notes namespace GETs."""

    def __init__(self) -> None:
        self.namespace_get = asyncio.Event()
        self._writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        request_line = await reader.readline()
        if re.match(rb"GET /api/v1/namespaces/[^/?\s]+ ", request_line):
            self.namespace_get.set()
        await reader.read()  # hold the connection until the client gives up

    def close(self) -> None:
        for w in self._writers:
            w.close()


async def start_webhook(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> Process:
    full_env = {**os.environ, "METAGPU_WEBHOOK_SHUTDOWN_TIMEOUT_S": str(SHUTDOWN_TIMEOUT_S)}
    full_env.pop("KUBECONFIG", None)
    full_env.update(env or {})
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "metagpu.cli",
        "webhook",
        "--listen",
        "127.0.0.1:0",
        "--tls-dir",
        str(tmp_path / "tls"),
        *extra,
        cwd=REPO_ROOT,
        env=full_env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    return Process(proc)


@pytest.fixture
async def webhook_process(tmp_path: Path) -> AsyncIterator[Process]:
    process = await start_webhook(tmp_path, "--kubernetes", "false")
    try:
        yield process
    finally:
        await process.finish()


async def test_sigterm_drains_the_request_in_flight(tmp_path: Path) -> None:
    api = HangingApi()
    server = await asyncio.start_server(api.handle, "127.0.0.1", 0)
    api_port = server.sockets[0].getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{api_port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    lookup_s = 3
    process = await start_webhook(
        tmp_path,
        "--kubernetes",
        "true",
        "--kubeconfig",
        str(kubeconfig),
        env={"METAGPU_WEBHOOK_KUBERNETES__NAMESPACE_LOOKUP_TIMEOUT_S": str(lookup_s)},
    )
    try:
        async with server:
            await _drain_in_flight(process, api, lookup_s)
    finally:
        api.close()
        await process.finish()


async def _drain_in_flight(process: Process, api: HangingApi, lookup_s: float) -> None:
    match = await process.wait_for_line(r"serving (https://127\.0\.0\.1:(\d+)/mutate)")
    port = int(match.group(2))
    ca = await process.wait_for_line(r"generated CA \(trust it to connect\): (\S+)")
    ctx = ssl.create_default_context(cafile=ca.group(1))
    async with aiohttp.ClientSession() as session:
        request = asyncio.create_task(
            session.post(
                f"https://127.0.0.1:{port}/mutate",
                json=load_admission_fixture("pod-half-gpu.json"),
                ssl=ctx,
            )
        )
        await asyncio.wait_for(api.namespace_get.wait(), 20)  # the handler is mid-request
        signalled = time.monotonic()
        process.proc.send_signal(signal.SIGTERM)
        await process.wait_for_line("stopping on signal")
        async with await asyncio.wait_for(request, SHUTDOWN_TIMEOUT_S + 10) as response:
            assert response.status == 200
            answer = await response.json()
    assert answer["response"]["allowed"] is True
    assert answer["response"]["patch"]
    assert any("could not read namespace 'team-a'" in w for w in answer["response"]["warnings"])
    rc = await asyncio.wait_for(process.proc.wait(), SHUTDOWN_TIMEOUT_S + 10)
    assert rc == 0, "\n".join(process.lines)
    assert time.monotonic() - signalled < SHUTDOWN_TIMEOUT_S + 2
    assert any("stopped" in line for line in process.lines)
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_idle_webhook_exits_promptly_on_sigterm(webhook_process: Process) -> None:
    await webhook_process.wait_for_line(r"serving https://")
    signalled = time.monotonic()
    webhook_process.proc.send_signal(signal.SIGTERM)
    rc = await asyncio.wait_for(webhook_process.proc.wait(), SHUTDOWN_TIMEOUT_S + 5)
    assert rc == 0
    assert time.monotonic() - signalled < SHUTDOWN_TIMEOUT_S  # nothing in flight: no waiting
    assert any("stopped" in line for line in webhook_process.lines)


async def test_drain_delay_keeps_serving_while_not_ready(ca_bundle: BundlePaths) -> None:
    config = webhook_config(ca_bundle, drain_delay_s=3)
    hook_cm = running_webhook(config)
    hook = await hook_cm.__aenter__()
    async with aiohttp.ClientSession() as session:
        c = ReviewClient(session, hook.url, client_context(ca_bundle.ca_file))
        assert (await c.get("/readyz")).status == 200
        stopping = asyncio.create_task(hook_cm.__aexit__(None, None, None))
        await eventually(lambda: hook.state.draining)
        assert (await c.get("/readyz")).status == 503
        answer = await c.post(load_admission_fixture("pod-half-gpu.json"))
        assert answer.status == 200
        assert not stopping.done()
        await asyncio.wait_for(stopping, 10)
    with pytest.raises((aiohttp.ClientError, OSError, ssl.SSLError)):
        async with aiohttp.ClientSession() as session:
            await session.get(hook.url + "/healthz", ssl=client_context(ca_bundle.ca_file))
