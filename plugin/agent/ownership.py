"""Telling the operator that another device plugin hands out a GPU metagpu serves (pure).

The device plugin withdraws such a GPU's units (:mod:`plugin.deviceplugin.ownership`)
but has no Kubernetes API access; the agent sees the same PodResources answer
through the same core (:func:`plugin.placement.ownership.find_foreign_claims`),
already writes Events and labels, and serves mgctl and metrics. So the agent
writes the Event, on the **Node**, because the fix is the node's layout (which
plugin serves which GPU), not any one pod:

* ``GpuOwnershipConflict`` (Warning) once when a GPU metagpu serves becomes
  contested, naming the other resource and, for units already allocated on it,
  both pods;
* ``GpuOwnershipResolved`` (Normal) once when the other plugin lets go.

:class:`OwnershipReporter` decides which, from one snapshot to the next; it
logs each change once and never per cycle.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid as uuidlib
from dataclasses import dataclass
from typing import Any, Final, Literal

from plugin.agent.accounting import Conflict, GpuView, Snapshot
from plugin.agent.enforcement import REPORTING_CONTROLLER, _cap

logger = logging.getLogger(__name__)

REASON_CONFLICT: Final = "GpuOwnershipConflict"
REASON_RESOLVED: Final = "GpuOwnershipResolved"
NODE_EVENT_NAMESPACE: Final = "default"
"""Events about cluster-scoped objects (Nodes) live in ``default``, as the kubelet's do."""


@dataclass(frozen=True)
class OwnershipNotice:
    """One change to tell: a GPU became contested, or stopped being."""

    gpu: GpuView
    contested: bool
    conflicts: tuple[Conflict, ...] = ()

    def note(self) -> str:
        gpu = self.gpu
        if not self.contested:
            return (
                f"GPU {gpu.index} ({gpu.uuid}) is no longer handed out by another device "
                f"plugin; metagpu offers its {gpu.resource} units again."
            )
        assert gpu.claim is not None
        parts = [gpu.claim.reason() + "."]
        parts.extend(f"Conflict: {c.describe()}." for c in self.conflicts)
        return " ".join(parts)


class OwnershipReporter:
    """Which contested GPUs are new or gone since the last snapshot."""

    def __init__(self) -> None:
        self._reported: dict[str, tuple[str, ...]] = {}
        """GPU UUID → the other resources reported for it."""

    def decide(self, snapshot: Snapshot) -> list[OwnershipNotice]:
        """The changes since the previous call; none on a stale snapshot (the claims
        were not read this cycle, so nothing is known to have changed)."""
        if snapshot.stale & {"gpus", "podresources"}:
            return []
        notices: list[OwnershipNotice] = []
        contested = {g.uuid: g for g in snapshot.gpus if g.contested}
        for uuid, gpu in contested.items():
            assert gpu.claim is not None
            resources = gpu.claim.resources
            if self._reported.get(uuid) == resources:
                continue
            conflicts = tuple(c for c in snapshot.conflicts if c.share.gpu_uuid == uuid)
            notice = OwnershipNotice(gpu, contested=True, conflicts=conflicts)
            logger.warning("%s", notice.note(), extra={"gpu": uuid, "resources": resources})
            self._reported[uuid] = resources
            notices.append(notice)
        known = {g.uuid: g for g in snapshot.gpus}
        for uuid in [u for u in self._reported if u not in contested]:
            del self._reported[uuid]
            still_here = known.get(uuid)
            if still_here is None:
                continue  # the GPU left the node: nothing to offer again
            notice = OwnershipNotice(still_here, contested=False)
            logger.info("%s", notice.note(), extra={"gpu": uuid})
            notices.append(notice)
        return notices


def build_node_event(
    notice: OwnershipNotice,
    *,
    node: str,
    reporting_instance: str,
    now: dt.datetime,
) -> dict[str, Any]:
    """An ``events.k8s.io/v1`` Event on the Node for one notice."""
    event_type: Literal["Normal", "Warning"] = "Warning" if notice.contested else "Normal"
    stamp = now.astimezone(dt.UTC)
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            "name": f"{node[:200]}.{uuidlib.uuid4().hex[:16]}",
            "namespace": NODE_EVENT_NAMESPACE,
        },
        "eventTime": stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": reporting_instance[:128],
        "action": "WithdrawGpu" if notice.contested else "OfferGpu",
        "reason": REASON_CONFLICT if notice.contested else REASON_RESOLVED,
        "type": event_type,
        "note": _cap(notice.note()),
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
