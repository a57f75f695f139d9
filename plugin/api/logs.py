"""Process-wide logging set-up shared by every metagpu command.

One place decides the format so the webhook, device plugin and agent logs can
be parsed by the same pipeline. ``text`` is for people at a terminal; ``json``
is one object per line for log collectors. Object references (namespace, pod,
device, ...) are passed with ``extra={...}``, as kopf does with ``k8s_ref``,
and both formats print them, so they never need to be baked into messages.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Final, Literal, TextIO

LogFormat = Literal["text", "json"]
LOG_FORMATS: Final = ("text", "json")
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")

# Attributes every LogRecord has; anything else came in through ``extra=``.
_STANDARD_ATTRS: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


def record_extras(record: logging.LogRecord) -> dict[str, object]:
    """The ``extra=`` fields of a record, in the order they were given."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and k[0] != "_"}


class TextFormatter(logging.Formatter):
    """``2026-11-21T13:14:15.123Z INFO  webhook.server: message  key=value ...``."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return time.strftime(datefmt or "%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))

    def format(self, record: logging.LogRecord) -> str:
        stamp = self.formatTime(record, "%Y-%m-%dT%H:%M:%S")
        line = (
            f"{stamp}.{int(record.msecs):03d}Z {record.levelname:<7} "
            f"{record.name}: {record.getMessage()}"
        )
        extras = record_extras(record)
        if extras:
            line += "  " + " ".join(f"{k}={v}" for k, v in extras.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, extras, ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record_extras(record).items():
            payload.setdefault(key, value)
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str, ensure_ascii=False)


def configure_logging(
    *, level: str = "INFO", fmt: LogFormat = "text", stream: TextIO | None = None
) -> None:
    """Install one handler on the root logger; safe to call more than once."""
    if level.upper() not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}: {level!r}")
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}: {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Libraries that log every request or connection at INFO drown our own lines.
    for noisy in ("aiohttp.access", "kubernetes_asyncio", "urllib3"):
        logging.getLogger(noisy).setLevel(max(root.level, logging.WARNING))
