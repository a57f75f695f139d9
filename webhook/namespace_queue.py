"""Namespaces waiting to be reconciled, and the per-namespace index controllers keep (asyncio).

Why: the quota mirror (:mod:`webhook.quotas.controller`) and the claim-template
controller (:mod:`webhook.claimtemplate_controller`) reconcile the same way, one
namespace at a time from the newest state their watches hold, and each wrote the
queue and the index itself. One copy here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

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

    def mark(self, namespaces: Iterable[str]) -> None:
        added = set(namespaces)
        if added:
            self._dirty |= added
            self._wake.set()

    def clear(self) -> None:
        """Forget every mark (a controller starting over from a new list)."""
        self._dirty.clear()
        self._wake = asyncio.Event()

    async def run(self, reconcile: Callable[[str], Awaitable[None]]) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._dirty:
                batch = sorted(self._dirty)
                self._dirty.clear()
                for namespace in batch:
                    await reconcile(namespace)


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
