"""Watch a directory for files appearing and disappearing (adapter: Linux inotify via ctypes).

The supervisor needs to know, within a fraction of a second, when the kubelet
re-creates ``kubelet.sock`` or deletes our socket (both mean "the kubelet
restarted; serve and register again"). NVIDIA's plugin uses fsnotify for this;
here it is ``inotify_init1``/``inotify_add_watch`` from libc through ctypes,
with the descriptor handed to the event loop (``loop.add_reader``), so no
thread and no dependency.

Where inotify is unavailable (not Linux, a seccomp profile that forbids it,
``fs.inotify.max_user_instances`` exhausted), :class:`DirectoryWatcher` falls
back to polling the directory every ``poll_interval_s`` and says so in the
log. Polling compares inode numbers and change times, so a file deleted and
re-created between two polls (exactly what a restarting kubelet does to
``kubelet.sock``) is still reported as deleted and created. The supervisor additionally checks
that its own socket still exists on a timer, so even a missed event costs at
most one check interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

# The name it had before plugin/ was split by concern: log lines (text and JSON
# show the logger) and any logging config that names it stay as they were.
logger = logging.getLogger("plugin.inotify")

# <sys/inotify.h>
IN_MOVED_FROM: Final = 0x00000040
IN_MOVED_TO: Final = 0x00000080
IN_CREATE: Final = 0x00000100
IN_DELETE: Final = 0x00000200
IN_DELETE_SELF: Final = 0x00000400
IN_MOVE_SELF: Final = 0x00000800
IN_Q_OVERFLOW: Final = 0x00004000
IN_IGNORED: Final = 0x00008000
IN_ONLYDIR: Final = 0x01000000
IN_NONBLOCK: Final = os.O_NONBLOCK
IN_CLOEXEC: Final = os.O_CLOEXEC
WATCH_MASK: Final = (
    IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
)
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len

EventKind = Literal["created", "deleted", "overflow", "gone"]
"""``overflow``: events were lost, re-check everything; ``gone``: the directory
itself was removed or moved."""
WatchMode = Literal["inotify", "polling"]


@dataclass(frozen=True)
class DirEvent:
    kind: EventKind
    name: str = ""
    """File name inside the directory ("" for overflow and gone)."""


class InotifyUnavailableError(OSError):
    """inotify cannot be used here; the watcher polls instead."""


class DirectoryWatcher:
    """``async with DirectoryWatcher(dir) as w: event = await w.get()``."""

    def __init__(
        self,
        directory: Path,
        *,
        mode: WatchMode | None = None,
        poll_interval_s: float = 0.25,
    ) -> None:
        self.directory = directory
        self.poll_interval_s = poll_interval_s
        self._requested = mode
        self.mode: WatchMode = mode or "inotify"
        self._queue: asyncio.Queue[DirEvent] = asyncio.Queue()
        self._fd: int | None = None
        self._poller: asyncio.Task[None] | None = None

    async def __aenter__(self) -> DirectoryWatcher:
        if self._requested in (None, "inotify"):
            try:
                self._start_inotify()
                return self
            except InotifyUnavailableError as exc:
                if self._requested == "inotify":
                    raise
                logger.warning(
                    "inotify unavailable (%s); polling %s every %ss instead",
                    exc,
                    self.directory,
                    self.poll_interval_s,
                )
        self.mode = "polling"
        initial = _scan(self.directory)  # now, not when the task first runs
        if initial is None and not self.directory.is_dir():
            raise FileNotFoundError(errno.ENOENT, "no such directory", str(self.directory))
        self._poller = asyncio.create_task(self._poll(initial), name=f"poll-{self.directory}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._fd is not None:
            asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None

    async def get(self) -> DirEvent:
        """The next event (waits)."""
        return await self._queue.get()

    # ------------------------------------------------------------- inotify
    def _start_inotify(self) -> None:
        libc_name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(libc_name, use_errno=True)
            init1 = libc.inotify_init1
            add_watch = libc.inotify_add_watch
        except (OSError, AttributeError, TypeError) as exc:
            raise InotifyUnavailableError(f"libc has no inotify: {exc}") from exc
        init1.argtypes = [ctypes.c_int]
        init1.restype = ctypes.c_int
        add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        add_watch.restype = ctypes.c_int
        fd = init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise InotifyUnavailableError(f"inotify_init1: {os.strerror(err)}")
        wd = add_watch(fd, os.fsencode(self.directory), WATCH_MASK)
        if wd < 0:
            err = ctypes.get_errno()
            os.close(fd)
            if err in (errno.ENOENT, errno.ENOTDIR):
                raise FileNotFoundError(err, os.strerror(err), str(self.directory))
            raise InotifyUnavailableError(f"inotify_add_watch {self.directory}: {os.strerror(err)}")
        self._fd = fd
        asyncio.get_running_loop().add_reader(fd, self._on_readable)

    def _on_readable(self) -> None:
        assert self._fd is not None
        try:
            data = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return
        except OSError as exc:
            logger.error("reading inotify events failed: %s", exc)
            self._queue.put_nowait(DirEvent("overflow"))
            return
        for event in parse_events(data):
            self._queue.put_nowait(event)

    # ------------------------------------------------------------- polling
    async def _poll(self, previous: dict[str, tuple[int, int]] | None) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            current = _scan(self.directory)
            if current is None:
                if previous is not None:
                    self._queue.put_nowait(DirEvent("gone"))
                previous = current
                continue
            before = previous or {}
            for name, inode in before.items():
                if current.get(name) != inode:
                    self._queue.put_nowait(DirEvent("deleted", name))
            for name, inode in current.items():
                if before.get(name) != inode:
                    self._queue.put_nowait(DirEvent("created", name))
            previous = current


def parse_events(data: bytes) -> list[DirEvent]:
    """Decode a buffer of ``struct inotify_event`` records."""
    events: list[DirEvent] = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        _wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
        offset += _HEADER.size
        raw = data[offset : offset + length]
        offset += length
        name = os.fsdecode(raw.split(b"\0", 1)[0])
        if mask & IN_Q_OVERFLOW:
            events.append(DirEvent("overflow"))
        elif mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
            events.append(DirEvent("gone"))
        elif mask & (IN_CREATE | IN_MOVED_TO):
            events.append(DirEvent("created", name))
        elif mask & (IN_DELETE | IN_MOVED_FROM):
            events.append(DirEvent("deleted", name))
    return events


def _scan(directory: Path) -> dict[str, tuple[int, int]] | None:
    """Name → (inode, ctime): ext4 hands a freed inode number straight to the next
    file, so a re-created socket can have its predecessor's inode; not its ctime."""
    found: dict[str, tuple[int, int]] = {}
    try:
        with os.scandir(directory) as entries:
            for e in entries:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # deleted while scanning
                found[e.name] = (st.st_ino, st.st_ctime_ns)
    except OSError:
        return None
    return found
