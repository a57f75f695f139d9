"""Keeps the ResourceClaimTemplates DRA-mode pods name, in every namespace (adapter).

The quota mirror's pattern (:mod:`webhook.quotas.controller`): while this
replica leads (a Lease, :mod:`webhook.quotas.leader`), list and watch Pods
and our ResourceClaimTemplates (:class:`plugin.kube.listwatch.ListWatch`),
mark the namespaces that changed, and let one worker plan each with the pure
:func:`webhook.claimtemplates.plan_namespace` and write the actions one at a
time. Every list marks every namespace, so a controller that starts, takes
over or re-lists converges on what changed while nobody watched.

Only what the planner needs is kept: per pod, the shapes its claims name. Its Pod
watch also feeds any ``pod_observers`` (the waiting-pod explainer,
:mod:`webhook.dra_waiting`), so the leader holds one cluster-wide Pod watch, not two.
Writes are create and delete-with-uid-precondition; a 409 or 404 means the
view was stale and the watch event that follows re-plans the namespace.
Anything else is logged and the namespace retried with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, cast

from kubernetes_asyncio import client as k8s_client

from plugin.kube.listwatch import WATCH_TIMEOUT_S, ListWatch
from webhook.claimtemplates import GC_AFTER_S, Action, Create, Delete, plan_namespace, pod_shapes
from webhook.dra import MANAGED_BY, MANAGED_BY_LABEL, Shape
from webhook.dra_waiting import ExplainSettings, WaitingExplainer, WaitingPods
from webhook.metrics import DraWaitingStats
from webhook.model import DraSettings
from webhook.namespace_queue import NamespaceQueue, apply_change, index_by_namespace
from webhook.quotas.calls import Answer, call_api, raw_options
from webhook.quotas.leader import LeaderElector, LeaseTiming

logger = logging.getLogger(__name__)

Obj = dict[str, Any]

STALE: Final = frozenset({404, 409})
"""Answers that mean "the view was stale"; the next watch event re-plans."""

OURS_SELECTOR: Final = f"{MANAGED_BY_LABEL}={MANAGED_BY}"


class PodObserver(Protocol):
    """Something else the leader keeps from the same Pod list+watch."""

    def listed(self, items: Sequence[Obj]) -> None: ...

    def changed(self, kind: str, obj: Obj) -> None: ...


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class ClaimTemplateController:
    """Creates the templates pods name; deletes ours that no pod names for ``gc_after_s``."""

    def __init__(
        self,
        api: k8s_client.ApiClient,
        *,
        dra: DraSettings,
        gc_after_s: float = GC_AFTER_S,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        clock: Callable[[], float] | None = None,
        pod_observers: Sequence[PodObserver] = (),
    ) -> None:
        self._v1 = k8s_client.CoreV1Api(api)
        self._observers = tuple(pod_observers)
        self._resource = k8s_client.ResourceV1Api(api)
        self._dra = dra
        self._gc_after_s = gc_after_s
        self._watch_timeout_s = watch_timeout_s
        self._clock = clock
        self._pods: dict[str, dict[str, frozenset[Shape]]] = {}
        self._templates: dict[str, dict[str, Obj]] = {}
        self._unreferenced: dict[str, dict[str, float]] = {}
        self._queue = NamespaceQueue()

    def _now(self) -> float:
        return self._clock() if self._clock else asyncio.get_running_loop().time()

    async def run(self) -> None:
        """Until cancelled: list, watch and reconcile (state starts empty on every run)."""
        self._pods, self._templates = {}, {}
        self._unreferenced = {}
        self._queue.clear()
        watches = [
            ListWatch(
                "pods (claim templates)",
                self._v1.list_pod_for_all_namespaces,
                on_list=self._pods_listed,
                on_event=self._pod_changed,
                watch_timeout_s=self._watch_timeout_s,
            ),
            ListWatch(
                "resourceclaimtemplates (claim templates)",
                self._resource.list_resource_claim_template_for_all_namespaces,
                on_list=self._templates_listed,
                on_event=self._template_changed,
                query={"label_selector": OURS_SELECTOR},
                watch_timeout_s=self._watch_timeout_s,
            ),
        ]
        tasks = [
            asyncio.create_task(w.run(), name=f"metagpu-claim-templates-watch-{i}")
            for i, w in enumerate(watches)
        ]
        try:
            # Plan only once both views are whole: a namespace whose templates are
            # not listed yet would be planned as having none.
            await asyncio.gather(*(w.synced.wait() for w in watches))
            await self._queue.run(self._reconcile, what="claim templates")
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    # ----------------------------------------------------------- the view
    def _pods_listed(self, items: Sequence[Obj]) -> None:
        for observer in self._observers:
            observer.listed(items)
        previous = set(self._pods)
        pods: dict[str, dict[str, frozenset[Shape]]] = {}
        for item in items:
            namespace, name = _key(item)
            shapes = self._shapes(item)
            if namespace and name and shapes:
                pods.setdefault(namespace, {})[name] = shapes
        self._pods = pods
        self._queue.mark(previous | set(pods))

    def _pod_changed(self, kind: str, obj: Obj) -> None:
        for observer in self._observers:
            observer.changed(kind, obj)
        namespace, name = _key(obj)
        if not (namespace and name):
            return
        shapes = frozenset() if kind == "DELETED" else self._shapes(obj)
        held = self._pods.get(namespace, {})
        if held.get(name, frozenset()) == shapes:
            return  # most pod events (status) change nothing we plan from
        if shapes:
            self._pods.setdefault(namespace, {})[name] = shapes
        else:
            held.pop(name, None)
        self._queue.mark({namespace})

    def _shapes(self, pod: Obj) -> frozenset[Shape]:
        try:
            return pod_shapes(pod, prefix=self._dra.template_prefix)
        except ValueError:
            return frozenset()  # not shaped like a pod: nothing it could consume

    def _templates_listed(self, items: Sequence[Obj]) -> None:
        previous = set(self._templates)
        templates = index_by_namespace(items, _key)
        self._templates = templates
        self._queue.mark(previous | set(templates))

    def _template_changed(self, kind: str, obj: Obj) -> None:
        namespace = apply_change(self._templates, kind, obj, _key)
        if namespace is not None:
            self._queue.mark({namespace})

    # ------------------------------------------------------------ the work
    async def _reconcile(self, namespace: str) -> None:
        wanted: set[Shape] = set()
        for shapes in self._pods.get(namespace, {}).values():
            wanted |= shapes
        templates = self._templates.get(namespace, {})
        try:
            plan = plan_namespace(
                namespace,
                wanted=wanted,
                templates=list(templates.values()),
                dra=self._dra,
                unreferenced_since=self._unreferenced.get(namespace, {}),
                now=self._now(),
                gc_after_s=self._gc_after_s,
            )
            self._unreferenced[namespace] = plan.unreferenced_since
            if plan.recheck_in_s is not None:
                asyncio.get_running_loop().call_later(
                    plan.recheck_in_s, self._queue.mark, {namespace}
                )
            for action in plan.actions:
                await self._apply(action, namespace)
        finally:
            if not self._pods.get(namespace) and not self._templates.get(namespace):
                self._pods.pop(namespace, None)
                self._templates.pop(namespace, None)
                self._unreferenced.pop(namespace, None)

    async def _apply(self, action: Action, namespace: str) -> None:
        if isinstance(action, Create):
            name = action.obj["metadata"]["name"]
            answer = await call_api(
                lambda: self._resource.create_namespaced_resource_claim_template(
                    namespace, cast(Any, action.obj), **raw_options()
                )
            )
            self._check("create", namespace, name, answer)
            if answer.ok and answer.obj is not None:
                # Our own write, seen now rather than when its watch event arrives.
                self._templates.setdefault(namespace, {})[name] = answer.obj
            return
        await self._delete(action)

    async def _delete(self, action: Delete) -> None:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": action.uid}}
        answer = await call_api(
            lambda: self._resource.delete_namespaced_resource_claim_template(
                action.name, action.namespace, body=cast(Any, body), **raw_options()
            )
        )
        self._check("delete", action.namespace, action.name, answer, why=action.why)
        if answer.ok or answer.status == 404:
            self._templates.get(action.namespace, {}).pop(action.name, None)
            self._unreferenced.get(action.namespace, {}).pop(action.name, None)

    @staticmethod
    def _check(what: str, namespace: str, name: str, answer: Answer, *, why: str = "") -> None:
        ref = {"namespace": namespace, "template": name}
        if why:
            ref["why"] = why
        if answer.ok:
            logger.info("claim templates: %sd ResourceClaimTemplate", what, extra=ref)
        elif answer.status not in STALE:
            raise RuntimeError(
                f"{what} ResourceClaimTemplate {namespace}/{name}: HTTP {answer.status}: "
                f"{answer.message}"
            )


async def run_claim_templates(
    api: k8s_client.ApiClient,
    *,
    dra: DraSettings,
    lease_name: str,
    lease_namespace: str,
    identity: str,
    timing: LeaseTiming,
    gc_after_s: float = GC_AFTER_S,
    watch_timeout_s: int = WATCH_TIMEOUT_S,
    on_change: Any = None,
    explain: ExplainSettings | None = None,
    metrics: DraWaitingStats | None = None,
) -> None:
    """The controller under leader election, until cancelled (then the Lease is
    released); with ``explain``, the waiting-pod Events under the same leadership,
    reported to ``metrics`` while this replica leads."""
    pods = WaitingPods()
    controller = ClaimTemplateController(
        api,
        dra=dra,
        gc_after_s=gc_after_s,
        watch_timeout_s=watch_timeout_s,
        pod_observers=(pods,) if explain else (),
    )
    elector = LeaderElector(
        api,
        name=lease_name,
        namespace=lease_namespace,
        identity=identity,
        timing=timing,
        work_name="claim-template controller",
        on_change=on_change,
    )
    if explain is None:
        await elector.run(controller.run)
        return
    explainer = WaitingExplainer(
        api,
        pods,
        driver=explain.driver,
        device_class=dra.device_class_name,
        reporting_instance=identity,
        refresh_s=explain.refresh_s,
        metrics=metrics,
    )

    async def lead() -> None:
        # Both stop together: the elector cancels this when the Lease is lost.
        async with asyncio.TaskGroup() as group:
            group.create_task(controller.run(), name="metagpu-claim-templates")
            group.create_task(explainer.run(), name="metagpu-why-pending")

    await elector.run(lead)
