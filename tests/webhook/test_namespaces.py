"""The namespace cache against an API server speaking real HTTP+JSON (tests.harness.kube_api),
driven through the real kubernetes-asyncio client."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from certs.files import BundlePaths
from plugin.api.permissions import verb_set
from tests.conftest import load_admission_fixture
from tests.harness.kube_api import FakeKubeApi
from tests.webhook.conftest import client_context, webhook_config
from tests.webhook.http import ReviewClient
from tests.webhook.waiting import eventually
from webhook.config import KubernetesConfig
from webhook.model import NamespaceFacts
from webhook.namespaces import (
    KubernetesUnavailableError,
    NamespaceCache,
    StaticNamespaces,
    new_api_client,
    open_namespace_source,
)
from webhook.permissions import PERMISSIONS
from webhook.server import running_webhook


def namespace(
    name: str, *, policy: str | None = None, inject: str | None = None
) -> dict[str, object]:
    meta: dict[str, object] = {"name": name}
    if policy is not None:
        meta["annotations"] = {"metagpu.io/compute-policy": policy}
    if inject is not None:
        meta["labels"] = {"metagpu.io/inject": inject}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


async def open_cache(config: KubernetesConfig) -> NamespaceCache:
    """A cache whose watches end after a second, so the fake API records them promptly
    (it logs a request when its response ends) and reconnects are exercised."""
    return NamespaceCache(
        await new_api_client(config, os.environ), config=config, watch_timeout_s=1
    )


@pytest.fixture
async def cache(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> AsyncIterator[NamespaceCache]:
    api, _ = kube_api
    api.put(namespace("team-a", policy="fixed"))
    api.put(namespace("team-b", inject="false"))
    api.put(namespace("plain"))
    async with await open_cache(KubernetesConfig()) as source:
        async with asyncio.timeout(10):
            await source.wait_synced()
        yield source


async def test_lists_then_serves_from_cache(
    cache: NamespaceCache, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    assert cache.ready
    assert "synced" in cache.status
    before = len(api.requests)
    assert await cache.facts("team-a") == NamespaceFacts(compute_policy="fixed")
    assert await cache.facts("team-b") == NamespaceFacts(inject="false")
    assert await cache.facts("plain") == NamespaceFacts()
    assert len(api.requests) == before  # all three from the cache


async def test_follows_changes_through_the_watch(
    cache: NamespaceCache, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    api.put(namespace("team-a", policy="none"))
    api.put(namespace("new", policy="balance"))

    async def updated() -> bool:
        return (await cache.facts("team-a")).compute_policy == "none"

    await eventually(updated)
    await eventually(lambda: _policy_is(cache, "new", "balance"))
    api.remove("v1", "Namespace", "team-a")
    gets = _count(api, "get")

    async def deleted() -> bool:
        return "team-a" not in cache._cache

    await eventually(deleted)
    facts = await cache.facts("team-a")  # a miss now: one GET, 404, defaults + warning
    assert _count(api, "get") == gets + 1
    assert facts.compute_policy is None
    assert "could not read namespace 'team-a' (HTTP 404" in facts.warnings[0]


async def _policy_is(cache: NamespaceCache, name: str, policy: str) -> bool:
    return (await cache.facts(name)).compute_policy == policy


def _count(api: FakeKubeApi, verb: str) -> int:
    return sum(1 for r in api.requests if r.verb == verb)


async def test_verbs_sent_are_exactly_the_declared_permissions(
    cache: NamespaceCache, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    await cache.facts("not-there")  # a miss: the GET
    await eventually(lambda: _count(api, "watch") >= 1)
    assert api.verbs_used() == verb_set(PERMISSIONS)
    assert api.writes() == []


async def test_concurrent_misses_share_one_get(
    cache: NamespaceCache, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    gets = _count(api, "get")
    results = await asyncio.gather(*(cache.facts("missing") for _ in range(10)))
    assert _count(api, "get") == gets + 1
    assert all(r.warnings for r in results)
    again = await cache.facts("missing")  # failed moments ago: no new GET
    assert _count(api, "get") == gets + 1
    assert "the last lookup failed moments ago" in again.warnings[0]


async def test_relists_after_410_gone(
    cache: NamespaceCache, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    lists = _count(api, "list")
    api.fail_next(
        "watch", "namespaces", status=410, reason="Expired", message="too old resource version"
    )
    await eventually(lambda: _count(api, "list") > lists)
    api.put(namespace("after-relist", policy="fixed"))
    await eventually(lambda: _policy_is(cache, "after-relist", "fixed"))


async def test_forbidden_list_reports_ready_after_the_sync_timeout(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> None:
    api, _ = kube_api
    api.put(namespace("team-a", policy="fixed"))
    api.forbid("list", "namespaces")
    api.forbid("get", "namespaces")
    config = KubernetesConfig(initial_sync_timeout_s=0.2)
    async with await open_cache(config) as cache:
        assert not cache.ready
        assert cache.status == "syncing"
        await eventually(lambda: cache.ready)
        assert "degraded" in cache.status
        facts = await cache.facts("team-a")
    assert facts.compute_policy is None
    assert "HTTP 403" in facts.warnings[0]
    assert "webhook defaults were" in facts.warnings[0]


async def test_get_is_bounded_by_the_lookup_timeout(tmp_path: Path) -> None:
    async def black_hole(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accept and never answer

    server = await asyncio.start_server(black_hole, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    config = KubernetesConfig(enabled=True, kubeconfig=kubeconfig, namespace_lookup_timeout_s=0.2)
    async with server:
        source = await open_namespace_source(config, env={})
        assert isinstance(source, NamespaceCache)
        async with source, asyncio.timeout(5):
            facts = await source.facts("team-a")
    assert "timed out after 0.2s" in facts.warnings[0]


async def test_without_a_cluster_the_webhook_runs_on_config_alone(tmp_path: Path) -> None:
    assert isinstance(await open_namespace_source(KubernetesConfig(), env={}), StaticNamespaces)
    assert isinstance(
        await open_namespace_source(KubernetesConfig(enabled=False), env={"KUBECONFIG": "x"}),
        StaticNamespaces,
    )
    broken = tmp_path / "broken"
    broken.write_text("this is not a kubeconfig")
    auto = await open_namespace_source(KubernetesConfig(), env={"KUBECONFIG": str(broken)})
    assert isinstance(auto, StaticNamespaces)  # auto degrades
    with pytest.raises(KubernetesUnavailableError, match="kubeconfig"):
        await open_namespace_source(KubernetesConfig(enabled=True, kubeconfig=broken), env={})
    with pytest.raises(KubernetesUnavailableError, match="in-cluster service account"):
        await open_namespace_source(KubernetesConfig(enabled=True), env={})


async def test_server_uses_namespace_policy_and_dry_run_writes_nothing(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path, ca_bundle: BundlePaths
) -> None:
    api, _ = kube_api
    api.put(namespace("team-a", policy="fixed"))
    config = webhook_config(ca_bundle, kubernetes={"enabled": "auto"})
    async with running_webhook(config, env=os.environ) as hook, aiohttp.ClientSession() as session:
        c = ReviewClient(session, hook.url, client_context(ca_bundle.ca_file))
        await eventually(lambda: _ready(c))
        answer = await c.post(load_admission_fixture("pod-dry-run-0.3-gpu.json"))
    ops = {op["path"]: op.get("value") for op in answer.patch}
    assert ops["/metadata/annotations/metagpu.io~1compute-policy"] == "fixed"
    assert api.writes() == []


async def _ready(c: ReviewClient) -> bool:
    return (await c.get("/readyz")).status == 200
