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
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from certs.files import BundlePaths, write_atomic, write_bundle
from certs.issue import (
    CertPair,
    inspect_cert,
    issue_ca,
    issue_serving_cert,
    key_to_pem,
    new_private_key,
)
from certs.tls import ReloadingTLS, TlsError, load_serving_pair
from tests.certs.chains import KEY_ALGORITHM, SCHEMES, Chain, Scheme, build_chain
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


def handshake(server: ssl.SSLContext, *, ca_pem: bytes, server_name: str = "localhost") -> bytes:
    """A TLS handshake in memory between ``server`` and a client that trusts only
    ``ca_pem`` and checks ``server_name``; returns the certificate served (DER)."""
    client = ssl.create_default_context(cadata=ca_pem.decode())
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    ends = [
        client.wrap_bio(c_in, c_out, server_hostname=server_name),
        server.wrap_bio(s_in, s_out, server_side=True),
    ]
    pending = list(ends)
    for _ in range(10):
        for end in list(pending):
            try:
                end.do_handshake()
                pending.remove(end)
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if not pending:
            break
    assert not pending, "the handshake did not finish"
    der = ends[0].getpeercert(binary_form=True)
    assert der is not None
    return der


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_signature_scheme_the_api_server_verifies_is_reloaded_and_served(
    tmp_path: Path, chains: dict[Scheme, Chain], scheme: Scheme, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 31: a rotation to an Ed25519, ECDSA, RSA PKCS#1 v1.5 or RSA-PSS pair
    (cert-manager issues the first and the last) is loaded, and OpenSSL, as a client
    trusting only that chain's CA, accepts what the reloaded listener serves.

    Ed448 is the exception: OpenSSL serves it, but the API server is Go, which cannot
    verify Ed448, so a rotation to it is refused like any pair clients would refuse,
    and the working pair keeps serving; at start, with nothing better, it is served
    with a warning.
    """
    chain = chains[scheme]
    first_ca = issue_ca(key=new_private_key(), now=chain.now)
    first = issue_serving_cert(
        ca=first_ca, key=new_private_key(), now=chain.now, dns_names=["localhost"]
    )
    paths = write_bundle(tmp_path, ca_cert_pem=first_ca.cert_pem, leaf=first)
    tls = ReloadingTLS(paths.cert_file, paths.key_file, clock=lambda: chain.now)
    write_bundle(tmp_path, ca_cert_pem=chain.ca.cert_pem, leaf=chain.leaf)
    leaf_der = x509.load_pem_x509_certificate(chain.leaf.cert_pem).public_bytes(
        serialization.Encoding.DER
    )
    if scheme == "ed448":
        assert not poll_until_settled(tls)
        assert tls.current.info.serial == serial(first)
        (refusal,) = refusals(caplog)
        assert "has an Ed448 key, which the Kubernetes API server" in refusal
        assert "an Ed25519, ECDSA or RSA pair would be accepted" in refusal
        pair = load_serving_pair(paths.cert_file, paths.key_file, now=chain.now)
        assert "has an Ed448 key" in caplog.records[-1].getMessage()
        assert handshake(pair.context, ca_pem=chain.ca.cert_pem) == leaf_der
        return
    assert poll_until_settled(tls)
    assert refusals(caplog) == []
    assert tls.current.info.serial == serial(chain.leaf)
    assert tls.current.info.key_algorithm == KEY_ALGORITHM[scheme]
    assert handshake(tls.server_context, ca_pem=chain.ca.cert_pem) == leaf_der


def test_a_pair_an_ed448_ca_signed_is_refused_on_reload(
    tls: ReloadingTLS, paths: BundlePaths, caplog: pytest.LogCaptureFixture
) -> None:
    """An ECDSA key does not help when the signature on it is Ed448: the API server
    must verify that signature with the CA's key, and Go cannot."""
    chain = build_chain("ed448", now=T0, leaf_key=new_private_key())
    write_bundle(paths.ca_file.parent, ca_cert_pem=chain.ca.cert_pem, leaf=chain.leaf)
    assert not poll_until_settled(tls)
    (refusal,) = refusals(caplog)
    assert "is signed with Ed448, which the Kubernetes API server" in refusal


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
