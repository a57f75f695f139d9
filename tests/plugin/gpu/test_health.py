"""Health policy (which events are critical) and the recovery state machine (time passed in)."""

from __future__ import annotations

import pytest

from plugin.api.config import DEFAULT_IGNORED_XIDS
from plugin.gpu.backend import GpuEvent
from plugin.gpu.health import HealthChange, HealthLedger, HealthPolicy

GPU = "GPU-a"


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        *[
            pytest.param(GpuEvent(GPU, "xid", xid=x), None, id=f"xid-{x}-application-error")
            for x in DEFAULT_IGNORED_XIDS
        ],
        pytest.param(GpuEvent(GPU, "xid", xid=79), "XID 79", id="xid-79-fell-off-the-bus"),
        pytest.param(GpuEvent(GPU, "xid", xid=48), "XID 48", id="xid-48"),
        pytest.param(
            GpuEvent(GPU, "xid", xid=94, detail="contained ECC"),
            "XID 94: contained ECC",
            id="detail",
        ),
        pytest.param(GpuEvent(GPU, "xid"), "number unknown", id="xid-without-number"),
        pytest.param(GpuEvent(GPU, "ecc_double_bit", xid=48), "double-bit ECC", id="ecc-dbe"),
        pytest.param(GpuEvent(GPU, "gpu_lost"), "GPU lost", id="gpu-lost"),
        pytest.param(
            GpuEvent(GPU, "backend_error", detail="wait failed"), "driver error", id="backend-error"
        ),
    ],
)
def test_default_policy(event: GpuEvent, expected: str | None) -> None:
    verdict = HealthPolicy().verdict(event)
    if expected is None:
        assert verdict is None
    else:
        assert verdict is not None
        assert expected in verdict


def test_ignoring_48_ignores_double_bit_ecc() -> None:
    policy = HealthPolicy(ignored_xids=frozenset({48}))
    assert policy.verdict(GpuEvent(GPU, "ecc_double_bit", xid=48)) is None
    assert policy.verdict(GpuEvent(GPU, "gpu_lost")) is not None


def test_ignored_events_change_nothing() -> None:
    ledger = HealthLedger()
    assert ledger.record(GpuEvent(GPU, "xid", xid=13), now=0) is None
    assert ledger.is_healthy(GPU)


def test_sick_then_recovered_after_a_clean_period() -> None:
    ledger = HealthLedger(HealthPolicy(recovery_s=60))
    assert ledger.record(GpuEvent(GPU, "xid", xid=79), now=100) == HealthChange(
        GPU, healthy=False, reason="XID 79"
    )
    assert ledger.unhealthy() == {GPU: "XID 79"}
    assert ledger.next_recovery_at() == 160
    assert ledger.recovery_due(now=159) == []
    assert ledger.recover(GPU, now=159) is None
    assert ledger.recovery_due(now=160) == [GPU]
    change = ledger.recover(GPU, now=160)
    assert change is not None
    assert change.healthy
    assert "recovered from XID 79" in change.reason
    assert ledger.is_healthy(GPU)


def test_repeated_errors_restart_the_clock_without_a_new_change() -> None:
    ledger = HealthLedger(HealthPolicy(recovery_s=60))
    ledger.record(GpuEvent(GPU, "xid", xid=79), now=0)
    assert ledger.record(GpuEvent(GPU, "xid", xid=79), now=50) is None
    assert ledger.recovery_due(now=100) == []
    assert ledger.recovery_due(now=110) == [GPU]


def test_a_failed_probe_keeps_it_sick_and_restarts_the_clock() -> None:
    ledger = HealthLedger(HealthPolicy(recovery_s=10))
    ledger.record(GpuEvent(GPU, "gpu_lost"), now=0)
    ledger.probe_failed(GPU, "GPU is lost", now=10)
    assert not ledger.is_healthy(GPU)
    assert ledger.recovery_due(now=15) == []
    assert ledger.recovery_due(now=20) == [GPU]


def test_discovery_failures_never_recover_by_time() -> None:
    ledger = HealthLedger(HealthPolicy(recovery_s=1))
    (change,) = ledger.mark_discovery_failures({GPU: "NVML could not read the UUID"}, now=0)
    assert not change.healthy
    assert ledger.recovery_due(now=1e9) == []
    assert ledger.next_recovery_at() is None
    assert ledger.recover(GPU, now=1e9) is None


def test_a_clean_rediscovery_heals_discovery_failures_but_not_events() -> None:
    ledger = HealthLedger()
    ledger.mark_discovery_failures({"GPU-d": "unreadable"}, now=0)
    ledger.record(GpuEvent(GPU, "xid", xid=79), now=0)
    changes = ledger.mark_discovery_failures({}, now=1)
    assert [(c.uuid, c.healthy) for c in changes] == [("GPU-d", True)]
    assert ledger.unhealthy() == {GPU: "XID 79"}


def test_forget_drops_gpus_that_left() -> None:
    ledger = HealthLedger()
    ledger.record(GpuEvent(GPU, "gpu_lost"), now=0)
    ledger.record(GpuEvent("GPU-b", "gpu_lost"), now=0)
    ledger.forget(["GPU-b"])
    assert set(ledger.unhealthy()) == {"GPU-b"}


def test_a_new_policy_keeps_sick_gpus_sick() -> None:
    ledger = HealthLedger(HealthPolicy(recovery_s=10))
    ledger.record(GpuEvent(GPU, "xid", xid=31), now=0)  # ignored by default
    ledger.record(GpuEvent(GPU, "xid", xid=79), now=0)
    ledger.set_policy(HealthPolicy(ignored_xids=frozenset({79}), recovery_s=5))
    assert not ledger.is_healthy(GPU)
    assert ledger.recovery_due(now=5) == [GPU]
