"""The enforcement state machine, without killing anything: timelines of snapshots in,
decisions out. (Real kills and Events: ``test_enforcement.py``.)"""

from __future__ import annotations

import datetime as dt

import pytest

from plugin.agent.accounting import GpuView, ShareView, Snapshot
from plugin.agent.containers import PodRef
from plugin.agent.enforcement import (
    EVENT_NOTE_MAX,
    Kill,
    KillOutcome,
    OverrunTracker,
    Report,
    Resolved,
    build_event,
    kill_note,
    report_note,
)
from plugin.api.agent_config import MemoryEnforcement
from tests.agent.builders import gpu_uuid, key

U0 = gpu_uuid(0)


def share(
    used_mib: int, *, units: int = 25, pod: str = "a", pids: tuple[int, ...] = (101,)
) -> ShareView:
    return ShareView(
        key=key(pod),
        gpu_uuid=U0,
        gpu_index=0,
        resource="cnvrg.io/metagpu",
        units=units,
        units_per_gpu=100,
        memory_total_mib=81920,
        memory_limit_mib=units * 81920 // 100,
        memory_used_mib=used_mib,
        utilization_percent=None,
        pids=pids,
        container_id=None,
        pod_uid="uid-a",
    )


def gpu_view(*, processes_known: bool = True) -> GpuView:
    return GpuView(
        uuid=U0,
        index=0,
        name="A100",
        memory_total_mib=81920,
        memory_used_mib=0,
        utilization_percent=0,
        healthy=True,
        problem=None,
        resource="cnvrg.io/metagpu",
        units_total=100,
        units_allocated=25,
        unattributed_memory_mib=0,
        processes_known=processes_known,
    )


def snapshot(
    *shares: ShareView, blind: bool = False, stale: frozenset[str] = frozenset()
) -> Snapshot:
    return Snapshot(
        taken_at=0.0,
        units_per_gpu=100,
        gpus=(gpu_view(processes_known=not blind),),
        shares=shares,
        processes=(),
        stale=stale,  # type: ignore[arg-type]
    )


OVER = 30000  # limit of 25 units is 20480 MiB
UNDER = 10000


def kinds(decisions: list[Report | Kill | Resolved]) -> list[str]:
    return [type(d).__name__ for d in decisions]


@pytest.mark.parametrize(
    ("policy", "timeline", "expected"),
    [
        pytest.param(
            "kill",
            [(0, OVER), (10, OVER), (29, OVER), (30, OVER), (31, OVER)],
            [["Report"], [], [], ["Kill"], []],
            id="kill-after-grace-once",
        ),
        pytest.param(
            "kill",
            [(0, OVER), (30, OVER), (45, OVER), (60, OVER)],
            [["Report"], ["Kill"], [], ["Kill"]],
            id="kill-again-every-grace-while-it-persists",
        ),
        pytest.param(
            "kill",
            [(0, OVER), (20, UNDER), (40, OVER), (65, OVER), (70, OVER)],
            [["Report"], ["Resolved"], ["Report"], [], ["Kill"]],
            id="overrun-ending-before-grace-resets-the-clock",
        ),
        pytest.param(
            "kill",
            [(0, UNDER), (100, UNDER)],
            [[], []],
            id="never-over-never-anything",
        ),
        pytest.param(
            "report",
            [(0, OVER), (30, OVER), (300, OVER), (301, UNDER)],
            [["Report"], [], [], ["Resolved"]],
            id="report-never-kills",
        ),
        pytest.param(
            "off",
            [(0, OVER), (300, OVER)],
            [[], []],
            id="off-does-nothing",
        ),
    ],
)
def test_timeline(
    policy: MemoryEnforcement, timeline: list[tuple[float, int]], expected: list[list[str]]
) -> None:
    tracker = OverrunTracker()
    got = [
        kinds(tracker.decide(snapshot(share(used)), now_s=t, policy=policy, grace_s=30))
        for t, used in timeline
    ]
    assert got == expected


def loud(decisions: list[Report | Kill | Resolved]) -> list[str]:
    """Decision kinds, with ``Report(quiet)`` for a report within the cooldown."""
    return [
        "Report(quiet)" if isinstance(d, Report) and d.quiet else type(d).__name__
        for d in decisions
    ]


@pytest.mark.parametrize(
    ("cooldown_s", "timeline", "expected"),
    [
        pytest.param(
            600,
            [(0, OVER), (10, UNDER), (20, OVER), (30, UNDER), (40, OVER)],
            [["Report"], ["Resolved"], ["Report(quiet)"], ["Resolved"], ["Report(quiet)"]],
            id="swinging-job-reported-once",
        ),
        pytest.param(
            600,
            [(0, OVER), (10, UNDER), (599, OVER), (600, UNDER), (610, OVER), (620, UNDER)],
            [["Report"], ["Resolved"], ["Report(quiet)"], ["Resolved"], ["Report"], ["Resolved"]],
            id="reported-again-once-the-cooldown-is-over",
        ),
        pytest.param(
            600,
            [(0, OVER), (700, OVER), (710, UNDER), (720, OVER)],
            [["Report"], [], ["Resolved"], ["Report"]],
            id="cooldown-counts-from-the-report-not-the-end",
        ),
        pytest.param(
            0,
            [(0, OVER), (10, UNDER), (20, OVER)],
            [["Report"], ["Resolved"], ["Report"]],
            id="zero-reports-every-overrun",
        ),
    ],
)
def test_report_cooldown(
    cooldown_s: float, timeline: list[tuple[float, int]], expected: list[list[str]]
) -> None:
    tracker = OverrunTracker()
    got = [
        loud(
            tracker.decide(
                snapshot(share(used)),
                now_s=t,
                policy="report",
                grace_s=30,
                cooldown_s=cooldown_s,
            )
        )
        for t, used in timeline
    ]
    assert got == expected


def test_cooldown_is_per_share_and_never_delays_a_kill() -> None:
    tracker = OverrunTracker()

    def at(t: float, *shares: ShareView) -> list[str]:
        return loud(
            tracker.decide(snapshot(*shares), now_s=t, policy="kill", grace_s=30, cooldown_s=600)
        )

    assert at(0, share(OVER)) == ["Report"]
    assert at(10) == ["Resolved"]
    assert at(20, share(OVER), share(OVER, pod="b")) == ["Report(quiet)", "Report"]
    assert at(50, share(OVER), share(OVER, pod="b")) == ["Kill", "Kill"]


def test_zero_grace_kills_at_once() -> None:
    decisions = OverrunTracker().decide(snapshot(share(OVER)), now_s=0, policy="kill", grace_s=0)
    assert kinds(decisions) == ["Report", "Kill"]


def test_share_that_disappears_is_resolved() -> None:
    tracker = OverrunTracker()
    tracker.decide(snapshot(share(OVER)), now_s=0, policy="kill", grace_s=30)
    (resolved,) = tracker.decide(snapshot(), now_s=5, policy="kill", grace_s=30)
    assert isinstance(resolved, Resolved)
    assert resolved.share_id == (key("a"), U0)
    assert resolved.lasted_s == 5
    assert tracker.overruns == frozenset()


@pytest.mark.parametrize(
    "stale",
    [
        pytest.param(frozenset({"gpus"}), id="gpus"),
        pytest.param(frozenset({"podresources"}), id="podresources"),
    ],
)
def test_no_decision_on_stale_inputs(stale: frozenset[str]) -> None:
    tracker = OverrunTracker()
    tracker.decide(snapshot(share(OVER)), now_s=0, policy="kill", grace_s=30)
    assert (
        tracker.decide(snapshot(share(OVER), stale=stale), now_s=60, policy="kill", grace_s=30)
        == []
    )
    assert tracker.overruns  # kept, not resolved
    # fresh data again: still over, grace long past -> kill now
    assert kinds(tracker.decide(snapshot(share(OVER)), now_s=61, policy="kill", grace_s=30)) == [
        "Kill"
    ]


def test_pod_list_staleness_does_not_stop_enforcement() -> None:
    tracker = OverrunTracker()
    pods_stale = frozenset({"pods"})
    assert kinds(
        tracker.decide(snapshot(share(OVER), stale=pods_stale), now_s=0, policy="kill", grace_s=1)
    ) == ["Report"]


def test_blind_gpu_keeps_its_episode() -> None:
    tracker = OverrunTracker()
    tracker.decide(snapshot(share(OVER)), now_s=0, policy="kill", grace_s=30)
    # process list failed on that GPU: its shares are missing, but the episode is not "resolved"
    assert tracker.decide(snapshot(blind=True), now_s=10, policy="kill", grace_s=30) == []
    assert tracker.overruns


def test_unallocated_usage_is_never_enforced() -> None:
    decisions = OverrunTracker().decide(
        snapshot(share(70000, units=0)), now_s=0, policy="kill", grace_s=0
    )
    assert decisions == []


def test_notes_say_used_allowed_done() -> None:
    s = share(OVER, pids=(101, 102))
    note = report_note(Report(s, policy="kill", kill_after_s=30))
    for part in ("30,000 MiB", "20,480 MiB", "25/100 units", "GPU 0", U0, "PIDs 101, 102", "30 s"):
        assert part in note
    assert "nothing was done" in report_note(Report(s, policy="report", kill_after_s=None))
    killed = kill_note(Kill(s, over_for_s=31), KillOutcome(killed=(101,), gone=(102,)))
    for part in (
        "30,000 MiB",
        "20,480 MiB",
        "for 31 s",
        "killed PIDs 101 with SIGKILL",
        "Already exited: 102",
    ):
        assert part in killed


def test_event_is_events_k8s_io_v1() -> None:
    event = build_event(
        PodRef("ml", "train-0", "uid-1"),
        reason="GpuMemoryOverLimit",
        action="Report",
        note="x" * 5000,
        reporting_instance="node-a",
        now=dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC),
    )
    assert event["apiVersion"] == "events.k8s.io/v1"
    assert event["eventTime"] == "2026-01-02T03:04:05.678000Z"
    assert event["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ml",
        "name": "train-0",
        "uid": "uid-1",
    }
    assert event["reportingController"] == "metagpu.io/agent"
    assert event["metadata"]["namespace"] == "ml"
    assert event["metadata"]["name"].startswith("train-0.")
    # The API server's limit is on UTF-8 bytes; "…" alone is 3 of them.
    assert len(event["note"].encode("utf-8")) <= EVENT_NOTE_MAX
    assert event["note"].endswith("…")
    assert event["note"].startswith("x" * 1000)


@pytest.mark.parametrize(
    "note",
    [
        pytest.param("x" * 5000, id="ascii"),
        pytest.param("é" * 5000, id="two-byte"),
        pytest.param("x" + "€" * 5000, id="three-byte-unaligned"),
        pytest.param("x" * 1023 + "é", id="one-byte-over"),
    ],
)
def test_a_long_note_is_cut_to_the_byte_limit(note: str) -> None:
    event = build_event(
        PodRef("ml", "train-0", "uid-1"),
        reason="GpuMemoryOverLimit",
        action="Report",
        note=note,
        reporting_instance="node-a",
        now=dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
    )
    raw = event["note"].encode("utf-8")  # a split character would not encode back
    assert EVENT_NOTE_MAX - 4 < len(raw) <= EVENT_NOTE_MAX
    assert event["note"].endswith("…")
    assert note.startswith(event["note"][:-1])


def test_a_note_at_the_limit_is_kept_whole() -> None:
    note = "x" * (EVENT_NOTE_MAX - 2) + "é"  # exactly 1024 bytes
    event = build_event(
        PodRef("ml", "train-0", "uid-1"),
        reason="GpuMemoryOverLimit",
        action="Report",
        note=note,
        reporting_instance="node-a",
        now=dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
    )
    assert event["note"] == note
