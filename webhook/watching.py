"""List, then watch from the list's resourceVersion, for as long as it runs (adapter).

The loop :class:`webhook.namespaces.NamespaceCache` runs for Namespaces, made
generic for the quota cache and the quota mirror: one list, then watches that
continue from the last resourceVersion seen (server-side ``timeoutSeconds``,
bookmarks allowed), a fresh list when the API answers 410 Gone (the history
needed is compacted), and exponential backoff between failed attempts. Objects
are read as raw JSON (``_preload_content=False``): no model deserialisation,
and fields the client's models do not know survive.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

import aiohttp

from certs.kube import status_fields
from webhook.namespaces import BACKOFF_S, WATCH_TIMEOUT_S

logger = logging.getLogger(__name__)

Obj = dict[str, Any]
ListCall = Callable[..., Awaitable[object]]
"""A generated ``list_*`` method (``CoreV1Api.list_resource_quota_for_all_namespaces``)."""


def raw_response(response: object) -> aiohttp.ClientResponse:
    """With ``_preload_content=False`` the generated client returns the aiohttp response
    (its annotations say otherwise); reading it ourselves skips model deserialisation."""
    return cast(aiohttp.ClientResponse, response)


class ListWatch:
    """Feeds ``on_list`` (every object, after each list) and ``on_event`` (each change)."""

    def __init__(
        self,
        list_call: ListCall,
        *,
        what: str,
        on_list: Callable[[list[Obj]], None],
        on_event: Callable[[str, Obj], None],
        watch_timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        self._list_call = list_call
        self._what = what
        self._on_list = on_list
        self._on_event = on_event
        self._watch_timeout_s = watch_timeout_s

    async def run(self) -> None:
        """Forever (until cancelled); errors are logged and retried with backoff."""
        delay = BACKOFF_S[0]
        while True:
            try:
                rv: str | None = await self._list()
                delay = BACKOFF_S[0]
                while rv is not None:
                    rv = await self._watch(rv)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning(
                    "%s list/watch failed; retrying",
                    self._what,
                    extra={"error": f"{type(exc).__name__}: {exc}", "retry_in_s": delay},
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_S[1])

    async def _list(self) -> str:
        resp = raw_response(
            await self._list_call(
                _preload_content=False, _request_timeout=aiohttp.ClientTimeout(total=60)
            )
        )
        try:
            body = await resp.read()
        finally:
            resp.release()
        if resp.status != 200:
            raise RuntimeError(f"list {self._what}: HTTP {resp.status}: {status_fields(body)[0]}")
        data = json.loads(body)
        items = [i for i in data.get("items") or [] if isinstance(i, dict)]
        self._on_list(items)
        return str((data.get("metadata") or {}).get("resourceVersion") or "")

    async def _watch(self, rv: str) -> str | None:
        """Follow changes from ``rv``; the rv to continue from, or None to list again."""
        resp = raw_response(
            await self._list_call(
                watch=True,
                resource_version=rv,
                timeout_seconds=self._watch_timeout_s,
                allow_watch_bookmarks=True,
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(sock_read=self._watch_timeout_s + 30),
            )
        )
        try:
            if resp.status == 410:
                return None
            if resp.status != 200:
                body = await resp.read()
                raise RuntimeError(
                    f"watch {self._what}: HTTP {resp.status}: {status_fields(body)[0]}"
                )
            async for line in resp.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return None
                    raise RuntimeError(f"watch {self._what}: {obj.get('message', obj)}")
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if kind in ("ADDED", "MODIFIED", "DELETED") and isinstance(obj, dict):
                    self._on_event(kind, obj)
        finally:
            resp.release()
        return rv
