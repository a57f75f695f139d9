"""The directory watcher, with real inotify and with the polling fallback."""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path

import pytest

from plugin.deviceplugin.inotify import (
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_Q_OVERFLOW,
    DirectoryWatcher,
    DirEvent,
    WatchMode,
    parse_events,
)


async def next_event(watcher: DirectoryWatcher, wanted: DirEvent) -> None:
    """Wait for ``wanted``; other events (e.g. a temp file) are skipped."""
    async with asyncio.timeout(5):
        while await watcher.get() != wanted:
            pass


def bind_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


@pytest.mark.parametrize("mode", ["inotify", "polling"])
async def test_sees_sockets_created_and_deleted(short_tmp_path: Path, mode: WatchMode) -> None:
    async with DirectoryWatcher(short_tmp_path, mode=mode, poll_interval_s=0.02) as watcher:
        assert watcher.mode == mode
        sock = bind_socket(short_tmp_path / "kubelet.sock")
        await next_event(watcher, DirEvent("created", "kubelet.sock"))
        (short_tmp_path / "kubelet.sock").unlink()
        sock.close()
        await next_event(watcher, DirEvent("deleted", "kubelet.sock"))


async def test_polling_sees_a_replaced_file(short_tmp_path: Path) -> None:
    """Deleted and re-created between two polls, possibly with the same inode number
    (ext4 reuses a freed inode at once): the change time tells them apart."""
    path = short_tmp_path / "kubelet.sock"
    first = bind_socket(path)
    async with DirectoryWatcher(short_tmp_path, mode="polling", poll_interval_s=0.05) as watcher:
        path.unlink()
        first.close()
        second = bind_socket(path)
        try:
            await next_event(watcher, DirEvent("deleted", "kubelet.sock"))
            await next_event(watcher, DirEvent("created", "kubelet.sock"))
        finally:
            second.close()


async def test_missing_directory_is_an_error(short_tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        async with DirectoryWatcher(short_tmp_path / "nope", mode="inotify"):
            pass


@pytest.mark.parametrize("mode", ["inotify", "polling"])
async def test_directory_removed_is_reported(short_tmp_path: Path, mode: WatchMode) -> None:
    watched = short_tmp_path / "plugins"
    watched.mkdir()
    async with DirectoryWatcher(watched, mode=mode, poll_interval_s=0.02) as watcher:
        watched.rmdir()
        await next_event(watcher, DirEvent("gone"))


def record(mask: int, name: bytes = b"") -> bytes:
    padded = name + b"\0" * (16 - len(name)) if name else b""
    return struct.pack("iIII", 1, mask, 0, len(padded)) + padded


def test_parse_events() -> None:
    data = (
        record(IN_CREATE, b"kubelet.sock")
        + record(IN_DELETE, b"metagpu-metagpu.sock")
        + record(IN_Q_OVERFLOW)
        + record(IN_DELETE_SELF)
    )
    assert parse_events(data) == [
        DirEvent("created", "kubelet.sock"),
        DirEvent("deleted", "metagpu-metagpu.sock"),
        DirEvent("overflow"),
        DirEvent("gone"),
    ]
