"""Events that say why a DRA pod waits, kept up while this replica leads (adapter).

kube-scheduler's own Event for a pod whose GPU share fits nowhere says only ``0/3 nodes
are available: 3 cannot allocate all claims`` (captured:
``../shared/fixtures/dra/event-70-units-unschedulable.json``). This writes one beside
it, in ``kubectl describe pod``, with what each GPU has free, in the words of
:mod:`plugin.api.dra_waiting` (``claim p70-gpu-nd7kc: node-a: no single GPU has 70
free units (largest 40; 80 free in total) (free: gpu-0 40 units, 79Gi; …)``).

How it runs, and why so:

* **Cluster-wide, under the claim-template controller's Lease** (one writer: the
  scheduler tries every node, so one explainer per node would write one Event per
  node). It lives in the webhook process because DRA mode's controller already does,
  with the Pod watch it needs.
* **Fed by that controller's Pod watch** (:class:`WaitingPods` is one of its pod
  observers), not a second cluster-wide watch: it keeps only Pending pods the
  scheduler marked ``Unschedulable`` that name resource claims, trimmed to the few
  fields the words need, so memory grows with the waiting DRA pods, not the cluster.
* **A pass when something changed, or every** ``refresh_s`` **while pods wait**: a new
  waiting pod or a new scheduler verdict on one (its condition's message or time)
  wakes it at once; what each GPU has free changes without any pod event (another
  pod ends), which the periodic pass catches. A pass lists the driver's
  ResourceSlices and every ResourceClaim once, however many pods wait
  (:class:`~plugin.api.dra_waiting.WaitingBoard`), and decodes and judges them in a
  worker thread (about 100 ms at 1,000 nodes of 8 GPUs), so admission reviews served by
  the same process are not held up.
* **One Event per pod and distinct note**: a pod waiting for an hour with the same
  reason gets one Event, not one per pass; a changed reason gets a new one. At most
  ``max_events_per_pass`` are written per pass (the rest next pass), so a burst of
  pending pods cannot flood the API server.

Writing an Event is never worth a crash: a failed list or write is logged and tried
again next pass.

**Metrics** (:class:`~webhook.metrics.DraWaitingStats`, when given one): the pods tracked,
those no GPU can take as of the last pass, the Events written or failed and each pass's
duration. Only the explainer (this adapter) reports them; :class:`WaitingPods` and
:func:`notes_for` stay pure. While this replica does not lead, its figures read 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import gc
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import aiohttp
import orjson
from kubernetes_asyncio import client

from plugin.api.dra_waiting import WaitingBoard
from webhook.metrics import DraWaitingStats, PassOutcome

logger = logging.getLogger(__name__)

Obj = dict[str, Any]

REASON: Final = "NoGpuShareFits"
ACTION: Final = "Scheduling"
"""The scheduler's action on its own Event for the same pod (captured)."""
NOTE_MAX: Final = 1024
"""``events.k8s.io/v1`` refuses a longer note."""
REFRESH_S: Final = 60.0
MAX_EVENTS_PER_PASS: Final = 100
PAGE_SIZE: Final = 100
"""Items per list request: one page decodes in a few milliseconds, which is as long as it
holds the interpreter from the event loop that answers admission reviews."""
PASS_TIMEOUT_S: Final = 60.0
"""A pass's lists and judgement together; past it the pass fails (logged) and the next
tries again, so the collector is never off for longer (:func:`collector_paused`)."""
MAX_PAGES: Final = 1000
"""A pass gives up past this many pages (500,000 objects) rather than grow without end."""


@dataclass(frozen=True)
class ExplainSettings:
    """``dra.explain_waiting``'s part of the config (:class:`webhook.config.DraConfig`)."""

    driver: str
    """The ResourceSlices' ``spec.driver`` (the DRA plugin's ``driver``)."""
    refresh_s: float = REFRESH_S


class WaitingPods:
    """The Pending, Unschedulable pods that name resource claims (pure view).

    Fed :meth:`listed` and :meth:`changed` by a Pod list+watch; :attr:`wake` is set
    when a pod starts waiting or the scheduler says something new about one."""

    def __init__(self) -> None:
        self._pods: dict[str, Obj] = {}
        """uid → the trimmed pod (metadata, spec.resourceClaims, resourceClaimStatuses)."""
        self._verdicts: dict[str, tuple[str, str]] = {}
        """uid → the PodScheduled condition's (lastTransitionTime, message)."""
        self.wake = asyncio.Event()

    def __len__(self) -> int:
        return len(self._pods)

    def pods(self) -> list[Obj]:
        return list(self._pods.values())

    def uids(self) -> set[str]:
        return set(self._pods)

    def listed(self, items: Sequence[Obj]) -> None:
        self._pods, self._verdicts = {}, {}
        for item in items:
            self.changed("ADDED", item)

    def changed(self, kind: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid:
            return
        verdict = None if kind == "DELETED" else _unschedulable_verdict(obj)
        if verdict is None or not (obj.get("spec") or {}).get("resourceClaims"):
            self._pods.pop(uid, None)
            self._verdicts.pop(uid, None)
            return
        self._pods[uid] = _trimmed(obj)
        if self._verdicts.get(uid) != verdict:
            self._verdicts[uid] = verdict
            self.wake.set()


class WaitingExplainer:
    """Writes the Events; :meth:`run` while leading, :meth:`explain` for one pass."""

    def __init__(
        self,
        api: client.ApiClient,
        pods: WaitingPods,
        *,
        driver: str,
        device_class: str,
        reporting_instance: str,
        refresh_s: float = REFRESH_S,
        max_events_per_pass: int = MAX_EVENTS_PER_PASS,
        timeout_s: float = 10.0,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        metrics: DraWaitingStats | None = None,
    ) -> None:
        self._resource = client.ResourceV1Api(api)
        self._events = client.EventsV1Api(api)
        self._pods = pods
        self._driver = driver
        self._device_class = device_class
        self._instance = reporting_instance
        self._refresh_s = refresh_s
        self._max_events = max_events_per_pass
        self._timeout_s = timeout_s
        self._clock = clock
        self._metrics = metrics
        self._said: dict[str, str] = {}
        """Pod UID → the note last written, so an unchanged reason is not repeated."""

    async def run(self) -> None:
        """Until cancelled: a pass when woken, or every ``refresh_s`` while pods wait.

        Runs only while this replica leads, so the metrics report its pods from here
        and go back to 0 when it stops (the Lease lost, shutdown)."""
        self._said = {}
        if self._metrics is not None:
            self._metrics.lead(lambda: len(self._pods))
        try:
            await self._loop()
        finally:
            if self._metrics is not None:
                self._metrics.follow()

    async def _loop(self) -> None:
        while True:
            if len(self._pods):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._pods.wake.wait(), timeout=self._refresh_s)
            else:
                await self._pods.wake.wait()
            self._pods.wake.clear()
            try:
                await self.explain()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the next change or refresh tries again
                logger.warning(
                    "could not explain waiting DRA pods; trying again",
                    extra={"error": f"{type(exc).__name__}: {exc}"},
                )

    async def explain(self) -> int:
        """One pass over the waiting pods; how many Events it wrote."""
        waiting = self._pods.pods()
        uids = self._pods.uids()
        self._said = {uid: note for uid, note in self._said.items() if uid in uids}
        if not waiting:
            if self._metrics is not None:
                self._metrics.judged(0)
            return 0
        started = time.perf_counter()
        try:
            written = await self._pass(waiting)
        except Exception:  # timed out or a list failed: the caller logs it (not a cancel)
            self._timed("error", started)
            raise
        self._timed("ok", started)
        return written

    def _timed(self, outcome: PassOutcome, started: float) -> None:
        if self._metrics is not None:
            self._metrics.passed(outcome, time.perf_counter() - started)

    async def _pass(self, waiting: Sequence[Obj]) -> int:
        """Judge ``waiting`` and write the Events that changed (:meth:`explain` times it)."""
        with collector_paused():
            async with asyncio.timeout(PASS_TIMEOUT_S):
                notes = await self._judge(waiting)
        if self._metrics is not None:
            self._metrics.judged(len(notes))
        written = 0
        for pod, note in notes:
            uid = str(pod["metadata"]["uid"])
            if self._said.get(uid) == note:
                continue
            if written >= self._max_events:
                self._pods.wake.set()  # the rest in the next pass
                break
            if await self._write(pod, note):
                self._said[uid] = note
                written += 1
        return written

    async def _judge(self, waiting: Sequence[Obj]) -> list[tuple[Obj, str]]:
        """The notes for ``waiting``; the lists it reads are freed when it returns."""
        slices = await self._fetch(self._resource.list_resource_slice, trim_slice)
        claims = await self._fetch(
            self._resource.list_resource_claim_for_all_namespaces, trim_claim
        )
        # Judging every node takes tens of milliseconds at 1,000 nodes: off the event loop,
        # which answers admission reviews meanwhile.
        return await asyncio.to_thread(
            notes_for,
            waiting,
            slices=slices,
            claims=claims,
            driver=self._driver,
            device_class=self._device_class,
        )

    async def _fetch(self, send: Any, trim: Callable[[Obj], Obj]) -> list[Obj]:
        """Every item of a list, page by page (``limit``/``continue``), each page decoded
        and trimmed to what the words read in a worker thread: 10,000 claims never sit
        in the webhook's memory whole, nor hold its event loop while they decode."""
        items: list[Obj] = []
        token: str | None = None
        for _ in range(MAX_PAGES):
            resp = cast(
                aiohttp.ClientResponse,
                await send(
                    limit=PAGE_SIZE,
                    _continue=token,
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
            page, token = await asyncio.to_thread(_page, body, trim)
            items.extend(page)
            if not token:
                return items
        raise RuntimeError(f"listing failed: more than {MAX_PAGES} pages of {PAGE_SIZE}")

    async def _write(self, pod: Obj, note: str) -> bool:
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
            if self._metrics is not None:
                self._metrics.event("failed")
            return False
        if self._metrics is not None:
            self._metrics.event("written")
        return True


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for one pass.

    A pass allocates hundreds of thousands of short-lived dicts (decoded pages, trimmed
    items); with the collector on, they trigger full collections that scan every live
    object, holding the interpreter, and so the admission reviews of this process, for
    about 100 ms each at 8,000 claims (tests/benchmarks/dra_waiting.py). Nothing of the
    pass is cyclic: its objects are freed by reference counting when it returns, so the
    collections found nothing to free anyway. Restored even when the pass fails."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def notes_for(
    waiting: Sequence[Obj],
    *,
    slices: Sequence[Obj],
    claims: Sequence[Obj],
    driver: str,
    device_class: str,
) -> list[tuple[Obj, str]]:
    """Each waiting pod no node's GPUs can take, with its note (pure; run in a thread)."""
    board = WaitingBoard.of(
        slices,
        [c for c in claims if (c.get("status") or {}).get("allocation")],
        driver=driver,
        device_class=device_class,
    )
    by_namespace: dict[str, dict[str, Mapping[str, Any]]] = {}
    for claim in claims:
        meta = claim.get("metadata") or {}
        by_namespace.setdefault(str(meta.get("namespace")), {})[str(meta.get("name"))] = claim
    notes = []
    for pod in waiting:
        namespace = str(pod["metadata"].get("namespace"))
        note = board.pod_words(pod, by_namespace.get(namespace, {}))
        if note is not None:
            notes.append((pod, note))
    return notes


def _page(body: bytes, trim: Callable[[Obj], Obj]) -> tuple[list[Obj], str | None]:
    """One list page's trimmed items and its ``continue`` token (raw JSON: ``shareID`` and
    ``consumedCapacity`` survive older client models, as the DRA plugin's reader keeps them)."""
    decoded = orjson.loads(body)
    token = (decoded.get("metadata") or {}).get("continue") or None
    return [trim(item) for item in decoded.get("items") or []], token


def trim_slice(item: Obj) -> Obj:
    """What :func:`plugin.api.dra_waiting.free_by_node` reads of a ResourceSlice."""
    spec = item.get("spec") or {}
    return {
        "spec": {
            "driver": spec.get("driver"),
            "nodeName": spec.get("nodeName"),
            "pool": {"name": (spec.get("pool") or {}).get("name")},
            "devices": [
                {"name": d.get("name"), "capacity": d.get("capacity")}
                for d in spec.get("devices") or []
                if isinstance(d, dict)
            ],
        }
    }


def trim_claim(item: Obj) -> Obj:
    """What the words read of a ResourceClaim: its name, requests and allocation results."""
    meta = item.get("metadata") or {}
    allocation = (item.get("status") or {}).get("allocation") or {}
    trimmed: Obj = {
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
        "spec": {
            "devices": {
                "requests": ((item.get("spec") or {}).get("devices") or {}).get("requests") or []
            }
        },
    }
    if allocation:
        results = (allocation.get("devices") or {}).get("results") or []
        trimmed["status"] = {"allocation": {"devices": {"results": results}}}
    return trimmed


def _unschedulable_verdict(pod: Obj) -> tuple[str, str] | None:
    """The scheduler's standing verdict on a Pending pod it could not place, or None."""
    if (pod.get("status") or {}).get("phase") not in (None, "Pending"):
        return None
    if (pod.get("spec") or {}).get("nodeName"):
        return None
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            if condition.get("status") == "False" and condition.get("reason") == "Unschedulable":
                return (
                    str(condition.get("lastTransitionTime") or ""),
                    str(condition.get("message") or ""),
                )
            return None
    return None


def _trimmed(pod: Obj) -> Obj:
    """What :meth:`~plugin.api.dra_waiting.WaitingBoard.pod_words` and the Event read."""
    meta = pod.get("metadata") or {}
    return {
        "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid")},
        "spec": {"resourceClaims": (pod.get("spec") or {}).get("resourceClaims") or []},
        "status": {
            "resourceClaimStatuses": (pod.get("status") or {}).get("resourceClaimStatuses") or []
        },
    }


def _capped(note: str) -> str:
    raw = note.encode("utf-8")
    if len(raw) <= NOTE_MAX:
        return note
    return raw[: NOTE_MAX - 3].decode("utf-8", "ignore") + "…"
