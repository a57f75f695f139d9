"""Server TLS for the webhook, with certificate rotation that drops nothing.

The listener is built once with one :class:`ssl.SSLContext` (``server_context``)
whose SNI callback runs on every ClientHello (OpenSSL calls it with or without
an SNI extension) and points that handshake at the newest *good* pair by
setting ``SSLObject.context``. So:

* a rotated certificate is served to the next handshake, with no restart and
  no rebuilt site: established connections and in-flight requests are untouched;
* a broken new pair (unreadable, key mismatch, expired, not PEM) is refused with
  a logged error and the previous pair keeps serving.

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

from certs.issue import CertError, CertInfo, inspect_cert, key_matches

logger = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL_S = 0.5
"""Half a second keeps "new handshakes see the new certificate" well inside 2 s."""


class TlsError(Exception):
    """A certificate/key pair that cannot be served; the message says why and where."""


def utc_now() -> dt.datetime:
    """The clock the reloader uses unless a test passes its own."""
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class ServingPair:
    """A loaded, checked pair ready to serve."""

    context: ssl.SSLContext
    info: CertInfo
    digest: str
    """sha256 over both files: what the poller compares."""


def files_digest(cert_file: Path, key_file: Path) -> str:
    """sha256 of the two files' contents; raises OSError if either is unreadable."""
    h = hashlib.sha256()
    h.update(cert_file.read_bytes())
    h.update(b"\0")
    h.update(key_file.read_bytes())
    return h.hexdigest()


def new_server_context() -> ssl.SSLContext:
    """TLS 1.2+ server context with Python's default (secure) cipher selection."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION
    return ctx


def load_serving_pair(cert_file: Path, key_file: Path, *, now: dt.datetime) -> ServingPair:
    """Read, check and load a pair; :class:`TlsError` names the file and the fault.

    The files are hashed before and after ``load_cert_chain``: if a symlink swap
    happened in between, the pair we loaded may be half old, half new, so we
    refuse it and the next poll loads the settled files.
    """
    try:
        before = files_digest(cert_file, key_file)
        cert_pem = cert_file.read_bytes()
        key_pem = key_file.read_bytes()
    except OSError as exc:
        raise TlsError(f"cannot read TLS files {cert_file}, {key_file}: {exc}") from exc
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
        raise TlsError(f"cannot load TLS pair {cert_file}, {key_file}: {exc}") from exc
    if after != before:
        raise TlsError(f"TLS files {cert_file}, {key_file} changed while loading; will retry")
    return ServingPair(context=ctx, info=info, digest=after)


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
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self._clock = clock
        self._on_reload = on_reload
        self._current = load_serving_pair(cert_file, key_file, now=clock())
        self._rejected_digest: str | None = None
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

    def reload_if_changed(self) -> bool:
        """Load the files if their digest changed; True when a new pair now serves.

        A broken pair is logged once per distinct content and otherwise ignored:
        the previous pair keeps serving.
        """
        try:
            digest = files_digest(self.cert_file, self.key_file)
        except OSError as exc:
            self._reject(f"unreadable: {exc}", "unreadable")  # log once, not every poll
            return False
        if digest in (self._current.digest, self._rejected_digest):
            return False
        try:
            pair = load_serving_pair(self.cert_file, self.key_file, now=self._clock())
        except TlsError as exc:
            if "changed while loading" in str(exc):
                return False  # mid-swap; the next poll sees settled files
            self._reject(str(exc), digest)
            return False
        old = self._current
        self._current = pair
        self._rejected_digest = None
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
        """Poll forever (until cancelled) and reload on change."""
        while True:
            await asyncio.sleep(interval_s)
            self.reload_if_changed()

    # ----------------------------------------------------------- internals
    def _select_context(
        self, sslobj: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext
    ) -> None:
        current = self._current.context
        if sslobj.context is not current:
            sslobj.context = current

    def _reject(self, reason: str, digest: str) -> None:
        if digest == self._rejected_digest:
            return
        self._rejected_digest = digest
        logger.error(
            "refusing new TLS certificate files; still serving the previous certificate: %s",
            reason,
            extra={"serial": f"{self._current.info.serial:x}", **self._fields()},
        )

    def _fields(self) -> dict[str, str]:
        info = self._current.info
        return {"not_after": info.not_after.isoformat(), "cert_file": str(self.cert_file)}
