"""Certificates that load but break when a part of them is read (test builders).

``cryptography`` parses a certificate's extensions, names and public key only
when they are first asked for, and then raises ``ValueError``,
``x509.DuplicateExtension`` or ``UnsupportedAlgorithm``. A certificate from
someone's own PKI can plausibly carry such a part; these builders make one of
each, otherwise shaped like a good serving certificate (signed by ``ca``, for
``localhost``/``127.0.0.1``, with ``key``'s public key).

Two of them are edited after signing (their signature no longer verifies);
that does not matter, because the lazy parse fails first.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, ExtensionOID, NameOID

from certs.issue import CertPair, PrivateKey, load_private_key

Fault = Literal["garbage-san", "duplicate-extension", "unknown-curve"]
FAULTS: tuple[Fault, ...] = ("garbage-san", "duplicate-extension", "unknown-curve")

_SAN = x509.SubjectAlternativeName(
    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
)
_STAND_IN_OID = x509.ObjectIdentifier("2.5.29.99")
"""Encodes to as many bytes as subjectAltName's 2.5.29.17, so it can be swapped for it."""
_P256_OID_DER = bytes.fromhex("06082a8648ce3d030107")
_UNKNOWN_CURVE_OID_DER = bytes.fromhex("06082a8648ce3d030109")


def malformed_leaf(
    ca: CertPair,
    key: PrivateKey,
    *,
    now: dt.datetime,
    fault: Fault,
    common_name: str = "localhost",
) -> bytes:
    """PEM of a serving certificate with ``fault``; ``key`` must be ECDSA P-256."""
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.curve.name == "secp256r1"
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    )
    if fault == "garbage-san":
        garbage = x509.UnrecognizedExtension(ExtensionOID.SUBJECT_ALTERNATIVE_NAME, b"\x30\x03ab")
        builder = builder.add_extension(garbage, critical=False)
    else:
        builder = builder.add_extension(_SAN, critical=False)
    if fault == "duplicate-extension":
        stand_in = x509.UnrecognizedExtension(_STAND_IN_OID, _SAN.public_bytes())
        builder = builder.add_extension(stand_in, critical=False)
    der = builder.sign(load_private_key(ca.key_pem), hashes.SHA256()).public_bytes(
        serialization.Encoding.DER
    )
    if fault == "duplicate-extension":
        san_oid_der = b"\x06\x03" + bytes([0x55, 0x1D, 0x11])
        der = _replace_once(der, b"\x06\x03" + bytes([0x55, 0x1D, 0x63]), san_oid_der)
    if fault == "unknown-curve":
        der = _replace_once(der, _P256_OID_DER, _UNKNOWN_CURVE_OID_DER)
    return x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM)


def _replace_once(der: bytes, old: bytes, new: bytes) -> bytes:
    assert len(old) == len(new), "the edit must keep every length"
    assert der.count(old) == 1
    return der.replace(old, new)
