"""Clients that open connections and then hold them: idle, slow headers, stalled bodies,
answers never read. Each reproduces what issue 17 saw and checks the bound that now holds.

The webhook runs as a subprocess, so its RSS is its own. Timeouts are set short
where the test is about the mechanism; the defaults are checked against the docs.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import statistics
import time
from pathlib import Path

import aiohttp
import pytest

from certs.files import BundlePaths
from tests.webhook.hostile.process import (
    REVIEW,
    Webhook,
    closed_by_peer,
    post_head,
    raise_fd_limit,
    read_response,
    review_bytes,
    rss_bytes,
    tls_connect,
    webhook_process,
)
from tests.webhook.waiting import eventually
from webhook.config import API_SERVER_IDLE_CONN_TIMEOUT_S, ConnectionsConfig

MIB = 1 << 20
DOC = (Path(__file__).parents[3] / "docs" / "webhook.md").read_text()


async def _metric(hook: Webhook, name: str, **labels: str) -> float:
    async with (
        aiohttp.ClientSession() as session,
        session.get(hook.url + "/metrics", ssl=hook.client_context()) as r,
    ):
        text = await r.text()
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name + (f"{{{wanted}}}" if wanted else "")) + r" ([0-9.e+]+)"
    match = re.search(pattern, text)
    assert match, f"{name} {labels} not in /metrics"
    return float(match.group(1))


async def _reviews(hook: Webhook, count: int) -> list[float]:
    """``count`` reviews from 127.0.0.1, each on a new connection; their latencies."""
    latencies = []
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(count):
            started = time.perf_counter()
            async with session.post(
                hook.url + "/mutate",
                data=review_bytes(),
                ssl=hook.client_context(),
                headers={"Content-Type": "application/json"},
            ) as r:
                assert r.status == 200, await r.text()
                answer = await r.json()
            latencies.append(time.perf_counter() - started)
            assert answer["response"]["allowed"] is True
    return latencies


async def _open_idle(
    hook: Webhook, count: int, *, source: str
) -> tuple[list[asyncio.StreamWriter], int]:
    """Open ``count`` TLS connections from ``source`` that never send a byte."""
    held: list[asyncio.StreamWriter] = []
    refused = 0

    async def one() -> None:
        nonlocal refused
        try:
            _, writer = await tls_connect(hook, source=source)
        except (OSError, asyncio.IncompleteReadError):  # reset before the handshake: refused
            refused += 1
        else:
            held.append(writer)

    for start in range(0, count, 50):
        await asyncio.gather(*(one() for _ in range(min(50, count - start))))
    return held, refused


@pytest.mark.slow
async def test_1500_idle_connections_from_one_client_cost_little_and_starve_no_one(
    tmp_path: Path, bundle: BundlePaths
) -> None:
    """All 1,500 are held (the share is raised to allow it, and the header timeout so
    that none is closed while the rest open), so what is measured is what a held idle
    connection costs: under 200 MiB in all (each cost ~290 KB before)."""
    raise_fd_limit(3000)
    config = {
        "connections": {
            "max_connections": 2000,
            "max_connections_per_client": 2000,
            "header_timeout_s": 120,
        }
    }
    async with webhook_process(tmp_path, bundle, config=config) as hook:
        held, refused = await _open_idle(hook, 1500, source="127.0.0.2")
        try:
            assert (len(held), refused) == (1500, 0)
            latencies = await _reviews(hook, 20)
            assert len(latencies) == 20
            assert statistics.median(latencies) < 0.050, latencies
            rss = rss_bytes(hook.pid)
            assert rss <= 200 * MIB, f"RSS {rss / MIB:.0f} MiB with 1,500 idle connections"
            assert await _metric(hook, "metagpu_webhook_connections_open") >= 1500
        finally:
            for writer in held:
                writer.transport.abort()


async def test_one_client_gets_its_share_and_the_others_still_connect(
    tmp_path: Path, bundle: BundlePaths
) -> None:
    config = {"connections": {"max_connections": 64, "max_connections_per_client": 10}}
    async with webhook_process(tmp_path, bundle, config=config) as hook:
        held, refused = await _open_idle(hook, 30, source="127.0.0.2")
        try:
            assert (len(held), refused) == (10, 20)
            assert len(await _reviews(hook, 5)) == 5
            assert (
                await _metric(hook, "metagpu_webhook_connections_refused_total", why="client") == 20
            )
            # one WARNING for the flood, not one per connection
            assert sum("refusing connections over the budget" in line for line in hook.lines) == 1
        finally:
            for writer in held:
                writer.transport.abort()


async def test_headers_that_never_end_are_cut_off(tmp_path: Path, bundle: BundlePaths) -> None:
    """Slowloris: a header line every 0.2 s. Closed at the header timeout, not after an hour."""
    config = {"connections": {"header_timeout_s": 1.0}}
    async with webhook_process(tmp_path, bundle, config=config) as hook:
        reader, writer = await tls_connect(hook)
        silent_reader, silent = await tls_connect(hook)  # never sends a byte
        started = time.monotonic()
        writer.write(b"POST /mutate HTTP/1.1\r\n")

        async def trickle() -> None:
            for i in range(100):
                await asyncio.sleep(0.2)
                writer.write(f"X-Slow-{i}: y\r\n".encode())

        dripping = asyncio.create_task(trickle())
        try:
            await asyncio.wait_for(closed_by_peer(reader), 10)
            assert time.monotonic() - started < 3
            await asyncio.wait_for(closed_by_peer(silent_reader), 10)
            assert time.monotonic() - started < 3
        finally:
            dripping.cancel()
            writer.transport.abort()
            silent.transport.abort()
        assert (
            await _metric(hook, "metagpu_webhook_connections_closed_total", why="header_timeout")
            == 2
        )


def test_default_timeouts_are_what_the_docs_say() -> None:
    """The header timeout closes a stuck connection within 30 s, as the issue asks; the
    idle timeout outlives the API server's, so the API server is the one that closes."""
    defaults = ConnectionsConfig()
    assert defaults.header_timeout_s == 10
    assert defaults.header_timeout_s <= 30
    assert defaults.idle_timeout_s > API_SERVER_IDLE_CONN_TIMEOUT_S == 90
    for name, value in defaults.model_dump().items():
        row = next(line for line in DOC.splitlines() if line.startswith(f"| `connections.{name}`"))
        assert f"`{value:g}`" in row, row


async def test_a_stalled_body_gets_408_at_the_body_timeout(
    tmp_path: Path, bundle: BundlePaths
) -> None:
    config = {"connections": {"body_timeout_s": 1.0}}
    async with webhook_process(tmp_path, bundle, config=config) as hook:
        reader, writer = await tls_connect(hook)
        body = review_bytes()
        started = time.monotonic()
        writer.write(post_head(len(body)) + body[:100])
        status, text = await asyncio.wait_for(read_response(reader), 10)
        assert status == 408, text
        assert b"not complete within 1s" in text
        assert 0.9 < time.monotonic() - started < 3
        assert await asyncio.wait_for(closed_by_peer(reader), 5)
        writer.transport.abort()


async def test_idle_keep_alive_is_closed_after_the_idle_timeout(
    tmp_path: Path, bundle: BundlePaths
) -> None:
    config = {"connections": {"idle_timeout_s": 1.5, "write_timeout_s": 0.5}}
    async with webhook_process(tmp_path, bundle, config=config) as hook:
        reader, writer = await tls_connect(hook)
        body = review_bytes()
        writer.write(post_head(len(body)) + body)
        status, _ = await read_response(reader)
        assert status == 200
        answered = time.monotonic()
        await asyncio.wait_for(closed_by_peer(reader), 10)
        assert 1.2 < time.monotonic() - answered < 4
        writer.transport.abort()
        assert await _metric(hook, "metagpu_webhook_connections_closed_total", why="idle") == 1


def big_review(containers: int) -> bytes:
    """A pod with ``containers`` half-GPU containers: a large review with a larger answer."""
    review = copy.deepcopy(REVIEW)
    pod = review["request"]["object"]
    template = pod["spec"]["containers"][0]
    pod["spec"]["containers"] = [
        {**copy.deepcopy(template), "name": f"c-{i}"} for i in range(containers)
    ]
    pod["metadata"]["annotations"] = {}
    return json.dumps(review).encode()


@pytest.mark.slow
async def test_clients_that_never_read_their_answer_are_dropped(
    tmp_path: Path, bundle: BundlePaths
) -> None:
    """8 clients post a ~3.4 MB review and never read the ~4.7 MB answer: at most
    4 are held at once (the others are not even read), each is dropped at the write
    timeout, and the memory is given back. 30 such clients once held 650 MB."""
    body = big_review(7000)
    config = {"connections": {"write_timeout_s": 1.0}}
    async with webhook_process(tmp_path, bundle, config=config) as hook:
        writers = []
        for _ in range(8):
            _, writer = await tls_connect(hook, rcvbuf=4096)
            writer.write(post_head(len(body)) + body)
            writers.append(writer)
        try:

            async def all_dropped() -> bool:
                closed = await _metric(
                    hook, "metagpu_webhook_connections_closed_total", why="write_timeout"
                )
                return closed == 8

            await eventually(all_dropped, timeout_s=60)
            # ... and the memory is given back (malloc_trim, at most every 10 s)
            await eventually(lambda: rss_bytes(hook.pid) <= 200 * MIB, timeout_s=30)
            assert len(await _reviews(hook, 3)) == 3
        finally:
            for writer in writers:
                writer.transport.abort()


@pytest.mark.slow
async def test_big_reviews_do_not_starve_small_ones(tmp_path: Path, bundle: BundlePaths) -> None:
    """Four clients post ~1 MB reviews back to back; a small review does not wait for them.

    Judged against the big reviews' own latency in the same run, so it holds however
    loaded the machine is: before, a small review queued behind every big one in its
    loop turn (668 ms against 2 ms alone); now it is answered between their turns.
    """
    body = big_review(2000)
    async with webhook_process(tmp_path, bundle) as hook:
        stop = asyncio.Event()
        big_latencies: list[float] = []

        async def big_client() -> None:
            async with aiohttp.ClientSession() as session:
                while not stop.is_set():
                    started = time.perf_counter()
                    async with session.post(
                        hook.url + "/mutate",
                        data=body,
                        ssl=hook.client_context(),
                        headers={"Content-Type": "application/json"},
                    ) as r:
                        assert r.status == 200
                        await r.read()
                    big_latencies.append(time.perf_counter() - started)

        bigs = [asyncio.create_task(big_client()) for _ in range(4)]
        try:
            await eventually(lambda: len(big_latencies) >= 2, timeout_s=60)
            latencies = []
            async with aiohttp.ClientSession() as session:
                for _ in range(30):
                    started = time.perf_counter()
                    async with session.post(
                        hook.url + "/mutate",
                        data=review_bytes(),
                        ssl=hook.client_context(),
                        headers={"Content-Type": "application/json"},
                    ) as r:
                        assert r.status == 200
                    latencies.append(time.perf_counter() - started)
        finally:
            stop.set()
            await asyncio.gather(*bigs, return_exceptions=True)
        small, big = statistics.median(latencies), statistics.median(big_latencies)
        assert len(big_latencies) >= 4
        assert small < big / 3, f"small reviews {small * 1000:.0f} ms, big ones {big * 1000:.0f} ms"


async def test_a_handshake_that_never_comes_is_dropped(tmp_path: Path, bundle: BundlePaths) -> None:
    """A TCP connection that never sends its ClientHello: dropped at the handshake timeout."""
    config = {"connections": {"tls_handshake_timeout_s": 1.0}}
    async with webhook_process(tmp_path, bundle, config=config) as hook:
        reader, writer = await asyncio.open_connection("127.0.0.1", hook.port)
        started = time.monotonic()
        assert await asyncio.wait_for(closed_by_peer(reader), 10)
        assert 0.9 < time.monotonic() - started < 3
        writer.transport.abort()
