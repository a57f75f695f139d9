"""What a caller of the mgctl API gets to see: the ``/v1`` JSON documents.

Pure: a :class:`~plugin.agent.accounting.Snapshot` and a
:class:`~plugin.agent.identity.Caller` in, plain JSON-ready dicts out. In
container scope every document is cut down to the caller's own container: its
processes, its shares, and of each GPU only the static facts (name, memory
size) of GPUs it holds units of; other tenants' usage is not shown, not even
as a GPU-wide total.

Field names are camelCase like the Kubernetes API, because ``mgctl -o yaml``
output sits next to ``kubectl`` output in people's terminals. The documents are
versioned (``apiVersion: v1``); a field is never renamed within a version.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, Final

from plugin.agent.accounting import GpuView, ProcessView, ShareView, Snapshot, UsagePeak
from plugin.agent.identity import Caller
from plugin.api.rightsizing import HEADROOM

API_VERSION: Final = "v1"

Json = dict[str, Any]


class KillNotAllowedError(Exception):
    """A kill the caller may not do; ``str()`` says why."""


class NotAGpuProcessError(LookupError):
    """The PID is not a GPU process the agent knows of."""


def iso_time(epoch_s: float) -> str:
    """``2026-11-21T13:14:15Z``."""
    return dt.datetime.fromtimestamp(epoch_s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def caller_doc(caller: Caller) -> Json:
    """How the agent identified the caller (shown by ``mgctl -o yaml``)."""
    doc: Json = {"pid": caller.pid, "uid": caller.uid, "scope": caller.scope}
    if caller.container is not None:
        k = caller.container.key
        doc |= {
            "namespace": k.namespace,
            "pod": k.pod,
            "container": k.container,
            "containerId": caller.container.container_id,
        }
    else:
        doc["via"] = caller.via
    return doc


def _envelope(kind: str, snapshot: Snapshot, caller: Caller, node: str | None) -> Json:
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "node": node or "",
        "takenAt": iso_time(snapshot.taken_at) if snapshot.taken_at else None,
        "stale": sorted(snapshot.stale),
        "podsWatched": snapshot.pods_watched,
        "noGpusReason": snapshot.no_gpus_reason,
        "mps": _mps_doc(snapshot),
        "caller": caller_doc(caller),
        "unresolvedShares": _unresolved_docs(snapshot, caller),
    }


def _unresolved_docs(snapshot: Snapshot, caller: Caller) -> list[Json]:
    """DRA claim devices that are no share the agent can account for, with the reason
    (node scope: all; container scope: the caller's own)."""
    own = caller.container.key if caller.container is not None else None
    return [
        {
            "namespace": u.key.namespace,
            "pod": u.key.pod,
            "container": u.key.container,
            "claim": u.claim,
            "device": u.device,
            "reason": u.reason,
        }
        for u in snapshot.unresolved
        if own is None or u.key == own
    ]


ENFORCED_BY: Final = {
    "memory": "MPS: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, CUDA out of memory at the limit",
    "sm": "MPS: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, from the client's first context",
}
ADVISORY: Final = {
    "memory": "advisory: the node agent reports (or kills) over-use after the fact",
    "sm": "advisory: nothing caps SMs on this node (no supervised MPS daemon)",
}


def _mps_doc(snapshot: Snapshot) -> Json:
    """How the node serves MPS and what it enforces (node facts, no tenant's)."""
    mps = snapshot.mps
    doc: Json = {"mode": mps.mode, "enforces": list(snapshot.enforces)}
    if mps.status is not None:
        doc["daemon"] = {
            "state": mps.status.state,
            "reason": mps.status.reason,
            "restarts": mps.status.restarts,
            "since": iso_time(mps.status.since) if mps.status.since else None,
        }
    return doc


def _limits_doc(s: ShareView, enforces: tuple[str, ...]) -> Json:
    """The share's limits (:mod:`plugin.api.limits`) and whether the node holds the
    container to each: ``sm`` is None for ``balance`` and ``none`` (no cap)."""
    memory = "memory" in enforces
    doc: Json = {
        "memory": {
            "mib": s.memory_limit_mib,
            "enforced": memory,
            "by": ENFORCED_BY["memory"] if memory else ADVISORY["memory"],
        },
        "sm": None,
    }
    cap = s.thread_percentage
    if cap is not None:
        fixed = "fixed" in enforces
        doc["sm"] = {
            "percent": cap,
            "enforced": fixed,
            "by": ENFORCED_BY["sm"] if fixed else ADVISORY["sm"],
        }
    return doc


def _visible(caller: Caller) -> Callable[[ProcessView], bool]:
    if caller.container is None:
        return lambda _: True
    mine = caller.container.key
    return lambda p: p.container is not None and p.container.key == mine


def process_list(
    snapshot: Snapshot,
    caller: Caller,
    *,
    node: str | None,
    command: Callable[[ProcessView], str],
) -> Json:
    """``GET /v1/processes``: GPU processes the caller may see, with their share.

    ``command`` gives a listed process's command line (``""`` when it cannot be
    shown); it gets the whole view, so it can check the PID still belongs to
    the container the reading says."""
    shares = {(s.key, s.gpu_uuid): s for s in snapshot.shares}
    visible = _visible(caller)
    items: list[Json] = []
    for p in snapshot.processes:
        if not visible(p):
            continue
        item: Json = {
            "pid": p.pid,
            "gpuIndex": p.gpu_index,
            "gpuUuid": p.gpu_uuid,
            "usedMemoryMiB": p.used_memory_mib,
            "utilizationPercent": p.utilization_percent,
            "command": command(p),
            "containerId": p.container_id,
        }
        if p.container is not None:
            k = p.container.key
            item |= {"namespace": k.namespace, "pod": k.pod, "container": k.container}
            share = shares.get((k, p.gpu_uuid))
            if share is not None:
                item |= _share_fields(share, snapshot.enforces)
        items.append(item)
    return _envelope("ProcessList", snapshot, caller, node) | {"items": items}


def device_list(snapshot: Snapshot, caller: Caller, *, node: str | None) -> Json:
    """``GET /v1/devices``: GPUs with allocation and use (node) or the caller's shares."""
    items: list[Json] = []
    if caller.container is None:
        by_gpu: dict[str, list[ShareView]] = {}
        for s in snapshot.shares:
            by_gpu.setdefault(s.gpu_uuid, []).append(s)
        counts: dict[str, int] = {}
        for p in snapshot.processes:
            counts[p.gpu_uuid] = counts.get(p.gpu_uuid, 0) + 1
        for g in snapshot.gpus:
            items.append(
                _gpu_static(g)
                | {
                    "memoryUsedMiB": g.memory_used_mib,
                    "utilizationPercent": g.utilization_percent,
                    "healthy": g.healthy,
                    "problem": g.problem,
                    "health": _health_doc(g),
                    "resource": g.resource,
                    "unitsTotal": g.units_total,
                    "unitsAllocated": g.units_allocated,
                    "unitsFree": g.units_free,
                    "processes": counts.get(g.uuid, 0),
                    "shares": [
                        _share_doc(s, snapshot.enforces, peak=snapshot.peak_of(s))
                        for s in by_gpu.get(g.uuid, [])
                    ],
                    "otherOwner": _other_owner(g, snapshot),
                }
            )
    else:
        gpus = {g.uuid: g for g in snapshot.gpus}
        for s in snapshot.shares_of(caller.container.key):
            gpu = gpus.get(s.gpu_uuid)
            if gpu is None:
                continue
            doc = _gpu_static(gpu) | {
                "share": _share_doc(
                    s, snapshot.enforces, peak=snapshot.peak_of(s), with_owner=False
                )
            }
            if gpu.claim is not None:
                # The reason names resources and counts, never another tenant's pod.
                doc["otherOwner"] = {"resources": list(gpu.claim.resources)}
            items.append(doc)
    return _envelope("DeviceList", snapshot, caller, node) | {"items": items}


def authorize_kill(snapshot: Snapshot, caller: Caller, pid: int) -> ProcessView:
    """The GPU process ``pid`` if ``caller`` may kill it.

    Raises :class:`NotAGpuProcessError` when no GPU lists it and
    :class:`KillNotAllowedError` when it belongs to someone else. The agent only
    kills GPU processes: other processes are the business of ``kill(1)``.
    """
    process = next((p for p in snapshot.processes if p.pid == pid), None)
    if caller.container is None:
        if process is None:
            raise NotAGpuProcessError(
                f"PID {pid} is not a GPU process (none of this node's GPUs lists it in the "
                f"last reading); mgctl only kills GPU processes"
            )
        return process
    mine = caller.container.key
    if process is None or process.container is None or process.container.key != mine:
        # Same answer whether the PID exists elsewhere or not: a container must
        # not learn about other tenants' processes by probing PIDs.
        raise KillNotAllowedError(
            f"PID {pid} is not a GPU process of your container ({mine}); a container may "
            "only kill its own GPU processes (see mgctl get processes)"
        )
    return process


def _health_doc(g: GpuView) -> Json:
    """The device plugin's health record of the GPU (``source: plugin``), or the
    agent's own judgement when the plugin published none (``source: agent``)."""
    h = g.health
    if h is None:
        return {
            "state": "Healthy" if g.healthy else "Unhealthy",
            "reason": "" if g.healthy else (g.problem or ""),
            "check": "",
            "since": None,
            "source": "agent",
        }
    return {
        "state": h.state,
        "reason": h.reason,
        "check": h.check,
        "since": iso_time(h.since) if h.since else None,
        "source": "plugin",
    }


def _other_owner(g: GpuView, snapshot: Snapshot) -> Json | None:
    """Another device plugin's claim on this GPU (node scope): which resources, why
    its units are withdrawn, and each of our shares that conflicts, both pods named."""
    if g.claim is None:
        return None
    return {
        "resources": list(g.claim.resources),
        "reason": g.claim.reason(),
        "holders": [
            {
                "namespace": h.namespace,
                "pod": h.pod,
                "container": h.container,
                "resource": h.resource,
                "deviceId": h.device_id,
            }
            for h in g.claim.holders
        ],
        "conflicts": [
            {
                "namespace": c.share.key.namespace,
                "pod": c.share.key.pod,
                "container": c.share.key.container,
                "units": c.share.units,
                "otherNamespace": c.other.namespace,
                "otherPod": c.other.pod,
                "otherContainer": c.other.container,
                "otherResource": c.other.resource,
            }
            for c in snapshot.conflicts
            if c.share.gpu_uuid == g.uuid
        ],
    }


def _gpu_static(g: GpuView) -> Json:
    return {"index": g.index, "uuid": g.uuid, "name": g.name, "memoryTotalMiB": g.memory_total_mib}


def _share_fields(s: ShareView, enforces: tuple[str, ...]) -> Json:
    return {
        "units": s.units,
        "unitsPerGpu": s.units_per_gpu,
        "sharePercent": round(s.percent, 2),
        "memoryLimitMiB": s.memory_limit_mib if s.allocated else None,
        "computePolicy": s.compute_policy or None,
        "limits": _limits_doc(s, enforces) if s.allocated else None,
    }


def rightsize_doc(peak: UsagePeak | None) -> Json | None:
    """The share's peak use over the agent's window and the share it needs
    (:func:`plugin.api.rightsizing.recommended_units`); None before the first
    reading of it. ``span`` says when the covered time is less than the window:
    ``agent-start`` (the agent keeps no history across restarts) or
    ``share-start`` (the share is younger than the window)."""
    if peak is None:
        return None
    return {
        "windowS": peak.window_s,
        "coveredS": round(peak.covered_s, 1),
        "span": peak.span,
        "since": iso_time(peak.since),
        "memoryPeakMiB": peak.memory_peak_mib,
        "smPeakPercent": peak.sm_peak_percent,
        "recommendedUnits": peak.recommended_units,
        "headroomPercent": round((HEADROOM - 1) * 100),
    }


def _share_doc(
    s: ShareView,
    enforces: tuple[str, ...],
    *,
    peak: UsagePeak | None = None,
    with_owner: bool = True,
) -> Json:
    doc: Json = {}
    if with_owner:
        doc |= {"namespace": s.key.namespace, "pod": s.key.pod, "container": s.key.container}
    doc |= _share_fields(s, enforces) | {
        "resource": s.resource,
        "memoryUsedMiB": s.memory_used_mib,
        "utilizationPercent": s.utilization_percent,
        "overLimit": s.over_limit,
        "pids": list(s.pids),
        "rightsize": rightsize_doc(peak) if s.allocated else None,
    }
    return doc
