"""Properties of the preferred-allocation policy for random nodes, occupancy and requests."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from plugin.api.config import AllocationPolicy
from plugin.api.resources import parse_replica_id
from plugin.placement.allocation import preferred_allocation
from plugin.placement.devices import DeviceTable
from tests.plugin.builders import gpu, table


@dataclass(frozen=True)
class Scenario:
    table: DeviceTable
    available: list[str]
    must_include: list[str]
    size: int
    policy: AllocationPolicy

    @property
    def units(self) -> int:
        return self.table.units_per_gpu

    def free_per_gpu(self) -> Counter[str]:
        return Counter(parse_replica_id(i)[0] for i in self.available)


@st.composite
def scenarios(draw: st.DrawFn, *, with_must: bool = True) -> Scenario:
    count = draw(st.integers(1, 8), label="gpus")
    units = draw(st.sampled_from([1, 2, 3, 7, 10, 100]), label="units_per_gpu")
    numa = draw(st.lists(st.sampled_from([None, 0, 1]), min_size=count, max_size=count))
    t = table([gpu(i, numa_node=numa[i]) for i in range(count)], units_per_gpu=units)
    available: list[str] = []
    for pos in range(count):
        how = draw(st.sampled_from(["none", "all", "some"]), label=f"occupancy of GPU {pos}")
        taken: frozenset[int] = frozenset()
        if how == "all":
            taken = frozenset(range(units))
        elif how == "some":
            taken = draw(st.frozensets(st.integers(0, units - 1)), label=f"taken on GPU {pos}")
        available += [
            d.id for d in t.devices[pos * units : (pos + 1) * units] if d.unit not in taken
        ]
    order = draw(st.randoms(use_true_random=False))
    order.shuffle(available)
    size = draw(st.integers(0, len(available)), label="size")
    must: list[str] = []
    if with_must and size:
        must = draw(st.lists(st.sampled_from(available), max_size=min(size, 5), unique=True))
    policies: list[AllocationPolicy] = ["binpack", "spread"]
    policy = draw(st.sampled_from(policies))
    return Scenario(t, available, must, size, policy)


def allocate(s: Scenario) -> list[str]:
    placement = preferred_allocation(
        s.available, s.must_include, s.size, table=s.table, policy=s.policy
    )
    note(f"free per GPU: {sorted(s.free_per_gpu().values())}, size {s.size}, policy {s.policy}")
    note(f"answer per GPU: {Counter(parse_replica_id(i)[0] for i in placement.ids)}")
    return list(placement.ids)


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_answer_is_exact_valid_and_includes_must(s: Scenario) -> None:
    ids = allocate(s)
    assert len(ids) == s.size
    assert len(set(ids)) == s.size
    assert set(ids) <= set(s.available) | set(s.must_include)
    assert set(s.must_include) <= set(ids)


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_never_more_than_units_per_gpu_from_one_gpu(s: Scenario) -> None:
    per_gpu = Counter(parse_replica_id(i)[0] for i in allocate(s))
    assert all(n <= s.units for n in per_gpu.values())


@settings(max_examples=300, deadline=None)
@given(scenarios(with_must=False))
@example(
    Scenario(
        table(
            [gpu(0), gpu(1)],
            units_per_gpu=10,
        ),
        available=[f"GPU-00000000-0000-4000-8000-000000000000::{u}" for u in range(4, 10)]
        + [f"GPU-00000000-0000-4000-8000-000000000001::{u}" for u in range(10)],
        must_include=[],
        size=5,
        policy="binpack",
    )
)
def test_a_fraction_that_fits_on_one_gpu_lands_on_one_gpu(s: Scenario) -> None:
    if not (s.size <= s.units and any(n >= s.size for n in s.free_per_gpu().values())):
        return
    per_gpu = Counter(parse_replica_id(i)[0] for i in allocate(s))
    assert len(per_gpu) <= 1


@settings(max_examples=300, deadline=None)
@given(scenarios(with_must=False))
def test_whole_gpu_parts_use_completely_free_gpus(s: Scenario) -> None:
    completely_free = {g for g, n in s.free_per_gpu().items() if n == s.units}
    wanted = s.size // s.units
    per_gpu = Counter(parse_replica_id(i)[0] for i in allocate(s))
    full = {g for g, n in per_gpu.items() if n == s.units}
    assert len(full & completely_free) >= min(wanted, len(completely_free))


@settings(max_examples=300, deadline=None)
@given(scenarios(with_must=False))
def test_no_split_when_the_remainder_fits_beside_the_whole_gpus(s: Scenario) -> None:
    free = s.free_per_gpu()
    wanted, rest = divmod(s.size, s.units)
    completely_free = sorted(g for g, n in free.items() if n == s.units)
    if len(completely_free) < wanted:
        return
    # The remainder fits on some GPU that is not needed for a whole part.
    spare = [n for g, n in free.items() if g not in completely_free] + [s.units] * (
        len(completely_free) - wanted
    )
    if rest and not any(n >= rest for n in spare):
        return
    placement = preferred_allocation(s.available, [], s.size, table=s.table, policy=s.policy)
    assert not placement.fraction_split


@settings(max_examples=100, deadline=None)
@given(scenarios(), st.randoms(use_true_random=False))
def test_deterministic_whatever_the_order(s: Scenario, rnd: random.Random) -> None:
    shuffled = s.available[:]
    rnd.shuffle(shuffled)
    again = Scenario(s.table, shuffled, list(reversed(s.must_include)), s.size, s.policy)
    assert allocate(again) == allocate(s)
