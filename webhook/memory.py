"""Give memory that floods left behind back to the system (glibc's ``malloc_trim``).

After 8 clients that never read a 4.7 MB answer were dropped, the webhook's
RSS stayed 135 MiB above where it started: Python had freed everything, but
glibc keeps freed heap memory for reuse, and a heap that grew in a flood
stays grown (``docs/benchmarks.md`` has the figures). ``malloc_trim(0)``
returns the free pages. It walks the heap (a few milliseconds at worst), so
it runs at most once per :data:`MIN_INTERVAL_S`, a second after what asked
for it: the end of a big review, a connection the webhook closed. Elsewhere
than glibc it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable
from typing import Final

logger = logging.getLogger(__name__)

DELAY_S: Final = 1.0
MIN_INTERVAL_S: Final = 10.0


def _load_malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM: Final = _load_malloc_trim()


class Trimmer:
    """Debounced ``malloc_trim``: :meth:`soon` as often as you like, it runs rarely."""

    def __init__(self, trim: Callable[[int], int] | None = _MALLOC_TRIM) -> None:
        self._trim = trim
        self._scheduled = False
        self._last = -MIN_INTERVAL_S
        self.runs = 0

    def soon(self) -> None:
        if self._trim is None or self._scheduled:
            return
        loop = asyncio.get_running_loop()
        at = max(loop.time() + DELAY_S, self._last + MIN_INTERVAL_S)
        self._scheduled = True
        loop.call_at(at, self._run)

    def _run(self) -> None:
        self._scheduled = False
        assert self._trim is not None
        self._last = asyncio.get_running_loop().time()
        self.runs += 1
        self._trim(0)
