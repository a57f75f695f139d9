"""place_units: the count-level decision the device plugin and the scheduler extender share."""

from __future__ import annotations

import pytest

from plugin.api.config import AllocationPolicy
from plugin.placement.units import is_fraction_split, place_units


def place(
    free: list[int],
    size: int,
    *,
    held: list[int] | None = None,
    policy: AllocationPolicy = "binpack",
    numa: list[int | None] | None = None,
) -> list[int]:
    return place_units(
        free,
        held or [0] * len(free),
        size,
        units_per_gpu=100,
        numa=numa or [None] * len(free),
        policy=policy,
    )


@pytest.mark.parametrize(
    ("free", "size", "policy", "expected"),
    [
        pytest.param([100, 40, 70], 30, "binpack", [0, 30, 0], id="binpack-tightest"),
        pytest.param([100, 40, 70], 30, "spread", [30, 0, 0], id="spread-freest"),
        pytest.param([40, 40], 70, "binpack", [40, 30], id="split-only-when-no-gpu-fits"),
        pytest.param([100, 100, 50], 150, "binpack", [100, 0, 50], id="whole-plus-remainder"),
        pytest.param([100, 60, 100], 200, "binpack", [100, 0, 100], id="two-whole"),
        pytest.param([100, 100], 0, "binpack", [0, 0], id="nothing"),
    ],
)
def test_table(free: list[int], size: int, policy: AllocationPolicy, expected: list[int]) -> None:
    assert place(free, size, policy=policy) == expected


def test_units_held_from_an_init_container_pull_the_rest_onto_their_gpu() -> None:
    """The kubelet's reuse (KUBELET-FACTS 1): 30 units of GPU 1 held, 50 wanted."""
    assert place([100, 40, 100], 50, held=[0, 30, 0]) == [0, 20, 0]
    # ... and when that GPU has no room, the rest goes elsewhere: a split.
    take = place([100, 10, 100], 50, held=[0, 30, 0])
    assert sum(take) == 20
    assert is_fraction_split(
        [t + h for t, h in zip(take, [0, 30, 0], strict=True)], units_per_gpu=100
    )


def test_numa_keeps_whole_gpus_together() -> None:
    assert place([100, 100, 100, 100], 200, numa=[0, 1, 1, 0]) == [100, 0, 0, 100]


@pytest.mark.parametrize(
    ("held", "split"),
    [([100, 50], False), ([50, 50], True), ([30], False), ([0, 30, 0], False), ([20, 0, 30], True)],
)
def test_is_fraction_split(held: list[int], split: bool) -> None:
    assert is_fraction_split(held, units_per_gpu=100) is split
