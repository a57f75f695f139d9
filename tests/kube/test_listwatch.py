"""The shared list+watch loop (plugin.kube.listwatch) against the in-test API server:
lists come page by page, decoded off the event loop, and nothing changed while the pages
were read is lost to the watch that follows."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api

from plugin.kube.listwatch import ListWatch
from tests.harness.kube_api import FakeKubeApi, running_kube_api
from tests.webhook.waiting import eventually


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


class View:
    """What a cache built on the loop holds: name -> labels."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, str]] = {}
        self.lists = 0

    def listed(self, items: Sequence[dict[str, Any]]) -> None:
        self.lists += 1
        self.items = {i["metadata"]["name"]: i["metadata"].get("labels") or {} for i in items}

    def changed(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.items.pop(name, None)
        else:
            self.items[name] = obj["metadata"].get("labels") or {}


async def test_a_list_is_read_page_by_page_and_the_watch_misses_nothing() -> None:
    async with running_kube_api(FakeKubeApi()) as (fake, url):
        for i in range(7):
            fake.put(namespace(f"ns-{i}"))
        view = View()
        async with ApiClient(Configuration(host=url)) as client:
            core = CoreV1Api(client)
            changed_mid_list = False

            original = core.list_namespace

            async def list_namespace(**kwargs: Any) -> Any:
                nonlocal changed_mid_list
                # A change between two pages of the one list: the watch must bring it.
                if kwargs.get("_continue") and not changed_mid_list and not kwargs.get("watch"):
                    changed_mid_list = True
                    fake.put(namespace("ns-0", team="a"))
                    fake.remove("v1", "Namespace", "ns-6")
                return await original(**kwargs)

            loop = ListWatch(
                "namespaces",
                list_namespace,
                on_list=view.listed,
                on_event=view.changed,
                page_size=3,
                watch_timeout_s=2,
            )
            task = asyncio.create_task(loop.run())
            try:
                await asyncio.wait_for(loop.synced.wait(), timeout=10)
                pages = [
                    r for r in fake.requests if r.resource == "namespaces" and r.verb == "list"
                ]
                # ns-0..2, then ns-3..5 (ns-6 went between the two pages)
                assert [r.query.get("limit") for r in pages] == ["3", "3"]
                assert "continue" in pages[1].query
                assert changed_mid_list
                await eventually(lambda: view.items.get("ns-0") == {"team": "a"})
                await eventually(lambda: "ns-6" not in view.items)
                assert set(view.items) == {f"ns-{i}" for i in range(6)}
                assert view.lists == 1
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
