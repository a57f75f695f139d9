"""The extender's exec probe says what failed in one line (issue 32, item 4).

It used to be ``python -c "urllib.request.urlopen(...)"``, whose traceback
(about 40 lines) landed in the pod's Events on every failed probe at start-up.
Run as the kubelet runs it: a child process, its output read whole."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from tests.conftest import REPO_ROOT


def run_probe(url: str) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, "-m", "metagpu.probe", url],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=30,
        check=False,
    )
    return done.returncode, (done.stdout + done.stderr).splitlines()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def extender_like() -> AsyncIterator[str]:
    """/healthz answers 200, /readyz 503 with a reason, like a starting extender."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        report = {"ready": False, "reason": "waiting for the first node ledger list"}
        return web.Response(status=503, text=json.dumps(report, indent=2) + "\n")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_nothing_listening_is_one_line() -> None:
    url = f"http://127.0.0.1:{closed_port()}/readyz"
    code, lines = run_probe(url)
    assert code == 1
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{url}: not answering:")
    assert "refused" in lines[0].lower()


async def test_not_ready_is_one_line_with_the_reason(extender_like: str) -> None:
    code, lines = await _in_thread(f"{extender_like}/readyz")
    assert code == 1
    assert lines == [
        f'{extender_like}/readyz: HTTP 503: {{ "ready": false, "reason": '
        '"waiting for the first node ledger list" }'
    ]


async def test_healthy_is_exit_zero(extender_like: str) -> None:
    code, lines = await _in_thread(f"{extender_like}/healthz")
    assert (code, lines) == (0, [f"{extender_like}/healthz: HTTP 200"])


async def _in_thread(url: str) -> tuple[int, list[str]]:
    """The probe is a child process; the server lives on this loop, which must keep running."""
    return await asyncio.to_thread(run_probe, url)
