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

Recovery is more than "answers a probe": the GPU must also pass the
:class:`RecoveryChecks` that matter after an error (volatile uncorrectable
ECC errors, a pending or failed row remap, retired pages pending), each
skipped where the GPU does not support the query. A GPU that fails one stays
Unhealthy with a reason that says what to do (:func:`memory_problems`).

:class:`GpuHealth` is the one health record per GPU on the node: the plugin's
ListAndWatch, the board file the agent reads (:mod:`plugin.gpu.health_file`),
the agent's mgctl views, metrics and node labels all show this record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from plugin.api.config import DEFAULT_IGNORED_XIDS, HealthConfig
from plugin.gpu.backend import GpuEvent, MemoryHealth

ECC_DOUBLE_BIT_XID = 48
"""NVIDIA reports double-bit ECC errors as XID 48; ignoring 48 ignores them."""

Cause = Literal["event", "discovery"]

HealthState = Literal["Healthy", "Unhealthy"]
"""The kubelet's two device health values (``v1beta1.Healthy``/``Unhealthy``)."""

Check = Literal[
    "",
    "xid",
    "ecc",
    "lost",
    "driver",
    "discovery",
    "volatile-ecc",
    "row-remap",
    "retired-pages",
    "foreign",
    "mps",
]
"""Which check took the GPU out of service (empty while Healthy): a short, fixed
word for metrics labels and alerts; :attr:`GpuHealth.reason` has the details."""

HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"

RESET_HINT: Final = "reset the GPU (nvidia-smi -r) or reboot the node"


@dataclass(frozen=True)
class GpuHealth:
    """The one health record of one GPU: what every component shows for it."""

    uuid: str
    state: HealthState
    reason: str
    """Why it is Unhealthy, for an operator ("row remap pending: reset the GPU ...");
    empty while Healthy."""
    check: Check
    since: float
    """Wall-clock time (Unix seconds) the GPU entered this state."""

    @property
    def healthy(self) -> bool:
        return self.state == HEALTHY


@dataclass(frozen=True)
class RecoveryChecks:
    """What a sick GPU must pass, besides answering, to be put back in service.

    Each is on by default; each is skipped on a GPU that does not support its
    query (``NVML_ERROR_NOT_SUPPORTED``)."""

    volatile_ecc: bool = True
    row_remap: bool = True
    retired_pages: bool = True


def memory_problems(health: MemoryHealth, checks: RecoveryChecks) -> list[tuple[Check, str]]:
    """What keeps a GPU out of service, as ``(check, reason)``; empty when it may recover.

    The reasons say what an operator must do: every one of these clears only
    with a GPU reset (or a reboot), and a row-remap failure not even then."""
    problems: list[tuple[Check, str]] = []
    rows = health.remapped_rows
    if checks.row_remap and rows is not None:
        if rows.failure:
            problems.append(
                (
                    "row-remap",
                    "row remap failure: the GPU has no spare memory rows left; drain the node "
                    "and have the GPU serviced",
                )
            )
        elif rows.pending:
            problems.append(("row-remap", f"row remap pending: {RESET_HINT}"))
    ecc = health.volatile_uncorrected_ecc
    if checks.volatile_ecc and ecc:
        problems.append(
            (
                "volatile-ecc",
                f"{ecc} volatile uncorrectable ECC error(s) since the driver loaded: {RESET_HINT}",
            )
        )
    if checks.retired_pages and health.retired_pages_pending:
        problems.append(("retired-pages", f"retired pages pending: {RESET_HINT}"))
    return problems


def event_check(event: GpuEvent) -> Check:
    """The :data:`Check` an event stands for."""
    if event.kind == "xid":
        return "xid"
    if event.kind == "ecc_double_bit":
        return "ecc"
    if event.kind == "gpu_lost":
        return "lost"
    return "driver"


@dataclass(frozen=True)
class HealthPolicy:
    """Which events are critical and how long recovery takes."""

    ignored_xids: frozenset[int] = frozenset(DEFAULT_IGNORED_XIDS)
    recovery_s: float = 300.0
    checks: RecoveryChecks = field(default_factory=RecoveryChecks)
    liveness_interval_s: float = 10.0
    """Seconds between liveness polls of every healthy GPU; 0 turns them off."""

    @classmethod
    def of(cls, health: HealthConfig) -> HealthPolicy:
        """The policy a ``health`` config section asks for (the device plugin's and the
        DRA plugin's alike)."""
        return cls(
            ignored_xids=frozenset(health.ignored_xids),
            recovery_s=health.recovery_s,
            checks=RecoveryChecks(
                volatile_ecc=health.check_volatile_ecc,
                row_remap=health.check_row_remap,
                retired_pages=health.check_retired_pages,
            ),
            liveness_interval_s=health.liveness_interval_s,
        )

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
            return "GPU lost" + _detail(event) + f"; {RESET_HINT}"
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
    reason_only: bool = False
    """Still unhealthy, for a new reason (a recovery check failed): no device
    list changes, but the health record does."""


@dataclass
class _Sick:
    reason: str
    cause: Cause
    last_error_at: float
    errors: int = 1
    probe_error: str | None = None
    check: Check = "xid"
    first_reason: str = ""
    """What made it sick in the first place, kept when a recovery check rewrites ``reason``."""


@dataclass
class HealthLedger:
    """Per-GPU health, keyed by UUID. Not thread-safe: owned by one event loop."""

    policy: HealthPolicy = field(default_factory=HealthPolicy)
    _sick: dict[str, _Sick] = field(default_factory=dict)

    # ------------------------------------------------------------ queries
    def unhealthy(self) -> Mapping[str, str]:
        """UUID → reason for every GPU currently unhealthy."""
        return {uuid: s.reason for uuid, s in self._sick.items()}

    def check_of(self, uuid: str) -> Check:
        """The :data:`Check` that made ``uuid`` sick; empty when it is healthy."""
        s = self._sick.get(uuid)
        return s.check if s is not None else ""

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
        return self._mark(event.uuid, reason, cause="event", now=now, check=event_check(event))

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
            change = self._mark(uuid, reason, cause="discovery", now=now, check="discovery")
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

    def checks_failed(
        self, uuid: str, problems: list[tuple[Check, str]], *, now: float
    ) -> HealthChange | None:
        """The GPU answered but failed recovery checks: stay sick, restart the clock,
        and make the reason what the operator must do (the first error is kept in
        brackets). A change only when the reason changed."""
        s = self._sick.get(uuid)
        if s is None or not problems:
            return None
        s.last_error_at = now
        s.errors += 1
        reason = "; ".join(r for _, r in problems) + f" (after {s.first_reason or s.reason})"
        if reason == s.reason:
            return None
        s.reason, s.check = reason, problems[0][0]
        return HealthChange(uuid, healthy=False, reason=reason, reason_only=True)

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

    def _mark(
        self, uuid: str, reason: str, *, cause: Cause, now: float, check: Check
    ) -> HealthChange | None:
        s = self._sick.get(uuid)
        if s is not None:
            s.last_error_at = max(s.last_error_at, now)
            s.errors += 1
            if cause == "discovery" and (s.cause, s.reason) != ("discovery", reason):
                s.cause, s.reason, s.check, s.first_reason = "discovery", reason, check, reason
                return HealthChange(uuid, healthy=False, reason=reason, reason_only=True)
            return None
        self._sick[uuid] = _Sick(
            reason=reason, cause=cause, last_error_at=now, check=check, first_reason=reason
        )
        return HealthChange(uuid, healthy=False, reason=reason)
