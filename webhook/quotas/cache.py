"""A watch-backed cache of the ResourceQuotas that limit GPUs or units (adapter).

Feeds the admission warning of :mod:`webhook.quotas.coverage` without any
I/O per request: a background :class:`plugin.kube.listwatch.ListWatch` keeps, per
namespace, only the names of the quotas that limit ``nvidia.com/gpu`` or the
metagpu resource (a quota about CPU or pods is never stored), and the warning
text is worked out when a quota changes, not when a pod arrives. The cache is
bounded by :data:`MAX_QUOTAS`; past it, new quotas are not tracked (logged
once), which can only cost a warning, never an admission.

:class:`QuotaAwareNamespaces` is the composition point: it wraps any
:class:`webhook.namespaces.NamespaceSource` and puts the namespace's quota
warning in the facts' ``unit_warnings``, which :func:`webhook.admission.admit`
adds to the response of an admitted object that asks for metagpu units.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Final

from kubernetes_asyncio import client as k8s_client

from plugin.kube.listwatch import WATCH_TIMEOUT_S, ListWatch
from webhook.model import NamespaceFacts
from webhook.namespaces import NamespaceSource
from webhook.quotas.coverage import (
    NamespaceQuotas,
    QuotaKind,
    kind_of,
    uncounted_claims_warning,
    unmirrored_warning,
)
from webhook.quotas.mirror import MirrorSettings, key_of

logger = logging.getLogger(__name__)

Obj = dict[str, Any]

MAX_QUOTAS: Final = 100_000
"""Most quotas tracked; a few per namespace in the largest clusters is far below it."""


class QuotaCache:
    """``async with QuotaCache(api, settings=...) as quotas``; answers from memory."""

    def __init__(
        self,
        api: k8s_client.ApiClient,
        *,
        settings: MirrorSettings,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        max_quotas: int = MAX_QUOTAS,
    ) -> None:
        self._api = api
        self._settings = settings
        self._max_quotas = max_quotas
        self._kinds: dict[str, dict[str, QuotaKind]] = {}
        self._count = 0
        self._warnings: dict[str, tuple[str, ...]] = {}
        self._synced = asyncio.Event()
        self._full_logged = False
        self._watch = ListWatch(
            "resourcequotas",
            k8s_client.CoreV1Api(api).list_resource_quota_for_all_namespaces,
            on_list=self._listed,
            on_event=self._changed,
            watch_timeout_s=watch_timeout_s,
        )
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> QuotaCache:
        self._task = asyncio.create_task(self._watch.run(), name="metagpu-webhook-quota-watch")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._api.close()

    @property
    def status(self) -> str:
        if not self._synced.is_set():
            return "syncing"
        return f"synced ({len(self._warnings)} namespaces whose GPU quotas do not count units)"

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def warnings(self, namespace: str) -> tuple[str, ...]:
        """The quota warning for ``namespace``, or nothing: one dict lookup."""
        return self._warnings.get(namespace, ())

    # ---------------------------------------------------------- updating
    def _listed(self, items: Sequence[Obj]) -> None:
        self._kinds, self._count, self._warnings = {}, 0, {}
        for item in items:
            self._put(item)
        for namespace in list(self._kinds):
            self._refresh(namespace)
        self._synced.set()

    def _changed(self, kind: str, obj: Obj) -> None:
        namespace = self._put(obj) if kind != "DELETED" else self._drop(obj)
        if namespace:
            self._refresh(namespace)

    def _put(self, quota: Obj) -> str:
        namespace, name = key_of(quota)
        if not (namespace and name):
            return ""
        what = kind_of(quota, self._settings)
        kinds = self._kinds.get(namespace, {})
        if what is None:
            if kinds.pop(name, None) is not None:
                self._count -= 1
            return namespace
        if name not in kinds:
            if self._count >= self._max_quotas:
                if not self._full_logged:
                    self._full_logged = True
                    logger.warning(
                        "quota cache is full; quotas beyond it get no admission warning",
                        extra={"max_quotas": self._max_quotas},
                    )
                return ""
            self._count += 1
        self._kinds.setdefault(namespace, kinds)[name] = what
        return namespace

    def _drop(self, quota: Obj) -> str:
        namespace, name = key_of(quota)
        if self._kinds.get(namespace, {}).pop(name, None) is not None:
            self._count -= 1
        return namespace

    def _refresh(self, namespace: str) -> None:
        kinds = self._kinds.get(namespace)
        if not kinds:
            self._kinds.pop(namespace, None)
            self._warnings.pop(namespace, None)
            return
        quotas = NamespaceQuotas(kinds)
        if self._settings.claim_device_class is not None:
            uncounted = quotas.uncounted_claims()
            warning = uncounted_claims_warning(uncounted, self._settings) if uncounted else None
        else:
            unmirrored = quotas.unmirrored()
            warning = unmirrored_warning(unmirrored, self._settings) if unmirrored else None
        if warning is not None:
            self._warnings[namespace] = (warning,)
        else:
            self._warnings.pop(namespace, None)


class QuotaAwareNamespaces:
    """A :class:`NamespaceSource` whose facts also carry the namespace's quota warning.

    Readiness is the inner source's alone: a warning is not worth keeping the
    webhook out of its Service while the quota list is in flight.
    """

    def __init__(self, inner: NamespaceSource, quotas: QuotaCache) -> None:
        self._inner = inner
        self._quotas = quotas

    @property
    def ready(self) -> bool:
        return self._inner.ready

    @property
    def status(self) -> str:
        return f"{self._inner.status}; quotas: {self._quotas.status}"

    def cached(self, name: str) -> NamespaceFacts | None:
        facts = self._inner.cached(name)
        if facts is None:
            return None
        return self._with_quotas(name, facts)

    async def facts(self, name: str) -> NamespaceFacts:
        return self._with_quotas(name, await self._inner.facts(name))

    def _with_quotas(self, name: str, facts: NamespaceFacts) -> NamespaceFacts:
        extra = self._quotas.warnings(name)
        if not extra:
            return facts
        return dataclasses.replace(facts, unit_warnings=extra)
