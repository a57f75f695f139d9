"""Server TLS for the webhook, with certificate rotation that drops nothing.

The listener is built once with one :class:`ssl.SSLContext` (``server_context``)
whose SNI callback runs on every ClientHello (OpenSSL calls it with or without
an SNI extension) and points that handshake at the newest *good* pair by
setting ``SSLObject.context``. So:

* a rotated certificate is served to the next handshake, with no restart and
  no rebuilt site: established connections and in-flight requests are untouched;
* new file contents are acted on once two consecutive polls read the same
  bytes, so a rotation caught half-way (a new key next to the old certificate)
  is waited out, never refused;
* a new pair that cannot work is refused with one logged ERROR naming why, and
  the previous pair keeps serving: unreadable, not PEM, malformed, key
  mismatch, expired, not valid yet (beyond :data:`certs.issue.CLOCK_SKEW`, the
  back-dating our own issuer uses: an issuer's clock a little ahead), or names that
  no longer cover every DNS name and IP address the serving pair covers (the
  names clients dial). A new issuer is fine: a CA rotation (cert-manager's)
  changes only the issuer, and clients that trust the new CA need the new pair.
  So is any key and signature type the API server verifies (ECDSA, RSA signed
  with PKCS#1 v1.5 or PSS, Ed25519); an Ed448 key or signature is refused,
  because Go's TLS stack cannot verify one (served with a warning at start,
  as a pair not valid yet is). The pod mounts no ``ca.crt`` to judge the chain
  by, so chains are checked where a CA is at hand (``certs inspect --ca``,
  bootstrap), by :func:`certs.issue.verify_chain`.
  The refusal stays visible (:attr:`ReloadingTLS.rejection`, for ``/readyz`` and
  a metric) until a good pair replaces it.

Why poll instead of inotify: a mounted Secret changes by an atomic swap of the
``..data`` symlink, which many watchers miss, and kopf polls for the same
reason. Polling a sha256 of two small files every half second is cheap and
catches every swap. Only the digest and the certificate's public facts are
kept and logged, never key material.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from certs.issue import CLOCK_SKEW, CertError, CertInfo, inspect_cert, key_matches, utc_now

logger = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL_S = 0.5
"""Half a second: new files are loaded on the second poll that reads them, so new
handshakes see a rotated certificate within about a second, well inside 2 s."""


class TlsError(Exception):
    """A certificate/key pair that cannot be served; the message says why and where."""


class TlsFilesChangedError(TlsError):
    """The files changed while they were being loaded: caught mid-swap, not broken.

    The reloader waits for them to settle instead of refusing them.
    """


@dataclass(frozen=True)
class Rejection:
    """Why the newest files were refused, and when (see :attr:`ReloadingTLS.rejection`)."""

    reason: str
    at: dt.datetime


@dataclass(frozen=True)
class ServingPair:
    """A loaded, checked pair ready to serve."""

    context: ssl.SSLContext
    info: CertInfo
    digest: str
    """sha256 over both files: what the poller compares."""


def pair_digest(cert_pem: bytes, key_pem: bytes) -> str:
    """sha256 over a certificate's and a key's bytes: what the poller compares."""
    h = hashlib.sha256()
    h.update(cert_pem)
    h.update(b"\0")
    h.update(key_pem)
    return h.hexdigest()


def files_digest(cert_file: Path, key_file: Path) -> str:
    """:func:`pair_digest` of the two files' contents; raises OSError if either is unreadable."""
    return pair_digest(cert_file.read_bytes(), key_file.read_bytes())


def new_server_context() -> ssl.SSLContext:
    """TLS 1.2+ server context with Python's default (secure) cipher selection."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION
    return ctx


def load_serving_pair(cert_file: Path, key_file: Path, *, now: dt.datetime) -> ServingPair:
    """Read, check and load a pair; :class:`TlsError` names the file and the fault."""
    try:
        cert_pem = cert_file.read_bytes()
        key_pem = key_file.read_bytes()
    except OSError as exc:
        raise TlsError(f"cannot read TLS files {cert_file}, {key_file}: {exc}") from exc
    pair = _load_pair(cert_file, key_file, cert_pem, key_pem, now=now)
    unverifiable = _api_server_problem(pair.info)
    if unverifiable is not None:  # a reload refuses it (_replacement_problem); at start, warn
        logger.warning("certificate %s", unverifiable, extra={"cert_file": str(cert_file)})
    return pair


def _load_pair(
    cert_file: Path, key_file: Path, cert_pem: bytes, key_pem: bytes, *, now: dt.datetime
) -> ServingPair:
    """Check the bytes already read, then have OpenSSL load the files.

    ``ssl`` loads a pair only from files, so they are read once more; if they
    differ from the bytes that were checked (a swap in between), the pair may
    be half old, half new, and :class:`TlsFilesChangedError` says so.
    """
    before = pair_digest(cert_pem, key_pem)
    try:
        info = inspect_cert(cert_pem)
        if not key_matches(cert_pem, key_pem):
            raise TlsError(f"private key {key_file} does not belong to certificate {cert_file}")
    except CertError as exc:
        raise TlsError(f"{cert_file} / {key_file}: {exc}") from exc
    if now >= info.not_after:
        raise TlsError(f"certificate {cert_file} expired at {info.not_after.isoformat()}")
    if now < info.not_before:
        logger.warning(
            "certificate is not valid yet; clients with a correct clock will reject it",
            extra={"cert_file": str(cert_file), "not_before": info.not_before.isoformat()},
        )
    ctx = new_server_context()
    try:
        ctx.load_cert_chain(cert_file, key_file)
        after = files_digest(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        if _digest_or_none(cert_file, key_file) != before:
            raise TlsFilesChangedError(f"TLS files {cert_file}, {key_file} changed") from exc
        raise TlsError(f"cannot load TLS pair {cert_file}, {key_file}: {exc}") from exc
    if after != before:
        raise TlsFilesChangedError(f"TLS files {cert_file}, {key_file} changed while loading")
    return ServingPair(context=ctx, info=info, digest=before)


def _api_server_problem(info: CertInfo) -> str | None:
    """Why the Kubernetes API server could not verify ``info``, or None when it can.

    The API server is Go: crypto/x509 and crypto/tls verify RSA (PKCS#1 v1.5
    and PSS), ECDSA and Ed25519, and not Ed448. OpenSSL serves an Ed448 pair
    happily, so nothing else would notice before every admission call fails.
    """
    if info.key_algorithm == "ed448":
        what = "has an Ed448 key"
    elif info.signature_algorithm == "Ed448":
        what = "is signed with Ed448"
    else:
        return None
    return (
        f"{what}, which the Kubernetes API server (Go's crypto/tls) cannot verify: it would "
        "fail every admission call; an Ed25519, ECDSA or RSA pair would be accepted"
    )


def _replacement_problem(old: CertInfo, new: CertInfo, *, now: dt.datetime) -> str | None:
    """Why ``new`` must not replace a serving ``old``, or None when it may.

    Only for reloads: at start-up there is nothing better to serve, so a pair
    that is not valid yet, or one the API server cannot verify, is served with
    a warning (:func:`_load_pair`, :func:`load_serving_pair`).
    """
    if new.not_before - CLOCK_SKEW > now:
        return (
            f"is not valid until {new.not_before.isoformat()} (more than "
            f"{CLOCK_SKEW.total_seconds():g}s ahead of this clock); clients would refuse it"
        )
    unverifiable = _api_server_problem(new)
    if unverifiable is not None:
        return unverifiable
    lost_dns = sorted(set(old.dns_names) - set(new.dns_names))
    lost_ips = sorted(set(old.ip_addresses) - set(new.ip_addresses))
    if lost_dns or lost_ips:
        return (
            f"does not cover {', '.join([*lost_dns, *lost_ips])}, which the serving "
            f"certificate covers (new names: {', '.join([*new.dns_names, *new.ip_addresses])}); "
            "clients that dial those names would refuse it"
        )
    return None


def _digest_or_none(cert_file: Path, key_file: Path) -> str | None:
    try:
        return files_digest(cert_file, key_file)
    except OSError:
        return None


_UNREADABLE: Final = "unreadable"
"""Stands for the digest of files that cannot be read, in the settle-then-load rule."""


class ReloadingTLS:
    """Serve the newest good pair from two files; see the module docstring.

    Hand :attr:`server_context` to the server once; call :meth:`reload_if_changed`
    (or run :meth:`watch`) and new handshakes follow the files.
    """

    def __init__(
        self,
        cert_file: Path,
        key_file: Path,
        *,
        clock: Callable[[], dt.datetime] = utc_now,
        on_reload: Callable[[ServingPair], None] | None = None,
        on_reject: Callable[[Rejection], None] | None = None,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self._clock = clock
        self._on_reload = on_reload
        self._on_reject = on_reject
        self._rejection: Rejection | None = None
        self._current = load_serving_pair(cert_file, key_file, now=clock())
        self._rejected_digest: str | None = None
        self._pending_digest: str | None = None
        """New content seen by the last poll and not yet acted on."""
        self._outer = self._current.context
        self._outer.sni_callback = self._select_context
        logger.info(
            "serving TLS certificate",
            extra={"serial": f"{self._current.info.serial:x}", **self._fields()},
        )

    @property
    def server_context(self) -> ssl.SSLContext:
        """The context to build the listener with; it follows every reload."""
        return self._outer

    @property
    def current(self) -> ServingPair:
        """The pair new handshakes get now."""
        return self._current

    @property
    def rejection(self) -> Rejection | None:
        """Why the newest files are not served, or None when they are (or are unchanged)."""
        return self._rejection

    def reload_if_changed(self) -> bool:
        """Poll once; True when a new pair now serves.

        New content is acted on once two consecutive polls read the same bytes.
        A rotation is then never judged half-done: a kubelet swap is atomic, but
        ``metagpu certs generate`` renames ``tls.key`` before ``tls.crt``, and a
        poll between the two renames sees a new key with the old certificate.
        Settled content that is broken is logged once per distinct content and
        otherwise ignored: the previous pair keeps serving.
        """
        try:
            cert_pem = self.cert_file.read_bytes()
            key_pem = self.key_file.read_bytes()
        except OSError as exc:
            if self._settled(_UNREADABLE):
                self._reject(f"unreadable: {exc}", _UNREADABLE)  # log once, not every poll
            return False
        digest = pair_digest(cert_pem, key_pem)
        if digest == self._current.digest:
            self._pending_digest = None
            return False
        if digest == self._rejected_digest or not self._settled(digest):
            return False
        try:
            pair = _load_pair(self.cert_file, self.key_file, cert_pem, key_pem, now=self._clock())
        except TlsFilesChangedError:
            return False  # changed again under us; the next polls see settled files
        except TlsError as exc:
            self._reject(str(exc), digest)
            return False
        problem = _replacement_problem(self._current.info, pair.info, now=self._clock())
        if problem is not None:
            self._reject(f"certificate {self.cert_file} {problem}", digest)
            return False
        old = self._current
        self._current = pair
        self._rejected_digest = self._pending_digest = None
        self._rejection = None
        logger.info(
            "TLS certificate reloaded; new connections get the new certificate",
            extra={
                "old_serial": f"{old.info.serial:x}",
                "serial": f"{pair.info.serial:x}",
                **self._fields(),
            },
        )
        if self._on_reload is not None:
            self._on_reload(pair)
        return True

    async def watch(self, *, interval_s: float = DEFAULT_POLL_INTERVAL_S) -> None:
        """Poll forever (until cancelled) and reload on change.

        A poll that fails unexpectedly is logged and the next one runs: a
        watch that stopped would never pick up a renewed certificate, and the
        webhook would fail only when the old one expires.
        """
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.reload_if_changed()
            except Exception:
                logger.exception(
                    "checking the TLS certificate files failed; will check again",
                    extra={"serial": f"{self._current.info.serial:x}", **self._fields()},
                )

    # ----------------------------------------------------------- internals
    def _select_context(
        self, sslobj: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext
    ) -> None:
        current = self._current.context
        if sslobj.context is not current:
            sslobj.context = current

    def _settled(self, digest: str) -> bool:
        """True when the previous poll saw ``digest`` too; remembers it otherwise."""
        if digest == self._pending_digest:
            return True
        self._pending_digest = digest
        return False

    def _reject(self, reason: str, digest: str) -> None:
        if digest == self._rejected_digest:
            return
        self._rejected_digest = digest
        self._rejection = Rejection(reason=reason, at=self._clock())
        if self._on_reject is not None:
            self._on_reject(self._rejection)
        logger.error(
            "refusing new TLS certificate files; still serving the previous certificate: %s",
            reason,
            extra={"serial": f"{self._current.info.serial:x}", **self._fields()},
        )

    def _fields(self) -> dict[str, str]:
        info = self._current.info
        return {"not_after": info.not_after.isoformat(), "cert_file": str(self.cert_file)}
