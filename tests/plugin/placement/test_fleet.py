"""The vectorised one-container placement equals place_pod on every node (fleet.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin.api.config import AllocationPolicy
from plugin.placement.fleet import FITS, Fleet, fleet_of, place_container
from plugin.placement.pod import ContainerKind, ContainerRequest, GpuState, place_pod


@st.composite
def nodes(draw: st.DrawFn) -> tuple[int, list[GpuState]]:
    upg = draw(st.sampled_from([1, 4, 10, 100]))
    count = draw(st.integers(0, 8))
    choices: list[list[int | None]] = [[None], [0], [0, 1], [0, 1, None], [3, 1, 7], [0, 1, 2, 3]]
    numas = draw(st.sampled_from(choices))
    gpus = []
    for i in range(count):
        free = draw(
            st.one_of(st.sampled_from([0, upg, upg]), st.integers(0, upg)),
        )
        gpus.append(
            GpuState(
                f"GPU-{i}",
                free,
                healthy=draw(st.sampled_from([True, True, True, False])),
                numa=draw(st.sampled_from(numas)),
            )
        )
    return upg, gpus


def check(
    fleet_nodes: list[tuple[int, list[GpuState]]],
    units: int,
    kind: ContainerKind,
    policy: AllocationPolicy,
) -> None:
    fleet = fleet_of(fleet_nodes)
    placed = place_container(fleet, units, policy)
    keys = placed.refusal_keys(np.arange(len(fleet_nodes)))
    for row, (upg, gpus) in enumerate(fleet_nodes):
        expected = place_pod(
            [ContainerRequest("main", kind, units)], gpus, units_per_gpu=upg, policy=policy
        )
        assert (placed.outcome[row] == FITS) == expected.fits, (row, gpus, expected.refusal)
        if not expected.fits:
            words = placed.refusal(int(keys[row]), name="main", kind=kind)
            assert words == expected.refusal
            continue
        fraction = [gpu for gpu, n in expected.taken.items() if n < upg]
        if units % upg:
            assert len(fraction) == 1
            free_there = next(g.free for g in gpus if g.id == fraction[0])
            assert placed.remainder_free[row] == free_there, (row, gpus, expected.taken)
        else:
            assert fraction == []


@settings(max_examples=400, deadline=None)
@given(
    st.lists(nodes(), min_size=1, max_size=12),
    st.integers(1, 450),
    st.sampled_from(["app", "init", "sidecar"]),
    st.sampled_from(["binpack", "spread"]),
)
def test_every_node_gets_place_pods_answer(
    fleet_nodes: list[tuple[int, list[GpuState]]],
    units: int,
    kind: ContainerKind,
    policy: AllocationPolicy,
) -> None:
    check(fleet_nodes, units, kind, policy)


def gpus(*free: int, numa: tuple[int | None, ...] = ()) -> list[GpuState]:
    return [GpuState(f"GPU-{i}", n, numa=numa[i] if numa else None) for i, n in enumerate(free)]


@pytest.mark.parametrize("policy", ["binpack", "spread"])
@pytest.mark.parametrize(
    ("units", "node"),
    [
        (70, (100, gpus(40, 40))),  # the issue's example: refused, no single GPU
        (150, (100, gpus(90, 90, 100))),  # one whole GPU and the fraction beside it
        (200, (100, gpus(90, 90, 100))),  # two whole GPUs, one completely free
        (150, (100, gpus(100, 100, 60, 100, numa=(0, 1, 1, 0)))),  # NUMA preference
        (250, (100, gpus(100, 100, 60, 100, 70, numa=(0, 1, 1, 2, 2)))),  # groups too small
        (50, (100, [GpuState("GPU-0", 100, healthy=False), GpuState("GPU-1", 20)])),
        (30, (100, [])),  # a node without GPUs
        # no NUMA node has 3 completely free GPUs: the largest groups first (0, then 1),
        # so the fraction prefers NUMA nodes 0 and 1 (60 free) to 2 (80 free)
        (350, (100, gpus(100, 100, 100, 100, 100, 60, 80, numa=(0, 0, 1, 1, 2, 1, 2)))),
    ],
)
def test_known_cases(
    units: int, node: tuple[int, list[GpuState]], policy: AllocationPolicy
) -> None:
    check([node], units, "app", policy)


def test_the_issue_example_has_place_pods_words() -> None:
    placed = place_container(fleet_of([(100, gpus(40, 40))]), 70, "binpack")
    key = int(placed.refusal_keys(np.arange(1))[0])
    assert placed.refusal(key, name="main", kind="app") == (
        "no single GPU has 70 free units (largest 40; 80 free in total)"
    )


def test_bad_input_is_refused_with_what_is_wrong() -> None:
    fleet = fleet_of([(100, gpus(50))])
    with pytest.raises(ValueError, match="units must be positive"):
        place_container(fleet, 0, "binpack")
    with pytest.raises(ValueError, match="must stay below"):
        fleet_of([(1 << 20, gpus(1))])
    with pytest.raises(ValueError, match="one number per node"):
        Fleet(
            free=fleet.free,
            numa=fleet.numa,
            units_per_gpu=np.array([100, 100], dtype=np.int64),
            unhealthy=fleet.unhealthy,
            healthy=fleet.healthy,
            numa_columns=fleet.numa_columns,
        )
