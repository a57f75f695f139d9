"""Events written in the background, so a slow API server never holds up a cycle.

The enforcer decides and kills within the accounting cycle; the Event that
tells the pod's owner about it is only a report. Written inline, each Event
could wait up to its request timeout (10 s) for an API server that drops
packets, and a kill for one share would wait behind the Events of others;
enough of them would stretch a cycle past the ``/healthz`` limit and get the
agent restarted, losing its grace-period clocks. :class:`QueuedEventSink`
takes Events without waiting and a background task writes them, one at a time
and in order, to the real sink (:class:`plugin.agent.kube.KubeEventSink`).

The queue is bounded: when the API server cannot keep up, new Events are
dropped and counted (logged once per run of drops), never memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Final

from plugin.agent.enforcement import EventSink

logger = logging.getLogger(__name__)

MAX_PENDING_EVENTS: Final = 256
"""Far more than a node's shares can produce between two API round trips; a
queue this full means the API server is not answering."""


class QueuedEventSink:
    """An :class:`~plugin.agent.enforcement.EventSink` that never waits: run :meth:`run`."""

    def __init__(self, sink: EventSink, *, max_pending: int = MAX_PENDING_EVENTS) -> None:
        self._sink = sink
        self._queue: asyncio.Queue[Mapping[str, Any]] = asyncio.Queue(maxsize=max_pending)
        self.dropped = 0
        """Events dropped because the queue was full (since start)."""
        self._dropping = False

    @property
    def pending(self) -> int:
        """Events waiting to be written."""
        return self._queue.qsize()

    async def record(self, event: Mapping[str, Any]) -> None:
        """Queue ``event``; drops it (and logs) when the queue is full. Never waits."""
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1
            if not self._dropping:
                logger.warning(
                    "%d Events are waiting for the API server; dropping new ones until it "
                    "catches up",
                    self._queue.qsize(),
                    extra={"reason": event.get("reason")},
                )
            self._dropping = True
        else:
            self._dropping = False

    async def run(self) -> None:
        """Write queued Events to the sink, in order, until cancelled."""
        while True:
            event = await self._queue.get()
            try:
                await self._sink.record(event)
            except asyncio.CancelledError:
                raise
            except Exception:  # the sink should log, not raise; never let it end the task
                logger.exception("writing an Event failed", extra={"reason": event.get("reason")})
            finally:
                self._queue.task_done()

    async def flush(self, *, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the queue to empty (at shutdown); True if it did."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout=timeout_s)
            return True
        return False
