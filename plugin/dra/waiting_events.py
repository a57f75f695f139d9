"""Events that say why a DRA pod waits (adapter: reads and writes the API server).

One pass (:meth:`PendingExplainer.explain_once`): list the Pending pods the scheduler
marked ``Unschedulable`` that name ResourceClaims, the driver's ResourceSlices and the
claims, and for each pod whose claims of our DeviceClass no node's GPUs can take, write
an ``events.k8s.io/v1`` Event with :func:`plugin.dra.waiting.pod_waiting_words` as its
note. The scheduler's own Event says only ``cannot allocate all claims``; ours stands
beside it in ``kubectl describe pod``. A pod gets one Event per distinct note, not one
per pass, so a pod waiting for an hour does not flood its namespace.

**Not wired yet** (``docs/dra.md``, "What is not built yet"): nothing runs the passes.
The runner it needs is a leader-elected loop, cluster-wide rather than per node (the
scheduler tries every node), with ``pods``, ``resourceslices`` and ``resourceclaims``
list and ``events`` create.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final, cast

import aiohttp
from kubernetes_asyncio import client

from plugin.dra.waiting import pod_waiting_words

logger = logging.getLogger(__name__)

REASON: Final = "NoGpuShareFits"
ACTION: Final = "Scheduling"
"""The scheduler's action on its own Event for the same pod (captured)."""
NOTE_MAX: Final = 1024
"""``events.k8s.io/v1`` refuses a longer note."""


class PendingExplainer:
    """Explains waiting DRA pods in Events; :meth:`explain_once` per pass."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        driver: str,
        device_class: str,
        reporting_instance: str,
        timeout_s: float = 10.0,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._resource = client.ResourceV1Api(api)
        self._events = client.EventsV1Api(api)
        self._driver = driver
        self._device_class = device_class
        self._instance = reporting_instance
        self._timeout_s = timeout_s
        self._clock = clock
        self._said: dict[str, str] = {}
        """Pod UID → the note last written, so an unchanged reason is not repeated."""

    async def explain_once(self) -> int:
        """One pass; how many Events it wrote."""
        pods = [
            p
            for p in await self._list(
                self._core.list_pod_for_all_namespaces, field_selector="status.phase=Pending"
            )
            if _unschedulable(p) and (p.get("status") or {}).get("resourceClaimStatuses")
        ]
        waiting_uids = {str(p["metadata"]["uid"]) for p in pods}
        self._said = {uid: note for uid, note in self._said.items() if uid in waiting_uids}
        if not pods:
            return 0
        slices = [
            s
            for s in await self._list(self._resource.list_resource_slice)
            if (s.get("spec") or {}).get("driver") == self._driver
        ]
        claims = await self._list(self._resource.list_resource_claim_for_all_namespaces)
        allocated = [c for c in claims if (c.get("status") or {}).get("allocation")]
        by_namespace: dict[str, dict[str, Mapping[str, Any]]] = {}
        for claim in claims:
            meta = claim.get("metadata") or {}
            by_namespace.setdefault(str(meta.get("namespace")), {})[str(meta.get("name"))] = claim
        written = 0
        for pod in pods:
            meta = pod["metadata"]
            note = pod_waiting_words(
                pod,
                claims=by_namespace.get(str(meta.get("namespace")), {}),
                slices=slices,
                allocated=allocated,
                driver=self._driver,
                device_class=self._device_class,
            )
            uid = str(meta["uid"])
            if note is None or self._said.get(uid) == note:
                continue
            if await self._write(pod, note):
                self._said[uid] = note
                written += 1
        return written

    async def _list(self, send: Any, **kwargs: Any) -> list[dict[str, Any]]:
        """A list's items as raw JSON (``shareID`` and ``consumedCapacity`` survive older
        client models, as the plugin's claim reader keeps them)."""
        resp = cast(
            aiohttp.ClientResponse,
            await send(
                **kwargs,
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(total=self._timeout_s),
            ),
        )
        try:
            body = await resp.read()
        finally:
            resp.release()
        if resp.status != 200:
            raise RuntimeError(f"listing failed: HTTP {resp.status}: {body[:200]!r}")
        return list(json.loads(body).get("items") or [])

    async def _write(self, pod: Mapping[str, Any], note: str) -> bool:
        meta = pod["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        event = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": f"{name[:200]}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "eventTime": self._clock().strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "reportingController": f"{self._driver}/why-pending",
            "reportingInstance": self._instance[:128],
            "action": ACTION,
            "reason": REASON,
            "type": "Warning",
            "note": _capped(note),
            "regarding": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": namespace,
                "name": name,
                "uid": meta["uid"],
            },
        }
        try:
            await self._events.create_namespaced_event(
                namespace, cast(Any, event), _request_timeout=self._timeout_s
            )
        except Exception as exc:  # an Event is worth a log line, never a crash
            logger.warning(
                "could not record why a pod waits: %s", exc, extra={"pod": f"{namespace}/{name}"}
            )
            return False
        return True


def _unschedulable(pod: Mapping[str, Any]) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            return bool(
                condition.get("status") == "False" and condition.get("reason") == "Unschedulable"
            )
    return False


def _capped(note: str) -> str:
    raw = note.encode("utf-8")
    if len(raw) <= NOTE_MAX:
        return note
    return raw[: NOTE_MAX - 3].decode("utf-8", "ignore") + "…"
