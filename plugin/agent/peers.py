"""Adapter: who is at the other end of an mgctl connection, pinned when it is accepted.

The kernel records the peer's PID and UID at ``connect()`` (``SO_PEERCRED``)
and keeps them for the connection's life. But the PID is only a number: the
process can hand the socket to a child and exit, and once it is reaped the
number may be given to anyone, a host root process or another tenant's. A
caller identified from the number alone on every request would, with a
long-lived connection, eventually be identified as whoever holds the number
now.

So the connection's process is pinned (:mod:`plugin.agent.processes`), best
first:

1. ``SO_PEERPIDFD`` (Linux 6.5+): a pidfd for the very process that called
   ``connect()``, taken by the kernel at that moment. No window at all.
2. ``pidfd_open(pid)`` the moment the agent accepts the connection. The window
   is between the client's ``connect()`` and the agent's ``accept()``: the
   client does not control it (the agent accepts at once), and it is far
   shorter than cycling through the PID space.
3. Without pidfds: the process's start time, read at the same moment.

For each request, :meth:`Peer.confirm` runs *after* the caller's cgroup has
been read: the pinned process must still exist, so the number was never free
in between and the cgroup read was its own; and it must not have exited (a
zombie keeps its number, but on cgroup v1 the kernel shows every zombie in the
root cgroup, which would read as a host process).
"""

from __future__ import annotations

import errno
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from plugin.agent.cgroups import ProcessGoneError
from plugin.agent.identity import CallerRefusedError
from plugin.agent.processes import ProcessHandle, ProcStatError, open_process, read_proc_stat

SO_PEERPIDFD: Final = int(getattr(socket, "SO_PEERPIDFD", 77))
"""Linux 6.5+; Python names it only from 3.14 on."""
_PEERCRED: Final = struct.Struct("3i")


@dataclass
class Peer:
    """The process that opened one connection, as pinned at accept."""

    pid: int
    """From ``SO_PEERCRED``: 0 when the caller is in a PID namespace the agent cannot see."""
    uid: int
    process: ProcessHandle | None
    """None when ``pid`` is 0 or the process could not be pinned (see ``problem``)."""
    problem: str | None = None
    """Why no request on this connection can be answered, for the caller to read."""

    def confirm(self, *, proc_root: Path) -> None:
        """Raise :class:`CallerRefusedError` unless the pinned process still holds ``pid``
        and has not exited. Call it after reading anything about the caller from /proc."""
        if self.problem is not None:
            raise CallerRefusedError(self.problem)
        if self.process is None:
            raise CallerRefusedError(f"the process behind PID {self.pid} could not be pinned")
        try:
            stat = read_proc_stat(self.pid, proc_root=proc_root)
        except ProcessGoneError as exc:
            raise CallerRefusedError(self._gone()) from exc
        except ProcStatError as exc:
            raise CallerRefusedError(f"cannot verify calling process {self.pid}: {exc}") from exc
        if stat.exited or not self.process.alive():
            raise CallerRefusedError(self._gone())

    def close(self) -> None:
        """Release the pidfd (idempotent)."""
        if self.process is not None:
            self.process.close()

    def _gone(self) -> str:
        return (
            f"the process that opened this connection (PID {self.pid}) has exited; its PID "
            "may now belong to another process, so requests on this connection are refused "
            "(open a new connection)"
        )


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """``(pid, uid)`` that the kernel recorded when the peer called ``connect()``."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, _gid = _PEERCRED.unpack(raw)
    return pid, uid


def pin_peer(
    sock: socket.socket, *, proc_root: Path, peer_pidfd: bool = True, use_pidfd: bool = True
) -> Peer:
    """Pin the process at the other end of the just-accepted ``sock``.

    ``peer_pidfd=False`` and ``use_pidfd=False`` force the fallbacks (for tests
    of older kernels). Never raises for a peer that is gone: the :class:`Peer`
    then carries the ``problem`` every request on the connection is refused with.
    """
    pid, uid = peer_credentials(sock)
    if pid <= 0:
        return Peer(pid, uid, None)  # identify() says why: the agent needs hostPID
    if peer_pidfd:
        try:
            fd = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
        except OSError as exc:
            if exc.errno != errno.ENOPROTOOPT:  # ENOPROTOOPT: a kernel before 6.5
                return Peer(pid, uid, None, problem=_exited_early(pid))
        else:
            return Peer(pid, uid, ProcessHandle(pid, proc_root=proc_root, pidfd=fd))
    try:
        process = open_process(pid, proc_root=proc_root, use_pidfd=use_pidfd)
    except ProcessGoneError:
        return Peer(pid, uid, None, problem=_exited_early(pid))
    return Peer(pid, uid, process)


def _exited_early(pid: int) -> str:
    return f"calling process {pid} exited before it could be identified"


class PeerRegistry:
    """The pinned peer of each open connection, keyed by the connection's protocol object.

    :class:`~plugin.agent.api.ApiServer` adds a peer as the connection's
    protocol is created (before any byte of a request can be read) and
    discards it once the connection's transport is gone; :meth:`close_all`
    releases what is left at shutdown.
    """

    def __init__(self) -> None:
        self._peers: dict[object, Peer] = {}

    def __len__(self) -> int:
        return len(self._peers)

    def add(self, connection: object, peer: Peer) -> None:
        self._peers[connection] = peer

    def discard(self, connection: object) -> None:
        """Forget ``connection`` and release its pidfd (idempotent)."""
        peer = self._peers.pop(connection, None)
        if peer is not None:
            peer.close()

    def of(self, connection: object) -> Peer:
        """The peer of ``connection``; :class:`CallerRefusedError` when there is none."""
        peer = self._peers.get(connection)
        if peer is None:
            raise CallerRefusedError("the agent API only answers on its unix socket")
        return peer

    def close_all(self) -> None:
        for peer in self._peers.values():
            peer.close()
        self._peers.clear()
