"""The pod watch against the protocol-faithful fake API server: this node's pods only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from certs.kube import open_api_client
from plugin.agent import pods as pods_module
from plugin.agent.containers import PodIndex
from plugin.agent.pods import PodWatcher, WatchExpiredError
from tests.agent.builders import pod, ref
from tests.agent.helpers import eventually
from tests.harness.kube_api import FakeKubeApi


@pytest.fixture
async def api(kube_config_env: Path) -> AsyncIterator[client.ApiClient]:
    async with open_api_client() as (api, _source):
        yield api


async def test_indexes_only_this_nodes_pods_and_follows_changes(
    kube_api: tuple[FakeKubeApi, str], api: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Short server-side watches: the fake records a watch when it ends, and the
    # watcher must resume from its resourceVersion without missing events.
    monkeypatch.setattr(pods_module, "WATCH_TIMEOUT_S", 1)
    fake, _ = kube_api
    fake.put(pod("a", node="node-a"))
    fake.put(pod("x", node="node-b"))
    index = PodIndex()
    watcher = PodWatcher(api, node_name="node-a", index=index)
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(watcher.synced.wait(), 10)
        assert index.lookup(ref("a").container_id) == ref("a")
        assert index.lookup(ref("x").container_id) is None
        assert watcher.error is None

        fake.put(pod("b", node="node-a"))
        fake.put(pod("y", node="node-b"))
        await eventually(lambda: index.knows(ref("b").container_id), what="pod b indexed")
        fake.remove("v1", "Pod", "a", "ml")
        await eventually(lambda: not index.knows(ref("a").container_id), what="pod a removed")
        assert not index.knows(ref("y").container_id)
        await eventually(
            lambda: any(r.verb == "watch" for r in fake.requests), what="a watch ended"
        )
        fake.put(pod("c", node="node-a"))  # after a resumed watch
        await eventually(lambda: index.knows(ref("c").container_id), what="pod c indexed")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    selectors = {r.query.get("fieldSelector") for r in fake.requests if r.resource == "pods"}
    assert selectors == {"spec.nodeName=node-a"}
    assert {r.verb for r in fake.requests} == {"list", "watch"}
    assert [r.verb for r in fake.requests].count("list") == 1  # resumed, never re-listed


async def test_forbidden_is_reported_then_recovers(
    kube_api: tuple[FakeKubeApi, str], api: client.ApiClient
) -> None:
    fake, _ = kube_api
    fake.put(pod("a", node="node-a"))
    fake.forbid("list", "pods", times=1)
    index = PodIndex()
    watcher = PodWatcher(api, node_name="node-a", index=index)
    task = asyncio.create_task(watcher.run())
    try:
        await eventually(lambda: watcher.error != "not listed yet", what="first failure")
        failure = watcher.error or ""
        assert "403" in failure
        assert "cannot list resource" in failure
        await asyncio.wait_for(watcher.synced.wait(), 10)
        recovered: str | None = watcher.error
        assert recovered is None
        assert index.knows(ref("a").container_id)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_failed_watch_that_resumes_is_healthy_again(
    kube_api: tuple[FakeKubeApi, str], api: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pods_module, "WATCH_TIMEOUT_S", 1)
    fake, _ = kube_api
    fake.put(pod("a", node="node-a"))
    watcher = PodWatcher(api, node_name="node-a", index=PodIndex())
    errors: list[str | None] = []
    original = watcher._watch

    async def watch(resource_version: str) -> str:
        errors.append(watcher.error)
        return await original(resource_version)

    monkeypatch.setattr(watcher, "_watch", watch)
    fake.fail_next("watch", "pods", status=500, reason="InternalError", message="etcd is down")
    task = asyncio.create_task(watcher.run())
    try:
        await eventually(lambda: len(errors) >= 3, what="a failed watch, then two more")
        assert "etcd is down" in (errors[1] or "")  # the second watch follows the failure
        assert watcher.error is None  # the resumed watch is healthy: not stale any more
        assert watcher._backoff_s == pods_module.BACKOFF_INITIAL_S
        fake.put(pod("b", node="node-a"))
        await eventually(lambda: watcher.index.knows(ref("b").container_id), what="pod b")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert [r.verb for r in fake.requests].count("list") == 1  # resumed, never re-listed


async def test_compacted_resource_version_is_expired(
    kube_api: tuple[FakeKubeApi, str], api: client.ApiClient
) -> None:
    fake, _ = kube_api
    fake.put(pod("a", node="node-a"))
    fake.put(pod("b", node="node-a"))
    fake.compact()
    watcher = PodWatcher(api, node_name="node-a", index=PodIndex())
    with pytest.raises(WatchExpiredError):
        await watcher._watch("1")
