"""Running ``nvidia-cuda-mps-control`` (adapter: the only module that spawns it).

Every call is one process with a deadline: ``-d`` to start the daemon (the
program forks the daemon and returns), or the front end with one command on
stdin (it reads until EOF, prints the reply, exits). Nothing is kept open, so a
hung daemon costs one killed front end, never a stuck plugin. Output is read up
to :data:`MAX_REPLY_BYTES`; replies are a few lines.

The same code runs the real program and the stand-in (:mod:`plugin.gpu.mps_standin`),
only ``mps.control_command`` differs, so the tests exercise this path as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from plugin.gpu.mps import PID_FILE_NAME

logger = logging.getLogger(__name__)

T = TypeVar("T")

MAX_REPLY_BYTES: Final = 64 * 1024
"""A reply longer than this is cut (a server list of thousands of PIDs would still fit)."""

START_OUTPUT_NAME: Final = "metagpu-start.out"
"""What ``-d`` printed, in the log directory (overwritten by each start)."""


class MpsControlError(Exception):
    """The control program could not be run, did not finish in time, or said the daemon
    is not there (non-zero exit)."""


@dataclass(frozen=True)
class MpsControl:
    """How to reach one control daemon: its program, pipe and log directories."""

    command: tuple[str, ...]
    pipe_directory: Path
    log_directory: Path
    base_env: Mapping[str, str] | None = None
    """The environment to add the MPS variables to; None: this process's own."""

    def env(self) -> dict[str, str]:
        env = dict(os.environ if self.base_env is None else self.base_env)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.pipe_directory)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(self.log_directory)
        # The daemon's device ordinals (set_default_device_pinned_mem_limit <dev>) in
        # NVML/PCI order, not CUDA's default fastest-first order.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        # A limit or a device list inherited from the plugin's own environment would
        # apply to the daemon and every server it starts.
        for name in (
            "CUDA_VISIBLE_DEVICES",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        ):
            env.pop(name, None)
        return env

    @property
    def pid_file(self) -> Path:
        return self.pipe_directory / PID_FILE_NAME

    def prepare_directories(self) -> None:
        """Create the pipe and log directories. 0755: clients of any UID connect to
        the daemon's sockets; the sockets' own modes decide the rest."""
        for directory in (self.pipe_directory, self.log_directory):
            directory.mkdir(parents=True, exist_ok=True, mode=0o755)

    async def start_daemon(self, *, timeout_s: float) -> str:
        """``<command> -d``: returns its output once the launcher exits 0.

        Its output goes to a file, not a pipe: a daemon that kept the launcher's
        stdout open would otherwise hold the read open until the deadline."""
        out_file = self.log_directory / START_OUTPUT_NAME
        with out_file.open("w+b") as out:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self.command,
                    "-d",
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    env=self.env(),
                    start_new_session=True,
                )
            except OSError as exc:
                raise MpsControlError(f"cannot run {' '.join(self.command)}: {exc}") from exc
            code = await _killed_unless_done(
                proc, proc.wait(), timeout_s, late=f"{self._name} -d did not return"
            )
            out.seek(0)
            text = out.read(MAX_REPLY_BYTES).decode(errors="replace")
        if code != 0:
            raise MpsControlError(
                f"{self._name} -d exited {code}: {text.strip()[:300] or 'no output'}"
            )
        return text

    async def ask(self, command: str, *, timeout_s: float) -> str:
        """Send one command through the front end; its reply (stdout)."""
        code, out = await self._run([], stdin=command + "\n", timeout_s=timeout_s)
        if code != 0:
            raise MpsControlError(
                f"{command!r}: {self._name} exited {code} (daemon not found or the "
                f"connection broke): {out.strip()[:300] or 'no output'}"
            )
        return out

    def daemon_pid(self) -> int | None:
        """The PID the daemon wrote, when it is a running process."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _running(pid) else None

    @staticmethod
    def running(pid: int) -> bool:
        """Whether ``pid`` is a live process (a zombie is not)."""
        return _running(pid)

    @staticmethod
    def kill(pid: int) -> None:
        """SIGKILL the daemon (a ``quit`` that did not finish, a daemon that hangs)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)

    @property
    def _name(self) -> str:
        return Path(self.command[-1]).name if self.command else "mps control"

    async def _run(
        self, args: Sequence[str], *, stdin: str | None, timeout_s: float
    ) -> tuple[int, str]:
        """The front end (``args`` empty) with ``stdin``; exit code and stdout."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command,
                *args,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=self.env(),
                # Its own session: a daemon it forks is not in the plugin's process
                # group, and a terminal's Ctrl-C reaches the plugin, not the daemon.
                start_new_session=True,
            )
        except OSError as exc:
            raise MpsControlError(f"cannot run {' '.join(self.command)}: {exc}") from exc
        return await _killed_unless_done(
            proc,
            self._talk(proc, stdin),
            timeout_s,
            late=f"{self._name} {' '.join(args) or repr(stdin.strip() if stdin else '')} "
            "did not finish",
        )

    @staticmethod
    async def _talk(proc: asyncio.subprocess.Process, stdin: str | None) -> tuple[int, str]:
        if stdin is not None and proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(stdin.encode())
                await proc.stdin.drain()
            proc.stdin.close()
        assert proc.stdout is not None
        out = await proc.stdout.read(MAX_REPLY_BYTES)
        # Drain the rest without keeping it, so a chatty program cannot block on a full pipe.
        while await proc.stdout.read(MAX_REPLY_BYTES):
            pass
        code = await proc.wait()
        return code, out.decode(errors="replace")


def _running(pid: int) -> bool:
    """A live process; a zombie counts as gone. The daemon is reparented when it
    daemonizes, and a container's PID 1 may never reap it, so a killed daemon can
    stay a zombie that ``kill(pid, 0)`` still finds."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, another user's
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs here: trust kill(0)
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


async def _killed_unless_done(
    proc: asyncio.subprocess.Process, work: Awaitable[T], timeout_s: float, *, late: str
) -> T:
    """``work`` on ``proc`` within ``timeout_s``; past it, or when cancelled, the process is
    killed and reaped first (never left running, never a zombie), then ``late`` is raised
    (or the cancellation goes on)."""
    try:
        return await asyncio.wait_for(work, timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise MpsControlError(f"{late} within {timeout_s:g}s") from None
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await asyncio.shield(proc.wait())
        raise
