"""A pod's placement on every node at once (numpy): place_pod's answer, vectorised.

Why: the scheduler extender's filter and prioritize see every candidate node
for every pod (1,000 and more), and :func:`plugin.placement.pod.place_pod`
costs tens of microseconds of plain Python per node: 1,000 nodes took 10-100
ms where issue 14 allows 5. The same replay of the kubelet (containers in pod
order, init containers' units reused, each container placed by
:func:`~plugin.placement.units.place_units`) runs here on ``nodes × GPUs``
arrays: a Python loop over the pod's few containers and, inside place_units'
whole-GPU step, over a node's few GPUs, with every node handled by one numpy
operation at each step. The common pod shapes have closed forms that cost a
fraction of the replay's ~100 passes per container: one container asking;
shares below a GPU in sidecars or app containers before one last container;
init containers, each reusing what the ones before hold, then one more
container, after sidecars' shares or not.

Exactly place_pod's answer, not an approximation: the same order of whole
GPUs (NUMA groups as :func:`~plugin.placement.units.order_whole` ranks them),
the same GPU for a remainder (held GPUs first, then the NUMA nodes already
used, then the tightest or freest, then the lowest index), the same split when
no GPU can hold it, the same refusals in the same words (the text functions of
:mod:`plugin.placement.pod`). ``tests/plugin/placement/test_fleet.py`` checks
all of it against place_pod on random nodes and pods (hypothesis).

The package: :mod:`.arrays` (the arrays and the row-wise helpers all share),
:mod:`.closed_forms` (the common shapes), :mod:`.replay` (any pod, and place_pod
row by row for a few rows); :func:`place_pod_on_fleet` here picks the cheapest
that applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from plugin.api.config import AllocationPolicy
from plugin.placement.fleet.arrays import (
    NO_NUMA,
    Bools,
    Fleet,
    FleetPlacement,
    Ints,
    distinct_rows,
    fleet_of,
    gpu_row,
    numa_key,
    row_count,
    row_max,
)
from plugin.placement.fleet.closed_forms import (
    one_container,
    shares_then_inits_then_one,
    without_reuse,
)
from plugin.placement.fleet.packing import two_items_fit
from plugin.placement.fleet.replay import replay_pod, row_by_row, rows_until_spent
from plugin.placement.plan_search import SearchBudget, independent_items
from plugin.placement.pod import (
    ContainerRequest,
    largest_first,
    raised_chains,
    replays_are_exact,
)
from plugin.placement.refusals import FITS, SHORT

__all__ = [
    "NODE_BY_NODE_BELOW",
    "NO_NUMA",
    "Bools",
    "Fleet",
    "FleetPlacement",
    "Ints",
    "distinct_rows",
    "fleet_of",
    "gpu_row",
    "numa_key",
    "place_pod_on_fleet",
]

NODE_BY_NODE_BELOW: Final = 8
"""Fewer rows than this are placed with place_pod row by row: a numpy pass costs about
the same for 1 row as for 1,000, and the extender patches one or two rows per pod."""


def place_pod_on_fleet(
    fleet: Fleet,
    containers: Sequence[ContainerRequest],
    policy: AllocationPolicy,
    *,
    node_by_node_below: int = NODE_BY_NODE_BELOW,
) -> FleetPlacement:
    """place_pod(containers) on every row; containers asking for nothing are skipped.

    The same answer by the cheapest way that applies: row by row with place_pod
    itself for a few rows; a closed form for one container asking, for shares
    before one last container with nothing reused, and for init containers (each
    reusing what the ones before hold) before one last container, after shares or
    not; else the replay over arrays. Rows where that replay refuses a later
    container and another plan might exist get place_pod's whole-pod search
    (:func:`searched`).
    """
    if fleet.free.shape[0] < node_by_node_below:
        return row_by_row(fleet, containers, policy)
    asking = [index for index, c in enumerate(containers) if c.units > 0]
    if len(asking) == 1:
        return one_container(fleet, asking[0], containers[asking[0]].units, policy)
    return searched(fleet, containers, policy, _replayed(fleet, containers, asking, policy))


def _replayed(
    fleet: Fleet,
    containers: Sequence[ContainerRequest],
    asking: list[int],
    policy: AllocationPolicy,
) -> FleetPlacement:
    """The policy's replay container by container, by the cheapest way that applies."""
    if (
        len(asking) > 1
        and all(containers[i].kind != "init" for i in asking[:-1])
        and containers[asking[-1]].units >= int(fleet.units_per_gpu.min(initial=1 << 62))
    ):
        # (a last container below a GPU costs the replay no more than this)
        chained = without_reuse(fleet, containers, asking, policy)
        if chained is not None:
            return chained
    if len(asking) > 1:
        chained = shares_then_inits_then_one(fleet, containers, asking, policy)
        if chained is not None:
            return chained
    return replay_pod(fleet, containers, policy)


def searched(
    fleet: Fleet,
    containers: Sequence[ContainerRequest],
    policy: AllocationPolicy,
    placed: FleetPlacement,
) -> FleetPlacement:
    """``placed`` (the replay's answer) with place_pod's answer on the rows where the
    replay refused a container after the first one asking and another plan may exist
    (:func:`plugin.placement.pod.may_search`, as arrays).

    place_pod's next step, the reuse-aware replay (:func:`~plugin.placement.pod.chain_replay`),
    is a replay too: it runs here over those rows at once, by the same closed forms.
    Only the rows it refuses as well go to place_pod's search, and those repeat: each
    distinct row (free units, NUMA columns, units per GPU, GPU health) is decided once,
    by place_pod itself. A cheap necessary condition leaves out rows no plan can fit:
    every container's remainder needs a GPU with that many units free, and its whole
    GPUs completely free GPUs.
    """
    asking = [index for index, c in enumerate(containers) if c.units > 0]
    if len(asking) < 2:
        return placed
    rows = np.flatnonzero(
        (placed.outcome != FITS) & (placed.outcome != SHORT) & (placed.container > asking[0])
    )
    if not rows.size:
        return placed
    if rows.size >= NODE_BY_NODE_BELOW:
        # (fewer rows go to place_pod below, which tries these replays itself)
        for again in (raised_chains(containers), largest_first(containers)):
            if again is None or not rows.size:
                continue
            alt = _replayed(
                fleet.subset(rows), again, [i for i, c in enumerate(again) if c.units > 0], policy
            )
            fits = alt.fits
            placed.patch(rows[fits], _only(alt, np.flatnonzero(fits)))
            rows = rows[~fits]
        if replays_are_exact(containers):
            return placed
        items = independent_items([(c.kind, c.units) for c in containers])
        if items is not None and len(items) == 2 and rows.size:
            rows = rows[two_items_fit(fleet.free[rows], fleet.units_per_gpu[rows], *items)]
    if rows.size:
        upg = fleet.units_per_gpu[rows]
        free = fleet.free[rows]
        largest = row_max(free)
        complete = row_count(free == upg[:, None])
        possible = np.ones(rows.size, dtype=np.bool_)
        for index in asking:
            whole, remainder = np.divmod(containers[index].units, upg)
            possible &= (complete >= whole) & (largest >= remainder)
        rows = rows[possible]
    if not rows.size:
        return placed
    width = fleet.free.shape[1]
    keys = np.column_stack(
        (
            fleet.free[rows],
            fleet.numa[rows],
            fleet.units_per_gpu[rows],
            fleet.unhealthy[rows],
            fleet.healthy[rows],
        )
    )
    distinct, inverse = distinct_rows(keys)
    part = Fleet(
        free=distinct[:, :width],
        numa=distinct[:, width : 2 * width],
        units_per_gpu=distinct[:, 2 * width],
        unhealthy=distinct[:, 2 * width + 1],
        healthy=distinct[:, 2 * width + 2],
        numa_columns=fleet.numa_columns,
    )
    fresh, decided = rows_until_spent(part, containers, policy, budget=SearchBudget())
    # rows whose distinct row was not reached keep the replay's refusal
    reached = inverse < decided
    placed.patch(rows[reached], _only(fresh, inverse[reached]))
    return placed


def _only(placed: FleetPlacement, rows: Ints) -> FleetPlacement:
    """``placed`` on ``rows`` only (in that order; a row may repeat)."""
    return FleetPlacement(
        placed.outcome[rows],
        placed.container[rows],
        placed.numbers[rows],
        placed.gpus_used[rows],
        placed.left_on_used[rows],
        placed.units_taken[rows],
        None if placed.taken is None else placed.taken[rows],
    )
