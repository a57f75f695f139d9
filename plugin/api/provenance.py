"""Who wrote a node file, and whether that is still true: state one process shares with another.

The device plugin and the node agent run in different pods of one node and
share state through files on the host (today one: the GPU health board,
:mod:`plugin.gpu.health_file`). A file outlives the process that wrote it: a
plugin that crashed, a release that was uninstalled, a node that rebooted all
leave the last document behind, and a reader that trusts it publishes GPUs
that do not exist (a real install labelled a driverless node with two healthy
A100s from a file an earlier install had left; HAMi #1839 and #2923 are the
same failure in a peer). So such a file is trusted only while it is *provably
current*, and carries what proves it (:class:`Stamp`):

* the **boot ID** (``/proc/sys/kernel/random/boot_id``): a file from before
  the node's last boot describes hardware and processes that are gone;
* the **writer**: its PID and its start time in clock ticks after boot
  (field 22 of ``/proc/<pid>/stat``). A PID alone is recycled; the pair is
  unique within a boot. The reader checks that this process still runs;
* a **freshness bound**: the writer rewrites the file well within
  ``validForS`` even when nothing changed, so a writer that hangs, or one the
  reader cannot see, goes stale by the clock alone.

:func:`judge` applies the rule (pure: the reader's boot ID, the time and a
"does this process run" function are passed in) and returns *why* a file is
not current, for logs and ``mgctl``. :class:`ProcessProbe` is the procfs side.

PID namespaces. The plugin's pod has its own PID namespace, so the PID it
records is the one it sees (often 1), not the host's. The agent runs with the
host's (``hostPID``): it first looks at that PID in its own ``/proc`` and, if
that is not the writer, finds the process whose start time matches and whose
innermost PID (the last ``NSpid`` of ``/proc/<pid>/status``) is the recorded
one. Start times are counted from boot, the same in every PID namespace. The
search reads one small file per process, and runs once per writer: a process
found is re-checked by its host PID, and one found gone stays gone (a start
time never comes back).

Standard library only: the plugin writes with it and the agent reads with it,
and neither may pull the other's dependencies in.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

BOOT_ID_FILE: Final = Path("sys/kernel/random/boot_id")
"""Relative to a procfs root."""
DEFAULT_PROC_ROOT: Final = Path("/proc")
_START_TIME_FIELD: Final = 22
"""``starttime`` in ``proc(5)``: the process's start, in clock ticks after boot."""


class ProvenanceError(ValueError):
    """A stamp in a document is malformed (the whole document is then not trusted)."""


@dataclass(frozen=True)
class Writer:
    """One process on one boot of one node."""

    boot_id: str
    pid: int
    """As the writer sees it (its own PID namespace)."""
    start_ticks: int
    """Clock ticks after boot at which it started (``/proc/<pid>/stat`` field 22)."""

    def describe(self) -> str:
        return f"process {self.pid} (started {self.start_ticks} ticks after boot)"


@dataclass(frozen=True)
class Stamp:
    """Provenance carried inside a shared file."""

    writer: Writer
    written_at: float
    """Wall-clock seconds since the epoch of the last (re)write."""
    valid_for_s: float
    """The writer promises to rewrite the file before this many seconds pass."""

    def to_json(self) -> dict[str, Any]:
        return {
            "writer": {
                "bootId": self.writer.boot_id,
                "pid": self.writer.pid,
                "startTicks": self.writer.start_ticks,
            },
            "writtenAt": self.written_at,
            "validForS": self.valid_for_s,
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> Stamp | None:
        """The stamp of a document written by :meth:`to_json`'s fields at its top level;
        None when it has none (a release from before stamps). Raises :class:`ProvenanceError`."""
        writer = document.get("writer")
        if writer is None:
            return None
        try:
            stamp = cls(
                writer=Writer(
                    boot_id=str(writer["bootId"]),
                    pid=int(writer["pid"]),
                    start_ticks=int(writer["startTicks"]),
                ),
                written_at=float(document["writtenAt"]),
                valid_for_s=float(document["validForS"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProvenanceError(f"malformed writer stamp: {exc!r}") from exc
        if stamp.valid_for_s <= 0:
            raise ProvenanceError(f"validForS must be positive, not {stamp.valid_for_s}")
        return stamp


def judge(
    stamp: Stamp | None,
    *,
    boot_id: str | None,
    now: float,
    running: Callable[[Writer], bool],
) -> str | None:
    """None when the stamped file is current; otherwise why not (one clause, for
    "<file> is not current: <reason>"). Cheap checks first: ``running`` may read procfs."""
    if stamp is None:
        return "it does not say which process wrote it (written by an older release?)"
    if boot_id is None:
        return "this node's boot ID cannot be read, so the file's boot cannot be checked"
    writer = stamp.writer
    if writer.boot_id != boot_id:
        return "it was written before this node last booted"
    age = now - stamp.written_at
    if age > stamp.valid_for_s:
        return (
            f"it was last refreshed {age:.0f} s ago, and its writer promised to refresh it "
            f"within {stamp.valid_for_s:g} s"
        )
    if age < -stamp.valid_for_s:
        return f"it claims to be written {-age:.0f} s in the future (did the clock move?)"
    if not running(writer):
        return f"its writer, {writer.describe()}, is no longer running"
    return None


def read_boot_id(proc_root: Path = DEFAULT_PROC_ROOT) -> str:
    """This boot's ID. Raises OSError."""
    return (proc_root / BOOT_ID_FILE).read_text(encoding="ascii").strip()


def read_start_ticks(pid: int | str, proc_root: Path = DEFAULT_PROC_ROOT) -> int:
    """When process ``pid`` started, in clock ticks after boot. Raises OSError
    (FileNotFoundError: no such process) or ValueError (not a stat line)."""
    text = (proc_root / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    # The command name (field 2) is in parentheses and may hold spaces or ')'.
    fields = text.rpartition(")")[2].split()
    return int(fields[_START_TIME_FIELD - 3])


def current_writer(proc_root: Path = DEFAULT_PROC_ROOT) -> Writer:
    """This process as a :class:`Writer`. Raises OSError or ValueError."""
    pid = os.getpid()
    return Writer(
        boot_id=read_boot_id(proc_root),
        pid=pid,
        start_ticks=read_start_ticks(pid, proc_root),
    )


class ProcessProbe:
    """Does a :class:`Writer` still run? Answered from the reader's procfs (see the
    module docstring for PID namespaces). Not thread-safe: one owner."""

    def __init__(self, proc_root: Path = DEFAULT_PROC_ROOT) -> None:
        self.proc_root = proc_root
        self._host_pid: dict[Writer, int] = {}
        self._gone: set[Writer] = set()

    def boot_id(self) -> str | None:
        try:
            return read_boot_id(self.proc_root)
        except OSError:
            return None

    def running(self, writer: Writer) -> bool:
        if writer in self._gone:
            return False
        known = self._host_pid.get(writer)
        if known is not None and self._started_at(known) == writer.start_ticks:
            return True
        self._host_pid.pop(writer, None)
        if self._started_at(writer.pid) == writer.start_ticks:
            self._host_pid[writer] = writer.pid
            return True
        found = self._search(writer)
        if found is None:
            self._gone.add(writer)
            return False
        self._host_pid[writer] = found
        return True

    def _started_at(self, pid: int) -> int | None:
        try:
            return read_start_ticks(pid, self.proc_root)
        except (OSError, ValueError, IndexError):
            return None

    def _search(self, writer: Writer) -> int | None:
        """The host PID of ``writer`` running in another PID namespace, or None."""
        try:
            entries = os.listdir(self.proc_root)
        except OSError:
            return None
        for name in entries:
            if not name.isdigit() or self._started_at(int(name)) != writer.start_ticks:
                continue
            if _innermost_pid(self.proc_root / name / "status") == writer.pid:
                return int(name)
        return None


def _innermost_pid(status: Path) -> int | None:
    """The last ``NSpid`` of a ``/proc/<pid>/status``: the PID the process sees itself as."""
    try:
        text = status.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            parts = line.split()[1:]
            return int(parts[-1]) if parts and parts[-1].isdigit() else None
    return None
