"""The quota mirror's reconcile loop: watch ResourceQuotas, write companions (adapter).

While this replica leads (:mod:`webhook.quotas.leader`), :class:`QuotaMirror`
lists every ResourceQuota in the cluster, then watches them
(:class:`plugin.kube.listwatch.ListWatch`: resourceVersion, 410 → list again,
backoff). Each change marks its namespace; a single worker plans each marked
namespace with the pure :func:`webhook.quotas.mirror.plan_namespace` and
applies the actions one at a time. Every list marks every namespace, so a
mirror that starts (or takes over from another replica, or re-lists after a
410) converges on everything that changed while nobody watched.

Writes are plain create, replace-with-resourceVersion and
delete-with-uid-precondition: a 409 or 404 means the view is stale, and the
watch event that follows re-plans the namespace. Anything else is logged and
the namespace is retried with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

from kubernetes_asyncio import client as k8s_client

from plugin.kube.listwatch import WATCH_TIMEOUT_S, ListWatch
from webhook.namespace_queue import NamespaceQueue, apply_change, index_by_namespace
from webhook.quotas.calls import Answer, call_api, raw_options
from webhook.quotas.leader import LeaderElector, LeaseTiming
from webhook.quotas.mirror import (
    Action,
    Blocked,
    Create,
    Delete,
    MirrorSettings,
    Replace,
    key_of,
    meta_of,
    plan_namespace,
)

logger = logging.getLogger(__name__)

Obj = dict[str, Any]

STALE: Final = frozenset({404, 409})
"""Answers that mean "the view was stale"; the next watch event re-plans."""


class QuotaMirror:
    """Keeps every source quota's companion as :mod:`webhook.quotas.mirror` wants it."""

    def __init__(
        self,
        api: k8s_client.ApiClient,
        *,
        settings: MirrorSettings,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        self._v1 = k8s_client.CoreV1Api(api)
        self._settings = settings
        self._watch_timeout_s = watch_timeout_s
        self._quotas: dict[str, dict[str, Obj]] = {}
        self._queue = NamespaceQueue()
        self._blocked: set[tuple[str, str]] = set()

    async def run(self) -> None:
        """Until cancelled: list, watch and reconcile (state starts empty on every run)."""
        self._quotas = {}
        self._queue.clear()
        watch = ListWatch(
            "resourcequotas (quota mirror)",
            self._v1.list_resource_quota_for_all_namespaces,
            on_list=self._listed,
            on_event=self._changed,
            watch_timeout_s=self._watch_timeout_s,
        )
        watcher = asyncio.create_task(watch.run(), name="metagpu-quota-mirror-watch")
        try:
            await self._queue.run(self._reconcile, what="quota mirror")
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    # ----------------------------------------------------------- the view
    def _listed(self, items: Sequence[Obj]) -> None:
        previous = set(self._quotas)
        quotas = index_by_namespace(items, key_of)
        self._quotas = quotas
        self._queue.mark(previous | set(quotas))
        logger.info(
            "quota mirror listed ResourceQuotas",
            extra={"quotas": len(items), "namespaces": len(quotas)},
        )

    def _changed(self, kind: str, obj: Obj) -> None:
        namespace = apply_change(self._quotas, kind, obj, key_of)
        if namespace is not None:
            self._queue.mark({namespace})

    # ------------------------------------------------------------ the work
    async def _reconcile(self, namespace: str) -> None:
        quotas = self._quotas.get(namespace, {})
        try:
            for action in plan_namespace(list(quotas.values()), self._settings):
                await self._apply(action, namespace)
        finally:
            if not quotas:
                self._quotas.pop(namespace, None)

    async def _apply(self, action: Action, namespace: str) -> None:
        if isinstance(action, Blocked):
            if (action.namespace, action.name) not in self._blocked:
                self._blocked.add((action.namespace, action.name))
                logger.warning(
                    "a ResourceQuota not managed by metagpu already has the companion's name; "
                    "its source's GPU budget is not mirrored (rename or delete it)",
                    extra={
                        "namespace": action.namespace,
                        "quota": action.name,
                        "source": action.source,
                    },
                )
            return
        if isinstance(action, Create):
            answer = await self._send(
                "create",
                action.obj,
                lambda: self._v1.create_namespaced_resource_quota(
                    namespace, cast(Any, action.obj), **raw_options()
                ),
            )
        elif isinstance(action, Replace):
            name = action.obj["metadata"]["name"]
            answer = await self._send(
                "repair",
                action.obj,
                lambda: self._v1.replace_namespaced_resource_quota(
                    name, namespace, cast(Any, action.obj), **raw_options()
                ),
            )
        else:
            answer = await self._delete(action)
            if answer.ok or answer.status == 404:
                self._quotas.get(namespace, {}).pop(action.name, None)
            return
        if answer.ok and answer.obj is not None:
            # Our own write, seen now rather than when its watch event arrives, so a
            # change in between is planned against it and does not write it twice.
            self._quotas.setdefault(namespace, {})[action.obj["metadata"]["name"]] = answer.obj

    async def _send(self, what: str, obj: Mapping[str, Any], send: Any) -> Answer:
        answer = await call_api(send)
        meta = meta_of(obj)
        ref = {"namespace": meta.get("namespace"), "quota": meta.get("name")}
        if answer.ok:
            logger.info("quota mirror: %s companion", what, extra=ref)
        elif answer.status not in STALE:
            raise RuntimeError(
                f"{what} ResourceQuota {ref}: HTTP {answer.status}: {answer.message}"
            )
        return answer

    async def _delete(self, action: Delete) -> Answer:
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": action.uid},
        }
        answer = await call_api(
            lambda: self._v1.delete_namespaced_resource_quota(
                action.name, action.namespace, body=cast(Any, body), **raw_options()
            )
        )
        ref = {"namespace": action.namespace, "quota": action.name}
        if answer.ok:
            logger.info("quota mirror: deleted companion", extra=ref)
        elif answer.status not in STALE:
            raise RuntimeError(
                f"delete ResourceQuota {ref}: HTTP {answer.status}: {answer.message}"
            )
        return answer


async def run_quota_mirror(
    api: k8s_client.ApiClient,
    *,
    settings: MirrorSettings,
    lease_name: str,
    lease_namespace: str,
    identity: str,
    timing: LeaseTiming,
    watch_timeout_s: int = WATCH_TIMEOUT_S,
    on_change: Any = None,
) -> None:
    """The mirror under leader election, until cancelled (then the Lease is released)."""
    mirror = QuotaMirror(api, settings=settings, watch_timeout_s=watch_timeout_s)
    elector = LeaderElector(
        api,
        name=lease_name,
        namespace=lease_namespace,
        identity=identity,
        timing=timing,
        work_name="quota mirror",
        on_change=on_change,
    )
    await elector.run(mirror.run)
