"""Clients that try to flood or poison the log: garbage request lines, disconnects
mid-body, connection floods past the file-descriptor limit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import sys
from pathlib import Path

import aiohttp

from certs.files import BundlePaths
from tests.webhook.hostile.process import (
    post_head,
    raise_fd_limit,
    review_bytes,
    tls_connect,
    webhook_process,
)
from webhook.logguard import RateLimitFilter, TrimFilter


async def _review_ok(url: str, ctx: ssl.SSLContext) -> bool:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url + "/mutate",
            data=review_bytes(),
            ssl=ctx,
            headers={"Content-Type": "application/json"},
        ) as r,
    ):
        return r.status == 200


async def test_garbage_and_disconnects_leave_short_lines_and_no_tracebacks(
    tmp_path: Path, bundle: BundlePaths
) -> None:
    async with webhook_process(tmp_path, bundle, log_level="INFO") as hook:
        for garbage in (
            b"G" * 67_000 + b" / HTTP/1.1\r\n\r\n",  # a request line past aiohttp's limit
            b"GET /" + b"x" * 7_000 + b" HTTP/1.1\r\n\r\n",
            b"POST /mutate HTTP/1.1\r\nX-Junk: " + b"\x01" * 8_000 + b"\r\n\r\n",
            b"\x16\x03\x01" + b"\xff" * 5000 + b"\r\n\r\n",
        ):
            reader, writer = await tls_connect(hook)
            writer.write(garbage)
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await asyncio.wait_for(reader.read(), 10)
            writer.transport.abort()
        for _ in range(5):  # clients that go away half-way through their body
            _, writer = await tls_connect(hook)
            body = review_bytes()
            writer.write(post_head(len(body)) + body[: len(body) // 2])
            await writer.drain()
            writer.transport.abort()
        assert await _review_ok(hook.url, hook.client_context())
        await hook.finish()
    assert max(len(line) for line in hook.lines) < 5000, hook.log()
    assert not any("Traceback" in line for line in hook.lines), hook.log()
    assert not any(" ERROR " in line for line in hook.lines), hook.log()
    malformed = [line for line in hook.lines if "refused a malformed HTTP request" in line]
    assert len(malformed) == 1, hook.log()  # one per 10 s: they share a template


async def test_a_flood_past_the_fd_limit_is_refused_by_the_budget_in_few_lines(
    tmp_path: Path, bundle: BundlePaths
) -> None:
    """The webhook's open-file limit is 256: the budget is lowered to fit (one WARNING),
    so a flood of 600 connections is refused by the budget, never by accept() failing
    (which once wrote 12,238 tracebacks in 9 s)."""
    raise_fd_limit(1024)
    async with webhook_process(tmp_path, bundle, nofile=256) as hook:
        await hook.wait_for_line("the open-file limit cannot hold max_connections")
        held: list[asyncio.StreamWriter] = []
        refused = 0
        for _ in range(12):
            results = await asyncio.gather(
                *(tls_connect(hook, source="127.0.0.2") for _ in range(50)),
                return_exceptions=True,
            )
            for result in results:
                if isinstance(result, BaseException):
                    refused += 1
                else:
                    held.append(result[1])
        try:
            assert refused > 0
            assert len(held) <= (256 - 128) * 256 // 1024  # the share of what the limit allows
            lines_during_flood = len(hook.lines)
            assert lines_during_flood < 20, hook.log()
            assert not any("accept" in line.lower() for line in hook.lines), hook.log()
        finally:
            for writer in held:
                writer.transport.abort()
        assert await _review_ok(hook.url, hook.client_context())


def _record(msg: str, *args: object, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("asyncio", level, __file__, 1, msg, args, None)


def test_rate_limit_lets_one_line_per_condition_per_interval_through() -> None:
    now = [0.0]
    limiter = RateLimitFilter(10, clock=lambda: now[0])
    passed = [
        limiter.filter(_record("socket.accept() out of system resource")) for _ in range(12_238)
    ]
    assert passed.count(True) == 1
    assert limiter.filter(_record("another condition"))  # its own budget
    # asyncio's lines: the message, then context that differs every time
    assert limiter.filter(_record("SSL handshake failed\nprotocol: <object at 0x1>"))
    assert not limiter.filter(_record("SSL handshake failed\nprotocol: <object at 0x2>"))
    assert limiter.filter(_record("debug is never limited", level=logging.DEBUG))
    now[0] = 10.0
    record = _record("socket.accept() out of system resource")
    assert limiter.filter(record)
    assert record.suppressed == 12_237  # type: ignore[attr-defined]


def test_trim_cuts_messages_extras_and_exception_texts_and_says_the_length() -> None:
    trim = TrimFilter(max_chars=100)
    record = _record("bad line %s", "x" * 67_000)
    record.client_text = "y" * 500
    try:
        raise ValueError("z" * 10_000)
    except ValueError:
        record.exc_info = sys.exc_info()
    assert trim.filter(record)
    assert len(record.getMessage()) < 200
    assert "67009 characters in all" in record.getMessage()
    assert len(record.client_text) < 200  # type: ignore[attr-defined]
    assert vars(record)["exc_info"] is None  # formatted, cut, kept in exc_text
    assert record.exc_text is not None
    assert "characters in all" in record.exc_text
    assert all(len(line) < 200 for line in record.exc_text.splitlines())
