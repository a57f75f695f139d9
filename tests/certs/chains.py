"""CA + serving-certificate chains in every signature scheme TLS stacks use (test builders).

Built with ``cryptography`` directly, not through :mod:`certs.issue`, so the
chain checks are not graded by the code they test: ``certs.issue`` only ever
signs with ECDSA or RSA PKCS#1 v1.5, while cert-manager and other PKIs also
hand out Ed25519 (``privateKey.algorithm: Ed25519``) and RSA-PSS chains
(issue 31: ``certs inspect --ca`` called both broken).

Each :class:`Chain` also carries a *forged* leaf: the same subject, issuer
name and authorityKeyIdentifier as the good leaf, signed by another key of the
same type. Only the signature can tell it apart, so it is what every chain
check must refuse with "the signature does not verify".
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa
from cryptography.hazmat.primitives.serialization import Encoding, load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs.issue import CertPair, PrivateKey, key_to_pem

Scheme = Literal["ed25519", "ed448", "ecdsa-p256", "ecdsa-p384", "rsa-pkcs1v15", "rsa-pss"]
SCHEMES: tuple[Scheme, ...] = (
    "ed25519",
    "ed448",
    "ecdsa-p256",
    "ecdsa-p384",
    "rsa-pkcs1v15",
    "rsa-pss",
)

KEY_ALGORITHM: dict[Scheme, str] = {
    "ed25519": "ed25519",
    "ed448": "ed448",
    "ecdsa-p256": "ecdsa-p256",
    "ecdsa-p384": "ecdsa-p384",
    "rsa-pkcs1v15": "rsa-2048",
    "rsa-pss": "rsa-2048",
}
"""What ``certs inspect`` names each scheme's keys (``key:`` / ``keyAlgorithm``)."""

SIGNATURE: dict[Scheme, str] = {
    "ed25519": "Ed25519",
    "ed448": "Ed448",
    "ecdsa-p256": "ECDSA with SHA256",
    "ecdsa-p384": "ECDSA with SHA384",
    "rsa-pkcs1v15": "RSA PKCS#1 v1.5 with SHA256",
    "rsa-pss": "RSA-PSS with SHA256",
}
"""What ``certs inspect`` says each scheme's certificates are signed with (``signed with:``)."""

CA_NAME = "chain-test-ca"


@dataclass(frozen=True)
class Chain:
    """A CA, a serving pair it issued, and a forged serving certificate (see module doc)."""

    scheme: Scheme
    now: dt.datetime
    """When it was issued; everything in it is valid from a minute before."""
    ca: CertPair
    leaf: CertPair
    forged: bytes
    """PEM of a certificate like ``leaf`` (same key and names), signed by an impostor key."""


def new_key(scheme: Scheme) -> PrivateKey:
    """A fresh key for ``scheme`` (RSA at 2048 bits: the schemes differ in padding only)."""
    if scheme == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    if scheme == "ed448":
        return ed448.Ed448PrivateKey.generate()
    if scheme == "ecdsa-p256":
        return ec.generate_private_key(ec.SECP256R1())
    if scheme == "ecdsa-p384":
        return ec.generate_private_key(ec.SECP384R1())
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def build_chain(
    scheme: Scheme,
    *,
    now: dt.datetime,
    dns_names: Sequence[str] = ("localhost",),
    ip_addresses: Sequence[str] = ("127.0.0.1",),
    leaf_key: PrivateKey | None = None,
    validity: dt.timedelta = dt.timedelta(days=90),
) -> Chain:
    """A chain signed throughout with ``scheme``; the leaf key is of the same type unless
    ``leaf_key`` is given (bootstrap keeps a leaf only with the key type it was asked for)."""
    ca_key, impostor = new_key(scheme), new_key(scheme)
    key = leaf_key or new_key(scheme)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{CA_NAME} ({scheme})")])
    ca_cert = sign(
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + validity * 10)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False),
        ca_key,
        scheme,
    )
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    common_name = dns_names[0] if dns_names else "chain-test-leaf"
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    return Chain(
        scheme=scheme,
        now=now,
        ca=CertPair(pem(ca_cert), key_to_pem(ca_key)),
        leaf=CertPair(pem(sign(leaf, ca_key, scheme)), key_to_pem(key)),
        forged=pem(sign(leaf, impostor, scheme)),
    )


def ca_variant(
    chain: Chain,
    *,
    scheme: Scheme | None = None,
    is_ca: bool = True,
    not_after: dt.datetime | None = None,
) -> bytes:
    """PEM of another certificate with the subject of ``chain``'s CA, to isolate one fault.

    By default it has the CA's key, so the leaf's signature still verifies and
    only what was changed can be wrong: ``is_ca=False`` (not a CA), an earlier
    ``not_after`` (an expired CA), or a fresh key of another ``scheme`` (a
    signature that key type cannot have made).
    """
    ca = x509.load_pem_x509_certificate(chain.ca.cert_pem)
    if scheme is None:
        scheme = chain.scheme
        key = load_pem_private_key(chain.ca.key_pem, password=None)
        assert isinstance(key, PrivateKey)
    else:
        key = new_key(scheme)
    builder = (
        x509.CertificateBuilder()
        .subject_name(ca.subject)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(ca.not_valid_before_utc)
        .not_valid_after(not_after or ca.not_valid_after_utc)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=0 if is_ca else None), True)
        .add_extension(_usage(cert_sign=is_ca), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    )
    return pem(sign(builder, key, scheme))


def sign(builder: x509.CertificateBuilder, key: PrivateKey, scheme: Scheme) -> x509.Certificate:
    """Sign the way ``scheme`` says: Edwards keys hash internally (no digest), P-384
    pairs with SHA-384, RSA-PSS uses MGF1-SHA-256 with a digest-length salt (what
    OpenSSL's ``-sigopt rsa_padding_mode:pss`` and most PSS issuers produce)."""
    if scheme in ("ed25519", "ed448"):
        return builder.sign(key, None)
    if scheme == "ecdsa-p384":
        return builder.sign(key, hashes.SHA384())
    if scheme == "rsa-pss":
        pss = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.DIGEST_LENGTH)
        return builder.sign(key, hashes.SHA256(), rsa_padding=pss)
    return builder.sign(key, hashes.SHA256())


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(Encoding.PEM)


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )
