"""The agent's side of the node's one GPU health truth (adapter).

:class:`BoardReader` reads the device plugin's published board
(:mod:`plugin.gpu.health_file`) every cycle, so mgctl, metrics and the node
labels show the health record the plugin advertises to the kubelet, reason
included. When there is no board (no plugin on the node yet, or the kubelet
just emptied its directory) the last one read is kept; before any was read,
the agent falls back to its own "described and read this cycle". A board
that cannot be parsed is logged once and ignored, like a stale input.

:class:`DiscoveryLog` keeps the agent's log quiet: discovery runs every cycle,
so a GPU that cannot be described is logged once when that starts and once
when it ends, not every ``interval_s``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

from plugin.agent.accounting import GpuReading
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
    """The plugin's board at ``path``; :attr:`last` is the newest one read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.last: PluginBoard | None = None
        self._problem: str | None = None

    def read(self) -> PublishedBoard | None:
        """Read the board now (blocking); None when there is none or it is broken."""
        try:
            board = read_board(self.path)
        except HealthFileError as exc:
            self._set_problem(str(exc))
            return None
        if board is None:
            self._set_problem(f"{self.path} does not exist (no device plugin running?)")
            return None
        self._set_problem(None)
        self.last = PluginBoard(board)
        return board

    def _set_problem(self, problem: str | None) -> None:
        if problem == self._problem:
            return
        before, self._problem = self._problem, problem
        if problem is None:
            logger.info("reading the device plugin's GPU health board again: %s", self.path)
        elif before is None:
            shown = "the last one read" if self.last is not None else "the agent's own readings"
            logger.warning(
                "cannot read the device plugin's GPU health board; showing %s: %s",
                shown,
                problem,
            )


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
