"""List, then watch, one kind of object, forever (adapter; kubernetes-asyncio).

The loop the webhook's namespace cache (:mod:`webhook.namespaces`) runs,
extracted here in a neutral place so that the scheduler extender's ledger
cache (Nodes, Pods, Namespaces) follows it without importing the webhook:

* list once (raw JSON, no model deserialisation: a 5,000-pod list decodes in
  milliseconds instead of seconds), page by page (``limit``/``continue``, every page
  from one snapshot), each page decoded in a worker thread: a cluster's whole pod list
  is tens of megabytes, and decoding it in one piece on the event loop held every
  request the process serves (admission reviews, filter calls) for as long; then hand
  every item to ``on_list`` at once;
* watch from the list's resourceVersion, with bookmarks and a server-side
  timeout, handing each event to ``on_event``; re-open the watch from the
  last resourceVersion when it ends;
* on 410 Gone (history compacted) list again; on any other error back off
  (0.5 s doubling to 30 s) and list again.

The handlers are plain synchronous callables, so a cache built on them never
sees a half-applied event.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, cast

import aiohttp

logger = logging.getLogger(__name__)

WATCH_TIMEOUT_S: Final = 300
"""Server-side watch timeout; the watch is re-opened from the last resourceVersion."""

PAGE_SIZE: Final = 500
"""Objects per list request (kubectl's and client-go's pager chunk): one page of pods
decodes in a few milliseconds, the longest the event loop waits for the decoding thread."""

BACKOFF_S: Final = (0.5, 30.0)
"""First and largest delay between attempts after a list or watch error."""

ListCall = Callable[..., Awaitable[object]]
"""A generated ``list_*`` method (e.g. ``CoreV1Api.list_node``), called with
``_preload_content=False`` and, for the watch, ``watch=True``."""


class ListWatch:
    """One resource's list+watch loop; :meth:`run` until cancelled."""

    def __init__(
        self,
        what: str,
        list_call: ListCall,
        *,
        on_list: Callable[[Sequence[dict[str, Any]]], None],
        on_event: Callable[[str, dict[str, Any]], None],
        query: dict[str, Any] | None = None,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        page_size: int = PAGE_SIZE,
    ) -> None:
        self.what = what
        self._list_call = list_call
        self._on_list = on_list
        self._on_event = on_event
        self._query = dict(query or {})
        self._watch_timeout_s = watch_timeout_s
        self._page_size = page_size
        self.synced = asyncio.Event()
        """Set after the first complete list was handed to ``on_list``."""

    async def run(self) -> None:
        delay = BACKOFF_S[0]
        while True:
            try:
                rv: str | None = await self._list()
                delay = BACKOFF_S[0]
                while rv is not None:
                    rv = await self._watch(rv)
                # rv None: 410 Gone, the history we need is compacted; list again
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning(
                    "%s list/watch failed; retrying",
                    self.what,
                    extra={"error": f"{type(exc).__name__}: {exc}", "retry_in_s": delay},
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_S[1])

    async def _list(self) -> str:
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            paging: dict[str, Any] = {"limit": self._page_size}
            if token:
                paging["_continue"] = token
            resp = _raw(
                await self._list_call(
                    **self._query,
                    **paging,
                    _preload_content=False,
                    _request_timeout=aiohttp.ClientTimeout(total=120),
                )
            )
            try:
                body = await resp.read()
            finally:
                resp.release()
            if resp.status != 200:
                # 410 on a continue token: the snapshot was compacted mid-list; the
                # caller lists again from the start.
                raise RuntimeError(f"list {self.what}: HTTP {resp.status}: {status_message(body)}")
            data = await asyncio.to_thread(json.loads, body)
            items.extend(i for i in data.get("items") or [] if isinstance(i, dict))
            meta = data.get("metadata") or {}
            token = str(meta.get("continue") or "")
            if not token:
                break
        self._on_list(items)
        if not self.synced.is_set():
            self.synced.set()
            logger.info("%s listed", self.what, extra={"count": len(items)})
        return str(meta.get("resourceVersion") or "")

    async def _watch(self, rv: str) -> str | None:
        """Follow changes from ``rv``; the rv to continue from, or None to re-list."""
        resp = _raw(
            await self._list_call(
                **self._query,
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
                raise RuntimeError(f"watch {self.what}: HTTP {resp.status}: {status_message(body)}")
            async for line in resp.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return None
                    raise RuntimeError(f"watch {self.what}: {obj.get('message', obj)}")
                meta = obj.get("metadata") or {}
                rv = str(meta.get("resourceVersion") or rv)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._on_event(kind, obj)
        finally:
            resp.release()
        return rv


def status_message(body: bytes) -> str:
    """The ``message`` of a Kubernetes Status body, or its first 200 bytes."""
    try:
        data = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace")
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return str(data["message"])
    return body[:200].decode("utf-8", "replace")


def _raw(response: object) -> aiohttp.ClientResponse:
    """With ``_preload_content=False`` the generated client returns the aiohttp response."""
    return cast(aiohttp.ClientResponse, response)
