"""Certificate rotation under load (issue 3): nothing fails, new handshakes follow within 2 s.

The serving pair lives in a directory laid out the way the kubelet mounts a
Secret: a timestamped ``..2026_...`` directory holding the files, a ``..data``
symlink to it, and ``tls.crt -> ..data/tls.crt``. A rotation writes a new
timestamped directory, points a temporary symlink at it and renames that over
``..data`` (one atomic rename), then removes the old directory.

While the leaf is rotated five times, clients that trust only the CA keep
posting AdmissionReviews, some on keep-alive connections and some on a fresh
connection per request. Every request must succeed, and after each swap a fresh
connection must present the new serial within 2 s. Then three broken pairs (a
key that does not match, an expired certificate, a missing key) are swapped
in: each is refused with a logged error and the previous certificate keeps
serving.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import ssl
import time
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509

from certs.issue import CertPair, issue_ca, issue_serving_cert, new_private_key
from tests.conftest import load_admission_fixture
from tests.webhook.waiting import eventually
from webhook.config import WebhookConfig
from webhook.server import running_webhook

ROTATIONS = 5
NEW_SERIAL_WITHIN_S = 2.0
REVIEW = load_admission_fixture("pod-half-gpu.json")


class SecretVolume:
    """A directory updated the way the kubelet updates a mounted Secret."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._stamps = count(1)
        root.mkdir(parents=True, exist_ok=True)

    @property
    def cert_file(self) -> Path:
        return self.root / "tls.crt"

    @property
    def key_file(self) -> Path:
        return self.root / "tls.key"

    def publish(self, files: dict[str, bytes]) -> None:
        stamp = f"..2026_11_21_14_00_{next(self._stamps):02d}.{time.monotonic_ns()}"
        new_dir = self.root / stamp
        new_dir.mkdir()
        for name, data in files.items():
            (new_dir / name).write_bytes(data)
        data_link = self.root / "..data"
        old = os.readlink(data_link) if data_link.is_symlink() else None
        tmp = self.root / "..data_tmp"
        os.symlink(stamp, tmp)
        os.rename(tmp, data_link)  # the atomic swap
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                os.symlink(f"..data/{name}", link)
        if old is not None:
            for f in (self.root / old).iterdir():
                f.unlink()
            (self.root / old).rmdir()

    def publish_pair(self, pair: CertPair) -> None:
        self.publish({"tls.crt": pair.cert_pem, "tls.key": pair.key_pem})


def serial_of(pair: CertPair) -> int:
    return x509.load_pem_x509_certificate(pair.cert_pem).serial_number


@dataclass
class Load:
    """Clients posting reviews until stopped; counts successes and failures."""

    url: str
    ctx: ssl.SSLContext
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _keep_alive_client(self) -> None:
        async with aiohttp.ClientSession() as session:
            while not self._stop.is_set():
                await self._post(session)

    async def _fresh_connection_client(self) -> None:
        while not self._stop.is_set():
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
                await self._post(s)

    async def _post(self, session: aiohttp.ClientSession) -> None:
        try:
            async with session.post(self.url, json=REVIEW, ssl=self.ctx) as r:
                body = await r.json()
                if r.status != 200 or body["response"]["allowed"] is not True:
                    self.failures.append(f"HTTP {r.status}: {body}")
                else:
                    self.ok += 1
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            self.failures.append(f"{type(exc).__name__}: {exc}")

    def start(self) -> list[asyncio.Task[None]]:
        return [
            asyncio.create_task(self._keep_alive_client()),
            asyncio.create_task(self._keep_alive_client()),
            asyncio.create_task(self._fresh_connection_client()),
            asyncio.create_task(self._fresh_connection_client()),
        ]

    def stop(self) -> None:
        self._stop.set()


async def served_serial(port: int, ctx: ssl.SSLContext) -> int:
    """The serial a brand-new connection is served (verified against the CA)."""
    _, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"
    )
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.fixture
def pki() -> tuple[CertPair, dt.datetime]:
    now = dt.datetime.now(dt.UTC)
    return issue_ca(key=new_private_key(), now=now - dt.timedelta(days=30)), now


def leaf(
    ca: CertPair, now: dt.datetime, *, validity: dt.timedelta = dt.timedelta(days=30)
) -> CertPair:
    return issue_serving_cert(
        ca=ca, key=new_private_key(), now=now, ip_addresses=["127.0.0.1"], validity=validity
    )


@pytest.mark.slow
async def test_rotation_under_load(
    tmp_path: Path, pki: tuple[CertPair, dt.datetime], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    ca, now = pki
    volume = SecretVolume(tmp_path / "secret")
    first = leaf(ca, now)
    volume.publish_pair(first)
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    config = WebhookConfig.model_validate(
        {
            "listen": "127.0.0.1:0",
            "tls": {"cert_file": str(volume.cert_file), "key_file": str(volume.key_file)},
            "kubernetes": {"enabled": False},
        }
    )
    async with running_webhook(config) as hook:
        assert await served_serial(hook.port, ctx) == serial_of(first)
        load = Load(hook.mutate_url, ctx)
        tasks = load.start()
        await eventually(lambda: load.ok >= 20)

        current = first
        for _ in range(ROTATIONS):
            before = load.ok
            current = leaf(ca, now)
            volume.publish_pair(current)
            swapped = time.monotonic()
            wanted = serial_of(current)

            async def new_serial_served(wanted: int = wanted) -> bool:
                return await served_serial(hook.port, ctx) == wanted

            await eventually(new_serial_served, timeout_s=NEW_SERIAL_WITHIN_S)
            assert time.monotonic() - swapped < NEW_SERIAL_WITHIN_S
            await eventually(lambda before=before: load.ok >= before + 10)  # type: ignore[misc]

        reloads = hook.metrics.registry.get_sample_value("metagpu_webhook_tls_cert_reloads_total")
        assert reloads == ROTATIONS

        other = leaf(ca, now)
        broken = {
            "key does not belong": {"tls.crt": leaf(ca, now).cert_pem, "tls.key": other.key_pem},
            "expired": _pair_files(
                leaf(ca, now - dt.timedelta(days=10), validity=dt.timedelta(days=1))
            ),
            # the new ..data directory has no tls.key: the tls.key symlink dangles
            "unreadable": {"tls.crt": leaf(ca, now).cert_pem},
        }
        for expected_log, files in broken.items():
            errors_before = _refusals(caplog)
            ok_before = load.ok
            volume.publish(files)
            await eventually(lambda n=errors_before: _refusals(caplog) > n)  # type: ignore[misc]
            assert expected_log in _last_refusal(caplog)
            assert await served_serial(hook.port, ctx) == serial_of(current)
            await eventually(lambda n=ok_before: load.ok >= n + 10)  # type: ignore[misc]

        load.stop()
        await asyncio.gather(*tasks)
    assert load.failures == []
    assert load.ok > 100


def _pair_files(pair: CertPair) -> dict[str, bytes]:
    return {"tls.crt": pair.cert_pem, "tls.key": pair.key_pem}


def _refusals(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in caplog.records if "refusing new TLS certificate files" in r.getMessage())


def _last_refusal(caplog: pytest.LogCaptureFixture) -> str:
    return [r.getMessage() for r in caplog.records if "refusing new TLS" in r.getMessage()][-1]
