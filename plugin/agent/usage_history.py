"""Each share's peak GPU memory and SM use over a sliding window, for right-sizing.

Pure. The agent feeds it every cycle's :class:`~plugin.agent.accounting.Snapshot`
and puts what it answers, a :class:`~plugin.agent.accounting.UsagePeak` per
allocated share with the recommended share
(:func:`plugin.api.rightsizing.recommended_units`, the formula of the recording
rule and of ``metagpu usage --rightsize``), into the same snapshot, where
``mgctl get rightsize`` and the metrics read it.

Compact and bounded: per share (container and GPU) at most ``buckets + 1``
maxima, one per ``window_s / buckets`` (an hour by default), so memory grows
with the number of shares on the node and nothing else; a share's history is
dropped as soon as a cycle no longer lists it (its pod ended, or a recreated pod
of the same name, told apart by its UID, starts afresh). A sample leaves the
window no sooner than ``window_s`` after it was taken and no later than one
bucket after that.

Nothing survives a restart of the agent (no file, no API object): the window
starts over and each peak says so (``span``), which mgctl shows ("since the
agent started"). Prometheus, with the recording rule, is the durable history.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from plugin.agent.accounting import PeakSpan, ShareView, Snapshot, UsagePeak
from plugin.agent.containers import ContainerKey
from plugin.api.rightsizing import recommended_units

BUCKETS: Final = 24
"""Maxima per window: hourly over the default day, the resolution of the recording
rule's evaluation is finer, but right-sizing asks for a peak, not a curve."""

ShareKey = tuple[ContainerKey, str]
"""(container, GPU UUID): one share."""


@dataclass
class _Bucket:
    index: int
    memory_mib: int
    sm_percent: int | None


@dataclass
class _ShareHistory:
    pod_uid: str
    first_s: float
    """Monotonic seconds when the agent first listed the share."""
    buckets: deque[_Bucket] = field(default_factory=deque)

    def add(self, index: int, memory_mib: int, sm_percent: int | None) -> None:
        last = self.buckets[-1] if self.buckets else None
        if last is None or last.index != index:
            self.buckets.append(_Bucket(index, memory_mib, sm_percent))
            return
        last.memory_mib = max(last.memory_mib, memory_mib)
        if sm_percent is not None:
            last.sm_percent = max(last.sm_percent or 0, sm_percent)


class UsageHistory:
    """Per-share maxima over the last ``window_s`` (monotonic time), in ``buckets`` buckets."""

    def __init__(self, *, window_s: float, buckets: int = BUCKETS) -> None:
        if window_s <= 0 or buckets < 1:
            raise ValueError(f"window_s and buckets must be positive: {window_s}, {buckets}")
        self.window_s = window_s
        self.buckets = buckets
        self.bucket_s = window_s / buckets
        self._origin_s: float | None = None
        self._shares: dict[ShareKey, _ShareHistory] = {}

    def __len__(self) -> int:
        """Shares with a history."""
        return len(self._shares)

    def bucket_count(self) -> int:
        """Maxima held over all shares (bounded by ``len(self) × (buckets + 1)``)."""
        return sum(len(h.buckets) for h in self._shares.values())

    def record(self, snapshot: Snapshot, *, now_s: float) -> dict[ShareKey, UsagePeak]:
        """Add one cycle's use of every allocated share; forget shares it no longer lists.

        ``now_s`` is monotonic (the agent's cycle clock). A GPU whose processes were
        not read this cycle, or readings that are stale, add nothing: the peak
        must never be a stale or partial figure. Returns every share's peak."""
        if self._origin_s is None:
            self._origin_s = now_s
        current = math.floor((now_s - self._origin_s) / self.bucket_s)
        fresh = "gpus" not in snapshot.stale
        read = {g.uuid for g in snapshot.gpus if g.processes_known}
        seen: set[ShareKey] = set()
        for share in snapshot.shares:
            if not share.allocated:
                continue  # usage without units: nothing to right-size
            key = (share.key, share.gpu_uuid)
            seen.add(key)
            history = self._shares.get(key)
            if history is None or (
                history.pod_uid and share.pod_uid and history.pod_uid != share.pod_uid
            ):
                history = self._shares[key] = _ShareHistory(
                    share.pod_uid, now_s, deque(maxlen=self.buckets + 1)
                )
            history.pod_uid = history.pod_uid or share.pod_uid
            if fresh and share.gpu_uuid in read:
                history.add(current, share.memory_used_mib, share.utilization_percent)
        for gone in self._shares.keys() - seen:
            del self._shares[gone]
        oldest = current - self.buckets
        for history in self._shares.values():
            while history.buckets and history.buckets[0].index < oldest:
                history.buckets.popleft()
        return self.peaks(snapshot, now_s=now_s)

    def peaks(self, snapshot: Snapshot, *, now_s: float) -> dict[ShareKey, UsagePeak]:
        """Each listed share's peak and recommendation (shares with no sample have none)."""
        by_key: Mapping[ShareKey, ShareView] = {(s.key, s.gpu_uuid): s for s in snapshot.shares}
        found: dict[ShareKey, UsagePeak] = {}
        for key, history in self._shares.items():
            share = by_key.get(key)
            if share is None or not history.buckets or share.memory_total_mib <= 0:
                continue
            age_s = max(0.0, now_s - history.first_s)
            span: PeakSpan
            if age_s >= self.window_s:
                span = "window"
            elif history.first_s <= (self._origin_s or 0.0):
                span = "agent-start"
            else:
                span = "share-start"
            covered_s = min(age_s, self.window_s)
            memory = max(b.memory_mib for b in history.buckets)
            sms = [b.sm_percent for b in history.buckets if b.sm_percent is not None]
            found[key] = UsagePeak(
                memory_peak_mib=memory,
                sm_peak_percent=max(sms) if sms else None,
                window_s=self.window_s,
                covered_s=covered_s,
                since=snapshot.taken_at - covered_s,
                span=span,
                recommended_units=recommended_units(
                    memory_peak=memory / share.memory_total_mib,
                    units_per_gpu=share.units_per_gpu,
                ),
            )
        return found
