"""Right-sizing in the agent (issue 30, item 4): each share's peak over a sliding window,
the recommended share from the one formula, and what mgctl and the metrics show.

The history is fed whole snapshots (the agent's join), on a fake monotonic clock:
a day passes without sleeping.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from plugin.agent import mgctl
from plugin.agent.accounting import Allocation, Snapshot, build_snapshot
from plugin.agent.agent import Agent
from plugin.agent.identity import Caller
from plugin.agent.usage_history import BUCKETS, UsageHistory
from plugin.agent.views import device_list
from plugin.api.config import PluginConfig
from plugin.api.rightsizing import recommended_units
from plugin.gpu.simulated import SimulatedGpu, SimulatedGpus, SimulatedGpusFile
from tests.agent.builders import (
    A100,
    gpu,
    gpu_uuid,
    index_of,
    key,
    place_in_container,
    pod,
    reading,
    ref,
)

R = "cnvrg.io/metagpu"
U0 = gpu_uuid(0)
HOUR = 3600.0
DAY = 24 * HOUR
GPU_MIB = 81920


def snapshot(
    used: dict[str, int],
    *,
    units: dict[str, int] | None = None,
    util: int | None = None,
    stale: frozenset[Any] = frozenset(),
    pods: Sequence[dict[str, Any]] | None = None,
    memory_mib: int = GPU_MIB,
    units_per_gpu: int = 100,
) -> Snapshot:
    """Pods named in ``units`` hold that many units of GPU 0 (25 each by default, for
    those in ``used``); each uses ``used[name]`` MiB in one process."""
    units = units if units is not None else dict.fromkeys(used, 25)
    allocations, first = [], 0
    for name, n in units.items():
        allocations.append(
            Allocation(key(name), R, tuple(f"{U0}::{u}" for u in range(first, first + n)))
        )
        first += n
    procs = [(100 + i, mib) for i, mib in enumerate(used.values())]
    owners = {100 + i: ref(name).container_id for i, name in enumerate(used)}
    return build_snapshot(
        [reading(gpu(0, memory_mib=memory_mib), procs, util=util)],
        allocations,
        owners,
        directory=index_of(*(pods if pods is not None else [pod(n) for n in units])),
        units_per_gpu=units_per_gpu,
        gpu_resources={U0: R},
        resources=[R],
        taken_at=1_700_000_000,
        stale=stale,
    )


def peak_of(history: UsageHistory, snap: Snapshot, *, at: float, pod_name: str = "a") -> Any:
    return history.record(snap, now_s=at).get((key(pod_name), U0))


def test_the_window_keeps_the_peak_and_says_what_it_covers() -> None:
    history = UsageHistory(window_s=DAY)
    first = peak_of(history, snapshot({"a": 30000}, util=90), at=0)
    assert (first.memory_peak_mib, first.sm_peak_percent) == (30000, 90)
    assert (first.covered_s, first.span) == (0, "agent-start")
    for hour in range(1, 24):
        peak = peak_of(history, snapshot({"a": 1000}, util=10), at=hour * HOUR + 20 * 60)
        assert peak.memory_peak_mib == 30000  # a day's peak, not the last reading
    assert peak.covered_s == 23 * HOUR + 20 * 60
    assert peak.span == "agent-start"
    # 30,000 of 81,920 MiB is 36.6%, + 10% is 40.3%: 41 units, the shared formula
    assert (
        peak.recommended_units
        == 41
        == recommended_units(memory_peak=30000 / GPU_MIB, units_per_gpu=100)
    )
    full = peak_of(history, snapshot({"a": 1000}), at=DAY)
    assert (full.memory_peak_mib, full.span, full.covered_s) == (30000, "window", DAY)


@pytest.mark.parametrize(
    ("at", "kept"),
    [
        pytest.param(DAY - 1, True, id="just-inside-the-window"),
        pytest.param(DAY, True, id="kept-at-least-the-window"),
        pytest.param(DAY + DAY / BUCKETS - 1, True, id="within-one-bucket-after"),
        pytest.param(DAY + DAY / BUCKETS, False, id="forgotten-one-bucket-after"),
    ],
)
def test_a_peak_leaves_the_window(at: float, kept: bool) -> None:
    history = UsageHistory(window_s=DAY)
    peak_of(history, snapshot({"a": 30000}), at=0)
    peak = peak_of(history, snapshot({"a": 2000}), at=at)
    assert peak.memory_peak_mib == (30000 if kept else 2000)
    assert peak.span == ("window" if at >= DAY else "agent-start")


def test_memory_is_bounded_by_the_shares_and_freed_when_they_end() -> None:
    history = UsageHistory(window_s=DAY)
    names = ["a", "b", "c"]
    for step in range(3 * 24 * 12):  # three days of 5-minute cycles
        history.record(snapshot(dict.fromkeys(names, 1000 + step % 7)), now_s=step * 300.0)
        assert len(history) == 3
        assert history.bucket_count() <= 3 * (BUCKETS + 1)
    assert history.bucket_count() == 3 * (BUCKETS + 1)
    history.record(snapshot({"a": 1000}), now_s=4 * DAY)  # b and c ended
    assert len(history) == 1
    history.record(snapshot({}, units={}), now_s=4 * DAY + 300)
    assert (len(history), history.bucket_count()) == (0, 0)


def test_a_share_that_ends_starts_over_and_so_does_a_recreated_pod() -> None:
    history = UsageHistory(window_s=DAY)
    peak_of(history, snapshot({"a": 30000}), at=0)
    peak_of(history, snapshot({}, units={}), at=HOUR)  # a's share ended
    again = peak_of(history, snapshot({"a": 500}), at=2 * HOUR)
    assert (again.memory_peak_mib, again.span, again.covered_s) == (500, "share-start", 0)
    # same name, new pod (a StatefulSet's replacement): its predecessor's peak is not its own
    recreated = pod("a")
    recreated["metadata"]["uid"] = "0f0f0f0f-0000-4000-8000-000000000001"
    fresh = peak_of(history, snapshot({"a": 100}, pods=[recreated]), at=3 * HOUR)
    assert (fresh.memory_peak_mib, fresh.span) == (100, "share-start")


def test_stale_readings_add_nothing_and_usage_without_units_is_not_tracked() -> None:
    history = UsageHistory(window_s=DAY)
    peak_of(history, snapshot({"a": 1000}), at=0)
    stale = snapshot({"a": 70000}, stale=frozenset({"gpus"}))
    assert peak_of(history, stale, at=60).memory_peak_mib == 1000
    assert history.record(snapshot({"x": 5000}, units={}), now_s=120) == {}


@settings(max_examples=60, deadline=None)
@given(
    peaks=st.lists(st.integers(min_value=0, max_value=96 * 1024), min_size=1, max_size=12),
    memory_mib=st.sampled_from([16384, 40960, 81920, 98304]),
    units_per_gpu=st.sampled_from([4, 8, 10, 100]),
)
def test_the_recommendation_is_the_shared_formula_of_the_peak(
    peaks: list[int], memory_mib: int, units_per_gpu: int
) -> None:
    history = UsageHistory(window_s=DAY)
    units = {"a": units_per_gpu // 2 or 1}
    for i, used in enumerate(peaks):
        snap = snapshot(
            {"a": used}, units=units, memory_mib=memory_mib, units_per_gpu=units_per_gpu
        )
        peak = peak_of(history, snap, at=i * HOUR)
    assert peak.memory_peak_mib == max(peaks)
    want = recommended_units(memory_peak=max(peaks) / memory_mib, units_per_gpu=units_per_gpu)
    assert peak.recommended_units == want
    assert 1 <= want <= units_per_gpu


# ------------------------------------------------- the agent, mgctl and metrics
class Allocations:
    """The kubelet's answer, fixed (the PodResources adapter has its own tests)."""

    def __init__(self, *allocations: Allocation) -> None:
        self.allocations = allocations

    async def list_allocations(self) -> tuple[Allocation, ...]:
        return self.allocations

    async def close(self) -> None:
        return None


async def test_mgctl_shows_the_container_its_peak_and_recommended_share(tmp_path: Path) -> None:
    proc_root = tmp_path / "proc"
    place_in_container(proc_root, 4242, ref("a"))
    backend = SimulatedGpus(
        SimulatedGpusFile(gpus=[SimulatedGpu(uuid=U0, name=A100, memory_mib=GPU_MIB)])
    )
    clock = [1000.0]
    config = PluginConfig.model_validate(
        {"agent": {"proc_root": str(proc_root), "node_name": "node-a"}}
    )
    agent = Agent(
        config,
        backend=backend,
        allocations=Allocations(Allocation(key("a"), R, tuple(f"{U0}::{u}" for u in range(50)))),
        index=index_of(pod("a")),
        monotonic=lambda: clock[0],
    )
    assert config.agent.rightsizing_window_s == DAY

    def use(mib: int, sm: int) -> None:
        backend.update(
            U0, processes=[{"pid": 4242, "used_memory_mib": mib, "utilization_percent": sm}]
        )

    use(16384, 70)  # 20% of the GPU
    await agent.cycle()
    use(2048, 5)
    clock[0] += 3 * HOUR + 20 * 60
    snap = (await agent.cycle()).snapshot

    me = Caller(pid=1, uid=1000, scope="container", container=ref("a"), via="pod container")
    doc = device_list(snap, me, node="node-a")
    rightsize = doc["items"][0]["share"]["rightsize"]
    assert rightsize["memoryPeakMiB"] == 16384
    assert rightsize["smPeakPercent"] == 70
    assert rightsize["recommendedUnits"] == 22  # 20% + 10%, as the recording rule
    assert (rightsize["span"], rightsize["coveredS"]) == ("agent-start", 3 * HOUR + 20 * 60)

    text = mgctl.render_rightsize(doc)
    header, row = text.splitlines()[2:4]
    assert [c.strip() for c in header.split("  ") if c.strip()] == [
        "GPU",
        "SHARE",
        "MEMORY PEAK",
        "SM PEAK",
        "RECOMMENDED",
        "CHANGE",
        "PEAK OVER",
    ]
    assert "50 units (50%)" in row
    assert "16,384 MiB (20.0%)" in row
    assert "22 units" in row
    assert "-28 units" in row
    assert "last 3 h 20 min (since the agent started)" in row
    assert "a restart of the agent starts it over" in text

    node = Caller(pid=1, uid=0, scope="node", container=None, via="host root")
    node_text = mgctl.render_rightsize(device_list(snap, node, node="n"))
    assert node_text.splitlines()[3].split()[:4] == ["0", "ml", "a", "main"]

    families = {f.name: f for f in text_string_to_metric_families(agent.metrics.render().decode())}
    (sample,) = families["metagpu_container_recommended_units"].samples
    assert (sample.labels["pod"], sample.value) == ("a", 22)
    (peak,) = families["metagpu_container_memory_peak_bytes"].samples
    assert peak.value == 16384 * 1024 * 1024
    (covered,) = families["metagpu_container_rightsizing_covered_seconds"].samples
    assert covered.value == 3 * HOUR + 20 * 60


def test_mgctl_says_when_the_agent_keeps_no_history() -> None:
    doc = {
        "node": "n",
        "takenAt": "2026-05-01T10:00:00Z",
        "caller": {"scope": "container", "namespace": "ml", "pod": "a", "container": "main"},
        "items": [
            {"index": 0, "memoryTotalMiB": GPU_MIB, "share": {"units": 50, "sharePercent": 50}}
        ],
    }
    text = mgctl.render_rightsize(doc)
    assert "no reading yet" in text
    assert "keeps no usage history" in text
