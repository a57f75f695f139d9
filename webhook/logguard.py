"""Log filters that keep a flood of clients from flooding the log.

Installed on the process's log handlers by ``metagpu webhook`` (:func:`install`):

* :class:`TrimFilter`: a message, an ``extra=`` value or an exception's text
  longer than :data:`~webhook.clienttext.MAX_LOG_CHARS` is cut, with its full
  length said. Client text reaches the log through aiohttp (a garbage request
  line in a parser error), asyncio, and our own lines.
* :class:`RateLimitFilter`: a WARNING or ERROR from the same place with the
  same template is written at most once per interval; the next one that gets
  through says how many were left out. ``accept()`` failing with EMFILE once
  wrote 12,238 tracebacks in 9 s.

* :class:`ClientErrorFilter` (on ``aiohttp.server``): a request aiohttp could
  not parse is the client's fault, not the webhook's: aiohttp logs it as an
  ERROR with the exception; it becomes a WARNING with the (trimmed) reason and
  no traceback, and the rate limit applies to it.

Records below WARNING are never rate-limited: an operator who turns on DEBUG
asked for every line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from aiohttp.http_exceptions import HttpProcessingError

from plugin.api.logs import record_extras
from webhook.clienttext import MAX_LOG_CHARS, trim_chars

RATE_LIMIT_INTERVAL_S: Final = 10.0
MAX_CONDITIONS: Final = 1024
"""Templates remembered by the rate limiter; beyond that the oldest are forgotten."""


class TrimFilter(logging.Filter):
    """Cut long messages, extras and exception texts (never drops a record)."""

    def __init__(self, max_chars: int = MAX_LOG_CHARS) -> None:
        super().__init__()
        self.max_chars = max_chars

    def filter(self, record: logging.LogRecord) -> bool:
        limit = self.max_chars
        message = record.getMessage()
        if len(message) > limit:
            record.msg, record.args = trim_chars(message, limit), None
        for key, value in record_extras(record).items():
            if isinstance(value, str) and len(value) > limit:
                setattr(record, key, trim_chars(value, limit))
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            text = str(exc)
            if len(text) > limit:
                # Format the traceback now, with the exception's text cut, instead of
                # letting the formatter print all of it.
                record.exc_text = _trimmed_traceback(record, limit)
                record.exc_info = None
        return True


def _trimmed_traceback(record: logging.LogRecord, limit: int) -> str:
    formatted = logging.Formatter().formatException(record.exc_info)  # type: ignore[arg-type]
    lines = [trim_chars(line, limit) for line in formatted.splitlines()]
    return "\n".join(lines)


class RateLimitFilter(logging.Filter):
    """At most one WARNING+ record per (logger, template) per interval."""

    def __init__(
        self,
        interval_s: float = RATE_LIMIT_INTERVAL_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[tuple[str, int, str], float] = {}
        self._suppressed: dict[tuple[str, int, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        # The first line of the template: asyncio puts the varying context (which
        # transport, which protocol object) on the lines below its message.
        key = (record.name, record.levelno, str(record.msg).split("\n", 1)[0][:200])
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        if len(self._last) >= MAX_CONDITIONS and key not in self._last:
            oldest = next(iter(self._last))
            del self._last[oldest]
            self._suppressed.pop(oldest, None)
        self._last.pop(key, None)
        self._last[key] = now  # re-inserted: the dict's order is oldest first
        left_out = self._suppressed.pop(key, 0)
        if left_out:
            record.suppressed = left_out  # shows as an extra: "suppressed=N"
        return True


class ClientErrorFilter(logging.Filter):
    """Turn aiohttp's ERROR for a malformed request into a WARNING without traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and record.levelno > logging.WARNING:
            client = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            # One template for all of them, so the rate limit counts them as one condition.
            record.msg = "refused a malformed HTTP request from %s: %s"
            record.args = (client, trim_chars(" ".join(str(exc).split()), MALFORMED_CHARS))
            record.exc_info, record.exc_text = None, None
        return True


CLIENT_ERROR_LOGGER: Final = "aiohttp.server"
MALFORMED_CHARS: Final = 300
"""Of aiohttp's reason for refusing a request (which quotes the request)."""


def install(handlers: list[logging.Handler] | None = None) -> None:
    """Put the filters on ``handlers`` (the root logger's by default) and aiohttp's logger."""
    for handler in handlers if handlers is not None else logging.getLogger().handlers:
        if not any(isinstance(f, TrimFilter) for f in handler.filters):
            handler.addFilter(TrimFilter())
            handler.addFilter(RateLimitFilter())
    server_logger = logging.getLogger(CLIENT_ERROR_LOGGER)
    if not any(isinstance(f, ClientErrorFilter) for f in server_logger.filters):
        server_logger.addFilter(ClientErrorFilter())
