"""Keeps the extender's ledger current from the API server (adapter; kubernetes-asyncio).

Three list+watch loops (:class:`plugin.kube.listwatch.ListWatch`):

* **Nodes**: each node's ``metagpu.io/gpu-ledger`` annotation (the agent's
  report) into :meth:`Ledger.set_node`;
* **Pods** bound to a node (``spec.nodeName!=``): a pod carrying
  ``metagpu.io/assigned-gpus`` that its node has not reported is assumed
  (this is how a restarted extender rebuilds what it had reserved); a pod
  deleted or ended drops its reservation;
* **Namespaces**: their annotations, for ``metagpu.io/placement-policy``;
* **PodDisruptionBudgets** (policy/v1), which preemption weighs as
  kube-scheduler does. A watch rather than a read per decision: budgets are few,
  the decision stays synchronous (the filter call never waits on the API), and
  kube-scheduler keeps them in an informer for the same reason.

The pod watch also keeps, for pods that ask for the extender's resource, what
preemption needs (priority, labels, start time, terminating;
:class:`~plugin.extender.podfacts.PodDirectory`), and tells the core when a pod
named as a victim starts terminating or goes (the preemptor is then nominated).

Plus a timer that drops assumptions past the assume timeout, and nominations
past theirs. The cache is
*ready* once Nodes and Pods have been listed; before that the extender
answers every verb with an error, so the scheduler retries the pod instead
of placing it on a half-known cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from kubernetes_asyncio import client as k8s_client

from plugin.api.scheduling import (
    ANNOTATION_ASSIGNED_GPUS,
    ANNOTATION_GPU_LEDGER,
    ANNOTATION_LEDGER_REFRESH,
)
from plugin.extender.budgets import BudgetError, parse_budget
from plugin.extender.ledger import Nomination
from plugin.extender.podfacts import pod_facts
from plugin.extender.pods import PodSpecError, container_requests
from plugin.extender.service import ExtenderCore
from plugin.kube.listwatch import WATCH_TIMEOUT_S, ListWatch

logger = logging.getLogger(__name__)


class LedgerCache:
    """Use as ``async with LedgerCache(api, core) as cache``; the API client stays the caller's."""

    def __init__(
        self,
        api: k8s_client.ApiClient,
        core: ExtenderCore,
        *,
        clock: Callable[[], float] = time.time,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        expiry_interval_s: float | None = None,
        on_expired: Callable[[int], None] | None = None,
        on_nominated: Callable[[Nomination], None] | None = None,
    ) -> None:
        self._on_expired = on_expired
        self._on_nominated = on_nominated
        self._core = core
        self._clock = clock
        self.binds_in_flight: set[str] = set()
        """Pod UIDs being bound now: a re-list that does not show them yet keeps them."""
        v1 = k8s_client.CoreV1Api(api)
        self.nodes = ListWatch(
            "nodes",
            v1.list_node,
            on_list=self._nodes_listed,
            on_event=self._node_event,
            watch_timeout_s=watch_timeout_s,
        )
        self.pods = ListWatch(
            "pods",
            v1.list_pod_for_all_namespaces,
            on_list=self._pods_listed,
            on_event=self._pod_event,
            query={"field_selector": "spec.nodeName!="},
            watch_timeout_s=watch_timeout_s,
        )
        self.namespaces = ListWatch(
            "namespaces",
            v1.list_namespace,
            on_list=self._namespaces_listed,
            on_event=self._namespace_event,
            watch_timeout_s=watch_timeout_s,
        )
        self.budgets = ListWatch(
            "poddisruptionbudgets",
            k8s_client.PolicyV1Api(api).list_pod_disruption_budget_for_all_namespaces,
            on_list=self._budgets_listed,
            on_event=self._budget_event,
            watch_timeout_s=watch_timeout_s,
        )
        core.budgets_ready = False
        self._expiry_interval_s = expiry_interval_s or min(5.0, core.assume_timeout_s / 10)
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> LedgerCache:
        self._tasks = [
            asyncio.create_task(self.nodes.run(), name="metagpu-extender-nodes"),
            asyncio.create_task(self.pods.run(), name="metagpu-extender-pods"),
            asyncio.create_task(self.namespaces.run(), name="metagpu-extender-namespaces"),
            asyncio.create_task(self.budgets.run(), name="metagpu-extender-budgets"),
            asyncio.create_task(self._expire_forever(), name="metagpu-extender-expiry"),
        ]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def ready(self) -> bool:
        return self.nodes.synced.is_set() and self.pods.synced.is_set()

    async def wait_synced(self) -> None:
        await self.nodes.synced.wait()
        await self.pods.synced.wait()

    # -------------------------------------------------------------- nodes
    def _nodes_listed(self, items: Sequence[dict[str, Any]]) -> None:
        ledger = self._core.ledger
        seen = set()
        for node in items:
            name = _name(node)
            if name:
                seen.add(name)
                ledger.set_node(
                    name, _annotation(node, ANNOTATION_GPU_LEDGER), refresh_s=_refresh_s(node)
                )
        for name in set(ledger.node_names()) - seen:
            ledger.drop_node(name)

    def _node_event(self, kind: str, node: dict[str, Any]) -> None:
        name = _name(node)
        if not name:
            return
        if kind == "DELETED":
            self._core.ledger.drop_node(name)
        else:
            self._core.ledger.set_node(
                name, _annotation(node, ANNOTATION_GPU_LEDGER), refresh_s=_refresh_s(node)
            )

    # --------------------------------------------------------------- pods
    def _pods_listed(self, items: Sequence[dict[str, Any]]) -> None:
        listed = set()
        for pod in items:
            uid = (pod.get("metadata") or {}).get("uid")
            if isinstance(uid, str):
                listed.add(uid)
            self._pod_event("ADDED", pod)
        for assumption in self._core.ledger.assumed():
            if assumption.pod_uid not in listed and assumption.pod_uid not in self.binds_in_flight:
                # Deleted while we were not watching (the watch history was compacted).
                self._core.ledger.pod_gone(assumption.pod_uid)

    def _pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not isinstance(uid, str):
            return
        if kind == "DELETED":
            self._core.directory.drop(uid)
            self._core.ledger.pod_gone(uid)
            self._victim_leaving(uid)
            return
        self._note_facts(uid, pod)
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        self._core.ledger.observe_pod(
            pod_uid=uid,
            namespace=str(meta.get("namespace") or ""),
            pod=str(meta.get("name") or ""),
            node_name=spec.get("nodeName"),
            phase=status.get("phase"),
            annotation=_annotation(pod, ANNOTATION_ASSIGNED_GPUS),
            now=self._clock(),
            ttl_s=self._core.assume_timeout_s,
        )

    def _note_facts(self, uid: str, pod: dict[str, Any]) -> None:
        """Keep preemption's facts for pods that ask for the resource (the only ones that
        can hold units), and drop them for pods that ended."""
        try:
            requests = container_requests(pod, resource=self._core.ledger.resource)
        except PodSpecError:
            requests = ()
        asking = {c.name for c in requests if c.units}
        if not asking or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self._core.directory.drop(uid)
            return
        facts = pod_facts(pod, asking=asking)
        self._core.directory.put(facts)
        if facts.terminating:
            self._victim_leaving(uid)

    def _victim_leaving(self, uid: str) -> None:
        nominated = self._core.victim_leaving(uid, now=self._clock())
        if nominated is not None:
            logger.info(
                "kube-scheduler preempted the victims named for a pod: its GPU units are held",
                extra={
                    "namespace": nominated.namespace,
                    "pod": nominated.pod,
                    "node": nominated.node,
                    "gpus": dict(nominated.taken),
                },
            )
            if self._on_nominated is not None:
                self._on_nominated(nominated)

    # ------------------------------------------------------------- budgets
    def _budgets_listed(self, items: Sequence[dict[str, Any]]) -> None:
        self._core.budgets.replace_all([])
        for item in items:
            self._budget_event("ADDED", item)
        self._core.budgets_ready = True

    def _budget_event(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if kind == "DELETED":
            self._core.budgets.remove(str(meta.get("namespace") or ""), str(meta.get("name")))
            return
        try:
            self._core.budgets.put(parse_budget(obj))
        except BudgetError as exc:
            logger.warning("ignoring a PodDisruptionBudget: %s", exc)

    # ---------------------------------------------------------- namespaces
    def _namespaces_listed(self, items: Sequence[dict[str, Any]]) -> None:
        self._core.namespace_annotations = {}
        for ns in items:
            self._namespace_event("ADDED", ns)

    def _namespace_event(self, kind: str, ns: dict[str, Any]) -> None:
        name = _name(ns)
        if not name:
            return
        annotations = (ns.get("metadata") or {}).get("annotations") or {}
        if kind == "DELETED" or not annotations:
            self._core.namespace_annotations.pop(name, None)
        else:
            self._core.namespace_annotations[name] = {
                str(k): str(v) for k, v in annotations.items() if k.startswith("metagpu.io/")
            }

    # -------------------------------------------------------------- expiry
    async def _expire_forever(self) -> None:
        while True:
            await asyncio.sleep(self._expiry_interval_s)
            self.expire_now()

    def expire_now(self) -> None:
        for name in self._core.ledger.mark_stale(self._clock()):
            logger.warning(
                "a node's GPU ledger is no longer trusted: its agent stopped refreshing it",
                extra={"node": name, "why": self._core.ledger.view(name)},
            )
        for lapsed in self._core.ledger.expire_nominations(self._clock()):
            logger.warning(
                "units held for a preemptor released: it was not scheduled in time",
                extra={"namespace": lapsed.namespace, "pod": lapsed.pod, "node": lapsed.node},
            )
        expired = self._core.ledger.expire(self._clock())
        if expired and self._on_expired is not None:
            self._on_expired(len(expired))
        for gone in expired:
            logger.warning(
                "assumed GPU assignment expired: the node never reported the pod",
                extra={"namespace": gone.namespace, "pod": gone.pod, "node": gone.node},
            )


def _name(obj: dict[str, Any]) -> str | None:
    name = (obj.get("metadata") or {}).get("name")
    return name if isinstance(name, str) and name else None


def _refresh_s(node: dict[str, Any]) -> float | None:
    """The agent's promised rewrite period (:data:`ANNOTATION_LEDGER_REFRESH`); None when
    absent or not a positive number (then the ledger is trusted however old)."""
    text = _annotation(node, ANNOTATION_LEDGER_REFRESH)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < float("inf") else None


def _annotation(obj: dict[str, Any], key: str) -> str | None:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(key) if isinstance(annotations, dict) else None
    return value if isinstance(value, str) else None
