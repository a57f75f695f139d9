"""The DRA plugin's API-server side (adapter; kubernetes-asyncio): read claims, publish
the node's ResourceSlice and publish it again whenever it disappears.

Objects are plain JSON (``_preload_content=False``): the generated models of the
installed client may predate ``shareID``, ``consumedCapacity`` or ``requestPolicy`` and
would drop them silently.

Why re-publishing is a loop and not a start-up step: the kubelet deletes every
ResourceSlice of its node when it starts (captured: a kubelet restart mid-run wiped
them, the plugin re-registered 1 s later), and a driver's slices 30 s after its socket
goes away. So the publisher watches the node's slices of this driver and publishes
again on a deletion, on a health change, and every ``resync_s`` in any case.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, Final, cast

import aiohttp
from kubernetes_asyncio import client

from plugin.dra.claims import ClaimError, ClaimNotFoundError, ClaimRef
from plugin.dra.slices import SliceError, SlicePlan, same_devices
from plugin.dra.validation import slice_errors
from plugin.kube.listwatch import ListWatch, status_message

logger = logging.getLogger(__name__)

RESYNC_S: Final = 300.0
"""Publish at least this often even when nothing was seen to change: a missed watch
event (a network partition) costs at most this long without a slice."""
BACKOFF_S: Final = (0.5, 30.0)
"""First and largest delay after a failed publish."""


def _raw(response: object) -> aiohttp.ClientResponse:
    """With ``_preload_content=False`` the generated client returns the aiohttp response."""
    return cast(aiohttp.ClientResponse, response)


async def _call(send: Any, *args: Any, timeout_s: float, **kwargs: Any) -> tuple[int, Any]:
    """One request read raw: ``(status, decoded body or the Status message)``."""
    resp = _raw(
        await send(
            *args,
            **kwargs,
            _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(total=timeout_s),
        )
    )
    try:
        body = await resp.read()
    finally:
        resp.release()
    if 200 <= resp.status < 300:
        return resp.status, json.loads(body)
    return resp.status, status_message(body)


class ClaimReader:
    """GETs a ResourceClaim as JSON; the servicer's :data:`~plugin.dra.servicer.ReadClaim`."""

    def __init__(self, api: client.ApiClient, *, timeout_s: float) -> None:
        self._resource = client.ResourceV1Api(api)
        self._timeout_s = timeout_s

    async def __call__(self, ref: ClaimRef) -> dict[str, Any]:
        status, body = await _call(
            self._resource.read_namespaced_resource_claim,
            ref.name,
            ref.namespace,
            timeout_s=self._timeout_s,
        )
        if status == 404:
            raise ClaimNotFoundError(f"claim {ref} not found in the API server: {body}")
        if status != 200 or not isinstance(body, dict):
            raise ClaimError(f"claim {ref}: reading it failed: HTTP {status}: {body}")
        return cast(dict[str, Any], body)


async def read_runtime_version(
    api: client.ApiClient, *, node_name: str, timeout_s: float
) -> str | None:
    """``status.nodeInfo.containerRuntimeVersion`` of the node (``containerd://1.7.13``).

    Raises RuntimeError when the node cannot be read (RBAC, a missing node)."""
    status, body = await _call(client.CoreV1Api(api).read_node, node_name, timeout_s=timeout_s)
    if status != 200 or not isinstance(body, dict):
        raise RuntimeError(f"reading node {node_name}: HTTP {status}: {body}")
    info = (body.get("status") or {}).get("nodeInfo") or {}
    version = info.get("containerRuntimeVersion")
    return str(version) if version else None


class SlicePublisher:
    """Keeps the node's one ResourceSlice equal to ``plan()``, for as long as it runs."""

    def __init__(
        self,
        api: client.ApiClient,
        plan: Callable[[int], SlicePlan],
        *,
        node_name: str,
        driver: str,
        timeout_s: float,
        resync_s: float = RESYNC_S,
        watch_timeout_s: int = 300,
    ) -> None:
        self._resource = client.ResourceV1Api(api)
        self._plan = plan
        self._node = node_name
        self._driver = driver
        self._timeout_s = timeout_s
        self._resync_s = resync_s
        self._wake = asyncio.Event()
        self.published = 0
        """How many creates and replaces succeeded (tests and logs)."""
        self.in_sync = asyncio.Event()
        """Set after a publish left the API server with the planned slice."""
        self._watch = ListWatch(
            f"ResourceSlices of {driver} on {node_name}",
            self._resource.list_resource_slice,
            on_list=self._on_list,
            on_event=self._on_event,
            query={"field_selector": f"spec.nodeName={node_name},spec.driver={driver}"},
            watch_timeout_s=watch_timeout_s,
        )
        self.watching = self._watch.synced
        """Set once the node's slices were first listed (deletions are seen from then on)."""

    def wake(self) -> None:
        """Publish again soon (a health change, a deletion seen)."""
        self.in_sync.clear()
        self._wake.set()

    async def run(self) -> None:
        """Publish now, then on every wake-up and every ``resync_s``; until cancelled."""
        watcher = asyncio.create_task(self._watch.run(), name="dra-slice-watch")
        delay = BACKOFF_S[0]
        try:
            while True:
                self._wake.clear()
                try:
                    await self.publish_once()
                    delay = BACKOFF_S[0]
                    timeout = self._resync_s
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    logger.warning(
                        "publishing the ResourceSlice failed; retrying",
                        extra={"error": f"{type(exc).__name__}: {exc}", "retry_in_s": delay},
                    )
                    timeout, delay = delay, min(delay * 2, BACKOFF_S[1])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def publish_once(self) -> None:
        """Create the slice, or replace it when its devices differ; nothing when equal."""
        first = self._plan(1)
        name = first.body["metadata"]["name"]
        status, current = await _call(
            self._resource.read_resource_slice, name, timeout_s=self._timeout_s
        )
        if status == 404:
            await self._write("create", first.body)
        elif status == 200 and isinstance(current, dict):
            if same_devices(current, first.body):
                self.in_sync.set()
                return
            generation = int(((current.get("spec") or {}).get("pool") or {}).get("generation", 0))
            body = self._plan(generation + 1).body
            body["metadata"]["resourceVersion"] = (current.get("metadata") or {}).get(
                "resourceVersion"
            )
            await self._write("replace", body)
        else:
            raise RuntimeError(f"reading ResourceSlice {name}: HTTP {status}: {current}")
        self.in_sync.set()

    async def _write(self, verb: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        errors = slice_errors(body)
        if errors:
            raise SliceError(f"ResourceSlice {name} would be refused: {'; '.join(errors)}")
        if verb == "create":
            status, answer = await _call(
                self._resource.create_resource_slice, body, timeout_s=self._timeout_s
            )
        else:
            status, answer = await _call(
                self._resource.replace_resource_slice, name, body, timeout_s=self._timeout_s
            )
        if status not in (200, 201):
            # 409 (someone else wrote it meanwhile) too: the next round reads it again
            raise RuntimeError(f"{verb} ResourceSlice {name}: HTTP {status}: {answer}")
        self.published += 1
        spec = body["spec"]
        logger.info(
            "ResourceSlice published",
            extra={
                "slice": name,
                "verb": verb,
                "generation": spec["pool"]["generation"],
                "devices": [d["name"] for d in spec["devices"]],
            },
        )

    def _on_list(self, items: Sequence[dict[str, Any]]) -> None:
        name = self._plan(1).body["metadata"]["name"]
        if not any((i.get("metadata") or {}).get("name") == name for i in items):
            self.wake()

    def _on_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            logger.info(
                "ResourceSlice deleted (the kubelet wipes them when it starts); publishing again",
                extra={"slice": (obj.get("metadata") or {}).get("name")},
            )
            self.wake()
        elif kind == "MODIFIED" and not same_devices(obj, self._plan(1).body):
            self.wake()
