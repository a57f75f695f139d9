"""Async helpers for the agent tests: wait on a condition (with a deadline), never sleep blind."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path


async def eventually(
    predicate: Callable[[], bool], *, timeout_s: float = 10.0, what: str = ""
) -> None:
    """Wait until ``predicate()`` holds; fail with ``what`` after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what or predicate}")
        await asyncio.sleep(0.01)


MGCTL_RUNNER = (
    "import os, sys\n"
    "sys.stdin.readline()\n"
    "uid, path, argv = sys.argv[1], sys.argv[2], sys.argv[3:]\n"
    "ns = {'__name__': 'mgctl'}\n"
    "exec(compile(open(path).read(), path, 'exec'), ns)\n"
    "if uid != '-':\n"
    "    os.setgid(int(uid))\n"
    "    os.setuid(int(uid))\n"
    "raise SystemExit(ns['main'](argv))\n"
)
"""Runs an mgctl file with ``python -I -S`` (standard library only) once a line
arrives on stdin, so the test can first place the process (write
``<proc_root>/<pid>/cgroup``). It loads the file, optionally drops to another UID
(after loading: the interpreter's own files may not be readable by that UID),
then runs mgctl's ``main``."""


async def start_mgctl(
    mgctl: Path,
    *args: str,
    uid: int | None = None,
    env: Mapping[str, str] | None = None,
) -> asyncio.subprocess.Process:
    """Start ``mgctl args`` under :data:`MGCTL_RUNNER`, its stdin, stdout and stderr piped.

    It waits for a line on stdin before running mgctl: place it first. For
    callers that talk to a running mgctl (``--watch``); :func:`run_mgctl` for
    the rest."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-S",
        "-c",
        MGCTL_RUNNER,
        "-" if uid is None else str(uid),
        str(mgctl),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": os.environ.get("PATH", ""), **(env or {})},
    )


async def run_mgctl(
    mgctl: Path,
    *args: str,
    place: Callable[[int], None],
    uid: int | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[int, str, str]:
    """Run ``mgctl args`` as a real process placed by ``place(pid)``; (exit code, out, err)."""
    proc = await start_mgctl(mgctl, *args, uid=uid, env=env)
    place(proc.pid)
    out, err = await asyncio.wait_for(proc.communicate(b"go\n"), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
