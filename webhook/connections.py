"""The webhook's listener: TLS connections with a budget, deadlines and a drain.

aiohttp's own site gives every connection one timer, the keep-alive (3,630 s
by default), also while it waits for headers or a body, and asyncio gives each
TLS connection a 256 KiB read buffer: a few hundred connections that never
send a byte took the webhook past its memory limit. What a Go webhook gets
from ``net/http`` (``ReadHeaderTimeout``, ``IdleTimeout``, bounded buffers) is
built here around aiohttp's request handler, which stays unchanged:

* **Budget.** A connection over ``max_connections``, or over
  ``max_connections_per_client`` from one address, is closed as soon as it is
  accepted, before its handshake; it costs nothing after that.
* **Smaller buffers.** TLS is layered by :class:`TLSConnection`, an
  :class:`asyncio.sslproto.SSLProtocol` reading 16 KiB at a time (one TLS
  record at most) instead of 256 KiB; ``docs/benchmarks.md`` has the
  per-connection figures.
* **Deadlines.** One timer per connection, moved as the connection goes
  through its :class:`Phase`: handshake (asyncio's own timeout), headers
  (from the handshake, or from a request's first byte), the handler (which
  bounds the body itself), the answer being taken by the client, idle.
* **Drain.** :meth:`Listener.drain` stops accepting, closes what carries no
  complete request, and waits until every request whose headers had arrived
  is answered: its body keeps being read (aiohttp's own shutdown stops
  reading at once and drops it).

What a request goes through is seen at two points: the plain-text bytes (the
:class:`_Tap` between TLS and aiohttp, which finds the end of the headers)
and the answer (:meth:`TLSConnection.answered`, from the app's
``on_response_prepare`` signal, which every answer passes, 404s included).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import ssl
from asyncio.sslproto import SSLProtocol
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal, cast

from webhook.config import ConnectionsConfig
from webhook.memory import Trimmer

logger = logging.getLogger(__name__)

READ_CHUNK: Final = 16 * 1024
"""Bytes read from a socket at once, and the per-connection read buffer: the
largest TLS record carries 16 KiB, so a bigger buffer only costs memory."""

END_OF_HEADERS: Final = b"\r\n\r\n"

Refusal = Literal["full", "client"]
CloseReason = Literal["header_timeout", "unanswered", "write_timeout", "idle", "drain"]
CLOSE_REASONS: Final[tuple[CloseReason, ...]] = (
    "header_timeout",
    "unanswered",
    "write_timeout",
    "idle",
    "drain",
)


class ClientBudget:
    """How many connections are open, in all and per client address (pure)."""

    def __init__(self, *, total: int, per_client: int) -> None:
        self.total = total
        self.per_client = per_client
        self.open = 0
        self._by_client: dict[str, int] = {}

    def admit(self, client: str) -> Refusal | None:
        """Count a new connection from ``client``, or say why it may not open."""
        if self.open >= self.total:
            return "full"
        held = self._by_client.get(client, 0)
        if held >= self.per_client:
            return "client"
        self._by_client[client] = held + 1
        self.open += 1
        return None

    def release(self, client: str) -> None:
        held = self._by_client.get(client, 0)
        if held <= 1:
            self._by_client.pop(client, None)
        else:
            self._by_client[client] = held - 1
        self.open -= 1

    def held_by(self, client: str) -> int:
        return self._by_client.get(client, 0)


class Phase(enum.Enum):
    """Where a connection is; each phase has its own deadline (or none)."""

    HANDSHAKE = "handshake"
    """TLS handshake; asyncio's ``ssl_handshake_timeout`` bounds it."""
    NEW = "new"
    """Handshake done, no byte of a request yet: the header deadline runs."""
    HEADERS = "headers"
    """Some bytes of a request, not all its headers: the header deadline runs."""
    REQUEST = "request"
    """Headers complete, not answered yet: the handler bounds the body and its own
    work; a backstop deadline (headers + body timeouts) catches the rest."""
    HANDLING = "handling"
    """A handler that bounds itself said it will take long (a big review waiting
    for its slot); no deadline here."""
    WRITING = "writing"
    """Answer being sent; the client must take it before the write deadline."""
    IDLE = "idle"
    """Keep-alive, waiting for the next request: the idle deadline runs."""


BUSY: Final = frozenset({Phase.REQUEST, Phase.HANDLING})
"""Phases that hold a request the drain must answer."""


@dataclass
class ConnectionStats:
    """Counts for ``/metrics``; plain numbers, read when scraped."""

    refused: dict[str, int] = field(default_factory=lambda: {"full": 0, "client": 0})
    """By :data:`Refusal`."""
    closed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLOSE_REASONS, 0))
    """By :data:`CloseReason`."""
    accepted: int = 0


class TLSConnection(SSLProtocol):
    """One accepted TCP connection: budget check, TLS, and the deadline of its phase."""

    max_size = READ_CHUNK  # asyncio's read size and per-connection buffer (256 KiB there)

    def __init__(self, listener: Listener, app: asyncio.Protocol) -> None:
        self.listener = listener
        self.app = app
        self.phase = Phase.HANDSHAKE
        self.client = "?"
        self._admitted = False
        self._tcp: asyncio.Transport | None = None
        self._tls: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._due: float | None = None
        """When the current phase's deadline passes (loop time), or None."""
        self._tail = b""
        limits = listener.limits
        super().__init__(
            listener.loop,
            _Tap(self, app),
            listener.ssl_context,
            None,  # type: ignore[arg-type]  # no one awaits the handshake: asyncio allows None
            server_side=True,
            ssl_handshake_timeout=limits.tls_handshake_timeout_s,  # type: ignore[arg-type]
            ssl_shutdown_timeout=limits.write_timeout_s,
        )

    # ------------------------------------------------------- TCP level
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        listener = self.listener
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        refusal = listener.budget.admit(self.client) if not listener.draining else "full"
        if refusal is not None:
            listener.refused(self.client, refusal)
            transport.abort()
            return
        self._admitted = True
        self._tcp = transport
        listener.stats.accepted += 1
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._cancel_timer()
        self.listener.forget(self)
        super().connection_lost(exc)

    # ------------------------------------------------------- app level
    def app_connected(self, transport: asyncio.Transport) -> None:
        """The handshake is done (from :class:`_Tap`)."""
        self._tls = transport
        self.phase = Phase.NEW
        self._arm(self.listener.limits.header_timeout_s)

    def app_data(self, data: bytes) -> None:
        """Plain-text bytes arrived; note a new request and the end of its headers."""
        phase = self.phase
        if phase in (Phase.IDLE, Phase.WRITING):
            self.phase = phase = Phase.HEADERS
            self._tail = b""
            self._arm(self.listener.limits.header_timeout_s)
        elif phase is Phase.NEW:
            self.phase = phase = Phase.HEADERS  # the deadline from the handshake stands
        if phase is Phase.HEADERS:
            seen = self._tail + data if self._tail else data
            if END_OF_HEADERS in seen:
                self.phase = Phase.REQUEST
                self._tail = b""
                self.listener.busy += 1
                # A backstop only: the handler bounds the body (body_timeout_s) and
                # its own work; this catches a request no handler ever answers.
                limits = self.listener.limits
                self._arm(limits.header_timeout_s + limits.body_timeout_s)
            else:
                self._tail = seen[-3:]

    def handling(self) -> None:
        """The handler will take long and bounds itself (a big review waiting for a slot)."""
        if self.phase is Phase.REQUEST:
            self.phase = Phase.HANDLING
            self._due = None

    def answered(self) -> None:
        """The answer is about to be written (``on_response_prepare``)."""
        if self.phase in BUSY:
            self.phase = Phase.WRITING
            self._arm(self.listener.limits.write_timeout_s)
            self.listener.not_busy()

    def close_unless_busy(self) -> None:
        """Drain: close unless a request is in the building or its answer is being sent."""
        if self.phase in BUSY:
            return
        if self.phase is Phase.WRITING and self._write_pending():
            return
        self._close("drain", graceful=self.phase in (Phase.IDLE, Phase.WRITING))

    # ---------------------------------------------------------- timers
    # One timer per connection, moved lazily: a later deadline leaves the timer where
    # it is (it fires, sees the deadline moved and sleeps again), so a keep-alive
    # request costs no timer operations, only an earlier deadline reschedules. A timer
    # per phase change filled the loop's heap with cancelled timers under load.
    def _arm(self, delay_s: float) -> None:
        loop = self.listener.loop
        due = loop.time() + delay_s
        self._due = due
        timer = self._timer
        if timer is not None:
            if self._timer_at <= due:
                return
            timer.cancel()
        self._timer_at = due
        self._timer = loop.call_at(due, self._wake)

    def _cancel_timer(self) -> None:
        self._due = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wake(self) -> None:
        self._timer = None
        due = self._due
        if due is None:
            return
        if due > self.listener.loop.time():  # the deadline moved on: sleep until then
            self._timer_at = due
            self._timer = self.listener.loop.call_at(due, self._wake)
            return
        self._due = None
        self._deadline()

    def _deadline(self) -> None:
        phase = self.phase
        limits = self.listener.limits
        if phase in (Phase.NEW, Phase.HEADERS):
            self._close("header_timeout", graceful=False)
        elif phase is Phase.REQUEST:
            self._close("unanswered", graceful=False)
        elif phase is Phase.WRITING:
            if self._write_pending():
                self._close("write_timeout", graceful=False)
            elif self.listener.draining:
                self._close("drain", graceful=True)
            else:
                self.phase = Phase.IDLE
                self._arm(max(limits.idle_timeout_s - limits.write_timeout_s, 0.001))
        elif phase is Phase.IDLE:
            self._close("idle", graceful=True)

    def _write_pending(self) -> bool:
        tls, tcp = self._tls, self._tcp
        pending = tls.get_write_buffer_size() if tls is not None else 0
        if tcp is not None and not tcp.is_closing():
            pending += tcp.get_write_buffer_size()
        return pending > 0

    def _close(self, reason: CloseReason, *, graceful: bool) -> None:
        self.listener.closing(self, reason)
        self._cancel_timer()
        if graceful and self._tls is not None and not self._tls.is_closing():
            self._tls.close()  # close_notify; ssl_shutdown_timeout bounds it
        elif self._tcp is not None:
            self._tcp.abort()


class _Tap(asyncio.Protocol):
    """Between TLS and aiohttp's handler: passes everything on, tells the connection."""

    __slots__ = ("_app", "_conn")

    def __init__(self, conn: TLSConnection, app: asyncio.Protocol) -> None:
        self._conn = conn
        self._app = app

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._conn.app_connected(transport)
        self._app.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._conn.app_data(data)
        self._app.data_received(data)

    def eof_received(self) -> bool | None:
        return self._app.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._app.connection_lost(exc)

    def pause_writing(self) -> None:
        self._app.pause_writing()

    def resume_writing(self) -> None:
        self._app.resume_writing()


class Listener:
    """The listening socket and every connection on it."""

    def __init__(
        self,
        app_factory: Callable[[], asyncio.Protocol],
        *,
        ssl_context: ssl.SSLContext,
        limits: ConnectionsConfig,
        max_connections: int | None = None,
    ) -> None:
        """``max_connections``: fewer than ``limits`` says, when the file limit is lower."""
        self.loop = asyncio.get_running_loop()
        self.ssl_context = ssl_context
        self.limits = limits
        total = limits.max_connections
        per_client = limits.max_connections_per_client
        if max_connections is not None and max_connections < total:
            # Fewer in all (the file limit): the same share of them per client, so
            # one client still cannot take every connection there is.
            per_client = max(1, per_client * max_connections // total)
            total = max_connections
        self.budget = ClientBudget(total=total, per_client=per_client)
        self.stats = ConnectionStats()
        self.trimmer = Trimmer()
        self.draining = False
        self._app_factory = app_factory
        self._by_app: dict[asyncio.Protocol, TLSConnection] = {}
        self._server: asyncio.Server | None = None
        self.busy = 0
        """Connections with a request whose headers arrived and whose answer is not ready."""
        self._answered = asyncio.Event()
        self._refusal_logged_at = -1e9

    async def start(self, host: str, port: int) -> list[tuple[str, int]]:
        """Listen on ``host:port``; returns the addresses bound."""
        self._server = await self.loop.create_server(
            self._accept, host or None, port, reuse_address=True, backlog=1024
        )
        return [sock.getsockname()[:2] for sock in self._server.sockets]

    def _accept(self) -> TLSConnection:
        app = self._app_factory()
        conn = TLSConnection(self, app)
        self._by_app[app] = conn
        return conn

    def connection_of(self, app: object) -> TLSConnection | None:
        """The connection an aiohttp handler (``request.protocol``) belongs to."""
        return self._by_app.get(cast(asyncio.Protocol, app))

    @property
    def open_connections(self) -> int:
        return self.budget.open

    def forget(self, conn: TLSConnection) -> None:
        self._by_app.pop(conn.app, None)
        self.budget.release(conn.client)
        self.trimmer.soon()  # a flood that ends leaves its memory free, not given back
        if conn.phase in BUSY:
            conn.phase = Phase.IDLE
            self.not_busy()

    def refused(self, client: str, why: Refusal) -> None:
        self.stats.refused[why] += 1
        now = self.loop.time()
        if now - self._refusal_logged_at >= 10:  # one line per 10 s, whatever the flood
            self._refusal_logged_at = now
            logger.warning(
                "refusing connections over the budget (counted in "
                "metagpu_webhook_connections_refused_total)",
                extra={
                    "client": client,
                    "why": why,
                    "open": self.budget.open,
                    "max_connections": self.budget.total,
                    "max_connections_per_client": self.budget.per_client,
                },
            )

    def closing(self, conn: TLSConnection, reason: CloseReason) -> None:
        self.stats.closed[reason] += 1
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "closing connection",
                extra={"client": conn.client, "why": reason, "phase": conn.phase.value},
            )

    def not_busy(self) -> None:
        self.busy -= 1
        if self.busy <= 0 and self.draining:
            self._answered.set()

    async def drain(self, timeout_s: float) -> bool:
        """Stop accepting, close what holds no request, answer the rest (at most ``timeout_s``).

        True when every request was answered in time.
        """
        self.draining = True
        if self._server is not None:
            self._server.close()
        for conn in list(self._by_app.values()):
            conn.close_unless_busy()
        if self.busy <= 0:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                await self._answered.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


FD_HEADROOM: Final = 128
"""File descriptors kept for everything but client connections (the listener,
the API client, certificate reads, logging)."""


def fit_to_fd_limit(max_connections: int) -> int:
    """``max_connections``, lowered if the open-file limit cannot hold that many.

    Raises the soft ``RLIMIT_NOFILE`` towards the hard one first. A budget the
    limit can hold means a flood is refused by the budget (one line a while)
    instead of by ``accept()`` failing with EMFILE on every try.
    """
    try:
        import resource  # noqa: PLC0415 - POSIX only
    except ImportError:  # pragma: no cover - not POSIX
        return max_connections
    needed = max_connections + FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return max_connections
    fitted = max(soft - FD_HEADROOM, 16)
    logger.warning(
        "the open-file limit cannot hold max_connections; serving fewer",
        extra={"max_connections": max_connections, "serving": fitted, "nofile_limit": soft},
    )
    return fitted
