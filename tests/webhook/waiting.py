"""Waiting on conditions with a bound, for state that has no event to await."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

POLL_S = 0.01


async def eventually(check: Callable[[], Awaitable[bool] | bool], *, timeout_s: float = 10) -> None:
    """Return as soon as ``check()`` holds; raise TimeoutError after ``timeout_s``.

    The bound is a failure deadline, not a sleep that papers over a race: on a
    fast machine this returns after the first poll that sees the condition.
    """
    async with asyncio.timeout(timeout_s):
        while True:
            result = check()
            if isinstance(result, Awaitable):
                result = await result
            if result:
                return
            await asyncio.sleep(POLL_S)
