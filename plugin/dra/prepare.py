"""Prepare and unprepare claims: from an allocated claim to CDI spec files and back.

No gRPC and no API client here: the servicer reads the claim and hands in its JSON,
and turns :class:`~plugin.dra.claims.ClaimError` into the claim's ``error`` entry.
Files are the only side effect, in ``cdi_dir``, written atomically (a temporary file
renamed over the target, so the runtime never reads half a spec).

Idempotent in both directions, because the kubelet repeats calls (after its own
restart, and for claims it did not see answered): preparing a claim again writes the
same files (skipped when the bytes are equal) and gives the same answer; unpreparing a
claim that has no files succeeds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugin.api.gpus import GpuInfo
from plugin.dra.cdi import build_spec, cdi_device_id, spec_file_name, spec_file_prefix
from plugin.dra.claims import (
    AllocatedShare,
    ClaimError,
    ClaimMismatchError,
    ClaimRef,
    shares_of,
)
from plugin.dra.config import DraConfig
from plugin.dra.slices import device_name

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedDevice:
    """One entry of the kubelet's answer for a claim (``v1.Device``)."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None


class Preparer:
    """Turns allocated claims into CDI specs for the GPUs this node offers now."""

    def __init__(self, *, config: DraConfig, node_name: str) -> None:
        self._config = config
        self._node = node_name
        self._dir = config.cdi_dir
        self._gpus: dict[str, GpuInfo] = {}
        self._withdrawn: dict[str, str] = {}

    def offer(self, gpus: Sequence[GpuInfo], *, withdrawn: Mapping[str, str]) -> None:
        """The node's GPUs (by device name) and why some are withdrawn (by UUID):
        what the published slice says, so prepare agrees with the scheduler's view."""
        self._gpus = {device_name(g): g for g in gpus if g.identity_known}
        self._withdrawn = dict(withdrawn)

    def prepare(self, ref: ClaimRef, claim: Mapping[str, Any]) -> tuple[PreparedDevice, ...]:
        """Write the claim's CDI specs and return its answer. Raises ClaimError."""
        driver = self._config.driver_name
        shares = shares_of(claim, ref=ref, driver=driver, node_name=self._node)
        planned: list[tuple[Path, bytes]] = []
        answer: list[PreparedDevice] = []
        for share in shares:
            gpu = self._gpus.get(share.device)
            if gpu is None:
                raise ClaimMismatchError(
                    f"claim {ref}: device {share.device} is not a GPU of node {self._node}"
                )
            path = self._dir / spec_file_name(share, driver=driver, claim_uid=ref.uid)
            reason = self._withdrawn.get(gpu.uuid)
            if reason is not None and not path.exists():
                # Already prepared shares keep running; new ones must not land on it.
                raise ClaimError(
                    f"claim {ref}: GPU {share.device} ({gpu.uuid}) is withdrawn: {reason}"
                )
            spec = build_spec(share, gpu=gpu, claim_uid=ref.uid, config=self._config)
            planned.append((path, _encode(spec)))
            answer.append(
                PreparedDevice(
                    request_names=(share.request,) if share.request else (),
                    pool_name=share.pool,
                    device_name=share.device,
                    cdi_device_ids=self._cdi_ids(share, gpu, claim_uid=ref.uid),
                    share_id=share.share_id,
                )
            )
        written: list[Path] = []
        try:
            for path, data in planned:
                if _write_if_changed(path, data):
                    written.append(path)
        except OSError as exc:
            for path in written:
                with contextlib.suppress(OSError):
                    path.unlink()
            raise ClaimError(f"claim {ref}: cannot write its CDI spec: {exc}") from exc
        if written:
            logger.info(
                "claim prepared",
                extra={"claim": str(ref), "uid": ref.uid, "files": [p.name for p in written]},
            )
        return tuple(answer)

    def _cdi_ids(self, share: AllocatedShare, gpu: GpuInfo, *, claim_uid: str) -> tuple[str, ...]:
        """The share's own CDI device, then the configured extra one for its GPU."""
        ours = cdi_device_id(share, driver=self._config.driver_name, claim_uid=claim_uid)
        extra = self._config.extra_cdi_device
        if extra is None:
            return (ours,)
        return (ours, extra.format(uuid=gpu.uuid, index=gpu.index, minor=gpu.minor_number))

    def unprepare(self, ref: ClaimRef) -> int:
        """Remove the claim's CDI specs; how many there were (0 is fine). Raises ClaimError."""
        prefix = spec_file_prefix(driver=self._config.driver_name, claim_uid=ref.uid)
        removed = 0
        try:
            for path in sorted(self._dir.glob(f"{prefix}*.json")):
                path.unlink(missing_ok=True)
                removed += 1
        except OSError as exc:
            raise ClaimError(f"claim {ref}: cannot remove its CDI spec: {exc}") from exc
        if removed:
            logger.info(
                "claim unprepared", extra={"claim": str(ref), "uid": ref.uid, "files": removed}
            )
        return removed


def _encode(spec: Mapping[str, Any]) -> bytes:
    return (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode()


def _write_if_changed(path: Path, data: bytes) -> bool:
    """Atomically replace ``path`` with ``data`` unless it holds exactly that already."""
    with contextlib.suppress(OSError):
        if path.read_bytes() == data:
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    # not *.json: the runtime's CDI cache would load a half-written temporary file
    fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # the runtime reads it; mkstemp makes it 0600
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True
