"""Events are written in the background (``plugin.agent.events``): an API server that does
not answer never holds up the accounting cycle, and a full queue drops, never grows."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from plugin.agent.events import QueuedEventSink


class GatedSink:
    """A sink whose writes wait until the test opens the gate (an API server that hangs)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.written: list[Mapping[str, Any]] = []
        self.started = asyncio.Event()

    async def record(self, event: Mapping[str, Any]) -> None:
        self.started.set()
        await self.gate.wait()
        if event.get("reason") == "Boom":
            raise RuntimeError("the sink broke its promise not to raise")
        self.written.append(event)


def ev(n: int, reason: str = "GpuMemoryOverLimit") -> dict[str, Any]:
    return {"n": n, "reason": reason}


@pytest.fixture
async def queued() -> AsyncIterator[tuple[QueuedEventSink, GatedSink]]:
    sink = GatedSink()
    events = QueuedEventSink(sink, max_pending=3)
    task = asyncio.create_task(events.run())
    try:
        yield events, sink
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_record_never_waits_for_the_api_server(
    queued: tuple[QueuedEventSink, GatedSink],
) -> None:
    events, sink = queued
    await asyncio.wait_for(events.record(ev(1)), timeout=1)
    await asyncio.wait_for(sink.started.wait(), timeout=10)  # the writer is stuck on it
    await asyncio.wait_for(events.record(ev(2)), timeout=1)
    assert sink.written == []
    sink.gate.set()
    assert await events.flush(timeout_s=10)
    assert [e["n"] for e in sink.written] == [1, 2]  # in order


async def test_a_full_queue_drops_new_events_and_says_so(
    queued: tuple[QueuedEventSink, GatedSink], caplog: pytest.LogCaptureFixture
) -> None:
    events, sink = queued
    await events.record(ev(0))
    await asyncio.wait_for(sink.started.wait(), timeout=10)  # 0 is being written
    with caplog.at_level(logging.WARNING, logger="plugin.agent.events"):
        for n in range(1, 7):
            await events.record(ev(n))
    assert events.pending == 3
    assert events.dropped == 3
    assert caplog.text.count("dropping new ones") == 1  # once per run of drops
    assert not await events.flush(timeout_s=0.01)
    sink.gate.set()
    assert await events.flush(timeout_s=10)
    assert [e["n"] for e in sink.written] == [0, 1, 2, 3]


async def test_a_raising_sink_does_not_stop_the_writer(
    queued: tuple[QueuedEventSink, GatedSink], caplog: pytest.LogCaptureFixture
) -> None:
    events, sink = queued
    sink.gate.set()
    with caplog.at_level(logging.ERROR, logger="plugin.agent.events"):
        await events.record(ev(1, reason="Boom"))
        await events.record(ev(2))
        assert await events.flush(timeout_s=10)
    assert [e["n"] for e in sink.written] == [2]
    assert "writing an Event failed" in caplog.text
