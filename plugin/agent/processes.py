"""A process held by its identity, not by its PID number.

A PID is a number the kernel hands out again once its process has been reaped.
Whatever the agent does in two steps ("read ``/proc/<pid>/cgroup``, then
signal ``<pid>``"; "identify the peer of a connection, then answer it") must be
sure both steps concern the same process. A pidfd (Linux 5.3+) refers to one
process for its whole life: a signal sent through it can never reach a later
process that got the same number, and signal 0 through it says whether that
process still exists. Hence the order everywhere: **pin** the process, read
``/proc/<pid>/…`` by number, then check the pinned process is **still there**.
If it is, the number was never free in between, so what was read was its own.

Where the kernel has no pidfds (``pidfd_open`` fails with ``ENOSYS``: a kernel
before 5.3 or a sandbox that filters the call), a handle pins the process by
its start time instead (field 22 of ``/proc/<pid>/stat``, clock ticks since
boot): a process that got the number later started later. That fallback is
weaker in one way only: its final ``kill(2)`` goes by number, microseconds
after the last check.

Adapter (``os``, ``signal`` and procfs); the parsing of ``stat`` is pure.
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from plugin.agent.cgroups import ProcessGoneError, read_proc_text

PinnedBy = Literal["pidfd", "start-time"]

_NO_PIDFD_ERRNOS: Final = frozenset({errno.ENOSYS, errno.EPERM, errno.EOPNOTSUPP})
"""``pidfd_open`` errors that mean "no pidfds here" (a seccomp filter may answer
EPERM), not "no such process"."""

EXITED_STATES: Final = frozenset({"Z", "X", "x"})
"""``/proc/<pid>/stat`` states of a process that has exited (zombie, dead). A
zombie still holds its PID, but its cgroup file no longer tells where it ran: on
cgroup v1 the kernel shows every zombie in the root cgroup."""


class ProcStatError(ValueError):
    """A ``/proc/<pid>/stat`` file that is not in the kernel's format."""


@dataclass(frozen=True)
class ProcStat:
    """The two fields of ``/proc/<pid>/stat`` the agent needs."""

    state: str
    """``R``, ``S``, ``D``, ``Z`` (zombie), …"""
    start_ticks: int
    """When the process started, in clock ticks since boot (field 22)."""

    @property
    def exited(self) -> bool:
        """True for a zombie or dead process."""
        return self.state in EXITED_STATES


def parse_proc_stat(text: str) -> ProcStat:
    """Parse ``/proc/<pid>/stat``. The command name (field 2) is in parentheses and may
    itself contain spaces and ``)``, so the fields are counted after the *last* ``)``."""
    _, sep, rest = text.rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 20:
        raise ProcStatError(f"not a /proc/<pid>/stat line: {text[:80]!r}")
    try:
        start_ticks = int(fields[19])  # field 22; fields[0] is field 3 (state)
    except ValueError as exc:
        raise ProcStatError(f"field 22 (starttime) is not a number: {fields[19]!r}") from exc
    return ProcStat(state=fields[0], start_ticks=start_ticks)


def read_proc_stat(pid: int, *, proc_root: Path) -> ProcStat:
    """Read ``<proc_root>/<pid>/stat``.

    Raises :class:`ProcessGoneError` or :class:`ProcStatError`.
    """
    text = read_proc_text(proc_root / str(pid) / "stat", pid=pid, unreadable=ProcStatError)
    return parse_proc_stat(text)


class ProcessHandle:
    """One process, pinned (see the module docstring). Close it, or use it as a context manager."""

    def __init__(
        self, pid: int, *, proc_root: Path, pidfd: int | None, start_ticks: int | None = None
    ) -> None:
        if pidfd is None and start_ticks is None:
            raise ValueError(f"process {pid}: a handle needs a pidfd or a start time")
        self.pid = pid
        self._proc_root = proc_root
        self._pidfd = pidfd
        self._start_ticks = start_ticks
        self._closed = False
        self.pinned_by: PinnedBy = "pidfd" if pidfd is not None else "start-time"
        """How the process is held: a pidfd, or its start time (no pidfds on this kernel)."""

    def alive(self) -> bool:
        """True while the pinned process exists (a zombie still does: it holds its PID).
        False once the handle is closed."""
        if self._closed:
            return False
        if self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True  # it exists; we may just not signal it
            return True
        try:
            stat = read_proc_stat(self.pid, proc_root=self._proc_root)
        except (ProcessGoneError, ProcStatError):
            return False
        return stat.start_ticks == self._start_ticks

    def send(self, sig: int) -> None:
        """Signal the pinned process; :class:`ProcessLookupError` once it is gone."""
        if self._closed:
            raise ProcessLookupError(errno.ESRCH, f"process {self.pid}: handle closed")
        if self._pidfd is not None:
            signal.pidfd_send_signal(self._pidfd, sig)
            return
        if not self.alive():
            raise ProcessLookupError(errno.ESRCH, f"process {self.pid} is gone or was replaced")
        os.kill(self.pid, sig)

    def close(self) -> None:
        """Release the pidfd (idempotent); the handle answers "gone" from then on."""
        self._closed = True
        fd, self._pidfd = self._pidfd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> ProcessHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_process(pid: int, *, proc_root: Path, use_pidfd: bool = True) -> ProcessHandle:
    """Pin whichever process holds ``pid`` now. Raises :class:`ProcessGoneError`.

    ``use_pidfd=False`` forces the start-time fallback (for tests of kernels
    without pidfds).
    """
    if use_pidfd:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError as exc:
            raise ProcessGoneError(f"process {pid} is gone") from exc
        except OSError as exc:
            if exc.errno not in _NO_PIDFD_ERRNOS:
                raise
        else:
            return ProcessHandle(pid, proc_root=proc_root, pidfd=fd)
    try:
        stat = read_proc_stat(pid, proc_root=proc_root)
    except ProcStatError as exc:
        raise ProcessGoneError(f"process {pid} cannot be pinned: {exc}") from exc
    if stat.exited:
        raise ProcessGoneError(f"process {pid} has exited")
    return ProcessHandle(pid, proc_root=proc_root, pidfd=None, start_ticks=stat.start_ticks)
