"""Adapter: the mgctl API, HTTP/1.1 + JSON on the agent's unix socket.

Endpoints (all under ``/v1``; documents built by :mod:`plugin.agent.views`):

=========================  ==============================================
``GET  /v1/version``       agent version, API version, node, GPU backend
``GET  /v1/processes``     GPU processes the caller may see
``GET  /v1/devices``       GPUs (node scope) or the caller's shares
``POST /v1/kill``          ``{"pid": N, "signal": "KILL"}``: kill a GPU process
=========================  ==============================================

Every request except ``/v1/version`` is identified by the peer credentials of
its connection (``SO_PEERCRED``, see :mod:`plugin.agent.identity`), and the
process behind them is pinned when the connection is accepted
(:mod:`plugin.agent.peers`): a request whose connecting process has gone, and
whose PID may therefore belong to someone else now, is refused. That is why
:class:`ApiServer` accepts connections itself instead of through an aiohttp
site: the pin must be taken at ``accept()``, before the client can send
anything. Errors are Kubernetes-style ``Status`` documents whose ``message``
mgctl prints as is.

The socket is mode 0666: containers run as arbitrary non-root UIDs and must be
able to connect. That is safe because the file mode is not the access control,
the caller's identity is: anyone may *connect*, and each caller then sees only
what its own container owns (a non-root host process sees nothing).

Two agents may share one node for a while: during a rolling update with
``maxSurge``, and during the upgrade from the chart that ran the agent inside
the device plugin's pod (that agent stops only when its pod is replaced, after
the new agent DaemonSet has started). The newer agent replaces the socket file
at start-up; an agent removes the file at shutdown only if it is still its own;
and an agent whose file disappears (an older agent that removes it without
looking, as releases before this check did) listens on a new one within
:data:`SOCKET_CHECK_INTERVAL_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from plugin.agent import mgctl
from plugin.agent.accounting import ProcessView, Snapshot
from plugin.agent.cgroups import (
    CgroupFormatError,
    ContainerId,
    ProcessGoneError,
    pick_container,
    read_command,
    read_process_cgroup,
)
from plugin.agent.containers import ContainerRef
from plugin.agent.enforcement import kill_share_processes
from plugin.agent.identity import Caller, CallerRefusedError, identify
from plugin.agent.peers import Peer, PeerRegistry, pin_peer
from plugin.agent.processes import ProcessHandle, open_process
from plugin.agent.views import (
    API_VERSION,
    KillNotAllowedError,
    NotAGpuProcessError,
    authorize_kill,
    device_list,
    process_list,
)
from plugin.api.resources import MGCTL_FILE_NAME

logger = logging.getLogger(__name__)

SOCKET_MODE: Final = 0o666
"""Anyone may connect; identity decides what they get (see the module docstring)."""
SOCKET_DIR_MODE: Final = 0o755
SIGNALS: Final = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM, "INT": signal.SIGINT}
MAX_BODY_BYTES: Final = 4096
ACCEPT_BACKLOG: Final = 128
ACCEPT_RETRY_DELAY_S: Final = 1.0
"""After a failed ``accept()`` (out of file descriptors), as asyncio's own servers do."""
SOCKET_CHECK_INTERVAL_S: Final = 2.0
"""How often the agent checks that its socket file still exists (see :class:`ApiServer`)."""
_VERSION_LINE: Final = '_EMBEDDED_VERSION = "unknown"'


@dataclass(frozen=True)
class ApiContext:
    """What the handlers read; every field is a live view into the running agent."""

    snapshot: Callable[[], Snapshot | None]
    """The latest snapshot, or None before the first cycle finished."""
    lookup: Callable[[ContainerId], ContainerRef | None]
    pods_problem: Callable[[], str | None]
    proc_root: Path
    agent_cgroup: str | None
    """The cgroup path of the agent's own container (:func:`plugin.agent.agent.own_cgroup`)."""
    node_name: str | None
    version: str
    backend: str
    open_process: Callable[..., ProcessHandle] = field(default=open_process)
    """Pins a process before a kill (:func:`plugin.agent.processes.open_process`)."""
    agent_uid: int | None = None
    """The agent's own UID: host processes of that user get node scope too
    (:func:`plugin.agent.identity.identify`); None: root only."""


CONTEXT: Final = web.AppKey("context", ApiContext)
PEERS: Final = web.AppKey("peers", PeerRegistry)


def status_response(code: int, reason: str, message: str) -> web.Response:
    """A Kubernetes-style ``Status`` document; mgctl prints ``message``."""
    body = {
        "apiVersion": API_VERSION,
        "kind": "Status",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }
    return web.json_response(body, status=code)


def identify_request(request: web.Request) -> Caller:
    """The caller of ``request``; raises :class:`CallerRefusedError`.

    The cgroup is read by PID number first, then the pinned process must still
    be the one holding that number (:meth:`~plugin.agent.peers.Peer.confirm`).
    """
    ctx = request.app[CONTEXT]
    peer = request.app[PEERS].of(request.protocol)
    caller = identify(
        peer.pid,
        peer.uid,
        proc_root=ctx.proc_root,
        lookup=ctx.lookup,
        agent_cgroup=ctx.agent_cgroup,
        node_name=ctx.node_name,
        pods_problem=ctx.pods_problem(),
        agent_uid=ctx.agent_uid,
    )
    peer.confirm(proc_root=ctx.proc_root)
    return caller


def command_of(process: ProcessView, *, ctx: ApiContext) -> str:
    """The command line of a listed GPU process, or ``""``.

    The reading may be ``interval_s`` old; by now its PID may belong to a
    different process. The command line is shown only if the process holding
    the PID runs in the container the reading says, and still holds it after
    its command line was read: a container never sees a stranger's command.
    """
    try:
        with ctx.open_process(process.pid, proc_root=ctx.proc_root) as handle:
            cgroup = read_process_cgroup(process.pid, proc_root=ctx.proc_root)
            owner = pick_container(cgroup, known=lambda c: ctx.lookup(c) is not None)
            if owner != process.container_id:
                return ""
            text = read_command(process.pid, proc_root=ctx.proc_root)
            return text if handle.alive() else ""
    except (ProcessGoneError, CgroupFormatError):
        return ""


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error as a ``Status`` document, never an HTML page or a traceback."""
    try:
        return await handler(request)
    except CallerRefusedError as exc:
        logger.info("mgctl caller refused: %s", exc, extra={"path": request.path})
        return status_response(403, "Forbidden", str(exc))
    except web.HTTPNotFound:
        return status_response(
            404,
            "NotFound",
            f"no endpoint {request.method} {request.path}; this agent serves "
            f"GET /{API_VERSION}/version, /{API_VERSION}/processes, /{API_VERSION}/devices "
            f"and POST /{API_VERSION}/kill",
        )
    except web.HTTPMethodNotAllowed:
        return status_response(405, "MethodNotAllowed", f"{request.method} {request.path}")
    except asyncio.CancelledError:
        raise
    except Exception:
        logger.exception("mgctl API request failed", extra={"path": request.path})
        return status_response(500, "InternalError", "the agent failed; see its log")


def _snapshot(request: web.Request) -> Snapshot | web.Response:
    snap = request.app[CONTEXT].snapshot()
    if snap is None:
        return status_response(
            503,
            "ServiceUnavailable",
            "the agent has not finished its first reading yet; try again in a few seconds",
        )
    return snap


async def get_version(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    return web.json_response(
        {
            "apiVersion": API_VERSION,
            "kind": "Version",
            "agentVersion": ctx.version,
            "node": ctx.node_name or "",
            "backend": ctx.backend,
        }
    )


async def get_processes(request: web.Request) -> web.Response:
    caller = identify_request(request)
    snap = _snapshot(request)
    if isinstance(snap, web.Response):
        return snap
    ctx = request.app[CONTEXT]
    # A few /proc reads per process: off the event loop.
    doc = await asyncio.to_thread(
        process_list, snap, caller, node=ctx.node_name, command=partial(command_of, ctx=ctx)
    )
    return web.json_response(doc)


async def get_devices(request: web.Request) -> web.Response:
    caller = identify_request(request)
    snap = _snapshot(request)
    if isinstance(snap, web.Response):
        return snap
    return web.json_response(device_list(snap, caller, node=request.app[CONTEXT].node_name))


async def post_kill(request: web.Request) -> web.Response:
    caller = identify_request(request)
    body = await _json_body(request)
    if isinstance(body, web.Response):
        return body
    pid = body.get("pid")
    sig_name = str(body.get("signal", "KILL")).upper().removeprefix("SIG")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return status_response(400, "BadRequest", f'"pid" must be a positive integer: {pid!r}')
    if sig_name not in SIGNALS:
        return status_response(
            400, "BadRequest", f"signal must be one of {', '.join(SIGNALS)}: {sig_name!r}"
        )
    snap = _snapshot(request)
    if isinstance(snap, web.Response):
        return snap
    try:
        process = authorize_kill(snap, caller, pid)
    except KillNotAllowedError as exc:
        logger.warning("mgctl kill refused: %s", exc, extra={"caller": caller.describe()})
        return status_response(403, "Forbidden", str(exc))
    except NotAGpuProcessError as exc:
        return status_response(404, "NotFound", str(exc))
    ctx = request.app[CONTEXT]
    outcome = kill_share_processes(
        [pid],
        container_id=process.container_id,
        proc_root=ctx.proc_root,
        known=lambda c: ctx.lookup(c) is not None,
        sig=SIGNALS[sig_name],
        open_process=ctx.open_process,
    )
    if outcome.killed:
        logger.warning(
            "mgctl kill: sent SIG%s to GPU process %d",
            sig_name,
            pid,
            extra={"caller": caller.describe(), "gpu": process.gpu_uuid},
        )
        result = "signalled"
    elif outcome.gone:
        result = "gone"
    elif outcome.skipped:
        return status_response(
            409,
            "Conflict",
            f"PID {pid} now belongs to another process than the one listed; not signalled",
        )
    else:
        error = outcome.failed.get(pid, "unknown error")
        return status_response(500, "InternalError", f"could not signal PID {pid}: {error}")
    return web.json_response(
        {
            "apiVersion": API_VERSION,
            "kind": "KillResult",
            "pid": pid,
            "signal": sig_name,
            "result": result,
        }
    )


async def _json_body(request: web.Request) -> dict[str, Any] | web.Response:
    """The whole request body as a JSON object, or the error response.

    A declared ``Content-Length`` over the limit is refused at once, without
    waiting for a body that may never come. Otherwise the body is read to its
    end: ``content.read(n)`` returns what has *arrived*, so a body written in
    two pieces (or chunked) would otherwise be judged by its first piece.
    """
    too_large = status_response(
        413, "RequestEntityTooLarge", f"request body too large (at most {MAX_BODY_BYTES} bytes)"
    )
    declared = request.content_length
    if declared is not None and declared > MAX_BODY_BYTES:
        return too_large
    raw = bytearray()
    while chunk := await request.content.read(MAX_BODY_BYTES + 1 - len(raw)):
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            return too_large
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        return status_response(400, "BadRequest", f"request body is not JSON: {exc}")
    if not isinstance(body, dict):
        return status_response(400, "BadRequest", "request body must be a JSON object")
    return body


def build_app(ctx: ApiContext, peers: PeerRegistry) -> web.Application:
    """The mgctl API application; ``peers`` holds the pinned peer of each connection."""
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
    app[CONTEXT] = ctx
    app[PEERS] = peers
    app.router.add_get(f"/{API_VERSION}/version", get_version)
    app.router.add_get(f"/{API_VERSION}/processes", get_processes)
    app.router.add_get(f"/{API_VERSION}/devices", get_devices)
    app.router.add_post(f"/{API_VERSION}/kill", post_kill)
    return app


class ApiServer:
    """Serves :func:`build_app` on a unix socket; an async context manager.

    It accepts connections itself (:meth:`_accept`) and hands each to aiohttp
    with ``loop.connect_accepted_socket``, so that the peer is pinned the
    moment the connection is accepted. ``pin`` replaces
    :func:`~plugin.agent.peers.pin_peer` (tests force its fallbacks).

    The socket file is watched (:meth:`_keep_socket`): if it disappears, the
    server listens on a new one; at :meth:`stop` it is removed only if it is
    still the file this server bound (another agent may have replaced it).
    """

    def __init__(
        self,
        ctx: ApiContext,
        socket_path: Path,
        *,
        pin: Callable[[socket.socket], Peer] | None = None,
        check_interval_s: float = SOCKET_CHECK_INTERVAL_S,
    ) -> None:
        self.socket_path = socket_path
        self.peers = PeerRegistry()
        self._pin = pin or partial(pin_peer, proc_root=ctx.proc_root)
        self._check_interval_s = check_interval_s
        self._runner = web.AppRunner(
            build_app(ctx, self.peers), handle_signals=False, shutdown_timeout=1.0, access_log=None
        )
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._keeping: asyncio.Task[None] | None = None
        self._bound: tuple[int, int, int] | None = None
        """Identity of the socket file this server bound last (:func:`_file_identity`)."""

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Create the directory, replace a stale socket, listen, open the file mode."""
        self.socket_path.parent.mkdir(mode=SOCKET_DIR_MODE, parents=True, exist_ok=True)
        if self.socket_path.is_socket() or self.socket_path.is_symlink():
            # Left by an agent that did not stop cleanly, or still served by an
            # older agent on its way out (an upgrade): the newest agent serves.
            self.socket_path.unlink()
        await self._runner.setup()
        assert self._runner.server is not None  # set by setup()
        self._forget_peers_of_closed_connections(self._runner.server)
        self._listen()
        self._keeping = asyncio.create_task(self._keep_socket(), name="mgctl API socket check")

    def _listen(self) -> None:
        """Bind a listener at :attr:`socket_path` and start accepting on it."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.socket_path))
            os.chmod(self.socket_path, SOCKET_MODE)
            self._bound = _file_identity(self.socket_path)
            listener.listen(ACCEPT_BACKLOG)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._accepting = asyncio.create_task(self._accept(listener), name="mgctl API accept")
        logger.info("mgctl API listening", extra={"socket": str(self.socket_path)})

    async def _stop_listening(self) -> None:
        """Stop accepting and close the listener (open connections stay)."""
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
            self._accepting = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    async def _keep_socket(self) -> None:
        """Listen on a new socket whenever the file disappears.

        Another agent may remove it: an older agent that stops after this one
        replaced its socket (an upgrade's overlap) and removes the file without
        checking whose it is. A file that is there but not this server's
        belongs to a newer agent on the node, and is left alone."""
        while True:
            await asyncio.sleep(self._check_interval_s)
            if _file_identity(self.socket_path) is not None:
                continue
            logger.warning(
                "the mgctl API socket was removed (by another agent stopping?); listening again",
                extra={"socket": str(self.socket_path)},
            )
            await self._stop_listening()
            try:
                self.socket_path.parent.mkdir(mode=SOCKET_DIR_MODE, parents=True, exist_ok=True)
                self._listen()
            except OSError as exc:  # another agent bound it meanwhile, or the dir is gone
                logger.warning(
                    "mgctl API cannot listen again: %s",
                    exc,
                    extra={"socket": str(self.socket_path)},
                )

    def _forget_peers_of_closed_connections(self, server: web.Server) -> None:
        """Release a connection's peer (and its pidfd) as soon as the connection is lost.

        aiohttp's request handler reports a lost connection to its server
        (``Server.connection_lost(handler, exc)``); this server instance's
        method is wrapped so the registry hears of it too. Without it each
        connection would leave a pidfd open until the agent stops."""
        forward = server.connection_lost

        def connection_lost(handler: web.RequestHandler, exc: BaseException | None = None) -> None:
            try:
                forward(handler, exc)
            finally:
                self.peers.discard(handler)

        server.connection_lost = connection_lost  # type: ignore[method-assign]

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None  # set by setup()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS: wait, as asyncio's servers do
                logger.warning("mgctl API cannot accept a connection: %s", exc)
                await asyncio.sleep(ACCEPT_RETRY_DELAY_S)
                continue
            await self._connect(conn, loop=loop, server=server)

    async def _connect(
        self, conn: socket.socket, *, loop: asyncio.AbstractEventLoop, server: web.Server
    ) -> None:
        """Pin the peer of ``conn``, then hand the connection to aiohttp."""
        try:
            peer = self._pin(conn)  # first of all: see plugin.agent.peers
        except OSError as exc:
            logger.warning("mgctl API cannot read a connection's peer: %s", exc)
            conn.close()
            return
        handlers: list[web.RequestHandler] = []

        def protocol() -> web.RequestHandler:
            handler = server()
            self.peers.add(handler, peer)  # before the protocol can read a request
            handlers.append(handler)
            return handler

        try:
            await loop.connect_accepted_socket(protocol, conn)
        except BaseException as exc:
            for handler in handlers:
                self.peers.discard(handler)
            peer.close()
            conn.close()
            if not isinstance(exc, Exception):
                raise
            logger.warning("mgctl API could not set up a connection: %s", exc)
            return

    async def stop(self) -> None:
        """Stop accepting, close the connections, remove the socket file if it is ours."""
        if self._keeping is not None:
            self._keeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeping
            self._keeping = None
        await self._stop_listening()
        await asyncio.shield(self._runner.cleanup())
        self.peers.close_all()
        current = _file_identity(self.socket_path)
        if self._bound is not None and current == self._bound:
            self.socket_path.unlink(missing_ok=True)
        elif self._bound is not None and current is not None:
            logger.info(
                "leaving the mgctl API socket to the agent that replaced it",
                extra={"socket": str(self.socket_path)},
            )


def _file_identity(path: Path) -> tuple[int, int, int] | None:
    """``(st_dev, st_ino, st_ctime_ns)`` of ``path`` itself (not a link's target); None
    if it is gone.

    The inode number alone is not enough: a file system hands a freed inode
    number to the next file, so a socket another agent bound right after
    removing this one's can have its number. Its change time is the moment it
    was bound (and chmod-ed), which differs unless both happened within one
    clock tick."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


def install_mgctl(directory: Path, *, version: str = "unknown") -> Path:
    """Copy the stdlib-only ``mgctl`` program into ``directory`` (atomically, mode 0755).

    The directory is mounted read-only into every metagpu container, so
    ``/var/run/metagpu/mgctl get processes`` works in any image with a Python 3,
    and always matches the agent's API version. The agent's ``version`` is
    stamped into the copy (the container has no metagpu package to ask).
    """
    source = Path(mgctl.__file__).read_text(encoding="utf-8")
    stamp = f"_EMBEDDED_VERSION = {json.dumps(version)}"
    if _VERSION_LINE not in source:
        raise RuntimeError(f"plugin/agent/mgctl.py lost its {_VERSION_LINE!r} line")
    source = source.replace(_VERSION_LINE, stamp, 1)
    directory.mkdir(mode=SOCKET_DIR_MODE, parents=True, exist_ok=True)
    target = directory / MGCTL_FILE_NAME
    tmp = directory / f".{MGCTL_FILE_NAME}.tmp"
    tmp.write_text(source, encoding="utf-8")
    tmp.chmod(0o755)
    os.replace(tmp, target)
    logger.info("installed mgctl", extra={"path": str(target)})
    return target
