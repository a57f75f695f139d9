"""Rotated certificate files that would fail every handshake are refused; the old pair serves.

Before, a pair not valid until tomorrow was swapped in after a WARNING and a
pair for ``wrong.example.com`` silently, and from then on every verifying
client failed. Now both are refused with one ERROR naming why, counted in
``metagpu_webhook_tls_cert_rejections_total`` and shown in ``/readyz``; a pair
from a new CA (cert-manager rotating its CA) is still taken.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
import re
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509

from certs.issue import CertPair, issue_ca, issue_serving_cert, new_private_key
from tests.webhook.waiting import eventually
from webhook.config import WebhookConfig
from webhook.server import RunningWebhook, running_webhook

NAMES = {"dns_names": ["localhost"], "ip_addresses": ["127.0.0.1"]}


def _ca(now: dt.datetime) -> CertPair:
    return issue_ca(key=new_private_key(), now=now - dt.timedelta(days=1))


def _leaf(ca: CertPair, now: dt.datetime, **names: list[str]) -> CertPair:
    return issue_serving_cert(ca=ca, key=new_private_key(), now=now, **(names or NAMES))  # type: ignore[arg-type]


def _publish(directory: Path, pair: CertPair) -> None:
    """Replace both files, each by an atomic rename (key first, as ``certs generate`` does)."""
    for name, data in (("tls.key", pair.key_pem), ("tls.crt", pair.cert_pem)):
        tmp = directory / f".{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, directory / name)


def _serial(pair: CertPair) -> int:
    return x509.load_pem_x509_certificate(pair.cert_pem).serial_number


async def _served_serial(hook: RunningWebhook) -> int:
    """The serial a new handshake gets (verification off: wrong names must be observable)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    _, writer = await asyncio.open_connection(hook.host, hook.port, ssl=ctx)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return x509.load_der_x509_certificate(der).serial_number


async def _readyz(hook: RunningWebhook) -> tuple[int, dict[str, object]]:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    async with aiohttp.ClientSession() as s, s.get(hook.url + "/readyz", ssl=ctx) as r:
        return r.status, json.loads(await r.text())


def _rejections(hook: RunningWebhook) -> float:
    text = hook.metrics.exposition().decode()
    match = re.search(r"^metagpu_webhook_tls_cert_rejections_total ([0-9.]+)", text, re.M)
    assert match
    return float(match.group(1))


@dataclass
class Served:
    hook: RunningWebhook
    directory: Path
    first_serial: int


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    now = dt.datetime.now(dt.UTC)
    ca = _ca(now)
    first = _leaf(ca, now)
    _publish(tmp_path, first)
    config = WebhookConfig.model_validate(
        {
            "listen": "127.0.0.1:0",
            "tls": {
                "cert_file": str(tmp_path / "tls.crt"),
                "key_file": str(tmp_path / "tls.key"),
                "reload_interval_s": 0.05,
            },
            "kubernetes": {"enabled": False},
        }
    )
    async with running_webhook(config) as hook:
        yield Served(hook, tmp_path, _serial(first))


async def test_refuses_a_pair_that_is_not_valid_yet_or_lost_a_name_and_takes_a_new_ca(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    hook, directory, first = served.hook, served.directory, served.first_serial
    now = dt.datetime.now(dt.UTC)
    ca = _ca(now)
    caplog.set_level(logging.ERROR, logger="certs.tls")

    cases = [
        (_leaf(ca, now + dt.timedelta(days=1)), "is not valid until"),
        (_leaf(ca, now, dns_names=["wrong.example.com"]), "does not cover localhost, 127.0.0.1"),
        (_leaf(ca, now, dns_names=["localhost"]), "does not cover 127.0.0.1"),
    ]
    for count, (pair, reason) in enumerate(cases, start=1):
        _publish(directory, pair)
        await eventually(lambda n=count: _rejections(hook) == n, timeout_s=10)  # type: ignore[misc]
        assert await _served_serial(hook) == first
        status, report = await _readyz(hook)
        assert status == 200  # still serving a good pair: ready, with the refusal shown
        rejected = report["tls"]["rejected"]  # type: ignore[index]
        assert reason in rejected["reason"], rejected
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == count, [r.getMessage() for r in errors]  # one ERROR per refusal
        assert reason in errors[-1].getMessage()

    # Ahead by less than the skew allowance: a clock a little off is not a broken pair.
    slightly_ahead = _leaf(ca, now + dt.timedelta(minutes=8))  # notBefore = now + 3 min
    _publish(directory, slightly_ahead)
    await eventually(lambda: hook.tls.current.info.serial == _serial(slightly_ahead), timeout_s=10)

    # cert-manager rotates its CA: same names, new issuer. Taken, and the refusal clears.
    new_ca_pair = _leaf(_ca(now), now)
    _publish(directory, new_ca_pair)
    await eventually(lambda: hook.tls.current.info.serial == _serial(new_ca_pair), timeout_s=10)
    assert await _served_serial(hook) == _serial(new_ca_pair)
    _, report = await _readyz(hook)
    assert "rejected" not in report["tls"]  # type: ignore[operator]
