"""Pure certificate work with ``cryptography``: issue, inspect, verify, decide renewal.

Nothing here reads a clock, a file or the network: keys and "now" are passed
in, PEM bytes come out. That makes the renewal boundary testable to the
second, and lets the same code serve ``metagpu certs generate`` (files), the
bootstrap job (a Secret) and the webhook's embedded default (a temp dir).

Defaults follow what the API server and cert-manager expect of a webhook
serving certificate: ECDSA P-256 keys, a CA with ``keyCertSign`` only, a leaf
with ``digitalSignature`` + ``serverAuth`` and every Service DNS name as a SAN
(Go's TLS stack ignores the CN, so the SANs are what is checked).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, SignatureAlgorithmOID

from plugin.api.resources import DNS_SUBDOMAIN_MAX_LEN, is_dns_label

KeyAlgorithm = Literal["ecdsa-p256", "ecdsa-p384", "rsa-2048", "rsa-3072", "rsa-4096"]
KEY_ALGORITHMS: tuple[KeyAlgorithm, ...] = (
    "ecdsa-p256",
    "ecdsa-p384",
    "rsa-2048",
    "rsa-3072",
    "rsa-4096",
)
PrivateKey = (
    ec.EllipticCurvePrivateKey
    | rsa.RSAPrivateKey
    | ed25519.Ed25519PrivateKey
    | ed448.Ed448PrivateKey
)
"""Every key a serving pair or a CA may hold here: what the API server's Go TLS stack and
cert-manager (``privateKey.algorithm``: RSA, ECDSA, Ed25519) use, and Ed448, which OpenSSL
serves. New keys are ECDSA or RSA (:data:`KeyAlgorithm`); the Edwards keys are for pairs
and CAs that someone else made and that the webhook, ``inspect`` and bootstrap must not
call broken."""
PublicKey = (
    ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey | ed448.Ed448PublicKey
)

DEFAULT_CA_VALIDITY = dt.timedelta(days=3650)
"""Ten years: the CA is the caBundle; changing it means re-patching every
webhook configuration, so it should outlive the installation."""

DEFAULT_LEAF_VALIDITY = dt.timedelta(days=365)
"""One year, renewed at two thirds of its life (see :data:`DEFAULT_RENEW_FRACTION`)."""

DEFAULT_RENEW_FRACTION = 1 / 3
"""Renew when less than this fraction of the lifetime is left (cert-manager's default)."""

CLOCK_SKEW = dt.timedelta(minutes=5)
"""notBefore is back-dated by this much so a node whose clock runs slightly
behind does not reject a certificate issued a second ago."""


class CertError(Exception):
    """A certificate or key that cannot be used; the message says why."""


@dataclass(frozen=True)
class CertPair:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class CertInfo:
    """What an operator (or the renew decision) needs to know about a certificate."""

    subject: str
    issuer: str
    serial: int
    not_before: dt.datetime
    not_after: dt.datetime
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]
    is_ca: bool
    server_auth: bool
    fingerprint_sha256: str
    key_algorithm: str = ""
    """``ecdsa-p256``, ``rsa-2048``, ... (see :func:`key_algorithm_of`); empty if unknown."""
    signature_algorithm: str = ""
    """How its issuer signed it (``ECDSA with SHA256``, ``RSA-PSS with SHA256``,
    ``Ed25519``, ...): a chain holds only if the CA's key made that kind of
    signature, and the API server (Go) cannot verify every kind. Empty if unknown."""

    @property
    def lifetime(self) -> dt.timedelta:
        return self.not_after - self.not_before

    def renew_at(self, fraction: float = DEFAULT_RENEW_FRACTION) -> dt.datetime:
        """The last instant at which :func:`should_renew` still says "keep".

        One microsecond later less than ``fraction`` of the lifetime is left.
        """
        return self.not_after - self.lifetime * fraction

    def remaining(self, now: dt.datetime) -> dt.timedelta:
        """Time left at ``now`` (negative once expired)."""
        return self.not_after - now


# ---------------------------------------------------------------------- keys
def new_private_key(algorithm: KeyAlgorithm = "ecdsa-p256") -> PrivateKey:
    """A fresh private key. P-256 is the default: small, fast, accepted everywhere."""
    if algorithm == "ecdsa-p256":
        return ec.generate_private_key(ec.SECP256R1())
    if algorithm == "ecdsa-p384":
        return ec.generate_private_key(ec.SECP384R1())
    if algorithm.startswith("rsa-"):
        return rsa.generate_private_key(public_exponent=65537, key_size=int(algorithm[4:]))
    raise CertError(f"key algorithm must be one of {', '.join(KEY_ALGORITHMS)}: {algorithm!r}")


def key_to_pem(key: PrivateKey) -> bytes:
    """PKCS#8 PEM, unencrypted: the form a ``kubernetes.io/tls`` Secret holds."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_private_key(pem: bytes) -> PrivateKey:
    """Parse a PEM private key (PKCS#8, PKCS#1 or SEC1)."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise CertError(f"not a usable unencrypted PEM private key: {exc}") from exc
    if not isinstance(key, PrivateKey):
        raise CertError(
            f"unsupported private key type {type(key).__name__}; use ECDSA, RSA, Ed25519 or Ed448"
        )
    return key


def key_algorithm_of(key: PrivateKey | PublicKey) -> str:
    """Name a key the way ``--key-algorithm`` does (``ecdsa-p256``, ``rsa-2048``, ...).

    Keys we would not issue still get a descriptive name (``ecdsa-secp521r1``,
    ``rsa-1024``, ``ed25519``, ``ed448``) so an inspection can show them.
    """
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        return {"secp256r1": "ecdsa-p256", "secp384r1": "ecdsa-p384"}.get(
            key.curve.name, f"ecdsa-{key.curve.name}"
        )
    if isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey):
        return "ed25519"
    if isinstance(key, ed448.Ed448PrivateKey | ed448.Ed448PublicKey):
        return "ed448"
    return f"rsa-{key.key_size}"


# ------------------------------------------------------------------- names
DNS_NAME_MAX_LEN = DNS_SUBDOMAIN_MAX_LEN


def normalize_dns_name(name: str) -> str:
    """A SAN-ready DNS name: lower-cased and checked, or :class:`CertError` saying why.

    Accepts RFC 1123 host names and one leading ``*.`` wildcard label. Names
    are lower-cased because DNS (and every TLS client's name check) is
    case-insensitive, so ``Foo.Example.com`` and ``foo.example.com`` are one SAN.
    """
    value = name.strip().lower()
    if not value:
        raise CertError(f"DNS name must not be empty: {name!r}")
    if not value.isascii():
        raise CertError(f"DNS name must be ASCII; write internationalised names as xn--: {name!r}")
    value = value.removesuffix(".")
    if len(value) > DNS_NAME_MAX_LEN:
        raise CertError(f"DNS name must be at most {DNS_NAME_MAX_LEN} characters: {name!r}")
    labels = value.split(".")
    if labels[0] == "*":
        labels = labels[1:]
        if not labels:
            raise CertError(f"a wildcard DNS name needs a domain after '*.': {name!r}")
    for label in labels:
        if not is_dns_label(label):
            raise CertError(
                "DNS name labels must be 1-63 letters, digits or '-', starting and ending "
                f"with a letter or digit (a leading '*.' is allowed): {name!r}"
            )
    return value


def normalize_ip_address(ip: str) -> str:
    """The canonical text of an IPv4/IPv6 address, or :class:`CertError`."""
    try:
        return str(ipaddress.ip_address(ip.strip()))
    except ValueError as exc:
        raise CertError(f"not an IP address: {ip!r}") from exc


# ------------------------------------------------------------------- issuing
def service_dns_names(
    service: str, namespace: str, *, cluster_domain: str = "cluster.local"
) -> list[str]:
    """Every name the API server may use to reach a Service's webhook."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{cluster_domain}",
    ]


def issue_ca(
    *,
    key: PrivateKey,
    now: dt.datetime,
    common_name: str = "metagpu-webhook-ca",
    validity: dt.timedelta = DEFAULT_CA_VALIDITY,
) -> CertPair:
    """A self-signed CA that may sign leaf certificates and nothing below them.

    Passing the key of an existing CA (and its common name) renews that CA:
    certificates it signed before still verify against the new CA
    certificate, because the subject and the key are the same.
    """
    _check_aware(now)
    if validity <= dt.timedelta(0):
        raise CertError(f"CA validity must be positive: {validity}")
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(ski, critical=False)
    )
    cert = builder.sign(key, _hash_for(key))
    return CertPair(cert.public_bytes(serialization.Encoding.PEM), key_to_pem(key))


def issue_serving_cert(
    *,
    ca: CertPair,
    key: PrivateKey,
    now: dt.datetime,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    common_name: str | None = None,
    validity: dt.timedelta = DEFAULT_LEAF_VALIDITY,
) -> CertPair:
    """A TLS server certificate for ``dns_names``/``ip_addresses``, signed by ``ca``.

    The leaf never outlives its CA: its notAfter is capped at the CA's. DNS
    names are lower-cased and IP addresses canonicalised (see
    :func:`normalize_dns_name`), then de-duplicated in order.
    """
    _check_aware(now)
    dns = _dedupe(normalize_dns_name(n) for n in dns_names)
    ips = _dedupe(normalize_ip_address(ip) for ip in ip_addresses)
    if not dns and not ips:
        raise CertError("a serving certificate needs at least one DNS name or IP address")
    if validity <= dt.timedelta(0):
        raise CertError(f"validity must be positive: {validity}")
    ca_cert = _load_cert(ca.cert_pem)
    ca_key = load_private_key(ca.key_pem)
    if not now < ca_cert.not_valid_after_utc:
        raise CertError(
            f"the CA expired at {ca_cert.not_valid_after_utc.isoformat()}; "
            "it cannot sign a new certificate"
        )
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cn = common_name or (dns[0] if dns else ips[0])
    not_after = min(now + validity, ca_cert.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn[:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False, rsa=isinstance(key, rsa.RSAPrivateKey)), True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    cert = builder.sign(ca_key, _hash_for(ca_key))
    return CertPair(cert.public_bytes(serialization.Encoding.PEM), key_to_pem(key))


# ------------------------------------------------------------------- times
def utc_now() -> dt.datetime:
    """The clock every ``certs`` entry point uses unless a test passes its own."""
    return dt.datetime.now(dt.UTC)


def iso_utc(when: dt.datetime) -> str:
    """``when`` in UTC to the second, as messages and JSON output show times."""
    return when.astimezone(dt.UTC).isoformat(timespec="seconds")


def validity_problem(what: str, info: CertInfo, *, now: dt.datetime) -> str | None:
    """Why ``info`` is not valid at ``now`` (its ``what`` names it), or None.

    ``notAfter`` itself is still valid (RFC 5280 4.1.2.5; OpenSSL agrees), so
    every check in ``certs`` judges the last second the same way.
    """
    return _validity_problem(what, info.not_before, info.not_after, now)


def _validity_problem(
    what: str, not_before: dt.datetime, not_after: dt.datetime, now: dt.datetime
) -> str | None:
    if now < not_before:
        return f"{what} is not valid before {iso_utc(not_before)}"
    if now > not_after:
        return f"{what} expired at {iso_utc(not_after)}"
    return None


# ----------------------------------------------------------------- inspecting
def inspect_cert(pem: bytes) -> CertInfo:
    """Parse the first certificate in ``pem`` into :class:`CertInfo`.

    Raises :class:`CertError` for anything unreadable, including extensions
    and public keys that ``cryptography`` only parses when asked (a malformed
    subjectAltName, a duplicated extension, an unknown curve).
    """
    cert = _load_cert(pem)
    with _parsing("certificate"):
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            dns = tuple(san.get_values_for_type(x509.DNSName))
            ips = tuple(str(ip) for ip in san.get_values_for_type(x509.IPAddress))
        except x509.ExtensionNotFound:
            dns, ips = (), ()
        try:
            is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        try:
            eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
            server_auth = ExtendedKeyUsageOID.SERVER_AUTH in eku
        except x509.ExtensionNotFound:
            server_auth = False
        return CertInfo(
            subject=cert.subject.rfc4514_string(),
            issuer=cert.issuer.rfc4514_string(),
            serial=cert.serial_number,
            not_before=cert.not_valid_before_utc,
            not_after=cert.not_valid_after_utc,
            dns_names=dns,
            ip_addresses=ips,
            is_ca=is_ca,
            server_auth=server_auth,
            fingerprint_sha256=cert.fingerprint(hashes.SHA256()).hex(),
            key_algorithm=_public_key_algorithm(cert),
            signature_algorithm=_signature_algorithm(cert),
        )


def inspect_certs(pem: bytes) -> tuple[CertInfo, ...]:
    """Every certificate in a PEM bundle (a ``ca.crt`` or a served chain), in order."""
    return tuple(inspect_cert(c.public_bytes(serialization.Encoding.PEM)) for c in _load_certs(pem))


_PEM_BLOCK: Final = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----.*?-----END \1-----", re.DOTALL)


def split_certificates(pem: bytes) -> tuple[tuple[bytes, ...], int]:
    """The certificates of a PEM bundle (a ``caBundle``), each as canonical PEM, and
    how many parts of it are not certificates.

    Unlike :func:`inspect_certs` this never raises: a bundle someone edited by
    hand may hold a broken block, a private key or stray text, and the caller
    (bootstrap, deciding what stays trusted) must still see every readable
    certificate. Each unreadable block counts once, and so does any text
    outside the blocks that is not whitespace.
    """
    found: list[bytes] = []
    unreadable = 0
    for match in _PEM_BLOCK.finditer(pem):
        if match.group(1) != b"CERTIFICATE":
            unreadable += 1
            continue
        try:
            cert = x509.load_pem_x509_certificate(match.group(0))
            with _parsing("certificate"):
                found.append(cert.public_bytes(serialization.Encoding.PEM))
        except (ValueError, CertError):
            unreadable += 1
    if _PEM_BLOCK.sub(b"", pem).strip():
        unreadable += 1
    return tuple(found), unreadable


def common_name_of(pem: bytes) -> str | None:
    """The subject CN of the first certificate in ``pem``, if it has one."""
    cert = _load_cert(pem)
    with _parsing("certificate"):
        attrs = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = attrs[0].value if attrs else None
    return value if isinstance(value, str) else None


def should_renew(
    info: CertInfo, *, now: dt.datetime, fraction: float = DEFAULT_RENEW_FRACTION
) -> bool:
    """True when less than ``fraction`` of the lifetime is left (or it is expired).

    At exactly ``fraction`` left it is not yet due: the boundary belongs to "keep".
    """
    _check_aware(now)
    if not 0 < fraction < 1:
        raise CertError(f"renew fraction must be between 0 and 1: {fraction}")
    return info.remaining(now) < info.lifetime * fraction


def verify_chain(leaf_pem: bytes, ca_pem: bytes, *, now: dt.datetime) -> None:
    """Raise :class:`CertError` unless a CA in ``ca_pem`` issued ``leaf`` and both are valid.

    ``ca_pem`` may hold one CA or a bundle (as a ``caBundle`` may); the leaf
    must be issued by one of them (see :func:`_check_issued_by` for what
    "issued" means). Only the first certificate of ``leaf_pem`` is checked.
    The message says what is wrong with each CA and what would be accepted.
    """
    _check_aware(now)
    leaf = _load_cert(leaf_pem)
    cas = _load_certs(ca_pem)
    _check_validity("certificate", leaf, now)
    errors: list[str] = []
    for ca in cas:
        try:
            _check_issued_by(leaf, ca)
            _check_validity(
                "CA certificate",
                ca,
                now,
                accepted="the same CA renewed (same subject and key) would be accepted",
            )
        except CertError as exc:
            errors.append(str(exc))
            continue
        return
    if len(errors) == 1:
        raise CertError(errors[0])
    raise CertError(
        f"certificate was not signed by any of the {len(cas)} CA certificates in the bundle: "
        + "; ".join(errors)
    )


def issuer_problem(leaf_pem: bytes, ca_pem: bytes) -> str | None:
    """Why the first CA certificate in ``ca_pem`` did not issue ``leaf``, or None when it did.

    Unlike :func:`verify_chain` this ignores validity periods: it answers
    "would this chain once the CA is renewed with the same key and subject?",
    which is what bootstrap asks before it keeps a serving certificate.
    """
    try:
        _check_issued_by(_load_cert(leaf_pem), _load_cert(ca_pem))
    except CertError as exc:
        return str(exc)
    return None


def key_matches(cert_pem: bytes, key_pem: bytes) -> bool:
    """True when ``key_pem`` is the private key of the certificate's public key."""
    cert = _load_cert(cert_pem)
    key = load_private_key(key_pem)
    fmt = serialization.PublicFormat.SubjectPublicKeyInfo
    enc = serialization.Encoding.DER
    with _parsing("certificate"):
        public = cert.public_key()
    return public.public_bytes(enc, fmt) == key.public_key().public_bytes(enc, fmt)


# ----------------------------------------------------------------- internals
_UNREADABLE: Final = (ValueError, x509.DuplicateExtension, UnsupportedAlgorithm)
"""What ``cryptography`` raises when it parses a part of a loaded certificate
lazily (extensions, names, the public key) and that part is malformed or of a
kind it does not support."""


@contextmanager
def _parsing(what: str) -> Iterator[None]:
    """Turn :data:`_UNREADABLE` into :class:`CertError`, so every caller that
    handles "unusable certificate" (bootstrap's decision, the TLS reloader)
    handles these too instead of crashing."""
    try:
        yield
    except _UNREADABLE as exc:
        raise CertError(f"{what} is malformed or unsupported: {exc}") from exc


def _load_cert(pem: bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise CertError(f"not a PEM certificate: {exc}") from exc


def _load_certs(pem: bytes) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise CertError(f"not a PEM certificate bundle: {exc}") from exc
    if not certs:
        raise CertError("no PEM certificate found")
    return certs


def _check_validity(
    what: str, cert: x509.Certificate, now: dt.datetime, *, accepted: str = ""
) -> None:
    problem = _validity_problem(what, cert.not_valid_before_utc, cert.not_valid_after_utc, now)
    if problem is not None:
        raise CertError(f"{problem}; {accepted}" if accepted else problem)


def _check_issued_by(cert: x509.Certificate, ca: x509.Certificate) -> None:
    """Raise :class:`CertError` unless ``ca`` issued ``cert``: the one chain check in ``certs``.

    ``inspect --ca``, :func:`verify_chain` and bootstrap's reuse decision
    (:func:`issuer_problem`) all come here. The signature is checked by
    ``cryptography``'s own ``verify_directly_issued_by``, which reads the
    algorithm and its parameters from the certificate (RSA PKCS#1 v1.5 and PSS,
    ECDSA, Ed25519, Ed448, DSA). Choosing padding and hash here by the CA's key
    type called good Ed25519 and RSA-PSS chains broken (issue 31).

    Checked in this order, each failure saying what would be accepted:
    the issuer name, then the signature, then that ``ca`` may issue at all
    (basicConstraints CA:TRUE, or an X.509 v1 root, as OpenSSL accepts). A
    self-signed certificate trusted as itself (``--ca tls.crt``) needs no CA
    flag: it is its own trust anchor, and TLS clients accept it.
    """
    issuer, ca_name = cert.issuer.rfc4514_string(), ca.subject.rfc4514_string()
    if cert.issuer != ca.subject:
        raise CertError(
            f"certificate issuer {issuer!r} is not the CA {ca_name!r}; "
            f"a CA certificate whose subject is {issuer!r} would be accepted"
        )
    with _parsing("CA certificate"):
        ca_key, ca_key_id = _public_key_algorithm(ca), _subject_key_id(ca)
    with _parsing("certificate"):
        signature, named_key_id = _signature_algorithm(cert), _authority_key_id(cert)
    wanted = "the CA certificate with the key that made it"
    if named_key_id is not None:
        wanted += f" (the certificate names key id {named_key_id}"
        wanted += f"; this CA's is {ca_key_id})" if ca_key_id else ")"
    try:
        cert.verify_directly_issued_by(ca)
    except InvalidSignature as exc:
        raise CertError(
            f"certificate was not signed by the CA {ca_name!r} (serial {ca.serial_number:x}): "
            f"the {signature} signature does not verify with its {ca_key} key; "
            f"only {wanted} would be accepted"
        ) from exc
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        # The issuer names match (checked above), so this is a signature the CA's
        # kind of key cannot make (an ECDSA signature, an Ed25519 key) or one
        # cryptography cannot check at all; its message says which.
        raise CertError(
            f"certificate was not signed by the CA {ca_name!r} (serial {ca.serial_number:x}): "
            f"its {signature} signature cannot be checked with the CA's {ca_key} key ({exc}); "
            f"only {wanted} would be accepted"
        ) from exc
    if cert != ca and not _may_issue(ca):
        raise CertError(
            f"the CA {ca_name!r} (serial {ca.serial_number:x}) is not a CA certificate "
            "(no basicConstraints CA:TRUE), so OpenSSL-based clients refuse what it signs; "
            "a CA certificate with the same subject and key would be accepted"
        )


def _may_issue(ca: x509.Certificate) -> bool:
    """basicConstraints CA:TRUE, or an X.509 v1 certificate (no extensions to say so),
    which OpenSSL accepts as a self-signed root outside its strict mode."""
    if ca.version == x509.Version.v1:
        return True
    with _parsing("CA certificate"):
        try:
            return ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            return False


def _signature_algorithm(cert: x509.Certificate) -> str:
    """How ``cert`` is signed, in words an operator compares with openssl's output.

    Never raises: a signature ``cryptography`` does not know is named by its
    OID, because only the chain check needs to verify it; reading a
    certificate (``inspect``, bootstrap, the TLS reloader) must not fail on it.
    """
    oid = cert.signature_algorithm_oid
    try:
        params = cert.signature_algorithm_parameters
        hash_alg = cert.signature_hash_algorithm
    except _UNREADABLE:
        return oid.dotted_string
    with_hash = f" with {hash_alg.name.upper()}" if hash_alg is not None else ""
    if isinstance(params, padding.PSS):
        return f"RSA-PSS{with_hash}"
    if isinstance(params, padding.PKCS1v15):
        return f"RSA PKCS#1 v1.5{with_hash}"
    if isinstance(params, ec.ECDSA):
        return f"ECDSA{with_hash}"
    names = {SignatureAlgorithmOID.ED25519: "Ed25519", SignatureAlgorithmOID.ED448: "Ed448"}
    return names.get(oid, f"{oid.dotted_string}{with_hash}")


def _authority_key_id(cert: x509.Certificate) -> str | None:
    """The issuer key id ``cert`` names (authorityKeyIdentifier), as hex, if it names one."""
    try:
        aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    except x509.ExtensionNotFound:
        return None
    return aki.key_identifier.hex(":") if aki.key_identifier else None


def _subject_key_id(cert: x509.Certificate) -> str | None:
    """The key id ``cert`` gives its own key (subjectKeyIdentifier), as hex, if it has one."""
    try:
        ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return None
    return ski.digest.hex(":")


def _public_key_algorithm(cert: x509.Certificate) -> str:
    public = cert.public_key()
    if isinstance(public, PublicKey):
        return key_algorithm_of(public)
    return type(public).__name__.lower()


def _key_usage(*, cert_sign: bool, rsa: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=rsa and not cert_sign,  # RSA key exchange in TLS 1.2 needs it
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _hash_for(key: PrivateKey) -> hashes.SHA256 | hashes.SHA384 | None:
    """The digest to sign with ``key``; None for Ed25519/Ed448, which hash internally
    (``cryptography`` refuses a digest for them). Lets bootstrap keep and renew a CA
    whose key is Edwards, instead of replacing a working CA."""
    if isinstance(key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey):
        return None
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.key_size > 256:
        return hashes.SHA384()
    return hashes.SHA256()


def _dedupe(values: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for v in values:
        seen.setdefault(v, None)
    return list(seen)


def _check_aware(now: dt.datetime) -> None:
    if now.tzinfo is None:
        raise CertError("now must be timezone-aware (UTC); naive datetimes are ambiguous")
