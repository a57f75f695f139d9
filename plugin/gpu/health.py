"""GPU health policy and the unhealthy → healthy state machine (pure; time is passed in).

After NVIDIA's ``internal/rm/health.go``, minus its one gap: NVIDIA marks a
GPU unhealthy on a critical XID and never brings it back (a ``FIXME`` in its
``ListAndWatch``). Here a GPU that stays free of critical errors for
``recovery_s`` *and answers a probe* becomes Healthy again. The probe matters:
a GPU that fell off the bus (XID 79) sends no more events, so silence alone
would wrongly heal it.

The event loop that feeds this (a thread around NVML's bounded wait) lives in
:mod:`plugin.gpu.health_monitor`; this module only decides.

Two kinds of unhealthy:

* **event**: a critical XID, a double-bit ECC error, a lost GPU or a failed
  driver call while watching; recovers after ``recovery_s`` clean + a probe.
* **discovery**: the driver could not even describe the GPU at start-up; it
  stays unhealthy until the next discovery (every restart of serving: a
  kubelet restart, SIGHUP, a plugin restart), because there is nothing to
  probe against.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from plugin.api.config import DEFAULT_IGNORED_XIDS
from plugin.gpu.backend import GpuEvent

ECC_DOUBLE_BIT_XID = 48
"""NVIDIA reports double-bit ECC errors as XID 48; ignoring 48 ignores them."""

Cause = Literal["event", "discovery"]


@dataclass(frozen=True)
class HealthPolicy:
    """Which events are critical and how long recovery takes."""

    ignored_xids: frozenset[int] = frozenset(DEFAULT_IGNORED_XIDS)
    recovery_s: float = 300.0

    def verdict(self, event: GpuEvent) -> str | None:
        """Why ``event`` makes its GPU unhealthy, or None when it does not."""
        if event.kind == "xid":
            if event.xid is None:
                return "XID error (number unknown)" + _detail(event)
            if event.xid in self.ignored_xids:
                return None
            return f"XID {event.xid}" + _detail(event)
        if event.kind == "ecc_double_bit":
            if ECC_DOUBLE_BIT_XID in self.ignored_xids:
                return None
            return f"double-bit ECC error (XID {ECC_DOUBLE_BIT_XID})" + _detail(event)
        if event.kind == "gpu_lost":
            return "GPU lost" + _detail(event)
        return "driver error while watching the GPU" + _detail(event)


def _detail(event: GpuEvent) -> str:
    return f": {event.detail}" if event.detail else ""


@dataclass(frozen=True)
class HealthChange:
    """A GPU changed state; the caller logs it and re-sends device lists."""

    uuid: str
    healthy: bool
    reason: str
    """Why it is unhealthy now, or what it recovered from."""


@dataclass
class _Sick:
    reason: str
    cause: Cause
    last_error_at: float
    errors: int = 1
    probe_error: str | None = None


@dataclass
class HealthLedger:
    """Per-GPU health, keyed by UUID. Not thread-safe: owned by one event loop."""

    policy: HealthPolicy = field(default_factory=HealthPolicy)
    _sick: dict[str, _Sick] = field(default_factory=dict)

    # ------------------------------------------------------------ queries
    def unhealthy(self) -> Mapping[str, str]:
        """UUID → reason for every GPU currently unhealthy."""
        return {uuid: s.reason for uuid, s in self._sick.items()}

    def is_healthy(self, uuid: str) -> bool:
        return uuid not in self._sick

    def recovery_due(self, *, now: float) -> list[str]:
        """Event-caused sick GPUs clean for ``recovery_s``: probe these, then :meth:`recover`."""
        limit = self.policy.recovery_s
        return sorted(
            uuid
            for uuid, s in self._sick.items()
            if s.cause == "event" and now - s.last_error_at >= limit
        )

    def next_recovery_at(self) -> float | None:
        """When the earliest event-caused sick GPU becomes due; None if none is."""
        times = [s.last_error_at for s in self._sick.values() if s.cause == "event"]
        return min(times) + self.policy.recovery_s if times else None

    # ------------------------------------------------------------ updates
    def record(self, event: GpuEvent, *, now: float) -> HealthChange | None:
        """Apply one event. A critical event on a healthy GPU is a change; on a sick
        one it restarts the recovery clock. Ignored events change nothing."""
        reason = self.policy.verdict(event)
        if reason is None:
            return None
        return self._mark(event.uuid, reason, cause="event", now=now)

    def mark_discovery_failures(
        self, failures: Mapping[str, str], *, now: float
    ) -> list[HealthChange]:
        """Replace the set of GPUs that failed discovery (a new discovery ran).

        GPUs that failed before and were described fine now become healthy;
        event-caused sickness is kept (a restart must not heal a faulting GPU)."""
        changes: list[HealthChange] = []
        for uuid, s in list(self._sick.items()):
            if s.cause == "discovery" and uuid not in failures:
                del self._sick[uuid]
                changes.append(
                    HealthChange(uuid, healthy=True, reason=f"rediscovered ({s.reason})")
                )
        for uuid, reason in failures.items():
            change = self._mark(uuid, reason, cause="discovery", now=now)
            if change is not None:
                changes.append(change)
        return changes

    def recover(self, uuid: str, *, now: float) -> HealthChange | None:
        """Mark ``uuid`` healthy if it is still due (no error since it was offered)."""
        s = self._sick.get(uuid)
        if s is None or s.cause != "event" or now - s.last_error_at < self.policy.recovery_s:
            return None
        del self._sick[uuid]
        return HealthChange(uuid, healthy=True, reason=f"recovered from {s.reason}")

    def probe_failed(self, uuid: str, detail: str, *, now: float) -> None:
        """The recovery probe failed: stay sick, restart the clock."""
        s = self._sick.get(uuid)
        if s is not None:
            s.last_error_at = now
            s.errors += 1
            s.probe_error = detail

    def set_policy(self, policy: HealthPolicy) -> None:
        """Adopt a reloaded policy; sick GPUs stay sick (their events happened)."""
        self.policy = policy

    def clear_events(self) -> list[HealthChange]:
        """Heal every event-caused sick GPU: health checking was turned off, so
        nothing would ever probe or recover them. Discovery failures stay (the
        GPU could not even be described)."""
        changes: list[HealthChange] = []
        for uuid, s in list(self._sick.items()):
            if s.cause == "event":
                del self._sick[uuid]
                changes.append(
                    HealthChange(
                        uuid, healthy=True, reason=f"health checking disabled ({s.reason})"
                    )
                )
        return changes

    def forget(self, keep: Iterable[str]) -> None:
        """Drop state for GPUs no longer on the node (after a rediscovery)."""
        keep_set = set(keep)
        for uuid in [u for u in self._sick if u not in keep_set]:
            del self._sick[uuid]

    def _mark(self, uuid: str, reason: str, *, cause: Cause, now: float) -> HealthChange | None:
        s = self._sick.get(uuid)
        if s is not None:
            s.last_error_at = max(s.last_error_at, now)
            s.errors += 1
            if cause == "discovery":
                s.cause = "discovery"
                s.reason = reason
            return None
        self._sick[uuid] = _Sick(reason=reason, cause=cause, last_error_at=now)
        return HealthChange(uuid, healthy=False, reason=reason)
