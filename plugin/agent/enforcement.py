"""GPU memory enforcement: a container over its share's limit, for how long, and what to do.

Two halves, kept apart so the decision can be tested without killing anything:

* :class:`OverrunTracker` (pure): a small state machine per (container, GPU).
  An overrun *starts* the first cycle a share's used memory exceeds its limit
  (one :class:`Report`), *persists* while it stays over, and *ends* the first
  cycle it is back under (:class:`Resolved`). With policy ``kill`` a
  :class:`Kill` is decided once the overrun has lasted ``grace_s``, and again
  every ``grace_s`` while it goes on (a container that respawns its workers is
  not killed in a tight loop). A share whose overrun was reported less than
  ``cooldown_s`` ago gets a *quiet* :class:`Report`: counted in the metrics,
  but no Event and no warning, so a job swinging around its limit does not
  write an Event every other cycle.
* :class:`Enforcer` (adapter over pidfds and an :class:`EventSink`): kills the
  container's processes on that GPU (all of them at once, not one per cycle as
  the original did) and records a Kubernetes Event on the pod saying what was
  used, what was allowed and what was done.

Safety rules, each for a reason:

* Only shares that hold units have a limit. A container using a GPU it holds no
  units of belongs to someone else's plugin; it is reported in metrics only.
* No decision is taken on a cycle whose inputs are stale (allocations or GPU
  readings could not be read) or for a GPU whose process list failed: the agent
  never kills on data it did not see.
* Before each SIGKILL the process holding the PID is pinned (a pidfd), its
  cgroup is read again and must still name the same container, and the signal
  goes through the pidfd: a PID reused by another process since the reading is
  skipped, and one reused *during* the check is never signalled.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from plugin.agent.accounting import ShareView, Snapshot
from plugin.agent.cgroups import (
    CgroupFormatError,
    ContainerId,
    ProcessGoneError,
    pick_container,
    read_process_cgroup,
)
from plugin.agent.containers import ContainerKey, PodRef
from plugin.agent.processes import ProcessHandle, open_process
from plugin.api.agent_config import MemoryEnforcement

logger = logging.getLogger(__name__)

REPORTING_CONTROLLER: Final = "metagpu.io/agent"
"""``reportingController`` of every Event the agent writes."""

REASON_OVER_LIMIT: Final = "GpuMemoryOverLimit"
REASON_KILLED: Final = "GpuMemoryLimitEnforced"
REASON_KILL_FAILED: Final = "GpuMemoryKillFailed"
EVENT_NOTE_MAX: Final = 1024
"""The API server rejects an Event ``note`` over 1024 *bytes* (UTF-8)."""
_ELLIPSIS: Final = "…"

ShareId = tuple[ContainerKey, str]
"""(container, GPU UUID): the unit enforcement tracks."""

EnforcementAction = Literal["report", "kill", "kill_failed", "kill_skipped", "resolved"]
ENFORCEMENT_ACTIONS: Final[tuple[EnforcementAction, ...]] = (
    "report",
    "kill",
    "kill_failed",
    "kill_skipped",
    "resolved",
)
""":class:`EnforcementRecord` actions; ``kill_skipped``: a kill found none of the
share's processes to signal (all had exited or now belong to someone else)."""


# ------------------------------------------------------------------ decisions
@dataclass(frozen=True)
class Report:
    """An overrun started: tell the operator (and the pod's owner)."""

    share: ShareView
    policy: MemoryEnforcement
    kill_after_s: float | None
    """Seconds until a kill if it persists (policy ``kill``); None otherwise."""
    quiet: bool = False
    """This share's overruns were reported less than the cooldown ago: count it,
    but write no Event and no warning."""


@dataclass(frozen=True)
class Kill:
    """The overrun lasted the grace period under policy ``kill``: kill its processes."""

    share: ShareView
    over_for_s: float


@dataclass(frozen=True)
class Resolved:
    """An overrun ended (back under the limit, or its processes exited)."""

    share_id: ShareId
    lasted_s: float


Decision = Report | Kill | Resolved


@dataclass
class _Episode:
    started_s: float
    next_kill_s: float


class OverrunTracker:
    """Per-share overrun state across cycles. Pure: time comes in as ``now_s``."""

    def __init__(self) -> None:
        self._episodes: dict[ShareId, _Episode] = {}
        self._reported_at: dict[ShareId, float] = {}
        """When each share's last loud Report was decided (monotonic seconds)."""

    @property
    def overruns(self) -> frozenset[ShareId]:
        """Shares currently over their limit."""
        return frozenset(self._episodes)

    def decide(
        self,
        snapshot: Snapshot,
        *,
        now_s: float,
        policy: MemoryEnforcement,
        grace_s: float,
        cooldown_s: float = 0.0,
    ) -> list[Decision]:
        """What to do this cycle. ``now_s`` is monotonic seconds; ``cooldown_s`` is how
        long after a loud Report a new overrun of the same share stays quiet."""
        if policy == "off":
            self._episodes.clear()
            self._reported_at.clear()
            return []
        for reported, at in list(self._reported_at.items()):
            if now_s - at >= cooldown_s:
                del self._reported_at[reported]
        if snapshot.stale & {"gpus", "podresources"}:
            return []  # keep every episode as it is; decide again on fresh data
        blind = {g.uuid for g in snapshot.gpus if not g.processes_known}
        decisions: list[Decision] = []
        seen: set[ShareId] = set()
        for share in snapshot.shares:
            if not share.over_limit or share.gpu_uuid in blind:
                continue
            sid: ShareId = (share.key, share.gpu_uuid)
            seen.add(sid)
            episode = self._episodes.get(sid)
            if episode is None:
                episode = _Episode(started_s=now_s, next_kill_s=now_s + grace_s)
                self._episodes[sid] = episode
                quiet = sid in self._reported_at
                if not quiet:
                    self._reported_at[sid] = now_s
                decisions.append(
                    Report(
                        share,
                        policy=policy,
                        kill_after_s=grace_s if policy == "kill" else None,
                        quiet=quiet,
                    )
                )
                if policy != "kill" or grace_s > 0:
                    continue
            if policy == "kill" and now_s >= episode.next_kill_s:
                decisions.append(Kill(share, over_for_s=now_s - episode.started_s))
                episode.next_kill_s = now_s + max(grace_s, 0.0)
        for sid in list(self._episodes):
            if sid in seen or sid[1] in blind:
                continue
            episode = self._episodes.pop(sid)
            decisions.append(Resolved(sid, lasted_s=now_s - episode.started_s))
        return decisions


# ------------------------------------------------------------------ messages
def format_mib(mib: int) -> str:
    """``12,288 MiB``: how nvidia-smi and mgctl print memory."""
    return f"{mib:,} MiB"


def describe_share(share: ShareView) -> str:
    """``used 12,288 MiB of GPU 0 (GPU-…); its 25/100 units allow 10,240 MiB``."""
    return (
        f"container {share.key.container} used {format_mib(share.memory_used_mib)} of "
        f"GPU {share.gpu_index} ({share.gpu_uuid}) memory; its share of "
        f"{share.units}/{share.units_per_gpu} units ({share.percent:g}%) allows "
        f"{format_mib(share.memory_limit_mib)}"
    )


def report_note(decision: Report) -> str:
    """The Event note for an overrun that started."""
    share = decision.share
    if decision.policy == "kill":
        done = (
            f"policy kill: its processes on this GPU (PIDs {_pids(share.pids)}) will be killed "
            f"if the overrun lasts {decision.kill_after_s:g} s"
        )
    else:
        done = "policy report: nothing was done"
    return _cap(f"{describe_share(share)}. {done}.")


def kill_note(decision: Kill, outcome: KillOutcome) -> str:
    """The Event note after a kill: what was used, what was allowed, what was done."""
    parts = [f"{describe_share(decision.share)} for {decision.over_for_s:.0f} s."]
    if outcome.killed:
        parts.append(f"policy kill: killed PIDs {_pids(outcome.killed)} with SIGKILL.")
    if outcome.gone:
        parts.append(f"Already exited: {_pids(outcome.gone)}.")
    if outcome.skipped:
        parts.append(f"Skipped (PID now belongs to another process): {_pids(outcome.skipped)}.")
    for pid, error in outcome.failed.items():
        parts.append(f"Could not kill {pid}: {error}.")
    return _cap(" ".join(parts))


def build_event(
    pod: PodRef,
    *,
    reason: str,
    action: str,
    note: str,
    reporting_instance: str,
    now: dt.datetime,
    event_type: Literal["Normal", "Warning"] = "Warning",
) -> dict[str, Any]:
    """An ``events.k8s.io/v1`` Event about ``pod``.

    events.k8s.io/v1 rather than core v1 because its required fields say what an
    operator needs: ``action`` (what was done), ``reportingController`` and
    ``reportingInstance`` (which node's agent did it), and ``regarding`` (the
    pod; the note names the container). Both APIs share one storage, so
    ``kubectl describe pod`` and ``kubectl events`` show it either way.
    """
    stamp = now.astimezone(dt.UTC)
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            # Unique per pod and moment, like the kubelet's <pod>.<hex> names.
            "name": f"{pod.name[:200]}.{uuidlib.uuid4().hex[:16]}",
            "namespace": pod.namespace,
        },
        "eventTime": stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": reporting_instance[:128],
        "action": action,
        "reason": reason,
        "type": event_type,
        "note": _cap(note),
        "regarding": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": pod.namespace,
            "name": pod.name,
            "uid": pod.uid,
        },
    }


def _pids(pids: Sequence[int]) -> str:
    return ", ".join(str(p) for p in pids) or "none"


def _cap(text: str) -> str:
    """``text`` cut to at most :data:`EVENT_NOTE_MAX` UTF-8 bytes, ending in ``…`` when cut
    (the limit is on bytes; a multi-byte character is never split)."""
    raw = text.encode("utf-8")
    if len(raw) <= EVENT_NOTE_MAX:
        return text
    budget = EVENT_NOTE_MAX - len(_ELLIPSIS.encode("utf-8"))
    return raw[:budget].decode("utf-8", "ignore") + _ELLIPSIS


# ------------------------------------------------------------------- adapter
@dataclass(frozen=True)
class KillOutcome:
    """What happened to each PID of a :class:`Kill`."""

    killed: tuple[int, ...] = ()
    gone: tuple[int, ...] = ()
    skipped: tuple[int, ...] = ()
    failed: Mapping[int, str] = field(default_factory=dict)


def kill_share_processes(
    pids: Sequence[int],
    *,
    container_id: ContainerId | None,
    proc_root: Path,
    known: Callable[[ContainerId], bool],
    sig: int = signal.SIGKILL,
    open_process: Callable[..., ProcessHandle] = open_process,
) -> KillOutcome:
    """Send ``sig`` to each PID that still runs in ``container_id`` (None: on the host).

    Between the cycle's reading and now the process may have exited and its PID
    been reused. So each PID is pinned first (:mod:`plugin.agent.processes`),
    its cgroup is read again, and the signal goes to the pinned process: if the
    PID changed hands after the pin, the signal finds its process gone instead
    of reaching the newcomer. PID 1 and the agent itself are never signalled.
    """
    killed: list[int] = []
    gone: list[int] = []
    skipped: list[int] = []
    failed: dict[int, str] = {}
    for pid in pids:
        if pid <= 1 or pid == os.getpid():
            skipped.append(pid)
            continue
        try:
            handle = open_process(pid, proc_root=proc_root)
        except ProcessGoneError:
            gone.append(pid)
            continue
        except OSError as exc:
            failed[pid] = exc.strerror or str(exc)
            continue
        with handle:
            try:
                owner = pick_container(read_process_cgroup(pid, proc_root=proc_root), known=known)
            except ProcessGoneError:
                gone.append(pid)
                continue
            except CgroupFormatError as exc:
                failed[pid] = str(exc)
                continue
            if owner != container_id:
                skipped.append(pid)
                continue
            try:
                handle.send(sig)
            except ProcessLookupError:
                gone.append(pid)
            except OSError as exc:
                failed[pid] = exc.strerror or str(exc)
            else:
                killed.append(pid)
    return KillOutcome(tuple(killed), tuple(gone), tuple(skipped), failed)


class EventSink(Protocol):
    """Where Events go: :class:`plugin.agent.kube.KubeEventSink` behind a
    :class:`plugin.agent.events.QueuedEventSink`, or a test list."""

    async def record(self, event: Mapping[str, Any]) -> None:
        """Write one Event; must log rather than raise on API errors."""
        ...


@dataclass(frozen=True)
class EnforcementRecord:
    """One thing the enforcer did, for metrics (``metagpu_enforcement_actions_total``)."""

    action: EnforcementAction
    share_id: ShareId


class Enforcer:
    """Carries out :class:`OverrunTracker` decisions: logs, kills and Events."""

    def __init__(
        self,
        *,
        events: EventSink | None,
        pods: Callable[[str, str], PodRef | None],
        known: Callable[[ContainerId], bool],
        proc_root: Path,
        reporting_instance: str,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        open_process: Callable[..., ProcessHandle] = open_process,
    ) -> None:
        self._events = events
        self._pods = pods
        self._known = known
        self._proc_root = proc_root
        self._instance = reporting_instance
        self._clock = clock
        self._open_process = open_process

    async def execute(self, decisions: Sequence[Decision]) -> list[EnforcementRecord]:
        """Act on each decision in order; never raises for one share's failure."""
        records: list[EnforcementRecord] = []
        for decision in decisions:
            if isinstance(decision, Resolved):
                key, gpu = decision.share_id
                logger.info(
                    "GPU memory back under the limit after %.0f s",
                    decision.lasted_s,
                    extra=_ref(key, gpu),
                )
                records.append(EnforcementRecord("resolved", decision.share_id))
            elif isinstance(decision, Report):
                records.append(await self._report(decision))
            else:
                records.append(await self._kill(decision))
        return records

    async def _report(self, decision: Report) -> EnforcementRecord:
        share = decision.share
        note = report_note(decision)
        if decision.quiet:
            logger.debug(
                "GPU memory over the limit again (reported recently, no Event): %s",
                note,
                extra=_ref(share.key, share.gpu_uuid),
            )
        else:
            logger.warning(
                "GPU memory over the limit: %s", note, extra=_ref(share.key, share.gpu_uuid)
            )
            await self._event(share, reason=REASON_OVER_LIMIT, action="Report", note=note)
        return EnforcementRecord("report", (share.key, share.gpu_uuid))

    async def _kill(self, decision: Kill) -> EnforcementRecord:
        share = decision.share
        if share.container_id is None:
            outcome = KillOutcome(failed=dict.fromkeys(share.pids, "container ID unknown"))
        else:
            outcome = kill_share_processes(
                share.pids,
                container_id=share.container_id,
                proc_root=self._proc_root,
                known=self._known,
                open_process=self._open_process,
            )
        note = kill_note(decision, outcome)
        if not outcome.killed and not outcome.failed:
            # Nothing was signalled: do not claim the limit was enforced.
            log = logger.warning if outcome.skipped else logger.info
            log(
                "GPU memory limit: no process left to kill: %s",
                note,
                extra=_ref(share.key, share.gpu_uuid),
            )
            return EnforcementRecord("kill_skipped", (share.key, share.gpu_uuid))
        ok = not outcome.failed
        log = logger.warning if ok else logger.error
        log("GPU memory limit enforced: %s", note, extra=_ref(share.key, share.gpu_uuid))
        await self._event(
            share,
            reason=REASON_KILLED if ok else REASON_KILL_FAILED,
            action="Kill",
            note=note,
        )
        return EnforcementRecord("kill" if ok else "kill_failed", (share.key, share.gpu_uuid))

    async def _event(self, share: ShareView, *, reason: str, action: str, note: str) -> None:
        if self._events is None:
            return
        pod = self._pods(share.key.namespace, share.key.pod)
        if pod is None:
            pod = PodRef(namespace=share.key.namespace, name=share.key.pod, uid=share.pod_uid)
        event = build_event(
            pod,
            reason=reason,
            action=action,
            note=note,
            reporting_instance=self._instance,
            now=self._clock(),
        )
        await self._events.record(event)


def _ref(key: ContainerKey, gpu: str) -> dict[str, str]:
    return {"namespace": key.namespace, "pod": key.pod, "container": key.container, "gpu": gpu}
