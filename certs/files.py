"""Write certificate bundles to disk the way a mounted ``kubernetes.io/tls`` Secret looks.

``ca.crt``, ``tls.crt`` and ``tls.key`` are the key names of a TLS Secret (plus
cert-manager's ``ca.crt``), so a directory written here and a mounted Secret
are interchangeable for ``metagpu webhook --tls-cert/--tls-key``.

Writes are atomic (temp file, fsync, rename) so a webhook polling the same
directory never reads half a certificate, and the key is created 0600.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from certs.issue import (
    DEFAULT_CA_VALIDITY,
    DEFAULT_LEAF_VALIDITY,
    CertPair,
    KeyAlgorithm,
    issue_ca,
    issue_serving_cert,
    new_private_key,
)

CA_CERT_NAME = "ca.crt"
CERT_NAME = "tls.crt"
KEY_NAME = "tls.key"


@dataclass(frozen=True)
class BundlePaths:
    """Where a bundle's three files are."""

    ca_file: Path
    cert_file: Path
    key_file: Path

    @classmethod
    def in_dir(cls, directory: Path) -> BundlePaths:
        return cls(directory / CA_CERT_NAME, directory / CERT_NAME, directory / KEY_NAME)


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` in one rename; readers see old or new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)  # O_CREAT's mode is masked by the umask
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bundle(directory: Path, *, ca_cert_pem: bytes, leaf: CertPair) -> BundlePaths:
    """Write ``ca.crt``, ``tls.crt`` and ``tls.key`` (0600) into ``directory``.

    The key is written before the certificate, so a poller that sees the new
    certificate also finds its key.
    """
    paths = BundlePaths.in_dir(directory)
    write_atomic(paths.ca_file, ca_cert_pem)
    write_atomic(paths.key_file, leaf.key_pem, mode=0o600)
    write_atomic(paths.cert_file, leaf.cert_pem)
    return paths


def generate_bundle(
    directory: Path,
    *,
    now: dt.datetime,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    algorithm: KeyAlgorithm = "ecdsa-p256",
    ca_validity: dt.timedelta = DEFAULT_CA_VALIDITY,
    leaf_validity: dt.timedelta = DEFAULT_LEAF_VALIDITY,
) -> BundlePaths:
    """A fresh CA and a serving certificate for the given names, written to ``directory``."""
    ca = issue_ca(key=new_private_key(algorithm), now=now, validity=ca_validity)
    leaf = issue_serving_cert(
        ca=ca,
        key=new_private_key(algorithm),
        now=now,
        dns_names=dns_names,
        ip_addresses=ip_addresses,
        validity=leaf_validity,
    )
    return write_bundle(directory, ca_cert_pem=ca.cert_pem, leaf=leaf)
