"""The agent's side of the node's one GPU health truth (adapter).

:class:`BoardReader` reads the device plugin's published board
(:mod:`plugin.gpu.health_file`) every cycle, so mgctl, metrics and the node
labels show the health record the plugin advertises to the kubelet, reason
included. A board counts only while it is current
(:func:`plugin.api.provenance.judge`): written on this boot by a device plugin
process that still runs, and refreshed within the bound it promised. A file
from another boot, a crashed plugin or an uninstalled release is ignored with
its reason, which :attr:`BoardReader.problem` keeps for mgctl. When the file is
missing (the kubelet just emptied its directory) the last board read is kept
while it stays current; otherwise the agent falls back to its own "described
and read this cycle". A board that cannot be parsed is logged once and
ignored, like a stale input.

:class:`DiscoveryLog` keeps the agent's log quiet: discovery runs every cycle,
so a GPU that cannot be described is logged once when that starts and once
when it ends, not every ``interval_s``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from plugin.agent.accounting import GpuReading
from plugin.api.provenance import DEFAULT_PROC_ROOT, ProcessProbe, judge
from plugin.gpu.backend import GpuInfo
from plugin.gpu.health import GpuHealth
from plugin.gpu.health_file import HealthFileError, PublishedBoard, read_board

logger = logging.getLogger(__name__)


class PluginBoard:
    """One board as read: records and liveness counts by UUID."""

    def __init__(self, board: PublishedBoard) -> None:
        self.board = board

    def health(self) -> dict[str, GpuHealth]:
        return {g.info.uuid: g.health for g in self.board.gpus}

    def liveness(self) -> dict[str, tuple[int, int]]:
        return {g.info.uuid: (g.liveness_ok, g.liveness_failed) for g in self.board.gpus}


class BoardReader:
    """The plugin's board at ``path``; :attr:`last` is the newest current one read."""

    def __init__(
        self,
        path: Path,
        *,
        proc_root: Path = DEFAULT_PROC_ROOT,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``proc_root``: the procfs the writer is looked up in (the agent's, with
        the host's PIDs); ``wall``: the clock the freshness bound is checked against."""
        self.path = path
        self.last: PluginBoard | None = None
        self.problem: str | None = None
        """Why there is no current board now (None: there is one)."""
        self._probe = ProcessProbe(proc_root)
        self._wall = wall

    def read(self) -> PublishedBoard | None:
        """Read the board now (blocking); None when there is no current one."""
        try:
            board = read_board(self.path)
        except HealthFileError as exc:
            self._lose(str(exc))
            return None
        if board is None:
            if self.last is None:
                self._lose(f"{self.path} does not exist (no device plugin running?)")
                return None
            board = self.last.board  # the kubelet emptied the directory: keep it while current
        stale = judge(
            board.stamp,
            boot_id=self._probe.boot_id(),
            now=self._wall(),
            running=self._probe.running,
        )
        if stale is not None:
            self._lose(f"{self.path} is not current: {stale}")
            return None
        self._set_problem(None)
        if self.last is None or self.last.board is not board:
            self.last = PluginBoard(board)
        return board

    def _lose(self, problem: str) -> None:
        """No current board: forget the last one too, so nothing it said outlives it."""
        self.last = None
        self._set_problem(problem)

    def _set_problem(self, problem: str | None) -> None:
        if problem == self.problem:
            return
        before, self.problem = self.problem, problem
        if problem is None:
            logger.info("reading the device plugin's GPU health board again: %s", self.path)
        elif before is None or _shape(before) != _shape(problem):
            # Logged when the kind of problem changes, not when only its figures
            # do (the age of a stale file grows every cycle).
            logger.warning(
                "no current GPU health board from the device plugin; showing the agent's "
                "own readings: %s",
                problem,
            )


def _shape(problem: str) -> str:
    return re.sub(r"\d+", "N", problem)


class DiscoveryLog:
    """Logs each GPU's discovery failure once, and once more when it clears."""

    def __init__(self) -> None:
        self._failing: dict[str, str] = {}

    def note(self, readings: Sequence[GpuReading], unidentified: Iterable[GpuInfo]) -> None:
        now: dict[str, str] = {}
        for r in readings:
            if r.info.unhealthy_reason is not None:
                now[f"GPU {r.info.index} ({r.info.uuid})"] = r.info.unhealthy_reason
        for info in unidentified:
            now[f"GPU {info.index} (never identified)"] = info.unhealthy_reason or "unidentified"
        for gpu, reason in now.items():
            if self._failing.get(gpu) != reason:
                logger.error("GPU discovery failed for %s: %s", gpu, reason)
        for gpu in self._failing.keys() - now.keys():
            logger.info("GPU discovery works again for %s", gpu)
        self._failing = now
