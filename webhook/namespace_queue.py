"""Namespaces waiting to be reconciled, and the per-namespace index controllers keep (asyncio).

Why: the quota mirror (:mod:`webhook.quotas.controller`) and the claim-template
controller (:mod:`webhook.claimtemplate_controller`) reconcile the same way, one
namespace at a time from the newest state their watches hold, retrying a namespace
that failed with a growing delay, and each wrote the queue, the retries and the
index itself. One copy here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from plugin.kube.listwatch import BACKOFF_S

logger = logging.getLogger(__name__)

Obj = dict[str, Any]


class NamespaceQueue:
    """Namespaces marked for reconciling; :meth:`run` works them off until cancelled.

    In name order, a batch at a time: a namespace marked again while its batch runs
    is reconciled again in the next batch, from its newest state. Marking is
    synchronous (watch callbacks call it), so a namespace is never lost between a
    change and the work it causes.
    """

    def __init__(self) -> None:
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._failures: dict[str, int] = {}

    def mark(self, namespaces: Iterable[str]) -> None:
        added = set(namespaces)
        if added:
            self._dirty |= added
            self._wake.set()

    def clear(self) -> None:
        """Forget every mark and failure (a controller starting over from a new list)."""
        self._dirty.clear()
        self._failures.clear()
        self._wake = asyncio.Event()

    async def run(self, reconcile: Callable[[str], Awaitable[None]], *, what: str) -> None:
        """Until cancelled: ``reconcile`` each marked namespace. One that raises is marked
        again after ``BACKOFF_S``, doubling per failure in a row (``what`` names the
        controller in the warning)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._dirty:
                batch = sorted(self._dirty)
                self._dirty.clear()
                for namespace in batch:
                    try:
                        await reconcile(namespace)
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:
                        self._retry_later(namespace, exc, what=what)
                    else:
                        self._failures.pop(namespace, None)

    def _retry_later(self, namespace: str, exc: Exception, *, what: str) -> None:
        failures = self._failures.get(namespace, 0) + 1
        self._failures[namespace] = failures
        delay = min(BACKOFF_S[0] * 2 ** (failures - 1), BACKOFF_S[1])
        logger.warning(
            "%s could not reconcile a namespace; retrying",
            what,
            extra={
                "namespace": namespace,
                "error": f"{type(exc).__name__}: {exc}",
                "retry_in_s": delay,
            },
        )
        asyncio.get_running_loop().call_later(delay, self.mark, {namespace})


def index_by_namespace(
    items: Sequence[Obj], key: Callable[[Obj], tuple[str, str]]
) -> dict[str, dict[str, Obj]]:
    """Listed objects by namespace, then name (objects without either are left out)."""
    index: dict[str, dict[str, Obj]] = {}
    for item in items:
        namespace, name = key(item)
        if namespace and name:
            index.setdefault(namespace, {})[name] = item
    return index


def apply_change(
    index: dict[str, dict[str, Obj]], kind: str, obj: Obj, key: Callable[[Obj], tuple[str, str]]
) -> str | None:
    """One watch event applied to ``index``; the namespace it touched, or None."""
    namespace, name = key(obj)
    if not (namespace and name):
        return None
    if kind == "DELETED":
        index.get(namespace, {}).pop(name, None)
    else:
        index.setdefault(namespace, {})[name] = obj
    return namespace
