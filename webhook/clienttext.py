"""Bounding text a client chose before it is echoed back or written to the log.

A review can carry a 1 MiB container name or annotation, and a request line
can be as long as aiohttp lets it be; echoing either in full makes every
answer and every log line as large as the attacker wants. Trimmed text keeps
its start (what a person needs to recognise it) and says how long it was.
"""

from __future__ import annotations

from typing import Final

MAX_MESSAGE_BYTES: Final = 3 * 1024
"""Bound on a denial's ``status.message`` in UTF-8 bytes: kubectl shows it to a
person, and 3 KiB plus the note of the full length stays under 4 KiB."""

MAX_LOG_CHARS: Final = 2048
"""Bound on one log message or one ``extra=`` value (characters)."""


def trim_text(text: str, max_bytes: int) -> str:
    """``text`` if its UTF-8 form fits in ``max_bytes``, else its start and its length.

    The result's UTF-8 form is at most ``max_bytes`` plus the note (under 60
    bytes); a character cut in half is dropped, never left as a broken byte.
    """
    if len(text) * 4 <= max_bytes:  # fits whatever the characters are
        return text
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= max_bytes:
        return text
    head = encoded[:max_bytes].decode("utf-8", "ignore")
    return f"{head}... (trimmed; {len(text)} characters in all)"


def trim_chars(text: str, max_chars: int = MAX_LOG_CHARS) -> str:
    """``text`` cut to ``max_chars`` characters with its full length said (for logs)."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}... (trimmed; {len(text)} characters in all)"
