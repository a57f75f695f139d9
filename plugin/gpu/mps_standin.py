"""A stand-in for ``nvidia-cuda-mps-control`` (standard library only), for GPU-less runs.

``python -m plugin.gpu.mps_standin [-d]`` behaves as NVIDIA documents the real
program (``man nvidia-cuda-mps-control``; MPS docs, "Legacy MPS v2 Interface"),
restricted to what metagpu uses, so the supervisor's subprocess path
(:mod:`plugin.gpu.mps_control`) runs unchanged against it:

* ``-d``: start the control daemon in the background and return 0 once it
  listens; 1 with "An instance of this daemon is already running" when a live
  daemon holds the pipe directory. Pipes in ``CUDA_MPS_PIPE_DIRECTORY`` (default
  ``/tmp/nvidia-mps``), the PID in ``nvidia-cuda-mps-control.pid`` there, the log
  in ``CUDA_MPS_LOG_DIRECTORY`` (default ``/var/log/nvidia-mps``) ``control.log``,
  one ``Cmd:<command>`` line per command as the real log has;
* no argument: the front end. It "keeps reading commands from stdin until EOF",
  prints each reply, prints an error message for a rejected command and still
  exits 0; exits 1 when "the daemon is not found or connection to the daemon is
  broken unexpectedly";
* commands: ``get_server_list`` (PIDs, one per line; none here, the stand-in
  starts no MPS server), ``set_default_active_thread_percentage <pct>``,
  ``get_default_active_thread_percentage`` (``100.0``),
  ``set_default_device_pinned_mem_limit <dev> <value>`` (value: an integer and
  ``M`` or ``G``), ``get_default_device_pinned_mem_limit <dev>``, ``quit``
  (synchronous: the front end returns once the daemon is gone; the defaults are
  lost with it, as the docs say).

Replies the docs leave open follow what driver 580.159.04 answered on an H100
(docs/benchmarks.md, "MPS"): ``set_default_active_thread_percentage`` answers the
default afterwards (``100.0``) and leaves it unchanged for an out-of-range value;
``get_default_device_pinned_mem_limit`` shows whole GiB rounded down (``79G`` for
``81559M``) and nothing for a device given by UUID; an unknown command answers
``Unknown command "<cmd>"``, exit status 0.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Final

PID_FILE: Final = "nvidia-cuda-mps-control.pid"
SOCKET: Final = "control"
END: Final = b"\x04\n"
"""Ends each reply on the stand-in's own socket protocol (not NVIDIA's)."""

_LIMIT = re.compile(r"^\d+[MG]$")


def _pipe_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")


def _log_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or "/var/log/nvidia-mps")


# ---------------------------------------------------------------- the daemon
class _Daemon:
    def __init__(self, pipe_dir: Path, log_dir: Path) -> None:
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.thread_percentage = 100.0
        self.mem_limits_mib: dict[str, int] = {}

    def log(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with (self.log_dir / "control.log").open("a") as f:
            f.write(f"[{stamp} Control {os.getpid():6d}] {text}\n")

    def answer(self, command: str) -> tuple[str, bool]:
        """The reply to one command, and whether the daemon quits after it."""
        self.log(f"Cmd:{command}")
        words = command.split()
        if not words:
            return "", False
        name, args = words[0], words[1:]
        if name == "quit":
            return "", True
        if name == "get_server_list" and not args:
            return "", False
        if name == "get_default_active_thread_percentage" and not args:
            return f"{self.thread_percentage:.1f}\n", False
        if name == "set_default_active_thread_percentage" and len(args) == 1:
            # Seen on driver 580: the reply is the default afterwards; an out-of-range
            # value (250) leaves it unchanged and the reply shows the old one.
            try:
                value = float(args[0])
            except ValueError:
                value = -1.0
            if 0 < value <= 100:
                self.thread_percentage = value
            return f"{self.thread_percentage:.1f}\n", False
        if name == "set_default_device_pinned_mem_limit" and len(args) == 2:
            if _LIMIT.match(args[1]) and args[0].isdigit():
                number, unit = int(args[1][:-1]), args[1][-1]
                self.mem_limits_mib[args[0]] = number * 1024 if unit == "G" else number
            return "", False
        if name == "get_default_device_pinned_mem_limit" and len(args) == 1:
            # Seen on driver 580: whole GiB, rounded down, from 1 GiB up ("79G" for
            # 81559M); an empty reply for a device it does not know (a UUID).
            mib = self.mem_limits_mib.get(args[0])
            if mib is None:
                return "", False
            return (f"{mib // 1024}G\n" if mib >= 1024 else f"{mib}M\n"), False
        return f'Unknown command "{command}"\n', False

    def serve(self, listener: socket.socket) -> None:
        while True:
            conn, _ = listener.accept()
            with conn, conn.makefile("rwb") as stream:
                quitting = False
                for raw in stream:
                    reply, quitting = self.answer(raw.decode(errors="replace").strip())
                    if quitting:
                        break
                    stream.write(reply.encode() + END)
                    stream.flush()
                if quitting:
                    self.log("Exit")
                    listener.close()
                    with contextlib.suppress(FileNotFoundError):
                        (self.pipe_dir / SOCKET).unlink()
                    with contextlib.suppress(FileNotFoundError):
                        (self.pipe_dir / PID_FILE).unlink()
                    # No reply: the connection closes when the process exits, which
                    # is what makes the front end's quit synchronous.
                    os._exit(0)


def _start_daemon() -> int:
    pipe_dir, log_dir = _pipe_dir(), _log_dir()
    pipe_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    lock = os.open(pipe_dir / PID_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("An instance of this daemon is already running")
        return 1
    ready_r, ready_w = os.pipe()
    if os.fork() > 0:  # the launcher: return once the daemon listens
        os.close(ready_w)
        os.close(lock)
        with os.fdopen(ready_r, "rb") as ready:
            ok = ready.read(1) == b"1"
        return 0 if ok else 1
    os.close(ready_r)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.ftruncate(lock, 0)
    os.write(lock, f"{os.getpid()}\n".encode())
    path = pipe_dir / SOCKET
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # left by a daemon that was killed: we hold the lock now
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    daemon = _Daemon(pipe_dir, log_dir)
    daemon.log(f"Starting control daemon using socket {path}")
    os.write(ready_w, b"1")
    os.close(ready_w)
    try:
        daemon.serve(listener)
    finally:
        os.close(lock)
    os._exit(0)


# ------------------------------------------------------------- the front end
def _front_end() -> int:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(_pipe_dir() / SOCKET))
    except OSError:
        print("Cannot find MPS control daemon process")
        return 1
    with sock, sock.makefile("rwb") as stream:
        for line in sys.stdin:
            command = line.strip()
            if not command:
                continue
            stream.write(command.encode() + b"\n")
            stream.flush()
            reply = bytearray()
            while not reply.endswith(END):
                chunk = stream.readline()
                if not chunk:
                    # quit: the daemon closed the connection by exiting
                    return 0 if command == "quit" else 1  # else: broken unexpectedly
                reply += chunk
            sys.stdout.write(reply[: -len(END)].decode(errors="replace"))
            sys.stdout.flush()
            if command == "quit":
                return 0
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["-d"]:
        return _start_daemon()
    if not args:
        return _front_end()
    print(f"unsupported arguments: {' '.join(args)} (stand-in supports -d and the front end)")
    return 2


if __name__ == "__main__":
    sys.exit(main())
