"""SIGTERM while a review is still uploading: it is read to the end and answered, and the
process exits as soon as it is, not at ``shutdown_timeout_s``.

Before, aiohttp's shutdown stopped reading at once: the body's last bytes were
dropped, the review never answered, and every such shutdown lasted the whole timeout.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

from certs.files import BundlePaths
from tests.webhook.hostile.process import (
    closed_by_peer,
    post_head,
    read_response,
    review_bytes,
    tls_connect,
    webhook_process,
)


async def test_a_review_uploading_at_sigterm_is_answered_and_the_exit_is_prompt(
    tmp_path: Path, bundle: BundlePaths
) -> None:
    async with webhook_process(tmp_path, bundle, config={"shutdown_timeout_s": 10}) as hook:
        uploading_r, uploading = await tls_connect(hook)
        body = review_bytes()
        # Expect: 100-continue makes "the webhook has these headers" observable: it
        # answers 100 once it has parsed them (the API server sends no Expect).
        head = post_head(len(body)).replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n")
        uploading.write(head)
        assert (await asyncio.wait_for(uploading_r.readuntil(b"\r\n\r\n"), 10)).startswith(
            b"HTTP/1.1 100"
        )
        uploading.write(body[:200])
        idle_r, idle = await tls_connect(hook)  # no request: closed at once
        partial_r, partial = await tls_connect(hook)  # headers not complete: closed too
        partial.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")
        await partial.drain()

        hook.proc.send_signal(signal.SIGTERM)
        await hook.wait_for_line("stopping: answering the requests received")
        assert await asyncio.wait_for(closed_by_peer(idle_r), 5)
        assert await asyncio.wait_for(closed_by_peer(partial_r), 5)

        await asyncio.sleep(0.5)  # the rest of the body arrives well after shutdown began
        uploading.write(body[200:])
        status, answer = await asyncio.wait_for(read_response(uploading_r), 10)
        answered = time.monotonic()
        assert status == 200, answer
        assert json.loads(answer)["response"]["allowed"] is True
        rc = await asyncio.wait_for(hook.proc.wait(), 10)
        assert rc == 0, hook.log()
        assert time.monotonic() - answered < 3, hook.log()
        for writer in (uploading, idle, partial):
            writer.transport.abort()
