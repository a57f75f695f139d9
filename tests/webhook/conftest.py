"""Fixtures for the webhook tests: a CA bundle (module-scoped), a running webhook over real TLS,
and a client that trusts only that CA."""

from __future__ import annotations

import datetime as dt
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from certs.files import BundlePaths, generate_bundle
from tests.webhook.http import ReviewClient
from webhook.config import WebhookConfig
from webhook.server import RunningWebhook, running_webhook


@pytest.fixture(scope="module")
def ca_bundle(tmp_path_factory: pytest.TempPathFactory) -> BundlePaths:
    """A CA and a serving certificate for 127.0.0.1/localhost (slow-ish: once per module)."""
    return generate_bundle(
        tmp_path_factory.mktemp("tls"),
        now=dt.datetime.now(dt.UTC),
        dns_names=["localhost"],
        ip_addresses=["127.0.0.1"],
    )


def webhook_config(bundle: BundlePaths, **overrides: object) -> WebhookConfig:
    """A config serving ``bundle`` on a free loopback port, without a cluster."""
    data: dict[str, object] = {
        "listen": "127.0.0.1:0",
        "tls": {"cert_file": str(bundle.cert_file), "key_file": str(bundle.key_file)},
        "kubernetes": {"enabled": False},
        "shutdown_timeout_s": 2,
    }
    data.update(overrides)
    return WebhookConfig.model_validate(data)


@pytest.fixture
async def webhook(ca_bundle: BundlePaths) -> AsyncIterator[RunningWebhook]:
    async with running_webhook(webhook_config(ca_bundle)) as hook:
        yield hook


def client_context(ca_file: Path) -> ssl.SSLContext:
    """Verifies the server against ``ca_file`` only, hostname included.

    ``create_default_context`` loads the system store only when no ``cafile`` is given.
    """
    return ssl.create_default_context(cafile=str(ca_file))


@pytest.fixture
async def client(webhook: RunningWebhook, ca_bundle: BundlePaths) -> AsyncIterator[ReviewClient]:
    async with aiohttp.ClientSession() as session:
        yield ReviewClient(session, webhook.url, client_context(ca_bundle.ca_file))
