"""Adapter: a watch on the pods of THIS node, feeding a :class:`PodSink`.

Shared by the node agent (its :class:`~plugin.agent.containers.PodIndex`) and
the device plugin (its :class:`~plugin.deviceplugin.assignments.AssignmentBook`).

``LIST`` then ``WATCH`` on ``/api/v1/pods?fieldSelector=spec.nodeName=<node>``
(the API server filters, so a 5,000-pod cluster costs this agent only its own
node's pods), resumed from the last resourceVersion when a watch ends, and
re-listed on ``410 Gone``. Failures are logged with a capped exponential
backoff; meanwhile the sink keeps what it knew, and :attr:`NodePodWatcher.error`
says why the data may be stale.

Objects are handled as plain JSON dicts (``_preload_content=False``): the
sinks read a few fields, and building full ``V1Pod`` models for every event
would cost more than everything else the agent does per cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any, Final, Protocol, cast

import aiohttp
from kubernetes_asyncio import client

from plugin.kube.errors import describe_api_error

logger = logging.getLogger(__name__)

WATCH_TIMEOUT_S: Final = 300
"""Server-side watch timeout; the watch is simply resumed. Bounds how long a
half-dead connection can go unnoticed."""
LIST_TIMEOUT_S: Final = 30.0
BACKOFF_INITIAL_S: Final = 0.5
BACKOFF_MAX_S: Final = 30.0


class WatchExpiredError(Exception):
    """The API server compacted the resourceVersion we resumed from (410 Gone)."""


class PodSink(Protocol):
    """What the watch feeds: a full list, then one event at a time."""

    def replace(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Start over from a full list (after a LIST or a 410 Gone re-list)."""
        ...

    def apply(self, event_type: str, pod: Mapping[str, Any]) -> None:
        """One watch event: ``ADDED``, ``MODIFIED`` or ``DELETED``."""
        ...


class NodePodWatcher:
    """Keeps ``sink`` equal to the pods bound to ``node_name``. Run :meth:`run` as a task."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        node_name: str,
        sink: PodSink,
        watch_timeout_s: int | None = None,
    ) -> None:
        """``watch_timeout_s``: the server-side watch timeout (default
        :data:`WATCH_TIMEOUT_S`, read when the watcher is made)."""
        self._core = client.CoreV1Api(api)
        self.node_name = node_name
        self.sink = sink
        self.watch_timeout_s = WATCH_TIMEOUT_S if watch_timeout_s is None else watch_timeout_s
        self.synced = asyncio.Event()
        """Set once the first LIST has been applied."""
        self.error: str | None = "not listed yet"
        """Why the sink may be stale, or None while the watch is healthy."""
        self._backoff_s = BACKOFF_INITIAL_S

    @property
    def selector(self) -> str:
        return f"spec.nodeName={self.node_name}"

    async def run(self) -> None:
        """List and watch forever; returns only when cancelled."""
        resource_version: str | None = None
        while True:
            try:
                if resource_version is None:
                    resource_version = await self._list()
                resource_version = await self._watch(resource_version)
            except asyncio.CancelledError:
                raise
            except WatchExpiredError:
                logger.info("pod watch expired (410 Gone); listing again")
                resource_version = None
            except Exception as exc:
                self.error = describe_api_error(exc)
                logger.warning(
                    "pod watch failed, retrying in %.1f s: %s",
                    self._backoff_s,
                    self.error,
                    extra={"node": self.node_name},
                )
                await asyncio.sleep(self._backoff_s)
                self._backoff_s = min(self._backoff_s * 2, BACKOFF_MAX_S)

    def _healthy(self) -> None:
        """A list or watch request succeeded: the sink is current again (a watch
        resumed from its resourceVersion misses nothing), and the next failure
        starts the backoff afresh."""
        if self.error is not None and self.synced.is_set():
            logger.info("pod watch recovered", extra={"node": self.node_name})
        self.error = None
        self._backoff_s = BACKOFF_INITIAL_S

    async def _list(self) -> str:
        resp = _raw(
            await self._core.list_pod_for_all_namespaces(
                field_selector=self.selector,
                _preload_content=False,
                _request_timeout=LIST_TIMEOUT_S,
            )
        )
        try:
            body = await _read_json(resp)
        finally:
            resp.release()
        items = body.get("items") or []
        self.sink.replace(items)
        self._healthy()
        if not self.synced.is_set():
            logger.info("pod index synced", extra={"node": self.node_name, "pods": len(items)})
        self.synced.set()
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    async def _watch(self, resource_version: str) -> str:
        """Apply events until the server ends the watch; returns the last resourceVersion."""
        resp = _raw(
            await self._core.list_pod_for_all_namespaces(
                field_selector=self.selector,
                watch=True,
                allow_watch_bookmarks=True,
                resource_version=resource_version,
                timeout_seconds=self.watch_timeout_s,
                _preload_content=False,
                _request_timeout=(LIST_TIMEOUT_S, self.watch_timeout_s + 30),
            )
        )
        try:
            if resp.status == 410:
                raise WatchExpiredError()
            if resp.status != 200:
                await _read_json(resp)  # raises with the API's message
            self._healthy()
            while True:
                line = await resp.content.readline()
                if not line:
                    return resource_version
                if not line.strip():
                    continue
                event = json.loads(line)
                etype = event.get("type")
                obj: dict[str, Any] = event.get("object") or {}
                if etype == "ERROR":
                    if obj.get("code") == 410:
                        raise WatchExpiredError()
                    raise WatchError(f"{obj.get('code')} {obj.get('message')}")
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv:
                    resource_version = str(rv)
                if etype in ("ADDED", "MODIFIED", "DELETED"):
                    self.sink.apply(etype, obj)
        finally:
            resp.release()


class WatchError(Exception):
    """The API server ended a watch with an error event."""


def _raw(response: object) -> aiohttp.ClientResponse:
    """With ``_preload_content=False`` the generated client returns the aiohttp response
    (its annotations say otherwise)."""
    return cast(aiohttp.ClientResponse, response)


async def _read_json(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    raw = await resp.read()
    if not 200 <= resp.status <= 299:
        message = raw[:300].decode("utf-8", "replace")
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(raw).get("message", message)
        raise WatchError(f"{resp.status} {message}")
    data: dict[str, Any] = json.loads(raw)
    return data
