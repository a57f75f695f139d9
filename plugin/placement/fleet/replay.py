"""The kubelet's replay over arrays: any pod, container by container.

What :func:`plugin.placement.pod.place_pod` does for one node, done for every
row at once: containers in pod order, init containers' units reused, each
container placed by :func:`plugin.placement.units.place_units`' rules (whole
GPUs in NUMA order, the remainder on one GPU, a split refused). The closed
forms (:mod:`.closed_forms`) answer the common shapes for less; this answers
every other one, and :func:`row_by_row` (place_pod itself, row by row) the few
rows of a patch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from plugin.api.config import AllocationPolicy
from plugin.placement.fleet.arrays import (
    BIG,
    Bools,
    Fleet,
    FleetPlacement,
    Ints,
    blank_answer,
    cells_of,
    per_numa,
    row_count,
    row_max,
    row_sum,
    with_taken,
)
from plugin.placement.fleet.closed_forms import share_gpu
from plugin.placement.plan_search import SearchBudget
from plugin.placement.pod import ContainerRequest, GpuState, place_pod
from plugin.placement.refusals import HELD, NO_SINGLE_GPU, REUSE, SHORT, WHOLE


def replay_pod(
    fleet: Fleet, containers: Sequence[ContainerRequest], policy: AllocationPolicy
) -> FleetPlacement:
    """place_pod's loop over the containers, every row at once.

    A row is dropped from the work that matters (``alive``) at its first
    refusal. Once a quarter of the rows are refused, the next containers work on
    the rows still placed only (``here``, ``row_of`` their places in ``fleet``):
    a pod whose first container rules out half the nodes costs half as much after.
    """
    rows = fleet.free.shape[0]
    outcome, refused_container, numbers = blank_answer(rows)
    here = fleet
    row_of = np.arange(rows)
    upg = here.units_per_gpu[:, None]
    cell = cells_of(here)
    free = here.free.copy()
    reusable: Ints | None = None  # None until an init container holds units
    taken = np.zeros_like(free)
    alive = np.ones(rows, dtype=np.bool_)
    smallest_gpu = int(fleet.units_per_gpu.min(initial=1 << 62))

    def refuse(mask: Bools, kind: int, index: int, *values: Ints | int) -> None:
        hit = np.flatnonzero(mask & alive)
        if hit.size:
            where = row_of[hit]
            outcome[where] = kind
            refused_container[where] = index
            for column, value in enumerate(values):
                numbers[where, column] = value[hit] if isinstance(value, np.ndarray) else value
            alive[hit] = False

    for index, c in enumerate(containers):
        if c.units <= 0:
            continue
        if np.count_nonzero(alive) * 4 < alive.size * 3:
            keep = np.flatnonzero(alive)
            if not keep.size:
                break
            here, row_of = here.subset(keep), row_of[keep]
            free, taken, alive = free[keep], taken[keep], alive[keep]
            reusable = None if reusable is None else reusable[keep]
            upg, cell = here.units_per_gpu[:, None], cells_of(here)
        units = c.units
        held: Ints | None = None
        need = np.full(alive.size, units, dtype=np.int64)
        if reusable is not None:
            reuse_total = row_sum(reusable)
            reuse_gpus = row_count(reusable > 0)
            refuse(
                (units < reuse_total) & (reuse_gpus > 1),
                REUSE,
                index,
                units,
                reuse_total,
                reuse_gpus,
            )
            # Reusable units are taken in GPU order, as many as the container asks.
            before = np.cumsum(reusable, axis=1) - reusable
            held = np.minimum(reusable, np.maximum(units - before, 0))
            need = need - row_sum(held)
            if not held.any():
                held = None  # nothing reused on any row: the cheaper path, same answer
        total = row_sum(free)
        refuse(need > total, SHORT, index, need, total, here.unhealthy)
        if held is None and units < smallest_gpu:
            # A share below a GPU with nothing held: place_units puts it on the tightest
            # (freest) GPU that holds it, or spreads it (refused below). One argmin.
            take, spread = _share_taken(free, units, policy)
        else:
            take, spread = _place_units(
                here, cell, free, held, size=units, need_now=need, policy=policy
            )
        mine = take if held is None else held + take
        split = (row_count((mine > 0) & (mine < upg)) > 1) | spread
        if (split & alive).any():
            whole, remainder = units // here.units_per_gpu, units % here.units_per_gpu
            largest = row_max(free)
            completely = row_count(free == upg)
            held_total = row_sum(held) if held is not None else np.zeros_like(total)
            short_whole = split & (whole > 0) & (completely < whole)
            refuse(short_whole, WHOLE, index, whole, completely, total)
            refuse(split & (held_total > 0), HELD, index, held_total, need, largest, total)
            single = np.where(remainder > 0, remainder, need)
            refuse(split, NO_SINGLE_GPU, index, single, largest, total)
        free -= take
        taken += take
        if held is not None and reusable is not None:
            reusable = reusable - held
        if c.kind == "init":
            reusable = mine.copy() if reusable is None else reusable + mine
    placed = np.zeros_like(fleet.free)
    live = np.flatnonzero(alive)
    placed[row_of[live]] = taken[live]
    return with_taken(fleet, outcome, refused_container, numbers, placed)


def row_by_row(
    fleet: Fleet,
    containers: Sequence[ContainerRequest],
    policy: AllocationPolicy,
    *,
    budget: SearchBudget | None = None,
) -> FleetPlacement:
    """place_pod on each row, its answers put in the arrays.

    A row becomes the GPUs place_pod would see: positions as IDs, NUMA columns
    as NUMA nodes (same order), and, after them, one GPU with nothing free per
    unhealthy GPU (a row holds 0 for those and forgets which they were; only
    their number shows, in a refusal). One search budget for all rows (a fresh one
    when not given): one decision's.
    """
    placed, _ = rows_until_spent(
        fleet, containers, policy, budget=budget or SearchBudget(), stop=False
    )
    return placed


def rows_until_spent(
    fleet: Fleet,
    containers: Sequence[ContainerRequest],
    policy: AllocationPolicy,
    *,
    budget: SearchBudget,
    stop: bool = True,
) -> tuple[FleetPlacement, int]:
    """:func:`row_by_row`, stopping (with ``stop``) at the first row once ``budget`` is
    spent: the answer and how many rows, from the first, it decided. A pod whose search
    spent the decision's budget would otherwise still pay its replays on every row left
    (hundreds of microseconds each for a pod of dozens of containers)."""
    rows, width = fleet.free.shape
    outcome, container, numbers = blank_answer(rows)
    taken = np.zeros((rows, width), dtype=np.int64)
    decided = 0
    for row in range(rows):
        if stop and budget.left <= 0:
            break
        decided += 1
        free = fleet.free[row].tolist()
        gpus = [
            GpuState(str(pos), free[pos], numa=numa)
            for pos, numa in enumerate(fleet.numa[row].tolist())
        ]
        gpus += [GpuState(f"unhealthy-{n}", 0, healthy=False) for n in range(fleet.unhealthy[row])]
        placed = place_pod(
            containers,
            gpus,
            units_per_gpu=int(fleet.units_per_gpu[row]),
            policy=policy,
            budget=budget,
        )
        if placed.refusal_key is not None:
            outcome[row], container[row] = placed.refusal_key[:2]
            numbers[row] = placed.refusal_key[2:]
            continue
        for gpu, units in placed.taken.items():
            taken[row, int(gpu)] = units
    return with_taken(fleet, outcome, container, numbers, taken), decided


def _share_taken(free: Ints, units: int, policy: AllocationPolicy) -> tuple[Ints, Bools]:
    """:func:`_place_units` for a share below every row's GPU size with nothing held:
    the units on :func:`~plugin.placement.fleet.closed_forms.share_gpu`'s GPU, and the
    rows where no GPU holds them (place_units would spread them)."""
    take = np.zeros_like(free)
    rows, width = free.shape
    if not width:
        return take, np.ones(rows, dtype=np.bool_)
    gpu, holds = share_gpu(free, units, policy, int(free.max(initial=0)))
    placed = np.flatnonzero(holds)
    take[placed, gpu[placed]] = units
    return take, ~holds


def _place_units(
    fleet: Fleet,
    cell: Ints,
    free_now: Ints,
    held: Ints | None,
    *,
    size: int,
    need_now: Ints,
    policy: AllocationPolicy,
) -> tuple[Ints, Bools]:
    """:func:`plugin.placement.units.place_units` on every row: units taken from each GPU.

    Also the rows where no single GPU has the units still needed free:
    place_units then spreads them (its step 3) over two GPUs or more and
    leaves each partly used. None can end up whole: one that could would
    have been taken whole in step 1, or held the rest alone. So place_pod
    refuses every such row, and their units are not worked out here
    (``tests/plugin/placement/test_fleet.py`` holds this to place_pod).
    ``held`` None: nothing reused (the common case, and the cheaper one).
    """
    rows, width = free_now.shape
    take = np.zeros_like(free_now)
    spread = np.zeros(rows, dtype=np.bool_)
    if width == 0:
        return take, spread
    upg = fleet.units_per_gpu
    numa_columns = fleet.numa_columns
    columns = np.arange(numa_columns)
    positions = np.arange(width)
    free = free_now
    need = need_now
    touched: Bools | None = held > 0 if held is not None else None
    used: Bools | None = None  # (rows, NUMA nodes) already used; None: none anywhere
    if touched is not None:
        used = per_numa(cell[touched], rows, numa_columns) > 0
    wanted = np.where(need > 0, size // upg, 0)

    # 1. Whole GPUs from completely free GPUs, in order_whole's order.
    if wanted.any():
        if used is None:
            used = np.zeros((rows, numa_columns), dtype=np.bool_)
        base = free if held is None else free + held
        candidate = base == upg[:, None]
        size_of = per_numa(cell[candidate], rows, numa_columns)  # candidates per node
        present = size_of > 0
        away = (~used).astype(np.int64)  # a NUMA node no held GPU is on ranks later
        span = 2 * width + 1
        # A NUMA node's rank as a number: (away, fewer candidates, node), unique per row,
        # below ``last``; the home node -1, nodes without candidates ``last``.
        last = 2 * span * numa_columns
        groups = (away * span + (width - size_of)) * numa_columns + columns
        enough = present & (size_of >= wanted[:, None])
        sign = 1 if policy == "binpack" else -1
        home_key = (away * span + (sign * size_of + width)) * numa_columns + columns
        home = np.where(
            enough.any(axis=1),
            np.where(enough, home_key, BIG).argmin(axis=1),
            np.where(present, groups, BIG).argmin(axis=1),
        )
        ranked = np.where(columns == home[:, None], -1, np.where(present, groups, last))
        # (untouched, node's rank, position) as one number, built in place
        order_key = ranked.ravel()[cell]
        order_key += 1  # each GPU's node's rank, 0..last
        if touched is not None:
            order_key += np.where(touched, 0, last + 2)
        order_key *= width
        order_key += positions
        order_key[~candidate] = BIG
        order = np.argsort(order_key, axis=1, kind="stable")
        flat_rows = np.arange(rows)[:, None] * width
        if held is None or touched is None:
            # Nothing held: every candidate is a whole free GPU and the request still
            # needs at least one whole GPU per GPU wanted, so the first ``wanted``
            # candidates in order are taken (place_units' loop never skips one).
            chosen = _first_in_order(order, flat_rows, candidate, 0, wanted)
            take = np.where(chosen, free, 0)
            need = need - row_sum(take)
            free = np.where(chosen, 0, free)
            touched = chosen
        else:
            free = free.copy()
            need = need.copy()
            touched = touched.copy()
            _take_whole_in_order(
                free,
                take,
                need,
                wanted=wanted,
                touched=touched,
                candidate=candidate,
                order=order,
                flat_rows=flat_rows,
                units_per_gpu=upg,
            )
        used = used | (per_numa(cell[touched], rows, numa_columns) > 0)

    # 2. The remainder on one GPU: held GPUs first, then used NUMA nodes, then policy.
    rest = need > 0
    if rest.any():
        preference: Ints | int = 2 if touched is None else (~touched).astype(np.int64) * 2
        if used is not None:
            any_used: Bools = np.any(used, axis=1, keepdims=True)
            preference = preference + (any_used & ~used.ravel()[cell])
        top = int(upg.max())
        by_free = free if policy == "binpack" else top - free
        fitting = preference * (top + 1) + by_free  # (preference, by free, position)
        fitting *= width
        fitting += positions
        fitting[free < need[:, None]] = BIG
        best = fitting.argmin(axis=1)
        single = rest & (fitting.ravel()[np.arange(rows) * width + best] < BIG)
        row_index = np.flatnonzero(single)
        take[row_index, best[row_index]] += need[row_index]
        # 3. No single GPU holds it: place_units would split it (refused, see above).
        spread = rest & ~single
    return take, spread


def _first_in_order(
    order: Ints, flat_rows: Ints, candidate: Bools, skip: Ints | int, count: Ints
) -> Bools:
    """The candidates at places ``skip .. skip + count - 1`` of each row's ``order``.

    Candidates come first in ``order``; a place past them (or past the row) is no
    candidate and is left out. A gather of ``max(count)`` places, not an inverse sort.
    """
    rows, width = order.shape
    chosen = np.zeros(rows * width, dtype=np.bool_)
    most = int(count.max(initial=0))
    if most <= 0:
        return chosen.reshape(rows, width)
    steps = np.arange(most)
    place = steps + (skip[:, None] if isinstance(skip, np.ndarray) else skip)
    inside = (steps < count[:, None]) & (place < width)
    gpu = order.ravel()[flat_rows + np.minimum(place, width - 1)] + flat_rows
    picked = gpu[inside & candidate.ravel()[gpu]]
    chosen[picked] = True
    return chosen.reshape(rows, width)


def _take_whole_in_order(
    free: Ints,
    take: Ints,
    need: Ints,
    *,
    wanted: Ints,
    touched: Bools,
    candidate: Bools,
    order: Ints,
    flat_rows: Ints,
    units_per_gpu: Ints,
) -> None:
    """place_units' whole-GPU loop where units are held (in place).

    The loop skips a candidate holding more than the request still needs. GPUs
    holding reused units come first in ``order`` and are walked step by step
    (a pod's reused units are on one or two GPUs); the completely free GPUs
    after them all hold ``units_per_gpu``, so the loop takes the first
    ``min(wanted, need // units_per_gpu)`` of them and skips the rest.
    """
    rows = np.arange(free.shape[0])
    first = candidate & touched
    ahead = row_count(first)  # they fill the first places of ``order``
    for step in range(int(ahead.max(initial=0))):
        pos = order[:, step]
        here = free[rows, pos]
        ok = first[rows, pos] & (wanted > 0) & (here <= need)
        if not ok.any():
            continue
        take[rows, pos] = np.where(ok, here, take[rows, pos])
        need -= np.where(ok, here, 0)
        wanted -= ok
        free[rows, pos] = np.where(ok, 0, here)
        touched[rows, pos] |= ok
    count = np.minimum(wanted, need // units_per_gpu)
    # the completely free candidates follow the held ones in ``order``
    chosen = _first_in_order(order, flat_rows, candidate, ahead, count)
    take[chosen] = free[chosen]
    need -= row_sum(np.where(chosen, free, 0))
    wanted -= row_count(chosen)
    free[chosen] = 0
    touched |= chosen
