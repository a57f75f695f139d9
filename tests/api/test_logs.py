"""Both log formats carry extras, and JSON lines stay parseable."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from plugin.api.logs import configure_logging


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("restore_root_logger")
def test_json_lines_carry_extras_and_exceptions() -> None:
    stream = io.StringIO()
    configure_logging(level="DEBUG", fmt="json", stream=stream)
    log = logging.getLogger("t.json")
    log.info("device %s unhealthy", "GPU-1", extra={"device": "GPU-1", "xid": 79})
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines() if line[0] == "{")
    assert first["msg"] == "device GPU-1 unhealthy"
    assert first["device"] == "GPU-1"
    assert first["xid"] == 79
    assert first["level"] == "INFO"
    assert first["logger"] == "t.json"
    assert first["ts"].endswith("Z")
    assert "RuntimeError: boom" in second["exc"]


@pytest.mark.usefixtures("restore_root_logger")
def test_text_lines_carry_extras_and_respect_level() -> None:
    stream = io.StringIO()
    configure_logging(level="WARNING", fmt="text", stream=stream)
    log = logging.getLogger("t.text")
    log.info("hidden")
    log.warning("shown", extra={"pod": "team-a/x"})
    out = stream.getvalue()
    assert "hidden" not in out
    assert "WARNING t.text: shown  pod=team-a/x" in out


@pytest.mark.parametrize(
    ("level", "fmt", "fragment"),
    [
        pytest.param("LOUD", "text", "log level must be one of", id="bad-level"),
        pytest.param("INFO", "xml", "log format must be one of", id="bad-format"),
    ],
)
def test_bad_settings_are_refused(level: str, fmt: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        configure_logging(level=level, fmt=fmt)  # type: ignore[arg-type]
