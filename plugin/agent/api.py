"""Adapter: the mgctl API, HTTP/1.1 + JSON on the agent's unix socket.

Endpoints (all under ``/v1``; documents built by :mod:`plugin.agent.views`):

=========================  ==============================================
``GET  /v1/version``       agent version, API version, node, GPU backend
``GET  /v1/processes``     GPU processes the caller may see
``GET  /v1/devices``       GPUs (node scope) or the caller's shares
``POST /v1/kill``          ``{"pid": N, "signal": "KILL"}``: kill a GPU process
=========================  ==============================================

Every request except ``/v1/version`` is identified by the peer credentials of
its connection (``SO_PEERCRED``, see :mod:`plugin.agent.identity`). Errors are
Kubernetes-style ``Status`` documents whose ``message`` mgctl prints as is.

The socket is mode 0666: containers run as arbitrary non-root UIDs and must be
able to connect. That is safe because the file mode is not the access control,
the caller's identity is: anyone may *connect*, and each caller then sees only
what its own container owns (a non-root host process sees nothing).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from plugin import mgctl
from plugin.agent.accounting import Snapshot
from plugin.agent.cgroups import ContainerId, read_command
from plugin.agent.containers import ContainerRef
from plugin.agent.enforcement import kill_share_processes
from plugin.agent.identity import Caller, CallerRefusedError, identify
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
_PEERCRED: Final = struct.Struct("3i")
_VERSION_LINE: Final = '_EMBEDDED_VERSION = "unknown"'


@dataclass(frozen=True)
class ApiContext:
    """What the handlers read; every field is a live view into the running agent."""

    snapshot: Callable[[], Snapshot | None]
    """The latest snapshot, or None before the first cycle finished."""
    lookup: Callable[[ContainerId], ContainerRef | None]
    pods_problem: Callable[[], str | None]
    proc_root: Path
    agent_container: ContainerId | None
    node_name: str | None
    version: str
    backend: str
    send_signal: Callable[[int, int], None] = os.kill


CONTEXT: Final = web.AppKey("context", ApiContext)


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


def peer_credentials(request: web.Request) -> tuple[int, int]:
    """``(pid, uid)`` of the process at the other end of the request's unix socket."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family != socket.AF_UNIX:
        raise CallerRefusedError("the agent API only answers on its unix socket")
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, _gid = _PEERCRED.unpack(raw)
    return pid, uid


def identify_request(request: web.Request) -> Caller:
    """The caller of ``request``; raises :class:`CallerRefusedError`."""
    ctx = request.app[CONTEXT]
    pid, uid = peer_credentials(request)
    return identify(
        pid,
        uid,
        proc_root=ctx.proc_root,
        lookup=ctx.lookup,
        agent_container=ctx.agent_container,
        node_name=ctx.node_name,
        pods_problem=ctx.pods_problem(),
    )


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
    # One /proc/<pid>/cmdline read per process: off the event loop.
    doc = await asyncio.to_thread(
        process_list,
        snap,
        caller,
        node=ctx.node_name,
        command=lambda pid: read_command(pid, proc_root=ctx.proc_root),
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
        send=ctx.send_signal,
        sig=SIGNALS[sig_name],
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
    raw = await request.content.read(MAX_BODY_BYTES + 1)
    if len(raw) > MAX_BODY_BYTES:
        return status_response(413, "RequestEntityTooLarge", "request body too large")
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        return status_response(400, "BadRequest", f"request body is not JSON: {exc}")
    if not isinstance(body, dict):
        return status_response(400, "BadRequest", "request body must be a JSON object")
    return body


def build_app(ctx: ApiContext) -> web.Application:
    """The mgctl API application."""
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
    app[CONTEXT] = ctx
    app.router.add_get(f"/{API_VERSION}/version", get_version)
    app.router.add_get(f"/{API_VERSION}/processes", get_processes)
    app.router.add_get(f"/{API_VERSION}/devices", get_devices)
    app.router.add_post(f"/{API_VERSION}/kill", post_kill)
    return app


class ApiServer:
    """Serves :func:`build_app` on a unix socket; an async context manager."""

    def __init__(self, ctx: ApiContext, socket_path: Path) -> None:
        self.socket_path = socket_path
        self._runner = web.AppRunner(
            build_app(ctx), handle_signals=False, shutdown_timeout=1.0, access_log=None
        )

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Create the directory, replace a stale socket, listen, open the file mode."""
        self.socket_path.parent.mkdir(mode=SOCKET_DIR_MODE, parents=True, exist_ok=True)
        if self.socket_path.is_socket() or self.socket_path.is_symlink():
            self.socket_path.unlink()  # left by a previous agent that did not stop cleanly
        await self._runner.setup()
        site = web.UnixSite(self._runner, str(self.socket_path))
        await site.start()
        os.chmod(self.socket_path, SOCKET_MODE)
        logger.info("mgctl API listening", extra={"socket": str(self.socket_path)})

    async def stop(self) -> None:
        """Stop serving and remove the socket file."""
        await asyncio.shield(self._runner.cleanup())
        self.socket_path.unlink(missing_ok=True)


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
        raise RuntimeError(f"plugin/mgctl.py lost its {_VERSION_LINE!r} line")
    source = source.replace(_VERSION_LINE, stamp, 1)
    directory.mkdir(mode=SOCKET_DIR_MODE, parents=True, exist_ok=True)
    target = directory / MGCTL_FILE_NAME
    tmp = directory / f".{MGCTL_FILE_NAME}.tmp"
    tmp.write_text(source, encoding="utf-8")
    tmp.chmod(0o755)
    os.replace(tmp, target)
    logger.info("installed mgctl", extra={"path": str(target)})
    return target
