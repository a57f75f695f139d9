"""The namespace cache against an API server speaking real HTTP+JSON (tests.harness.kube_api),
driven through the real kubernetes-asyncio client."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio.config import ConfigException

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
from webhook.permissions import NAMESPACE_PERMISSIONS
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
    # What the server's batch asks first: the same answers, without I/O.
    assert cache.cached("team-a") == NamespaceFacts(compute_policy="fixed")
    assert cache.cached("plain") == NamespaceFacts()
    assert cache.cached("not-there") is None  # only a GET can say
    assert len(api.requests) == before  # all from the cache


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
    assert api.verbs_used() == verb_set(NAMESPACE_PERMISSIONS)
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
    known = cache.cached("missing")  # the back-off needs no I/O either
    assert known is not None
    assert "the last lookup failed moments ago" in known.warnings[0]


class CannedResponse:
    """What ``read_namespace(..., _preload_content=False)`` returns: an aiohttp response."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self._body = body

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        return None


def _token_file_emptied(name: str, **_: object) -> object:
    # What kubernetes-asyncio's in-cluster token refresh raises from inside a request.
    raise ConfigException("Token file exists but empty.")


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        pytest.param(
            _token_file_emptied, "ConfigException: Token file exists but empty.", id="raises"
        ),
        pytest.param(
            CannedResponse(200, b'["team-x"]'), "JSON that is not an object", id="json-array"
        ),
        pytest.param(
            CannedResponse(200, b'{"metadata": {"annotations": "fixed"}}'),
            "AttributeError",
            id="annotations-not-a-map",
        ),
        pytest.param(
            CannedResponse(502, b"<html>bad gateway</html>"),
            "HTTP 502: <html>bad gateway</html>",
            id="not-a-status-body",
        ),
    ],
)
async def test_a_lookup_that_goes_wrong_in_any_way_answers_with_defaults(
    cache: NamespaceCache, monkeypatch: pytest.MonkeyPatch, answer: object, reason: str
) -> None:
    """The docs promise namespace lookups never fail a pod: no exception reaches /mutate
    (which would answer 500, and with failurePolicy Fail block the pod)."""
    calls = 0

    async def read_namespace(name: str, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        return answer(name, **kwargs) if callable(answer) else answer

    monkeypatch.setattr(cache._v1, "read_namespace", read_namespace)
    facts = await cache.facts("team-x")
    assert facts.compute_policy is None
    assert reason in facts.warnings[0]
    assert "webhook defaults were" in facts.warnings[0]
    again = await cache.facts("team-x")  # backs off: no second call
    assert "the last lookup failed moments ago" in again.warnings[0]
    assert calls == 1


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


async def test_without_a_cluster_the_webhook_runs_on_config_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config to fall back on
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


async def test_in_cluster_credentials_come_before_kubeconfig_as_everywhere_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The webhook, bootstrap and the agent find credentials the same way
    (certs.kube.load_credentials), so one pod never runs as two identities."""

    def load_incluster_config(client_configuration: Any, environ: dict[str, str], **_: Any) -> None:
        if "KUBERNETES_SERVICE_HOST" not in environ:
            raise ConfigException("Service host/port is not set.")
        client_configuration.host = "https://10.96.0.1:443"

    monkeypatch.setattr("certs.kube.config.load_incluster_config", load_incluster_config)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://from-kubeconfig:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    in_pod = await new_api_client(KubernetesConfig(), {**env, "KUBECONFIG": str(kubeconfig)})
    told = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig), env)
    outside = await new_api_client(KubernetesConfig(), {"KUBECONFIG": str(kubeconfig)})
    try:
        assert in_pod.configuration.host == "https://10.96.0.1:443"
        assert told.configuration.host == "https://from-kubeconfig:6443"
        assert outside.configuration.host == "https://from-kubeconfig:6443"
    finally:
        for api in (in_pod, told, outside):
            await api.close()


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
