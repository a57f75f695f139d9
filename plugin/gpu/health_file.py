"""The device plugin's health board as a file the node agent reads: one health truth per node.

The plugin decides GPU health (events, liveness polls, recovery checks,
remembered identities) and the kubelet schedules by what it advertises. The
agent's mgctl, metrics and node labels must say the same, so the plugin
writes its board (:meth:`~plugin.gpu.health_monitor.HealthBoard.records`, plus
each GPU's identity and liveness counts) to
``<device_plugins_dir>/metagpu-gpu-health.json`` whenever it changes, and the
agent reads it every cycle. Running the same checks twice would not do: two
event streams, two recovery clocks and two identity memories drift apart, and
the agent would call a GPU healthy in the seconds the plugin has it withdrawn.

The kubelet's device-plugins directory, because both DaemonSets mount it
already or harmlessly (the plugin read-write for its socket, the agent
read-only), and it is not mounted into tenants' containers as the agent's
socket directory is. The kubelet empties it when it restarts; the plugin
re-serves and rewrites the file at once, and the agent keeps its last reading
meanwhile, for as long as that reading is current.

The file outlives its writer (a crash, an uninstall, a reboot), so it carries
its provenance (:mod:`plugin.api.provenance`): the boot, the plugin process
that wrote it, and a freshness bound the plugin keeps by rewriting it every
:data:`REFRESH_INTERVAL_S`. The agent trusts a board only while that writer
runs on this boot and the bound holds; otherwise the node has no board, and
without a GPU driver of its own the agent shows no GPUs and says why. The
plugin removes its own file when it exits, so an uninstall leaves nothing.

Written atomically (a temporary file renamed over the old one), so a reader
never sees half a document. The format is versioned (``apiVersion: v1``);
readers ignore fields they do not know.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast, get_args

from plugin.api.gpus import GpuInfo
from plugin.api.limits import MpsMode
from plugin.api.provenance import ProvenanceError, Stamp, Writer, current_writer
from plugin.gpu.health import HEALTHY, UNHEALTHY, Check, GpuHealth
from plugin.gpu.health_monitor import HealthBoard
from plugin.gpu.mps import MpsNode, MpsState, MpsStatus

# Logged under the plugin's health logger: a failed publish is a health matter.
logger = logging.getLogger("plugin.health_monitor")

HEALTH_FILE_NAME: Final = "metagpu-gpu-health.json"
API_VERSION: Final = "v1"
KIND: Final = "GpuHealthBoard"
REFRESH_INTERVAL_S: Final = 10.0
"""The plugin rewrites the board at least this often, even when nothing changed."""
VALID_FOR_S: Final = 30.0
"""The freshness bound written into the board: three refreshes, so one slow
write (a busy node, a blocked event loop) does not make the agent drop it."""
_CHECKS: Final = frozenset(get_args(Check))
_MPS_MODES: Final = frozenset(get_args(MpsMode))
_MPS_STATES: Final = frozenset(get_args(MpsState))
"""Every value of :data:`plugin.gpu.health.Check` (one list, not a copy that can drift)."""


class HealthFileError(Exception):
    """The board file exists but is not a board this reader understands."""


@dataclass(frozen=True)
class PublishedGpu:
    """One GPU as the plugin published it."""

    info: GpuInfo
    health: GpuHealth
    liveness_ok: int = 0
    liveness_failed: int = 0


@dataclass(frozen=True)
class PublishedBoard:
    written_at: float
    gpus: tuple[PublishedGpu, ...]
    stamp: Stamp | None = None
    """Who wrote it and for how long it holds; None from a release without stamps
    (never current, see :func:`plugin.api.provenance.judge`)."""
    mps: MpsNode = field(default_factory=MpsNode)
    """How the plugin serves MPS (``mode: off`` from a release that did not say:
    nothing is enforced there)."""

    def by_uuid(self) -> dict[str, PublishedGpu]:
        return {g.info.uuid: g for g in self.gpus}


def health_file_path(device_plugins_dir: Path) -> Path:
    return device_plugins_dir / HEALTH_FILE_NAME


def board_document(
    infos: Mapping[str, GpuInfo],
    records: Mapping[str, GpuHealth],
    liveness: Mapping[str, tuple[int, int]],
    *,
    written_at: float,
    stamp: Stamp | None = None,
    mps: MpsNode | None = None,
) -> dict[str, Any]:
    """The JSON document for a board (pure); ``stamp`` adds its provenance
    (``writer``, ``validForS``; its ``written_at`` is the document's); ``mps`` the
    node's MPS (:func:`mps_document`)."""
    items = []
    for uuid, info in sorted(infos.items(), key=lambda kv: (kv[1].index, kv[0])):
        health = records[uuid]
        ok, failed = liveness.get(uuid, (0, 0))
        items.append(
            {
                "uuid": uuid,
                "index": info.index,
                "name": info.name,
                "memoryMiB": info.memory_mib,
                "minorNumber": info.minor_number,
                "pciBusId": info.pci_bus_id,
                "numaNode": info.numa_node,
                "migEnabled": info.mig_enabled,
                "state": health.state,
                "reason": health.reason,
                "check": health.check,
                "since": health.since,
                "livenessChecks": {"ok": ok, "failed": failed},
            }
        )
    document: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "writtenAt": written_at,
        "gpus": items,
        "mps": mps_document(mps or MpsNode()),
    }
    if stamp is not None:
        document |= stamp.to_json() | {"writtenAt": written_at}
    return document


def mps_document(node: MpsNode) -> dict[str, Any]:
    """The board's ``mps`` section: the mode, what the node enforces, and the
    supervised daemon's status (``daemon``, absent unless supervised)."""
    document: dict[str, Any] = {"mode": node.mode, "enforces": list(node.enforces)}
    status = node.status
    if status is not None:
        document["daemon"] = {
            "state": status.state,
            "reason": status.reason,
            "restarts": status.restarts,
            "since": status.since,
            "serverPids": list(status.server_pids),
        }
    return document


def parse_mps(data: object) -> MpsNode:
    """The ``mps`` section (absent or unknown mode: ``off``, nothing enforced)."""
    if not isinstance(data, Mapping):
        return MpsNode()
    mode = data.get("mode")
    if mode not in _MPS_MODES:
        return MpsNode()
    daemon = data.get("daemon")
    status = None
    if isinstance(daemon, Mapping) and daemon.get("state") in _MPS_STATES:
        status = MpsStatus(
            state=daemon["state"],
            reason=str(daemon.get("reason", "")),
            restarts=int(daemon.get("restarts", 0)),
            since=float(daemon.get("since", 0.0)),
            server_pids=tuple(int(p) for p in daemon.get("serverPids") or ()),
        )
    return MpsNode(mode=cast(MpsMode, mode), status=status)


def write_board(path: Path, document: Mapping[str, Any]) -> None:
    """Replace ``path`` with ``document`` atomically. Raises OSError."""
    fd, tmp = tempfile.mkstemp(prefix=".metagpu-gpu-health-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(document, f, sort_keys=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def parse_board(data: object) -> PublishedBoard:
    """A board from its JSON document; :class:`HealthFileError` says what is wrong."""
    try:
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise HealthFileError(f"not a {KIND} document")
        if data.get("apiVersion") != API_VERSION:
            raise HealthFileError(
                f"apiVersion {data.get('apiVersion')!r} is not {API_VERSION!r}; "
                "the plugin and the agent run different releases"
            )
        gpus = tuple(_gpu(item) for item in data["gpus"])
        stamp = Stamp.from_json(data)
        return PublishedBoard(
            written_at=float(data["writtenAt"]),
            gpus=gpus,
            stamp=stamp,
            mps=parse_mps(data.get("mps")),
        )
    except ProvenanceError as exc:
        raise HealthFileError(str(exc)) from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise HealthFileError(f"malformed board: {exc!r}") from exc


def read_board(path: Path) -> PublishedBoard | None:
    """The board at ``path``; None when there is none (no plugin running, or the
    kubelet just emptied the directory). Raises :class:`HealthFileError`."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HealthFileError(f"cannot read {path}: {exc}") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise HealthFileError(f"{path} is not JSON: {exc}") from exc
    return parse_board(data)


def _gpu(item: Mapping[str, Any]) -> PublishedGpu:
    state = item["state"]
    if state not in (HEALTHY, UNHEALTHY):
        raise ValueError(f"state {state!r} is neither {HEALTHY} nor {UNHEALTHY}")
    check = item.get("check", "")
    if check not in _CHECKS:
        check = "driver"  # a newer plugin's check: still unhealthy, still shown
    uuid = str(item["uuid"])
    numa = item.get("numaNode")
    info = GpuInfo(
        index=int(item["index"]),
        uuid=uuid,
        name=str(item["name"]),
        memory_mib=int(item["memoryMiB"]),
        minor_number=int(item["minorNumber"]),
        pci_bus_id=str(item["pciBusId"]),
        numa_node=None if numa is None else int(numa),
        mig_enabled=bool(item.get("migEnabled", False)),
    )
    health = GpuHealth(
        uuid=uuid,
        state=state,
        reason=str(item.get("reason", "")),
        check=check,
        since=float(item.get("since", 0.0)),
    )
    counts = item.get("livenessChecks") or {}
    return PublishedGpu(
        info=info,
        health=health,
        liveness_ok=int(counts.get("ok", 0)),
        liveness_failed=int(counts.get("failed", 0)),
    )


class BoardPublisher:
    """A :meth:`HealthBoard.add_listener` that writes the board to ``path``, stamped
    with this process as its writer.

    A failed write is logged once (and once more when writing works again):
    the plugin keeps serving, only the agent's view goes stale. Call it again
    every :data:`REFRESH_INTERVAL_S` (the supervisor does) to keep the stamp's
    promise, and :meth:`remove` at exit."""

    def __init__(
        self,
        path: Path,
        *,
        writer: Writer | None = None,
        valid_for_s: float = VALID_FOR_S,
    ) -> None:
        """``writer``: who the stamp names (default: this process, from ``/proc``)."""
        self.path = path
        self.valid_for_s = valid_for_s
        self._failing: str | None = None
        self.writes = 0
        self.writer = writer
        if writer is None:
            try:
                self.writer = current_writer()
            except (OSError, ValueError) as exc:
                logger.warning(
                    "cannot tell who this process is (%s); the GPU health board is written "
                    "without a writer stamp, so the node agent will not trust it",
                    exc,
                )

    def __call__(self, board: HealthBoard) -> None:
        liveness = {u: (c.ok, c.failed) for u, c in board.liveness().items()}
        written_at = board.wall()
        stamp = (
            None
            if self.writer is None
            else Stamp(writer=self.writer, written_at=written_at, valid_for_s=self.valid_for_s)
        )
        document = board_document(
            board.gpus,
            board.records(),
            liveness,
            written_at=written_at,
            stamp=stamp,
            mps=board.mps_node,
        )
        try:
            write_board(self.path, document)
        except OSError as exc:
            if self._failing is None:
                logger.warning(
                    "cannot publish GPU health for the node agent to %s (the agent shows "
                    "its own readings meanwhile): %s",
                    self.path,
                    exc,
                )
            self._failing = str(exc)
            return
        if self._failing is not None:
            logger.info("publishing GPU health to %s works again", self.path)
            self._failing = None
        self.writes += 1

    def remove(self) -> bool:
        """Delete the file if this process wrote it (not a newer plugin's, during a
        rolling update); True if it did. Never raises: an exit must not fail on it."""
        if self.writer is None:
            return False
        try:
            board = read_board(self.path)
        except HealthFileError:
            return False
        if board is None or board.stamp is None or board.stamp.writer != self.writer:
            return False
        try:
            self.path.unlink()
        except OSError as exc:
            logger.warning("cannot remove the GPU health board %s: %s", self.path, exc)
            return False
        return True
