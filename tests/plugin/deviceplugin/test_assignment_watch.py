"""The plugin's pod watch against the fake API server: the book holds the assignments
of the pods bound to this node, follows updates and deletions, and the running plugin
answers the simulated kubelet with them. Without the API it places as before."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from certs.kube import open_api_client
from plugin.api.permissions import verb_set
from plugin.deviceplugin.assignments import AssignmentBook
from plugin.deviceplugin.permissions import PERMISSIONS
from plugin.kube import node_pods
from plugin.kube.node_pods import NodePodWatcher
from tests.harness.kube_api import FakeKubeApi
from tests.plugin.builders import uuid_for
from tests.plugin.conftest import kubelet_and_plugin, wait_until
from tests.plugin.deviceplugin.assignment_builders import assigned_pod

R = "cnvrg.io/metagpu"
G0, G1 = uuid_for(0), uuid_for(1)


@pytest.fixture
async def api(kube_config_env: Path) -> AsyncIterator[client.ApiClient]:
    async with open_api_client() as (api, _source):
        yield api


def pending(book: AssignmentBook) -> list[str]:
    return [f"{c.pod}/{c.container}" for c in book.pending()]


async def test_the_watch_fills_the_book_with_this_nodes_pods_only(
    kube_api: tuple[FakeKubeApi, str], api: client.ApiClient
) -> None:
    fake, _ = kube_api
    fake.put(assigned_pod("mine", [("main", "app", 30, {G1: 30})]))
    fake.put(assigned_pod("theirs", [("main", "app", 30, {G1: 30})], node="node-b"))
    book = AssignmentBook()
    watcher = NodePodWatcher(api, node_name="node-a", sink=book, watch_timeout_s=1)
    task = asyncio.create_task(watcher.run(), name="watch under test")
    try:
        await wait_until(lambda: pending(book) == ["mine/main"], what="the first list")
        later = assigned_pod(
            "later", [("main", "app", 20, {G0: 20})], created="2026-11-25T10:05:00Z"
        )
        fake.put(later)
        await wait_until(lambda: pending(book) == ["mine/main", "later/main"], what="an added pod")
        admitted = assigned_pod("mine", [("main", "app", 30, {G1: 30})], admitted=True)
        fake.put(admitted)  # the kubelet admitted it: all its devices are allocated
        await wait_until(lambda: pending(book) == ["later/main"], what="an admitted pod")
        fake.remove("v1", "Pod", "later", "ml")
        await wait_until(lambda: pending(book) == [], what="a deleted pod")
        await wait_until(
            lambda: any(r.verb == "watch" for r in fake.requests), what="a watch request"
        )
        assert fake.verbs_used() == verb_set(PERMISSIONS)  # exactly what RBAC grants
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_the_running_plugin_answers_the_kubelet_with_the_watched_assignment(
    short_tmp_path: Path,
    kube_api: tuple[FakeKubeApi, str],
    kube_config_env: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # short server-side watches, so the fake server's handler ends with the test
    monkeypatch.setattr(node_pods, "WATCH_TIMEOUT_S", 1)
    fake, _ = kube_api
    async with kubelet_and_plugin(
        short_tmp_path,
        gpu_count=2,
        config={"placement": {"node_name": "node-a", "extender": True}},
        open_api=open_api_client,
    ) as (kubelet, plugin):
        await kubelet.wait_registered(R)
        await wait_until(
            lambda: any(r.verb == "list" for r in fake.requests), what="the first list"
        )
        ((_, first, _),) = await kubelet.admit_pod(R, [("main", "app", 30)])  # no assignment
        assert {i.rsplit("::", 1)[0] for i in first} == {G0}
        # binpack alone would put a second 30 next to the first on GPU 0; the
        # extender assigned GPU 1
        fake.put(assigned_pod("b", [("main", "app", 30, {G1: 30})]))
        await wait_until(lambda: len(plugin.supervisor.book.pending()) == 1, what="the watch")
        ((_, second, _),) = await kubelet.admit_pod(R, [("main", "app", 30)])
        assert {i.rsplit("::", 1)[0] for i in second} == {G1}
        assert plugin.supervisor.book.pending() == []


async def test_without_the_api_the_plugin_places_as_before_and_says_so_once(
    short_tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def no_credentials():  # type: ignore[no-untyped-def]
        raise RuntimeError("no kubeconfig and not in a cluster")

    with caplog.at_level(logging.INFO):
        async with kubelet_and_plugin(
            short_tmp_path,
            gpu_count=2,
            config={"placement": {"node_name": "node-a"}},
            open_api=no_credentials,
        ) as (kubelet, _):
            await kubelet.wait_registered(R)
            for _ in range(2):
                ((_, ids, _),) = await kubelet.admit_pod(R, [("main", "app", 30)])
                assert {i.rsplit("::", 1)[0] for i in ids} == {G0}  # binpack, as today
    lines = [r for r in caplog.records if "not watching pods for GPU assignments" in r.getMessage()]
    assert len(lines) == 1
    assert "no kubeconfig and not in a cluster" in lines[0].getMessage()
