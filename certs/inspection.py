"""``metagpu certs inspect``: what a certificate file says, or what an endpoint serves.

Two sources, one report:

* a PEM file (or ``-`` for stdin): every certificate in it, and optional checks
  against a CA (``--ca``: does it chain?), a key (``--key``: is it the pair?)
  and a name (``--server-name``: is it a SAN?);
* a live ``https://host:port``: the certificate the server presents right now
  (fetched without verification, so a broken one can still be shown), and
  with ``--ca`` a second, fully verifying handshake whose error is what a TLS
  client such as the API server would report ("certificate signed by unknown
  authority" shows up here as ``unable to get local issuer certificate``).

Only the standard library's :mod:`ssl` and the pure :mod:`certs.issue` are
used; nothing reads or prints key material (``--key`` is only compared).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import ssl
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from certs.bootstrap import format_duration
from certs.issue import (
    DEFAULT_RENEW_FRACTION,
    CertError,
    CertInfo,
    inspect_certs,
    iso_utc,
    key_matches,
    should_renew,
    validity_problem,
    verify_chain,
)

DEFAULT_CONNECT_TIMEOUT_S: Final = 5.0

CheckName = Literal["validity", "chain", "key", "name", "handshake"]


class InspectError(Exception):
    """The source cannot be read or reached; the message says which and why."""


@dataclass(frozen=True)
class Check:
    """One yes/no question about the certificate, with the reason."""

    name: CheckName
    ok: bool
    detail: str


@dataclass(frozen=True)
class Inspection:
    """Everything ``inspect`` shows."""

    source: str
    certs: tuple[CertInfo, ...]
    checks: tuple[Check, ...] = ()
    tls: dict[str, str] = field(default_factory=dict)
    """For a URL: protocol version, cipher, SNI name."""

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


# -------------------------------------------------------------- from files
def inspect_pem(
    pem: bytes,
    *,
    source: str,
    now: dt.datetime,
    ca_pem: bytes | None = None,
    key_pem: bytes | None = None,
    server_name: str | None = None,
) -> Inspection:
    """Facts and checks for the certificates in ``pem`` (the first one is "the" certificate)."""
    try:
        certs = inspect_certs(pem)
    except CertError as exc:
        raise InspectError(f"{source}: {exc}") from exc
    checks = [validity_check(certs, now=now)]
    leaf_pem = pem
    if ca_pem is not None:
        try:
            verify_chain(leaf_pem, ca_pem, now=now)
            checks.append(Check("chain", True, "signed by the given CA, and both valid now"))
        except CertError as exc:
            checks.append(Check("chain", False, str(exc)))
    if key_pem is not None:
        try:
            same = key_matches(leaf_pem, key_pem)
            detail = "the key belongs to the certificate" if same else "the key does not belong"
            checks.append(Check("key", same, detail))
        except CertError as exc:
            checks.append(Check("key", False, str(exc)))
    if server_name is not None:
        checks.append(name_check(certs[0], server_name))
    return Inspection(source, certs, tuple(checks))


def read_source(path: str) -> bytes:
    """A file's bytes, or stdin's for ``-``."""
    try:
        if path == "-":
            return sys.stdin.buffer.read()
        return Path(path).read_bytes()
    except OSError as exc:
        raise InspectError(f"cannot read {path}: {exc}") from exc


# ---------------------------------------------------------------- from URLs
def inspect_url(
    url: str,
    *,
    now: dt.datetime,
    ca_file: Path | None = None,
    server_name: str | None = None,
    timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> Inspection:
    """Connect to ``https://host:port`` and report the served certificate."""
    host, port = parse_https_url(url)
    name = server_name or host
    unverified = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE
    der, tls = _handshake(unverified, host, port, name, timeout_s)
    if der is None:
        raise InspectError(f"{url} completed a TLS handshake but presented no certificate")
    pem = ssl.DER_cert_to_PEM_cert(der).encode("ascii")
    certs = inspect_certs(pem)
    checks = [validity_check(certs, now=now), name_check(certs[0], name)]
    if ca_file is not None:
        try:
            verified = ssl.create_default_context(cafile=str(ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise InspectError(f"cannot use --ca {ca_file}: {exc}") from exc
        try:
            _handshake(verified, host, port, name, timeout_s)
            checks.append(
                Check("handshake", True, f"a client trusting {ca_file} accepts it for {name}")
            )
        except InspectError as exc:
            checks.append(Check("handshake", False, str(exc)))
    return Inspection(url, certs, tuple(checks), tls)


def parse_https_url(url: str) -> tuple[str, int]:
    """``(host, port)`` of ``https://host[:port]``; :class:`InspectError` otherwise."""
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        raise InspectError(f"--url must look like https://host:port: {url!r}")
    try:
        port = parts.port or 443
    except ValueError as exc:
        raise InspectError(f"--url has an invalid port: {url!r}") from exc
    return parts.hostname, port


def _handshake(
    ctx: ssl.SSLContext, host: str, port: int, name: str, timeout_s: float
) -> tuple[bytes | None, dict[str, str]]:
    sni = None if _is_ip(name) else name
    try:
        with (
            socket.create_connection((host, port), timeout=timeout_s) as sock,
            # An IP here is checked against IP SANs and sent without SNI, as Go does.
            ctx.wrap_socket(sock, server_hostname=name) as tls,
        ):
            cipher = tls.cipher()
            info = {
                "version": tls.version() or "",
                "cipher": cipher[0] if cipher else "",
                "serverName": sni or "(none: IP address)",
            }
            return tls.getpeercert(binary_form=True), info
    except ssl.SSLCertVerificationError as exc:
        raise InspectError(f"certificate verification failed: {exc.verify_message}") from exc
    except ssl.SSLError as exc:
        raise InspectError(f"TLS handshake with {host}:{port} failed: {exc}") from exc
    except OSError as exc:
        raise InspectError(f"cannot connect to {host}:{port}: {exc}") from exc


# ------------------------------------------------------------------ checks
def validity_check(certs: tuple[CertInfo, ...], *, now: dt.datetime) -> Check:
    """Every certificate in the file is inside its validity period at ``now``."""
    for i, info in enumerate(certs):
        label = "certificate" if len(certs) == 1 else f"certificate {i + 1}"
        problem = validity_problem(label, info, now=now)
        if problem is not None:
            return Check("validity", False, problem)
    return Check("validity", True, "valid now")


def name_check(info: CertInfo, name: str) -> Check:
    """Does a SAN of ``info`` cover ``name`` (exact, or a one-label wildcard)?"""
    if covers(info, name):
        return Check("name", True, f"{name} is in the certificate's names")
    names = ", ".join((*info.dns_names, *info.ip_addresses)) or "none"
    return Check("name", False, f"{name} is not among the certificate's names ({names})")


def covers(info: CertInfo, name: str) -> bool:
    """RFC 6125 matching as TLS clients do it: case-insensitive, wildcard = one label."""
    if _is_ip(name):
        want = ipaddress.ip_address(name)
        return any(ipaddress.ip_address(ip) == want for ip in info.ip_addresses)
    host = name.lower().rstrip(".")
    for san in info.dns_names:
        pattern = san.lower().rstrip(".")
        if pattern == host:
            return True
        if pattern.startswith("*.") and "." in host and host.split(".", 1)[1] == pattern[2:]:
            return True
    return False


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------- rendering
def to_json(
    ins: Inspection, *, now: dt.datetime, fraction: float = DEFAULT_RENEW_FRACTION
) -> dict[str, Any]:
    """The report as JSON-ready values (``-o json``)."""
    return {
        "source": ins.source,
        "ok": ins.ok,
        "tls": ins.tls or None,
        "certificates": [_cert_json(c, now=now, fraction=fraction) for c in ins.certs],
        "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in ins.checks],
    }


def to_text(ins: Inspection, *, now: dt.datetime, fraction: float = DEFAULT_RENEW_FRACTION) -> str:
    """The report for people (``-o text``)."""
    lines = [f"source: {ins.source}"]
    if ins.tls:
        lines.append(
            f"  tls: {ins.tls.get('version')}, {ins.tls.get('cipher')}, "
            f"server name {ins.tls.get('serverName')}"
        )
    for i, c in enumerate(ins.certs):
        lines.append(f"certificate {i + 1} of {len(ins.certs)}:")
        due = should_renew(c, now=now, fraction=fraction)
        rows = [
            ("subject", c.subject),
            ("issuer", c.issuer),
            ("serial", f"{c.serial:x}"),
            ("not before", iso_utc(c.not_before)),
            ("not after", f"{iso_utc(c.not_after)} ({_left(c, now)})"),
            (
                "renewal due",
                f"{'yes' if due else 'no'} (due after {iso_utc(c.renew_at(fraction))}, "
                f"with less than {fraction:.0%} of its lifetime left)",
            ),
            ("names", ", ".join((*c.dns_names, *c.ip_addresses)) or "(none)"),
            ("key", c.key_algorithm or "?"),
            ("signed with", c.signature_algorithm or "?"),
            ("CA", "yes" if c.is_ca else "no"),
            ("serverAuth", "yes" if c.server_auth else "no"),
            ("sha256", c.fingerprint_sha256),
        ]
        lines += [f"  {k + ':':<13} {v}" for k, v in rows]
    for check in ins.checks:
        lines.append(f"check {check.name}: {'OK' if check.ok else 'FAIL'} — {check.detail}")
    return "\n".join(lines)


def _cert_json(c: CertInfo, *, now: dt.datetime, fraction: float) -> dict[str, Any]:
    return {
        "subject": c.subject,
        "issuer": c.issuer,
        "serial": f"{c.serial:x}",
        "notBefore": iso_utc(c.not_before),
        "notAfter": iso_utc(c.not_after),
        "secondsLeft": int(c.remaining(now).total_seconds()),
        "renewalDue": should_renew(c, now=now, fraction=fraction),
        "renewAt": iso_utc(c.renew_at(fraction)),
        "dnsNames": list(c.dns_names),
        "ipAddresses": list(c.ip_addresses),
        "keyAlgorithm": c.key_algorithm,
        "signatureAlgorithm": c.signature_algorithm,
        "isCA": c.is_ca,
        "serverAuth": c.server_auth,
        "fingerprintSHA256": c.fingerprint_sha256,
    }


def _left(c: CertInfo, now: dt.datetime) -> str:
    left = c.remaining(now)
    if left.total_seconds() < 0:  # notAfter itself is still valid
        return f"EXPIRED {format_duration(-left)} ago"
    return f"{format_duration(left)} left"
