"""Client-chosen strings that used to grow without bound: namespace names (looked up,
logged, remembered for good) and names echoed in a denial's ``status.message``."""

from __future__ import annotations

import asyncio
import copy
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from certs.files import BundlePaths
from tests.conftest import load_admission_fixture
from tests.harness.kube_api import FakeKubeApi
from tests.webhook.conftest import client_context, webhook_config
from tests.webhook.http import ReviewClient
from webhook import namespaces
from webhook.config import KubernetesConfig
from webhook.namespaces import NamespaceCache, new_api_client


@pytest.fixture
async def cache(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> AsyncIterator[NamespaceCache]:
    config = KubernetesConfig()
    async with NamespaceCache(await new_api_client(config, os.environ), config=config) as source:
        async with asyncio.timeout(10):
            await source.wait_synced()
        yield source


def _gets(api: FakeKubeApi) -> int:
    return sum(1 for r in api.requests if r.verb == "get")


async def test_a_namespace_name_that_is_no_dns_label_is_never_looked_up_or_kept(
    cache: NamespaceCache, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    for bad in ("x" * 100_000, "Team-A", "a.b", "", "-a", "a" * 64, "ns\nINFO forged line"):
        facts = await cache.facts(bad)
        assert "is not a valid namespace name" in facts.warnings[0]
        assert len(facts.warnings[0]) < 400  # the name is shown cut, not in full
    assert _gets(api) == 0
    assert cache._failed_until == {}  # nothing about them is remembered


async def test_failed_lookups_are_remembered_in_bounded_number(
    cache: NamespaceCache, kube_api: tuple[FakeKubeApi, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(namespaces, "MAX_FAILED_NAMES", 20)
    api, _ = kube_api
    for i in range(45):  # none exists: each GET fails (404) and the name backs off
        await cache.facts(f"missing-{i}")
    assert _gets(api) == 45
    assert len(cache._failed_until) <= 20
    assert "missing-44" in cache._failed_until  # the newest are the ones kept


async def test_a_denial_echoing_a_1_mib_container_name_stays_under_4_kib(
    ca_bundle: BundlePaths,
) -> None:
    from webhook.server import running_webhook

    review = copy.deepcopy(load_admission_fixture("pod-sets-nvidia-visible-devices.json"))
    huge = "c" * (1 << 20)
    for container in review["request"]["object"]["spec"]["containers"]:
        container["name"] = huge
    async with (
        running_webhook(webhook_config(ca_bundle)) as hook,
        aiohttp.ClientSession() as session,
    ):
        client = ReviewClient(session, hook.url, client_context(ca_bundle.ca_file))
        answer = await client.post(review)
    assert answer.status == 200
    response = json.loads(answer.text)["response"]
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert len(message.encode()) <= 4096
    assert message.startswith('container "ccc')
    assert "characters in all" in message  # says how long it was
