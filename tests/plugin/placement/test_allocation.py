"""The preferred-allocation policy, case by case (properties are in test_allocation_hypothesis)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest

from plugin.api.config import AllocationPolicy
from plugin.api.resources import parse_replica_id
from plugin.placement.allocation import AllocationError, preferred_allocation
from plugin.placement.devices import DeviceTable, UnknownDeviceError
from plugin.placement.units import is_fraction_split
from tests.plugin.builders import gpu, table, uuid_for


def node(
    free: Sequence[int], numa: Sequence[int | None] | None = None, units: int = 100
) -> tuple[DeviceTable, list[str]]:
    """A table whose GPU ``i`` has ``free[i]`` available units (the highest-numbered ones)."""
    numa = numa if numa is not None else [0] * len(free)
    t = table([gpu(i, numa_node=numa[i]) for i in range(len(free))], units_per_gpu=units)
    available: list[str] = [d.id for d in t.devices if d.unit >= units - free[d.gpu.position]]
    return t, available


def per_gpu(ids: Sequence[str]) -> dict[int, int]:
    """GPU index → units chosen."""
    counts = Counter(parse_replica_id(i)[0] for i in ids)
    return {int(u.rsplit("-", 1)[1]): n for u, n in sorted(counts.items())}


CASES = [
    pytest.param([100, 60, 30, 80], None, 50, "binpack", {1: 50}, id="binpack-tightest-fit"),
    pytest.param([100, 60, 30, 80], None, 50, "spread", {0: 50}, id="spread-freest"),
    pytest.param([100, 60, 30, 80], None, 30, "binpack", {2: 30}, id="binpack-exact-fit"),
    pytest.param(
        [100, 100, 100, 100],
        [0, 0, 1, 1],
        150,
        "binpack",
        {0: 100, 1: 50},
        id="whole-then-same-numa",
    ),
    pytest.param(
        [100, 50, 100, 100],
        [0, 0, 1, 1],
        200,
        "binpack",
        {2: 100, 3: 100},
        id="wholes-on-one-numa-node",
    ),
    pytest.param(
        [100, 100, 100, 100],
        [0, 0, 0, 1],
        100,
        "binpack",
        {3: 100},
        id="binpack-smallest-numa-group",
    ),
    pytest.param(
        [100, 100, 100, 100], [0, 1, 1, 1], 100, "spread", {1: 100}, id="spread-largest-numa-group"
    ),
    pytest.param(
        [100, 100, 100, 100],
        [0, 0, 1, 1],
        300,
        "binpack",
        {0: 100, 1: 100, 2: 100},
        id="wholes-over-numa-nodes",
    ),
    pytest.param(
        [100, 40, 100, 35],
        [0, 0, 1, 1],
        130,
        "binpack",
        {0: 100, 1: 30},
        id="remainder-on-same-numa-before-tighter",
    ),
    pytest.param([40, 45, 30], None, 80, "binpack", {0: 35, 1: 45}, id="split-over-fewest-gpus"),
    pytest.param(
        [100, 90, 90], None, 200, "binpack", {0: 100, 1: 90, 2: 10}, id="not-enough-free-gpus"
    ),
    pytest.param([100, 100], None, 0, "binpack", {}, id="nothing"),
    pytest.param([100, 100], None, 200, "spread", {0: 100, 1: 100}, id="everything"),
]


@pytest.mark.parametrize(("free", "numa", "size", "policy", "expected"), CASES)
def test_preferred_allocation(
    free: list[int],
    numa: list[int | None] | None,
    size: int,
    policy: AllocationPolicy,
    expected: dict[int, int],
) -> None:
    t, available = node(free, numa)
    placement = preferred_allocation(available, [], size, table=t, policy=policy)
    assert len(placement.ids) == size
    assert set(placement.ids) <= set(available)
    assert per_gpu(placement.ids) == expected


def test_must_include_keeps_the_fraction_together() -> None:
    t, available = node([100, 100, 60])
    must = [i for i in available if parse_replica_id(i)[0] == uuid_for(2)][:30]
    placement = preferred_allocation(available, must, 50, table=t, policy="binpack")
    assert set(must) <= set(placement.ids)
    assert per_gpu(placement.ids) == {2: 50}


def test_must_include_on_two_gpus_does_not_overshoot() -> None:
    t, available = node([100, 100, 100])
    must = [f"{uuid_for(0)}::0", f"{uuid_for(1)}::0"]
    placement = preferred_allocation(available, must, 100, table=t, policy="binpack")
    assert len(placement.ids) == 100
    assert set(must) <= set(placement.ids)
    assert sum(per_gpu(placement.ids).values()) == 100


def test_must_include_outside_available_is_accepted() -> None:
    """The kubelet passes reused devices in must_include; they may be missing from available."""
    t, available = node([100, 100])
    must = [f"{uuid_for(1)}::0"]
    available = [i for i in available if i not in must]
    placement = preferred_allocation(available, must, 10, table=t, policy="binpack")
    assert per_gpu(placement.ids) == {1: 10}


def test_lowest_units_first_whatever_the_order() -> None:
    t, available = node([60])
    shuffled = available[:]
    random.Random(7).shuffle(shuffled)
    placement = preferred_allocation(shuffled, [], 5, table=t, policy="binpack")
    assert [parse_replica_id(i)[1] for i in placement.ids] == [40, 41, 42, 43, 44]


def test_deterministic_under_permutation_and_duplicates() -> None:
    t, available = node([100, 37, 52, 100, 81], [0, 0, 1, 1, None])
    reference = preferred_allocation(available, [], 123, table=t, policy="binpack")
    for seed in range(5):
        again = available + available[:10]
        random.Random(seed).shuffle(again)
        assert preferred_allocation(again, [], 123, table=t, policy="binpack") == reference


@pytest.mark.parametrize(
    ("size", "must", "expected"),
    [
        pytest.param(-1, [], "allocation_size must be >= 0: -1", id="negative"),
        pytest.param(201, [], "allocation_size 201 is more than the 200 devices", id="too-big"),
        pytest.param(
            1,
            [
                "GPU-00000000-0000-4000-8000-000000000000::0",
                "GPU-00000000-0000-4000-8000-000000000000::1",
            ],
            "must_include holds 2 devices but allocation_size is 1",
            id="must-too-big",
        ),
    ],
)
def test_unsatisfiable_requests_say_why(size: int, must: list[str], expected: str) -> None:
    t, available = node([100, 100])
    with pytest.raises(AllocationError) as err:
        preferred_allocation(available, must, size, table=t, policy="binpack")
    assert expected in str(err.value)


@pytest.mark.parametrize("where", ["available", "must_include"])
def test_unknown_ids_are_named(where: str) -> None:
    t, available = node([100])
    bogus = f"{uuid_for(0)}::100"
    args = ([*available, bogus], []) if where == "available" else (available, [bogus])
    with pytest.raises(UnknownDeviceError, match=f"unknown device: {bogus}"):
        preferred_allocation(*args, 1, table=t, policy="binpack")


@pytest.mark.parametrize(
    ("counts", "split"),
    [
        pytest.param({0: 50}, False, id="one-partial"),
        pytest.param({0: 100, 1: 50}, False, id="whole-plus-partial"),
        pytest.param({0: 30, 1: 20}, True, id="two-partials"),
        pytest.param({0: 100, 1: 100}, False, id="two-wholes"),
    ],
)
def test_is_fraction_split(counts: dict[int, int], split: bool) -> None:
    assert is_fraction_split(counts.values(), units_per_gpu=100) is split
