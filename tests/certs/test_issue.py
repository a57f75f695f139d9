"""certs.issue: what the certificates contain, how they verify, and the renew boundary.

Contents are read back with ``cryptography.x509`` directly (not through
``inspect_cert``), and chains are verified with cryptography's own RFC 5280
verifier and with a real TLS handshake, so these tests do not grade our code
with our code.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs.inspection import Check, validity_check
from certs.issue import (
    CLOCK_SKEW,
    DEFAULT_CA_VALIDITY,
    DEFAULT_LEAF_VALIDITY,
    KEY_ALGORITHMS,
    CertError,
    CertPair,
    KeyAlgorithm,
    common_name_of,
    inspect_cert,
    inspect_certs,
    iso_utc,
    issue_ca,
    issue_serving_cert,
    issuer_problem,
    key_algorithm_of,
    key_matches,
    key_to_pem,
    load_private_key,
    new_private_key,
    normalize_dns_name,
    normalize_ip_address,
    service_dns_names,
    should_renew,
    validity_problem,
    verify_chain,
)
from tests.certs.chains import KEY_ALGORITHM, SCHEMES, SIGNATURE, Chain, Scheme, ca_variant
from tests.certs.conftest import SERVICE_NAMES, T0
from tests.certs.malformed import FAULTS, Fault, malformed_leaf


def cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


# ----------------------------------------------------------------- contents
def test_service_dns_names_cover_every_form_the_api_server_may_use() -> None:
    assert service_dns_names("wh", "ns") == ["wh", "wh.ns", "wh.ns.svc", "wh.ns.svc.cluster.local"]
    assert service_dns_names("wh", "ns", cluster_domain="corp.internal")[-1] == (
        "wh.ns.svc.corp.internal"
    )


def test_ca_is_a_path_length_zero_ca_that_signs_certificates(ca_pair: CertPair) -> None:
    c = cert(ca_pair.cert_pem)
    bc = c.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical
    assert bc.value.ca
    assert bc.value.path_length == 0
    ku = c.extensions.get_extension_for_class(x509.KeyUsage)
    assert ku.critical
    assert ku.value.key_cert_sign
    assert ku.value.crl_sign
    assert c.issuer == c.subject
    assert c.not_valid_before_utc == T0 - CLOCK_SKEW
    assert c.not_valid_after_utc == T0 + DEFAULT_CA_VALIDITY
    assert isinstance(c.public_key(), ec.EllipticCurvePublicKey)


def test_serving_cert_has_service_sans_server_auth_and_no_ca_flag(
    ca_pair: CertPair, leaf_pair: CertPair
) -> None:
    c = cert(leaf_pair.cert_pem)
    san = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == list(SERVICE_NAMES)
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7")]
    eku = c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    ku = c.extensions.get_extension_for_class(x509.KeyUsage)
    assert ku.critical
    assert ku.value.digital_signature
    assert not ku.value.key_cert_sign
    assert not ku.value.key_encipherment  # ECDSA: no RSA key exchange
    bc = c.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical
    assert not bc.value.ca
    assert c.issuer == cert(ca_pair.cert_pem).subject
    assert c.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == SERVICE_NAMES[0]
    assert c.not_valid_before_utc == T0 - CLOCK_SKEW
    assert c.not_valid_after_utc == T0 + DEFAULT_LEAF_VALIDITY
    aki = c.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ski = cert(ca_pair.cert_pem).extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    assert aki.key_identifier == ski.value.digest


@pytest.mark.parametrize("algorithm", KEY_ALGORITHMS)
def test_every_key_algorithm_issues_a_chain_that_verifies(algorithm: KeyAlgorithm) -> None:
    ca = issue_ca(key=new_private_key(algorithm), now=T0)
    leaf = issue_serving_cert(ca=ca, key=new_private_key(algorithm), now=T0, dns_names=["a.b"])
    verify_chain(leaf.cert_pem, ca.cert_pem, now=T0)
    info = inspect_cert(leaf.cert_pem)
    assert info.key_algorithm == algorithm
    ku = cert(leaf.cert_pem).extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.key_encipherment == algorithm.startswith("rsa")


def test_operator_validity_is_used_and_the_leaf_never_outlives_its_ca() -> None:
    ca = issue_ca(key=new_private_key(), now=T0, validity=dt.timedelta(days=30))
    short = issue_serving_cert(
        ca=ca, key=new_private_key(), now=T0, dns_names=["x"], validity=dt.timedelta(days=7)
    )
    assert cert(short.cert_pem).not_valid_after_utc == T0 + dt.timedelta(days=7)
    long = issue_serving_cert(
        ca=ca, key=new_private_key(), now=T0, dns_names=["x"], validity=dt.timedelta(days=90)
    )
    assert cert(long.cert_pem).not_valid_after_utc == cert(ca.cert_pem).not_valid_after_utc


def test_names_are_normalised_and_deduplicated(ca_pair: CertPair) -> None:
    leaf = issue_serving_cert(
        ca=ca_pair,
        key=new_private_key(),
        now=T0,
        dns_names=["Svc.NS.svc", "svc.ns.svc", "*.example.com"],
        ip_addresses=["::0001", "::1", "10.0.0.1"],
    )
    info = inspect_cert(leaf.cert_pem)
    assert info.dns_names == ("svc.ns.svc", "*.example.com")
    assert info.ip_addresses == ("::1", "10.0.0.1")


def test_cryptography_verifier_accepts_the_leaf_for_each_service_name(
    ca_pair: CertPair, leaf_pair: CertPair
) -> None:
    store = verification.Store([cert(ca_pair.cert_pem)])
    for name in SERVICE_NAMES:
        verifier = (
            verification.PolicyBuilder()
            .store(store)
            .time(T0)
            .build_server_verifier(x509.DNSName(name))
        )
        chain = verifier.verify(cert(leaf_pair.cert_pem), [])
        assert chain[-1] == cert(ca_pair.cert_pem)
    verifier = (
        verification.PolicyBuilder()
        .store(store)
        .time(T0)
        .build_server_verifier(x509.DNSName("other.metagpu.svc"))
    )
    with pytest.raises(verification.VerificationError):
        verifier.verify(cert(leaf_pair.cert_pem), [])


async def test_real_tls_handshake_trusting_only_the_ca(tmp_path: Path) -> None:
    """ssl (OpenSSL) as the API server would use it: CA-only trust and hostname check."""
    now = dt.datetime.now(dt.UTC)
    ca = issue_ca(key=new_private_key(), now=now)
    leaf = issue_serving_cert(
        ca=ca, key=new_private_key(), now=now, dns_names=SERVICE_NAMES, ip_addresses=["127.0.0.1"]
    )
    (tmp_path / "tls.crt").write_bytes(leaf.cert_pem)
    (tmp_path / "tls.key").write_bytes(leaf.key_pem)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    client_ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    async with server:
        for name in ("metagpu-webhook.metagpu.svc", "127.0.0.1"):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_ctx, server_hostname=name
            )
            assert await reader.read() == b"ok"
            writer.close()
        with pytest.raises(ssl.SSLCertVerificationError, match="match"):
            await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_ctx, server_hostname="evil.metagpu.svc"
            )
        other_ca = issue_ca(key=new_private_key(), now=now)
        strict = ssl.create_default_context(cadata=other_ca.cert_pem.decode())
        with pytest.raises(ssl.SSLCertVerificationError, match="local issuer"):
            await asyncio.open_connection(
                "127.0.0.1", port, ssl=strict, server_hostname="metagpu-webhook.metagpu.svc"
            )


def test_renewed_ca_with_the_same_key_still_verifies_old_leaves(
    ca_pair: CertPair, leaf_pair: CertPair
) -> None:
    later = T0 + dt.timedelta(days=100)
    renewed = issue_ca(
        key=load_private_key(ca_pair.key_pem),
        now=later,
        common_name=common_name_of(ca_pair.cert_pem) or "",
    )
    assert cert(renewed.cert_pem).serial_number != cert(ca_pair.cert_pem).serial_number
    verify_chain(leaf_pair.cert_pem, renewed.cert_pem, now=T0 + dt.timedelta(days=200))
    assert issuer_problem(leaf_pair.cert_pem, renewed.cert_pem) is None


# ------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("dns", "ips", "expected"),
    [
        pytest.param([], [], "at least one DNS name or IP", id="no-names"),
        pytest.param(["bad name"], [], "'bad name'", id="space-in-name"),
        pytest.param(["-lead.example"], [], "'-lead.example'", id="leading-hyphen"),
        pytest.param(["a" * 64 + ".x"], [], "1-63", id="label-too-long"),
        pytest.param(["bücher.de"], [], "xn--", id="not-ascii"),
        pytest.param(["*."], [], "wildcard", id="bare-wildcard"),
        pytest.param(["a\n.example.com"], [], "'a\\n.example.com'", id="newline-in-label"),
        pytest.param([], ["10.0.0.256"], "not an IP address: '10.0.0.256'", id="bad-ip"),
    ],
)
def test_bad_names_are_refused_with_the_value(
    ca_pair: CertPair, dns: list[str], ips: list[str], expected: str
) -> None:
    with pytest.raises(CertError, match=None) as err:
        issue_serving_cert(
            ca=ca_pair, key=new_private_key(), now=T0, dns_names=dns, ip_addresses=ips
        )
    assert expected in str(err.value)


def test_naive_time_and_expired_ca_are_refused(ca_pair: CertPair) -> None:
    with pytest.raises(CertError, match="timezone-aware"):
        issue_ca(key=new_private_key(), now=dt.datetime(2030, 1, 1))
    with pytest.raises(CertError, match="the CA expired at"):
        issue_serving_cert(
            ca=ca_pair,
            key=new_private_key(),
            now=T0 + DEFAULT_CA_VALIDITY + dt.timedelta(seconds=1),
            dns_names=["x"],
        )
    with pytest.raises(CertError, match="validity must be positive"):
        issue_serving_cert(
            ca=ca_pair, key=new_private_key(), now=T0, dns_names=["x"], validity=dt.timedelta(0)
        )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("Svc.Ns.Svc", "svc.ns.svc", id="lowercased"),
        pytest.param("host.example.com.", "host.example.com", id="trailing-dot"),
        pytest.param("*.example.com", "*.example.com", id="wildcard"),
        pytest.param("localhost", "localhost", id="single-label"),
    ],
)
def test_normalize_dns_name(name: str, expected: str) -> None:
    assert normalize_dns_name(name) == expected


def test_normalize_ip_address() -> None:
    assert normalize_ip_address("0:0::1") == "::1"
    assert normalize_ip_address(" 10.1.2.3 ") == "10.1.2.3"


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        pytest.param("other-ca", "is not the CA", id="other-ca"),
        pytest.param("leaf-expired", "certificate expired at", id="leaf-expired"),
        pytest.param("not-yet-valid", "is not valid before", id="not-yet-valid"),
        pytest.param("same-name-other-key", "signature does not verify", id="forged-issuer"),
    ],
)
def test_verify_chain_failures_say_why(
    ca_pair: CertPair, leaf_pair: CertPair, case: str, expected: str
) -> None:
    if case == "other-ca":
        other = issue_ca(key=new_private_key(), now=T0, common_name="someone-else")
        leaf_pem, ca_pem, now = leaf_pair.cert_pem, other.cert_pem, T0
    elif case == "leaf-expired":
        leaf_pem, ca_pem = leaf_pair.cert_pem, ca_pair.cert_pem
        now = T0 + DEFAULT_LEAF_VALIDITY + dt.timedelta(seconds=1)
    elif case == "not-yet-valid":
        leaf_pem, ca_pem = leaf_pair.cert_pem, ca_pair.cert_pem
        now = T0 - CLOCK_SKEW - dt.timedelta(seconds=1)
    else:
        impostor = issue_ca(key=new_private_key(), now=T0)  # same default CN, other key
        leaf_pem, ca_pem, now = leaf_pair.cert_pem, impostor.cert_pem, T0
    with pytest.raises(CertError) as err:
        verify_chain(leaf_pem, ca_pem, now=now)
    assert expected in str(err.value)


def test_verify_chain_accepts_a_bundle_holding_the_signing_ca(
    ca_pair: CertPair, leaf_pair: CertPair
) -> None:
    other = issue_ca(key=new_private_key(), now=T0, common_name="other")
    verify_chain(leaf_pair.cert_pem, other.cert_pem + ca_pair.cert_pem, now=T0)
    with pytest.raises(CertError, match="any of the 2 CA certificates"):
        verify_chain(leaf_pair.cert_pem, other.cert_pem + other.cert_pem, now=T0)


# ------------------------------------------------------ signature schemes
@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_signature_scheme_chains_and_a_forged_leaf_says_why(
    chains: dict[Scheme, Chain], scheme: Scheme
) -> None:
    """Issue 31: Ed25519 and RSA-PSS chains were called broken. Each scheme's chain
    verifies; a leaf like it (same names, same key id) signed by another key of the
    same type fails, saying so and what would be accepted."""
    chain = chains[scheme]
    verify_chain(chain.leaf.cert_pem, chain.ca.cert_pem, now=chain.now)
    assert issuer_problem(chain.leaf.cert_pem, chain.ca.cert_pem) is None
    assert inspect_cert(chain.leaf.cert_pem).key_algorithm == KEY_ALGORITHM[scheme]
    with pytest.raises(CertError) as err:
        verify_chain(chain.forged, chain.ca.cert_pem, now=chain.now)
    message = str(err.value)
    assert f"was not signed by the CA 'CN=chain-test-ca ({scheme})'" in message
    assert f"signature does not verify with its {KEY_ALGORITHM[scheme]} key" in message
    assert "only the CA certificate with the key that made it" in message
    assert issuer_problem(chain.forged, chain.ca.cert_pem) == message


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_failure_names_the_signature_the_way_openssl_would(
    chains: dict[Scheme, Chain], scheme: Scheme
) -> None:
    chain = chains[scheme]
    assert inspect_cert(chain.leaf.cert_pem).signature_algorithm == SIGNATURE[scheme]
    problem = issuer_problem(chain.forged, chain.ca.cert_pem) or ""
    assert f"the {SIGNATURE[scheme]} signature does not verify" in problem


OTHER_TYPE: dict[Scheme, Scheme] = {
    "ed25519": "ecdsa-p256",
    "ed448": "ed25519",
    "ecdsa-p256": "ed25519",
    "ecdsa-p384": "rsa-pkcs1v15",
    "rsa-pkcs1v15": "ecdsa-p384",
    "rsa-pss": "ed448",
}


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        pytest.param(
            "other-issuer",
            ["is not the CA", "a CA certificate whose subject is 'CN=chain-test-ca ("],
            id="other-issuer",
        ),
        pytest.param(
            "not-a-ca",
            ["is not a CA certificate (no basicConstraints CA:TRUE)", "same subject and key"],
            id="not-a-ca",
        ),
        pytest.param(
            "expired-ca",
            ["CA certificate expired at", "the same CA renewed (same subject and key)"],
            id="expired-ca",
        ),
        pytest.param(
            "other-key-type",
            ["signature cannot be checked with the CA's", "only the CA certificate with the key"],
            id="other-key-type",
        ),
    ],
)
def test_each_chain_fault_says_what_is_wrong_and_what_would_be_accepted(
    chains: dict[Scheme, Chain], scheme: Scheme, fault: str, expected: list[str]
) -> None:
    chain = chains[scheme]
    now = chain.now
    if fault == "other-issuer":
        ca_pem = chains[OTHER_TYPE[scheme]].ca.cert_pem
    elif fault == "not-a-ca":
        ca_pem = ca_variant(chain, is_ca=False)
    elif fault == "expired-ca":
        ca_pem = ca_variant(chain, not_after=now)
        now += dt.timedelta(seconds=1)
    else:
        ca_pem = ca_variant(chain, scheme=OTHER_TYPE[scheme])
    with pytest.raises(CertError) as err:
        verify_chain(chain.leaf.cert_pem, ca_pem, now=now)
    for part in expected:
        assert part in str(err.value)


def test_a_signature_cryptography_does_not_know_is_named_not_fatal(
    ca_pair: CertPair, leaf_pair: CertPair
) -> None:
    """Reading a certificate (inspect, bootstrap, the TLS reloader) names its
    signature; only the chain check must verify it, and says it cannot."""
    ecdsa_sha256 = bytes.fromhex("06082a8648ce3d040302")  # 1.2.840.10045.4.3.2
    unknown = bytes.fromhex("06082a8648ce3d040309")  # 1.2.840.10045.4.3.9: cryptography knows none
    der = cert(leaf_pair.cert_pem).public_bytes(serialization.Encoding.DER)
    assert der.count(ecdsa_sha256) == 2  # inside the signed part, and beside the signature
    odd = x509.load_der_x509_certificate(der.replace(ecdsa_sha256, unknown))
    pem = odd.public_bytes(serialization.Encoding.PEM)
    assert inspect_cert(pem).signature_algorithm == "1.2.840.10045.4.3.9"
    with pytest.raises(CertError) as err:
        verify_chain(pem, ca_pair.cert_pem, now=T0)
    assert "its 1.2.840.10045.4.3.9 signature cannot be checked with the CA's" in str(err.value)


def test_a_self_signed_certificate_trusted_as_itself_needs_no_ca_flag(
    chains: dict[Scheme, Chain],
) -> None:
    """``inspect tls.crt --ca tls.crt`` for a self-signed serving certificate: TLS clients
    accept a trust anchor that is the certificate itself, so the chain check does too."""
    chain = chains["ed25519"]
    self_signed = ca_variant(chain, is_ca=False)
    verify_chain(self_signed, self_signed, now=chain.now)


def test_issuing_with_an_edwards_ca_key_keeps_that_ca_usable(
    chains: dict[Scheme, Chain],
) -> None:
    """Bootstrap keeps a working CA whatever its key type, so it must sign and renew
    with an Ed25519/Ed448 key too (no digest: Edwards keys hash internally)."""
    for scheme in ("ed25519", "ed448"):
        ca = chains[scheme].ca
        renewed = issue_ca(key=load_private_key(ca.key_pem), now=T0, common_name="renewed")
        leaf = issue_serving_cert(ca=renewed, key=new_private_key(), now=T0, dns_names=["a.b"])
        verify_chain(leaf.cert_pem, renewed.cert_pem, now=T0)
        assert inspect_cert(renewed.cert_pem).key_algorithm == scheme


def test_key_matches_and_inspection(ca_pair: CertPair, leaf_pair: CertPair) -> None:
    assert key_matches(leaf_pair.cert_pem, leaf_pair.key_pem)
    assert not key_matches(leaf_pair.cert_pem, ca_pair.key_pem)
    with pytest.raises(CertError, match="not a usable unencrypted PEM private key"):
        key_matches(leaf_pair.cert_pem, b"junk")
    with pytest.raises(CertError, match="not a PEM certificate"):
        inspect_cert(b"junk")
    infos = inspect_certs(leaf_pair.cert_pem + ca_pair.cert_pem)
    assert [i.is_ca for i in infos] == [False, True]
    assert infos[0].server_auth
    assert not infos[1].server_auth
    assert key_algorithm_of(load_private_key(ca_pair.key_pem)) == "ecdsa-p256"
    assert key_algorithm_of(rsa.generate_private_key(65537, 2048).public_key()) == "rsa-2048"


@pytest.mark.parametrize("fault", FAULTS)
def test_a_certificate_that_breaks_when_read_is_a_cert_error(
    ca_pair: CertPair, fault: Fault
) -> None:
    """cryptography parses extensions and keys lazily, with its own exception types;
    every caller handles CertError, so nothing else may escape."""
    key = new_private_key()
    pem = malformed_leaf(ca_pair, key, now=T0, fault=fault)
    with pytest.raises(CertError, match="certificate is malformed or unsupported"):
        inspect_cert(pem)
    with pytest.raises(CertError):
        inspect_certs(pem + ca_pair.cert_pem)
    if fault == "unknown-curve":  # the public key is the broken part
        with pytest.raises(CertError, match="Curve"):
            key_matches(pem, key_to_pem(key))
        # ... and as the CA (same subject), its key cannot check a signature
        ca_name = common_name_of(ca_pair.cert_pem)
        assert ca_name is not None
        as_ca = malformed_leaf(ca_pair, key, now=T0, fault=fault, common_name=ca_name)
        assert "malformed or unsupported" in (issuer_problem(ca_pair.cert_pem, as_ca) or "")
        with pytest.raises(CertError, match="malformed or unsupported"):
            verify_chain(ca_pair.cert_pem, as_ca, now=T0)
    else:
        assert key_matches(pem, key_to_pem(key))


def test_every_validity_check_agrees_the_not_after_second_is_still_valid(
    ca_pair: CertPair, leaf_pair: CertPair
) -> None:
    """RFC 5280: notAfter is inclusive. ``metagpu certs inspect``, bootstrap and the
    chain check all judge that second alike (inspect once said "expired")."""
    info = inspect_cert(leaf_pair.cert_pem)
    last = info.not_after
    assert validity_problem("certificate", info, now=last) is None
    assert validity_check((info,), now=last).ok
    verify_chain(leaf_pair.cert_pem, ca_pair.cert_pem, now=last)
    after = last + dt.timedelta(seconds=1)
    expired = f"certificate expired at {iso_utc(last)}"
    assert validity_problem("certificate", info, now=after) == expired
    assert validity_check((info,), now=after) == Check("validity", False, expired)
    with pytest.raises(CertError, match="certificate expired at"):
        verify_chain(leaf_pair.cert_pem, ca_pair.cert_pem, now=after)


# --------------------------------------------------------------- renew time
@pytest.mark.parametrize(
    ("offset_s", "due"),
    [
        pytest.param(-1, False, id="one-second-before"),
        pytest.param(0, False, id="exactly-at-boundary-keeps"),
        pytest.param(1, True, id="one-second-after"),
    ],
)
@pytest.mark.parametrize("fraction", [1 / 3, 0.5, 0.1])
def test_should_renew_at_the_boundary(
    leaf_pair: CertPair, offset_s: int, due: bool, fraction: float
) -> None:
    info = inspect_cert(leaf_pair.cert_pem)
    boundary = info.renew_at(fraction)
    # The boundary is "lifetime × fraction left"; check it independently of renew_at.
    assert info.not_after - boundary == info.lifetime * fraction
    now = boundary + dt.timedelta(seconds=offset_s)
    assert should_renew(info, now=now, fraction=fraction) is due


def test_default_renews_with_a_third_of_the_lifetime_left(leaf_pair: CertPair) -> None:
    info = inspect_cert(leaf_pair.cert_pem)
    third_left = info.not_after - info.lifetime / 3
    assert not should_renew(info, now=third_left)
    assert should_renew(info, now=third_left + dt.timedelta(microseconds=1))
    assert should_renew(info, now=info.not_after + dt.timedelta(days=1))  # expired: due


def test_should_renew_rejects_bad_fractions_and_naive_time(leaf_pair: CertPair) -> None:
    info = inspect_cert(leaf_pair.cert_pem)
    for bad in (0.0, 1.0, -0.5):
        with pytest.raises(CertError, match="between 0 and 1"):
            should_renew(info, now=T0, fraction=bad)
    with pytest.raises(CertError, match="timezone-aware"):
        should_renew(info, now=dt.datetime(2030, 1, 1))
