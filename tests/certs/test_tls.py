"""certs.tls: loading a serving pair, and the reloader's rules.

New file contents are acted on once two polls read the same bytes; a settled
broken pair is refused (logged once) and the previous pair keeps serving; a
pair that changes under the loader is waited out; a poll that fails in a way
nobody foresaw does not stop the watch. ``reload_if_changed`` is called by
hand, one poll at a time, so nothing here depends on timing; the real-timing
rotation under load is ``tests/webhook/test_rotation.py``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path
from typing import Any

import pytest

from certs.files import BundlePaths, write_atomic, write_bundle
from certs.issue import (
    CertPair,
    inspect_cert,
    issue_serving_cert,
    key_to_pem,
    new_private_key,
)
from certs.tls import ReloadingTLS, TlsError, load_serving_pair
from tests.certs.conftest import T0
from tests.certs.malformed import FAULTS, Fault, malformed_leaf

REFUSAL = "refusing new TLS certificate files"


def new_leaf(ca: CertPair) -> CertPair:
    return issue_serving_cert(ca=ca, key=new_private_key(), now=T0, dns_names=["localhost"])


def serial(pair: CertPair) -> int:
    return inspect_cert(pair.cert_pem).serial


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if REFUSAL in r.getMessage()]


@pytest.fixture
def paths(tmp_path: Path, ca_pair: CertPair) -> BundlePaths:
    return write_bundle(tmp_path, ca_cert_pem=ca_pair.cert_pem, leaf=new_leaf(ca_pair))


@pytest.fixture
def tls(paths: BundlePaths) -> ReloadingTLS:
    return ReloadingTLS(paths.cert_file, paths.key_file, clock=lambda: T0)


def poll_until_settled(tls: ReloadingTLS) -> bool:
    """Two polls: the first sees new content, the second acts on it."""
    first = tls.reload_if_changed()
    assert first is False, "new content must be seen twice before it is acted on"
    return tls.reload_if_changed()


@pytest.mark.parametrize("fault", FAULTS)
def test_a_certificate_that_breaks_when_read_is_a_tls_error(
    paths: BundlePaths, ca_pair: CertPair, fault: Fault
) -> None:
    key = new_private_key()
    write_bundle(
        paths.ca_file.parent,
        ca_cert_pem=ca_pair.cert_pem,
        leaf=CertPair(malformed_leaf(ca_pair, key, now=T0, fault=fault), new_leaf(ca_pair).key_pem),
    )
    with pytest.raises(TlsError, match="malformed or unsupported") as err:
        load_serving_pair(paths.cert_file, paths.key_file, now=T0)
    assert str(paths.cert_file) in str(err.value)


@pytest.mark.parametrize("fault", FAULTS)
def test_a_malformed_rotation_is_refused_and_a_later_good_one_still_loads(
    tls: ReloadingTLS,
    paths: BundlePaths,
    ca_pair: CertPair,
    fault: Fault,
    caplog: pytest.LogCaptureFixture,
) -> None:
    serving = tls.current.info.serial
    key = new_private_key()
    broken = CertPair(malformed_leaf(ca_pair, key, now=T0, fault=fault), key_to_pem(key))
    write_bundle(paths.ca_file.parent, ca_cert_pem=ca_pair.cert_pem, leaf=broken)
    assert not poll_until_settled(tls)
    assert tls.current.info.serial == serving
    assert len(refusals(caplog)) == 1
    assert "malformed or unsupported" in refusals(caplog)[0]

    good = new_leaf(ca_pair)
    write_bundle(paths.ca_file.parent, ca_cert_pem=ca_pair.cert_pem, leaf=good)
    assert poll_until_settled(tls)
    assert tls.current.info.serial == serial(good)


def test_a_rotation_caught_between_key_and_certificate_is_waited_out(
    tls: ReloadingTLS, paths: BundlePaths, ca_pair: CertPair, caplog: pytest.LogCaptureFixture
) -> None:
    """``write_bundle`` (``metagpu certs generate``) renames tls.key, then tls.crt.

    A poll in between reads the new key next to the old certificate: that is
    a rotation in progress, not a broken pair, and is neither loaded nor refused.
    """
    caplog.set_level(logging.INFO)
    new = new_leaf(ca_pair)
    write_atomic(paths.key_file, new.key_pem, mode=0o600)
    assert tls.reload_if_changed() is False  # new key, old certificate
    write_atomic(paths.cert_file, new.cert_pem)
    assert poll_until_settled(tls)
    assert tls.current.info.serial == serial(new)
    assert refusals(caplog) == []


def test_a_settled_broken_pair_is_refused_once_and_the_old_one_keeps_serving(
    tls: ReloadingTLS, paths: BundlePaths, ca_pair: CertPair, caplog: pytest.LogCaptureFixture
) -> None:
    serving = tls.current.info.serial
    mismatched = CertPair(new_leaf(ca_pair).cert_pem, new_leaf(ca_pair).key_pem)
    write_bundle(paths.ca_file.parent, ca_cert_pem=ca_pair.cert_pem, leaf=mismatched)
    assert tls.reload_if_changed() is False
    assert refusals(caplog) == []  # seen once: not judged yet
    for _ in range(3):
        assert tls.reload_if_changed() is False
    assert len(refusals(caplog)) == 1
    assert "does not belong to certificate" in refusals(caplog)[0]
    assert tls.current.info.serial == serving


def test_unreadable_files_are_refused_once_settled(
    tls: ReloadingTLS, paths: BundlePaths, caplog: pytest.LogCaptureFixture
) -> None:
    key_pem = paths.key_file.read_bytes()
    paths.key_file.unlink()
    assert tls.reload_if_changed() is False
    assert refusals(caplog) == []
    assert tls.reload_if_changed() is False
    assert "unreadable" in refusals(caplog)[0]
    write_atomic(paths.key_file, key_pem, mode=0o600)  # back to what is served
    assert tls.reload_if_changed() is False
    assert len(refusals(caplog)) == 1


class SwappingContext(ssl.SSLContext):
    """A server context whose load swaps the files first: a rotation under the loader."""

    swap: Any = None

    def load_cert_chain(self, *args: Any, **kwargs: Any) -> None:
        if self.swap is not None:
            self.swap()
        super().load_cert_chain(*args, **kwargs)


def test_files_that_change_while_loading_are_waited_out(
    tls: ReloadingTLS,
    paths: BundlePaths,
    ca_pair: CertPair,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second = new_leaf(ca_pair), new_leaf(ca_pair)
    write_bundle(paths.ca_file.parent, ca_cert_pem=ca_pair.cert_pem, leaf=first)

    def swapping_context() -> ssl.SSLContext:
        ctx = SwappingContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.swap = lambda: write_bundle(
            paths.ca_file.parent, ca_cert_pem=ca_pair.cert_pem, leaf=second
        )
        return ctx

    monkeypatch.setattr("certs.tls.new_server_context", swapping_context)
    assert not poll_until_settled(tls)  # loading `first` found `second` in its place
    monkeypatch.undo()
    assert refusals(caplog) == []
    assert poll_until_settled(tls)
    assert tls.current.info.serial == serial(second)


async def test_the_watch_outlives_a_poll_that_fails_unexpectedly(
    tls: ReloadingTLS, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    polls = 0
    polled_again = asyncio.Event()

    def flaky_poll() -> bool:
        nonlocal polls
        polls += 1
        if polls == 1:
            raise RuntimeError("a bug nobody foresaw")
        polled_again.set()
        return False

    monkeypatch.setattr(tls, "reload_if_changed", flaky_poll)
    task = asyncio.create_task(tls.watch(interval_s=0.01))
    try:
        async with asyncio.timeout(10):
            await polled_again.wait()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    failures = [r for r in caplog.records if "checking the TLS certificate files" in r.getMessage()]
    assert len(failures) == 1
    assert failures[0].exc_info is not None
