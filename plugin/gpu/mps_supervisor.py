"""The supervised MPS control daemon (asyncio adapter around :mod:`plugin.gpu.mps_control`).

One daemon per node, owned by the GPU concern, after NVIDIA's
``cmd/mps-control-daemon`` (``mps/daemon.go``: ``Start``, ``Stop``, ``AssertHealthy``)
with what it leaves out:

1. **Compute mode.** Every served GPU goes to ``Exclusive_Process`` through NVML
   (NVIDIA shells out to ``nvidia-smi -c``), so a process that ignores
   ``CUDA_MPS_PIPE_DIRECTORY`` cannot open a context beside the MPS server. The
   mode each GPU had first is written to ``<log dir>/metagpu-compute-modes.json``
   before anything changes, and restored from it on stop, also after a crash:
   a plugin that died without restoring finds the file at its next start.
2. **Start**: a daemon from an earlier run that still answers on the pipe
   directory is quit first (its defaults are not ours); then ``-d``, then the
   front end is asked until the daemon answers (``start_timeout_s``), then the
   defaults are set and each is read back (a rejected command still exits 0).
3. **Watch by asking**: ``get_server_list`` every ``health_interval_s``; a failed
   or timed-out ask, or a PID file naming no process, is down. NVIDIA only asks
   ``get_default_active_thread_percentage`` when its container's probe runs.
4. **Restart** with exponential backoff (``restart_backoff_s`` doubling up to
   ``restart_backoff_max_s``; reset once it has answered that long) and the
   defaults re-applied: the docs say they are "lost if a quit command is executed"
   and a new daemon starts without them.
5. **Health**: while the daemon is not up, every served GPU is withdrawn on the
   node's one health board (:meth:`~plugin.gpu.health_monitor.HealthBoard.set_mps`,
   check ``mps``) with the reason, so the kubelet offers it to no new container.
   A GPU whose compute mode cannot be set is withdrawn alone.
6. **Stop**: ``quit`` (bounded; SIGKILL of the daemon's PID after the bound), then
   the compute modes restored, then the state file removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final, get_args

from plugin.api.config import MpsConfig
from plugin.gpu.backend import (
    ComputeMode,
    ComputeModeControl,
    GpuBackend,
    GpuBackendError,
    NullBackend,
)
from plugin.gpu.health_monitor import HealthBoard
from plugin.gpu.mps import (
    GET_SERVER_LIST,
    QUIT,
    Backoff,
    MpsGpu,
    MpsNode,
    MpsReplyError,
    MpsStatus,
    check_default,
    daemon_defaults,
    down_reason,
    parse_server_list,
)
from plugin.gpu.mps_control import MpsControl, MpsControlError

logger = logging.getLogger(__name__)

EXCLUSIVE_PROCESS: Final[ComputeMode] = "Exclusive_Process"
STATE_FILE_NAME: Final = "metagpu-compute-modes.json"
"""Original compute modes, by GPU UUID, while the daemon serves them."""

_MODES: Final = frozenset(get_args(ComputeMode))


class MpsStartError(Exception):
    """The daemon could not be started or configured; the message is the reason."""


class MpsSupervisor:
    """Runs, watches and restarts the daemon for the GPUs given to :meth:`serve`."""

    def __init__(
        self,
        control: MpsControl,
        board: HealthBoard,
        *,
        modes: ComputeModeControl | None,
        health_interval_s: float,
        command_timeout_s: float,
        start_timeout_s: float,
        backoff: Backoff,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``modes`` None: leave the compute mode alone (``mps.set_exclusive_process`` false)."""
        self._control = control
        self._board = board
        self._modes = modes
        self._interval_s = health_interval_s
        self._timeout_s = command_timeout_s
        self._start_timeout_s = start_timeout_s
        self._backoff = backoff
        self._wall = wall
        self._gpus: tuple[MpsGpu, ...] = ()
        self._mode_failures: dict[str, str] = {}
        self._pid: int | None = None
        """The daemon's PID once it answered (from its PID file), watched beside the asks."""
        self._task: asyncio.Task[None] | None = None
        self._first_outcome = asyncio.Event()
        self._changed = asyncio.Event()
        self.status = MpsStatus(state="starting", since=wall())
        self.starts = 0
        """Successful starts so far (the first one included); tests wait on it."""

    def set_modes(self, modes: ComputeModeControl | None) -> None:
        """A reload opened a new GPU backend: set and restore modes through it."""
        self._modes = modes

    @property
    def state_file(self) -> Path:
        return self._control.log_directory / STATE_FILE_NAME

    # ------------------------------------------------------------ lifecycle
    async def serve(self, gpus: Sequence[MpsGpu]) -> None:
        """Serve these GPUs (after every discovery). The first call starts the daemon
        and returns once it is up or its first start failed (bounded by
        ``start_timeout_s`` and the command timeouts), so the first device list the
        kubelet sees is already right. Later calls apply modes and defaults to added
        GPUs and restore removed ones."""
        new = tuple(sorted(gpus, key=lambda g: g.index))
        old, self._gpus = self._gpus, new
        if self._task is None:
            self._publish()
            self._task = asyncio.create_task(self._run(), name="mps-control-daemon")
            self._task.add_done_callback(_log_exit)
            await self._first_outcome.wait()
            return
        if new == old:
            return
        removed = [g for g in old if g.uuid not in {n.uuid for n in new}]
        await self._restore_modes([g.uuid for g in removed])
        if self.status.state == "up":
            try:
                await self._set_modes(new)
                await self._apply_defaults(new)
            except MpsStartError as exc:
                logger.error("MPS: new GPUs could not be configured: %s", exc)
        self._publish()

    async def stop(self) -> None:
        """Quit the daemon, restore the compute modes, forget the state file. Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.status.state != "stopped":
            if self.status.state == "up" or self._pid is not None:
                await self._quit()
            await self._restore_modes([g.uuid for g in self._gpus], final=True)
            self._set_status(replace(self.status, state="stopped", reason="stopped"))

    @property
    def changed(self) -> asyncio.Event:
        """Set at the next status change (replaced after each): take it, check the
        status, then wait on it, and no change can slip between the two."""
        return self._changed

    # -------------------------------------------------------------- the loop
    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                await self._start_once()
            except MpsStartError as exc:
                failures += 1
                delay = self._backoff.delay(failures)
                logger.error("MPS control daemon did not start (retrying in %.0fs): %s", delay, exc)
                self._down(str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                continue
            up_at = time.monotonic()
            detail = await self._watch()
            if time.monotonic() - up_at >= self._backoff.max_s:
                failures = 0  # it answered for long enough: start the backoff over
            failures += 1
            delay = self._backoff.delay(failures)
            logger.error(
                "MPS control daemon stopped answering (restarting in %.0fs): %s", delay, detail
            )
            self._down(detail, retry_in_s=delay)
            await asyncio.sleep(delay)

    async def _start_once(self) -> None:
        gpus = self._gpus
        await self._set_modes(gpus)
        await asyncio.to_thread(self._control.prepare_directories)
        await self._quit_leftover()
        try:
            await self._control.start_daemon(timeout_s=self._timeout_s)
        except MpsControlError as exc:
            raise MpsStartError(str(exc)) from exc
        await self._wait_answering()
        self._pid = self._control.daemon_pid()
        await self._apply_defaults(gpus)
        self.starts += 1
        restarts = self.starts - 1
        logger.info(
            "MPS control daemon %s (pid %s) serves %d GPU(s) from %s",
            "restarted" if restarts else "started",
            self._pid,
            len(gpus),
            self._control.pipe_directory,
        )
        self._set_status(MpsStatus(state="up", restarts=restarts, since=self._wall()))

    async def _wait_answering(self) -> None:
        deadline = time.monotonic() + self._start_timeout_s
        last = "no answer yet"
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise MpsStartError(
                    f"the daemon did not answer within {self._start_timeout_s:g}s: {last}"
                )
            try:
                parse_server_list(
                    await self._control.ask(
                        GET_SERVER_LIST, timeout_s=min(self._timeout_s, remaining)
                    )
                )
                return
            except (MpsControlError, MpsReplyError) as exc:
                last = str(exc)
            # A fresh daemon binds its socket within milliseconds; this is a poll
            # interval, not a wait for something to happen by itself.
            await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    async def _apply_defaults(self, gpus: Sequence[MpsGpu]) -> None:
        """Set every default, then read each back: a rejected ``set`` still exits 0."""
        problems: list[str] = []
        for default in daemon_defaults(gpus):
            try:
                await self._control.ask(default.set_command, timeout_s=self._timeout_s)
                reply = await self._control.ask(default.get_command, timeout_s=self._timeout_s)
            except MpsControlError as exc:
                raise MpsStartError(f"setting the daemon's defaults failed: {exc}") from exc
            problem = check_default(default, reply)
            if problem is not None:
                problems.append(problem)
        if problems:
            raise MpsStartError("; ".join(problems))

    async def _watch(self) -> str:
        """Ask until the daemon stops answering; return why it is considered down."""
        while True:
            await asyncio.sleep(self._interval_s)
            if self._pid is not None and not self._control.running(self._pid):
                return f"its process {self._pid} is gone"
            try:
                reply = await self._control.ask(GET_SERVER_LIST, timeout_s=self._timeout_s)
                servers = parse_server_list(reply)
            except (MpsControlError, MpsReplyError) as exc:
                return str(exc)
            if servers != self.status.server_pids:
                self._set_status(replace(self.status, server_pids=servers))

    # --------------------------------------------------------- quitting
    async def _quit_leftover(self) -> None:
        """A daemon that answers before we started one is ours from before a restart,
        or an earlier run's: quit it, so that the defaults are the ones we set."""
        try:
            await self._control.ask(GET_SERVER_LIST, timeout_s=self._timeout_s)
        except MpsControlError:
            # Not answering. A hung daemon whose process is still there is killed,
            # or the new one could not take the pipe directory.
            pid = self._pid or self._control.daemon_pid()
            if pid is not None and self._control.running(pid):
                self._control.kill(pid)
                logger.warning("MPS: killed the control daemon %s, which stopped answering", pid)
            return
        if self._pid is None:
            logger.warning(
                "an MPS control daemon from an earlier run answers on %s; quitting it so "
                "that its defaults are ours",
                self._control.pipe_directory,
            )
        await self._quit()

    async def _quit(self) -> None:
        """``quit``, bounded by ``command_timeout_s``: the daemon waits for its clients
        to finish first, so a running client would hold it; after the bound the
        daemon is killed."""
        pid = self._pid or self._control.daemon_pid()
        try:
            await self._control.ask(QUIT, timeout_s=self._timeout_s)
        except MpsControlError as exc:
            if pid is not None and self._control.running(pid):
                self._control.kill(pid)
                logger.warning("MPS: quit failed (%s); killed the control daemon %s", exc, pid)
            return
        finally:
            self._pid = None
        logger.info("MPS control daemon quit")

    # -------------------------------------------------------- compute modes
    async def _set_modes(self, gpus: Sequence[MpsGpu]) -> None:
        if self._modes is None:
            return
        await asyncio.to_thread(self._set_modes_blocking, gpus)
        self._publish()

    def _set_modes_blocking(self, gpus: Sequence[MpsGpu]) -> None:
        assert self._modes is not None
        originals = self._load_originals()
        for gpu in gpus:
            try:
                mode = self._modes.compute_mode(gpu.uuid)
                if gpu.uuid not in originals:
                    originals[gpu.uuid] = mode
                    self._save_originals(originals)
                if mode != EXCLUSIVE_PROCESS:
                    self._modes.set_compute_mode(gpu.uuid, EXCLUSIVE_PROCESS)
                    logger.info(
                        "GPU compute mode %s -> %s for MPS",
                        mode,
                        EXCLUSIVE_PROCESS,
                        extra={"gpu": gpu.uuid},
                    )
            except (GpuBackendError, OSError) as exc:
                self._mode_failures[gpu.uuid] = (
                    f"MPS: cannot put the GPU in EXCLUSIVE_PROCESS compute mode ({exc}); a "
                    "process that bypasses MPS could take the whole GPU (the plugin must run "
                    "as root; set mps.set_exclusive_process=false to serve it anyway)"
                )
            else:
                self._mode_failures.pop(gpu.uuid, None)

    async def _restore_modes(self, uuids: Sequence[str], *, final: bool = False) -> None:
        if self._modes is None or not uuids:
            return
        await asyncio.to_thread(self._restore_blocking, uuids, final)

    def _restore_blocking(self, uuids: Sequence[str], final: bool) -> None:
        assert self._modes is not None
        originals = self._load_originals()
        for uuid in uuids:
            mode = originals.get(uuid)
            if mode is None:
                continue
            try:
                if self._modes.compute_mode(uuid) != mode:
                    self._modes.set_compute_mode(uuid, mode)
                    logger.info("GPU compute mode restored to %s", mode, extra={"gpu": uuid})
            except GpuBackendError as exc:
                logger.error("GPU compute mode not restored to %s: %s", mode, exc)
                continue
            del originals[uuid]
            self._mode_failures.pop(uuid, None)
        if final and not originals:
            with contextlib.suppress(FileNotFoundError):
                self.state_file.unlink()
        else:
            self._save_originals(originals)

    def _load_originals(self) -> dict[str, ComputeMode]:
        try:
            raw = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            logger.error("ignoring unreadable %s: %s", self.state_file, exc)
            return {}
        if not isinstance(raw, dict):
            return {}
        return {str(k): v for k, v in raw.items() if v in _MODES}

    def _save_originals(self, originals: Mapping[str, ComputeMode]) -> None:
        path = self.state_file
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(sorted(originals.items())), indent=2) + "\n")
        os.replace(tmp, path)

    # -------------------------------------------------------------- health
    def _down(self, detail: str, *, retry_in_s: float | None) -> None:
        reason = down_reason(detail, retry_in_s=retry_in_s)
        self._set_status(
            MpsStatus(
                state="down",
                reason=reason,
                restarts=max(0, self.starts - 1),
                since=self._wall(),
            )
        )

    def _set_status(self, status: MpsStatus) -> None:
        self.status = status
        self._publish()
        if status.state in ("up", "down"):
            self._first_outcome.set()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _publish(self) -> None:
        """The board's ``mps`` withdrawals: every GPU while the daemon is not up, else
        the GPUs whose compute mode could not be set; and the daemon's status for the
        node agent (what the node enforces, daemon up and restarts)."""
        self._board.set_mps_node(MpsNode(mode="supervised", status=self.status))
        uuids = [g.uuid for g in self._gpus]
        if self.status.state == "up":
            reasons = {u: r for u, r in self._mode_failures.items() if u in uuids}
        elif self.status.state == "stopped":
            reasons = {}
        else:
            why = self.status.reason or "MPS control daemon starting"
            reasons = {u: self._mode_failures.get(u, why) for u in uuids}
        self._board.set_mps(reasons)


def compute_mode_control(mps: MpsConfig, backend: GpuBackend) -> ComputeModeControl | None:
    """The backend, to set compute modes through, unless ``mps.set_exclusive_process`` is
    off (or the backend cannot set them)."""
    if mps.set_exclusive_process and isinstance(backend, ComputeModeControl):
        return backend
    return None


def supervisor_for(mps: MpsConfig, backend: GpuBackend, board: HealthBoard) -> MpsSupervisor | None:
    """The supervised daemon ``mps.supervise`` asks for, withdrawing GPUs on ``board``;
    None without it or without GPUs. One builder for the device plugin and the DRA
    plugin, so both read the ``mps`` section the same way."""
    if not (mps.enabled and mps.supervise) or isinstance(backend, NullBackend):
        return None
    control = MpsControl(
        command=tuple(mps.control_command),
        pipe_directory=mps.pipe_directory,
        log_directory=mps.effective_log_directory,
    )
    return MpsSupervisor(
        control,
        board,
        modes=compute_mode_control(mps, backend),
        health_interval_s=mps.health_interval_s,
        command_timeout_s=mps.command_timeout_s,
        start_timeout_s=mps.start_timeout_s,
        backoff=Backoff(initial_s=mps.restart_backoff_s, max_s=mps.restart_backoff_max_s),
    )


def _log_exit(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        logger.error("MPS supervisor task failed", exc_info=exc)
