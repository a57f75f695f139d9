"""Certificates for the embedded default: ``metagpu webhook`` with no ``--tls-cert``.

A CA and a serving certificate for ``localhost``, ``127.0.0.1`` and ``::1``
are written to ``tls.generate_dir`` (``ca.crt``, ``tls.crt``, ``tls.key``, the
names of a ``kubernetes.io/tls`` Secret). A bundle already there is reused
when it is still good (chain verifies, key matches, names covered, not due
for renewal), so the CA a developer trusted, or pasted into a kind cluster's
``caBundle``, survives restarts. Anything else is replaced by a fresh bundle.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from certs.files import BundlePaths, generate_bundle
from certs.issue import CertError, inspect_cert, key_matches, should_renew, verify_chain

logger = logging.getLogger(__name__)

LOCAL_DNS_NAMES: Final = ("localhost",)
LOCAL_IP_ADDRESSES: Final = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class LocalBundle:
    paths: BundlePaths
    generated: bool
    """True when written now; False when an existing good bundle was reused."""


def ensure_local_bundle(directory: Path, *, now: dt.datetime) -> LocalBundle:
    """Reuse the bundle in ``directory`` if it is still good, else write a new one."""
    paths = BundlePaths.in_dir(directory)
    reason = _unusable_reason(paths, now=now)
    if reason is None:
        logger.info(
            "reusing the embedded default's certificates", extra={"ca_file": str(paths.ca_file)}
        )
        return LocalBundle(paths, generated=False)
    paths = generate_bundle(
        directory, now=now, dns_names=LOCAL_DNS_NAMES, ip_addresses=LOCAL_IP_ADDRESSES
    )
    logger.info(
        "generated a CA and a serving certificate for localhost",
        extra={"ca_file": str(paths.ca_file), "why": reason},
    )
    return LocalBundle(paths, generated=True)


def _unusable_reason(paths: BundlePaths, *, now: dt.datetime) -> str | None:
    try:
        ca_pem = paths.ca_file.read_bytes()
        cert_pem = paths.cert_file.read_bytes()
        key_pem = paths.key_file.read_bytes()
    except FileNotFoundError:
        return "no certificates yet"
    except OSError as exc:
        return f"cannot read the existing certificates: {exc}"
    try:
        verify_chain(cert_pem, ca_pem, now=now)
        if not key_matches(cert_pem, key_pem):
            return "the key does not match the certificate"
        info = inspect_cert(cert_pem)
    except CertError as exc:
        return f"existing certificates unusable: {exc}"
    missing = (set(LOCAL_DNS_NAMES) - set(info.dns_names)) | (
        set(LOCAL_IP_ADDRESSES) - set(info.ip_addresses)
    )
    if missing:
        return f"the certificate does not cover {', '.join(sorted(missing))}"
    if should_renew(info, now=now):
        return "the certificate is due for renewal"
    return None
