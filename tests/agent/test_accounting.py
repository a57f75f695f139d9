"""The join: allocations + processes + containers + GPU facts → a snapshot."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from plugin.agent.accounting import (
    Allocation,
    GpuReading,
    Snapshot,
    build_snapshot,
    memory_limit_mib,
)
from plugin.agent.cgroups import ContainerId
from plugin.agent.containers import PodIndex
from plugin.api.resources import DEFAULT_RESOURCE_NAME
from plugin.gpu.backend import GpuProcess, GpuUsage
from tests.agent.builders import gpu, gpu_uuid, index_of, key, pod, reading, ref

R = DEFAULT_RESOURCE_NAME
U0, U1 = gpu_uuid(0), gpu_uuid(1)


def ids(device: str, units: range) -> tuple[str, ...]:
    return tuple(f"{device}::{u}" for u in units)


def snap(
    readings: list[GpuReading],
    allocations: list[Allocation],
    owners: Mapping[int, ContainerId | None],
    index: PodIndex,
    *,
    units_per_gpu: int = 100,
) -> Snapshot:
    return build_snapshot(
        readings,
        allocations,
        owners,
        directory=index,
        units_per_gpu=units_per_gpu,
        gpu_resources={r.info.uuid: R for r in readings},
        resources=[R],
        taken_at=1_700_000_000.0,
    )


@pytest.mark.parametrize(
    ("units", "units_per_gpu", "memory", "expected"),
    [
        pytest.param(25, 100, 81920, 20480, id="quarter-of-80GiB"),
        pytest.param(50, 100, 40960, 20480, id="half-of-40GiB"),
        pytest.param(1, 3, 16000, 5333, id="floored-to-whole-MiB"),
        pytest.param(0, 100, 81920, 0, id="no-units-no-memory"),
        pytest.param(100, 100, 81920, 81920, id="whole-gpu"),
    ],
)
def test_memory_limit(units: int, units_per_gpu: int, memory: int, expected: int) -> None:
    assert memory_limit_mib(units, units_per_gpu=units_per_gpu, memory_total_mib=memory) == expected


def test_two_containers_share_a_gpu() -> None:
    index = index_of(pod("a"), pod("b"))
    a, b = ref("a"), ref("b")
    readings = [reading(gpu(0), [(101, 4096), (102, 1024), (201, 30000), (900, 512)])]
    owners = {101: a.container_id, 102: a.container_id, 201: b.container_id, 900: None}
    allocations = [
        Allocation(key("a"), R, ids(U0, range(0, 25))),
        Allocation(key("b"), R, ids(U0, range(25, 75))),
    ]
    s = snap(readings, allocations, owners, index)

    (g,) = s.gpus
    assert (g.units_total, g.units_allocated, g.units_free) == (100, 75, 25)
    assert g.unattributed_memory_mib == 512  # the host process
    sa, sb = s.shares_of(key("a"))[0], s.shares_of(key("b"))[0]
    assert (sa.units, sa.memory_limit_mib, sa.memory_used_mib, sa.pids) == (
        25,
        20480,
        5120,
        (101, 102),
    )
    assert (sb.units, sb.memory_limit_mib, sb.memory_used_mib) == (50, 40960, 30000)
    assert sa.percent == 25.0
    assert not sa.over_limit
    assert not sb.over_limit
    assert sa.container_id == a.container_id
    assert sa.pod_uid == a.pod_uid
    host = next(p for p in s.processes if p.pid == 900)
    assert host.container is None
    assert host.container_id is None


def test_over_limit() -> None:
    index = index_of(pod("a"))
    a = ref("a")
    s = snap(
        [reading(gpu(0), [(101, 20481)])],
        [Allocation(key("a"), R, ids(U0, range(25)))],
        {101: a.container_id},
        index,
    )
    assert s.shares[0].over_limit


def test_index_device_ids_map_to_the_gpu() -> None:
    index = index_of(pod("a"))
    s = snap(
        [reading(gpu(0)), reading(gpu(1))],
        [Allocation(key("a"), R, ids("1", range(10)))],
        {},
        index,
    )
    (share,) = s.shares
    assert share.gpu_uuid == U1
    assert share.units == 10
    assert [g.units_allocated for g in s.gpus] == [0, 10]


def test_allocation_across_two_gpus_gives_two_shares() -> None:
    index = index_of(pod("a"))
    s = snap(
        [reading(gpu(0)), reading(gpu(1))],
        [Allocation(key("a"), R, ids(U0, range(100)) + ids(U1, range(50)))],
        {},
        index,
    )
    assert [(x.gpu_index, x.units) for x in s.shares_of(key("a"))] == [(0, 100), (1, 50)]


def test_other_resources_are_ignored() -> None:
    index = index_of(pod("a"))
    s = snap(
        [reading(gpu(0))],
        [Allocation(key("a"), "nvidia.com/gpu", (U0,)), Allocation(key("a"), R, ids(U0, range(5)))],
        {},
        index,
    )
    assert [x.units for x in s.shares] == [5]
    assert s.problems == ()


@pytest.mark.parametrize(
    ("device_id", "problem"),
    [
        pytest.param("GPU-gone::3", "no GPU 'GPU-gone' is on this node", id="unknown-gpu"),
        pytest.param("garbage", "meta-device ID must be <gpu>::<n>", id="malformed-id"),
    ],
)
def test_bad_allocations_are_reported_not_fatal(device_id: str, problem: str) -> None:
    index = index_of(pod("a"))
    s = snap([reading(gpu(0))], [Allocation(key("a"), R, (device_id, f"{U0}::0"))], {}, index)
    assert s.shares[0].units == 1
    assert any(problem in p and "ml/a/main" in p for p in s.problems), s.problems


def test_usage_without_allocation_has_no_limit() -> None:
    index = index_of(pod("a"))
    a = ref("a")
    s = snap([reading(gpu(0), [(101, 70000)])], [], {101: a.container_id}, index)
    (share,) = s.shares
    assert share.units == 0
    assert share.memory_limit_mib == 0
    assert not share.allocated
    assert not share.over_limit


def test_unknown_container_is_unattributed() -> None:
    index = index_of(pod("a"))
    s = snap([reading(gpu(0), [(101, 1000)])], [], {101: ContainerId("f" * 64)}, index)
    assert s.shares == ()
    assert s.processes[0].container is None
    assert s.processes[0].container_id == "f" * 64
    assert s.gpus[0].unattributed_memory_mib == 1000


def test_share_without_processes_names_its_container() -> None:
    index = index_of(pod("a"))
    s = snap([reading(gpu(0))], [Allocation(key("a"), R, ids(U0, range(5)))], {}, index)
    (share,) = s.shares
    assert share.container_id == ref("a").container_id
    assert share.memory_used_mib == 0
    assert share.pids == ()


@pytest.mark.parametrize(
    ("proc_utils", "owners", "gpu_util", "expected"),
    [
        pytest.param([30, 25], ["a", "a"], 90, 55, id="sum-of-own-processes"),
        pytest.param([None, None], ["a", "a"], 70, 70, id="sole-user-gets-gpu-figure"),
        pytest.param([None, None], ["a", "b"], 70, None, id="shared-gpu-unknown"),
        pytest.param([80, 60], ["a", "a"], 90, 100, id="capped-at-100"),
        pytest.param([None], ["a"], None, None, id="driver-cannot-tell"),
    ],
)
def test_container_utilization(
    proc_utils: list[int | None], owners: list[str], gpu_util: int | None, expected: int | None
) -> None:
    index = index_of(pod("a"), pod("b"))
    procs = tuple(
        GpuProcess(pid=100 + i, used_memory_mib=10, utilization_percent=u)
        for i, u in enumerate(proc_utils)
    )
    r = GpuReading(
        info=gpu(0),
        usage=GpuUsage(memory_used_mib=20, memory_total_mib=81920, utilization_percent=gpu_util),
        processes=procs,
    )
    own = {100 + i: ref(o).container_id for i, o in enumerate(owners)}
    s = snap([r], [], own, index)
    assert s.shares_of(key("a"))[0].utilization_percent == expected


def test_failed_reading_is_unhealthy_and_blind() -> None:
    index = PodIndex()
    r = GpuReading(info=gpu(0), usage=None, processes=None, error="NVML could not list processes")
    s = snap([r], [], {}, index)
    (g,) = s.gpus
    assert not g.healthy
    assert not g.processes_known
    assert g.problem == "NVML could not list processes"
    assert any("NVML could not list processes" in p for p in s.problems)


def test_gpu_outside_every_resource_has_no_units() -> None:
    s = build_snapshot(
        [reading(gpu(0)), reading(gpu(1))],
        [],
        {},
        directory=PodIndex(),
        units_per_gpu=100,
        gpu_resources={U0: R},
        resources=[R],
        taken_at=0.0,
    )
    assert [(g.resource, g.units_total) for g in s.gpus] == [(R, 100), (None, 0)]
