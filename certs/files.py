"""Write certificate bundles to disk the way a mounted ``kubernetes.io/tls`` Secret looks.

``ca.crt``, ``tls.crt`` and ``tls.key`` are the key names of a TLS Secret (plus
cert-manager's ``ca.crt``), so a directory written here and a mounted Secret
are interchangeable for ``metagpu webhook --tls-cert/--tls-key``.

Writes are atomic (temp file, fsync, rename) so a webhook polling the same
directory never reads half a certificate, and the key is created 0600.

:func:`ensure_bundle_dir` is ``metagpu certs generate``: it keeps ``ca.key``
next to the bundle so the CA is reused by later runs, and rewrites only what
:func:`certs.bootstrap.decide_bundle` says must change.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from certs.bootstrap import (
    BUNDLE_KEYS,
    CA_KEY_KEY,
    BootstrapError,
    BundleDecision,
    IssuePolicy,
    decide_bundle,
    render_bundle,
)
from certs.issue import (
    DEFAULT_CA_VALIDITY,
    DEFAULT_LEAF_VALIDITY,
    CertPair,
    KeyAlgorithm,
    PrivateKey,
    issue_ca,
    issue_serving_cert,
    new_private_key,
)

CA_CERT_NAME = "ca.crt"
CERT_NAME = "tls.crt"
KEY_NAME = "tls.key"
CA_KEY_NAME = CA_KEY_KEY
PRIVATE_NAMES = frozenset({KEY_NAME, CA_KEY_NAME})
"""Files written 0600: they hold private keys."""
MAX_BUNDLE_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class BundlePaths:
    """Where a bundle's three files are."""

    ca_file: Path
    cert_file: Path
    key_file: Path

    @classmethod
    def in_dir(cls, directory: Path) -> BundlePaths:
        return cls(directory / CA_CERT_NAME, directory / CERT_NAME, directory / KEY_NAME)

    @property
    def ca_key_file(self) -> Path:
        """Where :func:`ensure_bundle_dir` keeps the CA key (never mounted into a pod)."""
        return self.ca_file.with_name(CA_KEY_NAME)


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


@dataclass(frozen=True)
class DirResult:
    """What :func:`ensure_bundle_dir` found and did."""

    paths: BundlePaths
    decision: BundleDecision
    written: tuple[Path, ...]
    """Files rewritten, in write order; empty when nothing was due."""


def read_bundle_dir(directory: Path) -> dict[str, bytes]:
    """The bundle files present in ``directory`` (missing ones are left out)."""
    data: dict[str, bytes] = {}
    for name in BUNDLE_KEYS:
        path = directory / name
        try:
            if path.stat().st_size > MAX_BUNDLE_FILE_BYTES:
                raise BootstrapError(
                    f"{path} is larger than {MAX_BUNDLE_FILE_BYTES} bytes; not a certificate or key"
                )
            data[name] = path.read_bytes()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise BootstrapError(f"cannot read {path}: {exc}") from exc
    return data


def ensure_bundle_dir(
    directory: Path,
    *,
    policy: IssuePolicy,
    now: dt.datetime,
    force_leaf: bool = False,
    new_ca: bool = False,
    dry_run: bool = False,
    new_key: Callable[[KeyAlgorithm], PrivateKey] = new_private_key,
) -> DirResult:
    """Create or refresh ``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key`` in ``directory``.

    Running it again with the same arguments writes nothing. Keys are written
    before their certificates, so a poller that sees a new certificate finds
    its key; ``ca.key`` and ``tls.key`` are 0600.
    """
    current = read_bundle_dir(directory) if directory.exists() else {}
    decision = decide_bundle(current, policy=policy, now=now, force_leaf=force_leaf, new_ca=new_ca)
    paths = BundlePaths.in_dir(directory)
    if not decision.changes or dry_run:
        return DirResult(paths, decision, ())
    new = render_bundle(current, decision, policy=policy, now=now, new_key=new_key)
    written: list[Path] = []
    for name in (CA_KEY_NAME, CA_CERT_NAME, KEY_NAME, CERT_NAME):
        if current.get(name) == new[name]:
            continue
        path = directory / name
        try:
            write_atomic(path, new[name], mode=0o600 if name in PRIVATE_NAMES else 0o644)
        except OSError as exc:
            raise BootstrapError(f"cannot write {path}: {exc}") from exc
        written.append(path)
    return DirResult(paths, decision, tuple(written))
