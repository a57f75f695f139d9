"""One API request read raw: status, decoded object and the Status message (adapter).

The mirror and the leader elector both need to tell "not found", "already
exists" and "conflict" apart from real failures without exceptions from the
generated models; this is the one place that reads an answer.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, cast

import aiohttp

from certs.kube import status_fields


def raw_response(response: object) -> aiohttp.ClientResponse:
    """With ``_preload_content=False`` the generated client returns the aiohttp response
    (its annotations say otherwise); reading it ourselves skips model deserialisation."""
    return cast(aiohttp.ClientResponse, response)


REQUEST_TIMEOUT_S: Final = 10.0
"""Per request; these small reads and writes take milliseconds."""


@dataclass(frozen=True)
class Answer:
    status: int
    obj: dict[str, Any] | None
    """The decoded body of a 2xx answer."""
    message: str
    """The Status message of an error (or the start of a body that is not one)."""
    reason: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def raw_options(timeout_s: float = REQUEST_TIMEOUT_S) -> dict[str, Any]:
    return {
        "_preload_content": False,
        "_request_timeout": aiohttp.ClientTimeout(total=timeout_s),
    }


async def call_api(send: Callable[[], Awaitable[object]]) -> Answer:
    """Send, read the whole answer, release the connection. Transport errors raise."""
    resp = raw_response(await send())
    try:
        body = await resp.read()
    finally:
        resp.release()
    if 200 <= resp.status < 300:
        obj = json.loads(body)
        return Answer(resp.status, obj if isinstance(obj, dict) else None, "")
    message, reason = status_fields(body)
    return Answer(resp.status, None, message, reason)
