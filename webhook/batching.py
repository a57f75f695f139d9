"""Work off the requests that arrive together in one pass of the event loop.

Why: under load aiohttp hands the webhook one review at a time, each between
TLS records and HTTP parsing for the other connections, so every review ran
with the CPU caches full of that code and paid two to three times its cost in
a loop of its own. Queuing the reviews that the event loop produced in one
iteration and running them back to back in one callback keeps the parser's
and the rules' code and data in cache: 170 -> 120 us of CPU per review, 38-41%
-> 50-52% of the bare-aiohttp floor, p99 16-17 -> 12-14 ms at 64 connections
(``docs/benchmarks.md``).

Nothing waits for a batch to fill: the queue is worked off by a callback the
first submission schedules with ``call_soon``, so it runs at the start of the
next loop iteration whatever the queue's size. A request alone is answered
one iteration later than before (microseconds); there is no timer and no
size to tune.

Generic over the item and the result so it carries no webhook logic: the
server gives it a plain function (``webhook.server._review``) and awaits the
future :meth:`Batcher.submit` returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Batcher(Generic[T, R]):
    """Runs ``work`` on every submitted item, in submission order, one loop iteration later.

    ``work`` is synchronous and should not raise: the server's catches its own
    errors and turns them into answers. If it raises anyway, that item's
    future gets the exception and the rest of the batch still runs. An item
    whose future was cancelled (its request went away) is skipped.
    """

    def __init__(self, work: Callable[[T], R]) -> None:
        self._work = work
        self._queue: list[tuple[T, asyncio.Future[R]]] = []

    def submit(self, item: T) -> asyncio.Future[R]:
        """Queue ``item``; the future resolves with ``work(item)`` in the next iteration."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        queue = self._queue
        queue.append((item, future))
        if len(queue) == 1:
            loop.call_soon(self._run)
        return future

    @property
    def queued(self) -> int:
        """Items submitted and not yet worked off (tests and debugging)."""
        return len(self._queue)

    def _run(self) -> None:
        batch, self._queue = self._queue, []
        work = self._work
        try:
            for item, future in batch:
                if future.done():
                    continue
                try:
                    result = work(item)
                except Exception as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
        except BaseException:
            # The process is going down (KeyboardInterrupt, SystemExit): leave no
            # request of this batch waiting forever.
            for _, future in batch:
                if not future.done():
                    future.cancel()
            raise
