"""Named, guarded background tasks (after kopf's ``aiotasks.guard``/``stop``).

An "eternal" task that returns or fails is logged at once instead of dying
silently with its exception stored on a Task nobody awaits; stopping cancels,
waits a bounded time and names any task that did not finish.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from typing import Any

logger = logging.getLogger(__name__)


def create_guarded_task(coro: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
    """Start ``coro`` as a task that logs its unexpected end; keep the returned reference."""

    async def guard() -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            # Logged here and not re-raised: nobody awaits an eternal task, so a
            # stored exception would only surface as a warning at garbage collection.
            logger.exception("background task %s failed", name)
        else:
            logger.warning("background task %s exited; it should run until stopped", name)

    return asyncio.create_task(guard(), name=name)


async def stop_tasks(tasks: Iterable[asyncio.Task[None]], *, timeout_s: float) -> None:
    """Cancel ``tasks`` and wait up to ``timeout_s`` for them; log the ones still running."""
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    if not pending:
        return
    _, stuck = await asyncio.wait(pending, timeout=timeout_s)
    for task in stuck:
        logger.error("background task %s did not stop within %.1f s", task.get_name(), timeout_s)
