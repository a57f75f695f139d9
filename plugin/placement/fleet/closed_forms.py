"""Closed forms: the replay's answer for the common pod shapes in a few passes.

:func:`plugin.placement.pod.place_pod` replays the kubelet container by
container; over arrays that replay (:mod:`.replay`) costs about a hundred numpy
passes per container. For the shapes most pods have, the answer can be written
down directly:

* one container asking (:func:`one_container`);
* shares below a GPU in sidecars or app containers before one last container,
  none reusing another's units (:func:`without_reuse`);
* an init container's share below a GPU, reused by the one container after it
  (:func:`init_then_one`).

Each is held to place_pod by a hypothesis test of its own in
``tests/plugin/placement/test_fleet.py``.
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
    per_numa,
    record_refusal,
    row_count,
    row_max,
    row_sum,
    with_free,
)
from plugin.placement.pod import ContainerRequest
from plugin.placement.refusals import FITS, HELD, NO_SINGLE_GPU, SHORT, WHOLE


def one_container(fleet: Fleet, index: int, units: int, policy: AllocationPolicy) -> FleetPlacement:
    """One container asking (the common pod), in closed form: a few sums and maxima.

    For ``units = w × U + r`` with nothing held: refused when the free units are
    short, when fewer than ``w`` GPUs are completely free, or when ``r > 0`` and
    no GPU is left to hold it (neither a partly used GPU with ``r`` free nor one
    more completely free GPU); otherwise the whole GPUs are taken whole and the
    remainder goes to the GPU :func:`_beside_whole` (or, with no whole GPUs, the
    tightest or freest) names, and only its free units matter for the score.
    """
    placed, _ = one_container_located(fleet, index, units, policy, locate=False)
    return placed


def one_container_located(
    fleet: Fleet, index: int, units: int, policy: AllocationPolicy, *, locate: bool
) -> tuple[FleetPlacement, Ints]:
    """:func:`one_container`, and with ``locate`` the GPU its remainder joins per row:
    its position, or -1 (no remainder, refused, a completely free GPU beside whole
    ones, which is all a caller merging containers needs to know of it, or
    ``locate`` off)."""
    free = fleet.free
    upg = fleet.units_per_gpu
    whole = units // upg
    remainder = units % upg
    rows = free.shape[0]
    total = row_sum(free)
    completely = row_count(free == upg[:, None])
    partial_fit = (free < upg[:, None]) & (free >= remainder[:, None]) & (remainder[:, None] > 0)
    remainder_ok = (remainder == 0) | (row_count(partial_fit) > 0) | (completely > whole)
    short = units > total
    short_whole = ~short & (completely < whole)
    no_single = ~short & ~short_whole & ~remainder_ok
    outcome = np.full(rows, FITS, dtype=np.int64)
    container = np.full(rows, -1, dtype=np.int64)
    numbers = np.zeros((rows, 4), dtype=np.int64)
    answer = (outcome, container, numbers)
    if short.any():
        record_refusal(answer, short, SHORT, index, units, total, fleet.unhealthy)
    if short_whole.any():
        record_refusal(answer, short_whole, WHOLE, index, whole, completely, total)
    if no_single.any():
        largest = np.zeros_like(total)
        largest[no_single] = row_max(free[no_single])
        record_refusal(answer, no_single, NO_SINGLE_GPU, index, remainder, largest, total)
    fits = outcome == FITS
    remainder_free = np.zeros_like(total)
    gpu = np.full(free.shape[0], -1, dtype=np.int64)
    with_fraction = fits & (remainder > 0)
    alone = np.flatnonzero(with_fraction & (whole == 0))
    if alone.size:
        on = free[alone]
        if policy == "binpack":
            key = on * free.shape[1] + np.arange(free.shape[1])
            key[on < remainder[alone, None]] = BIG
            pick = key.argmin(axis=1)  # the tightest, the lowest of equals
        else:
            pick = on.argmax(axis=1)  # the freest, the lowest of equals
        remainder_free[alone] = on[np.arange(alone.size), pick]
        gpu[alone] = pick
    beside = np.flatnonzero(with_fraction & (whole > 0))
    if beside.size:
        remainder_free[beside], located = _beside_whole(
            fleet, beside, whole[beside], remainder[beside], policy, locate=locate
        )
        if located is not None:
            gpu[beside] = located
    placed = FleetPlacement(
        outcome,
        container,
        numbers,
        gpus_used=np.where(fits, whole + (remainder > 0), 0),
        left_on_used=np.where(with_fraction, remainder_free - remainder, 0),
        units_taken=np.where(fits, units, 0),
    )
    return placed, gpu


def without_reuse(
    fleet: Fleet,
    containers: Sequence[ContainerRequest],
    asking: Sequence[int],
    policy: AllocationPolicy,
) -> FleetPlacement | None:
    """Several containers, none reusing another's units (sidecars, app containers),
    each but the last asking less than a GPU on every row; None otherwise.

    place_pod places such containers one after another, each as a pod of its
    own on what the ones before left (place_units with nothing held ranks no
    NUMA node or GPU by what came before). A share below a GPU goes to the
    tightest or freest GPU that holds it: one argmin per container. The last
    container is :func:`one_container` on what is left, told where its
    remainder goes, so that the GPUs the pod uses are counted once.
    """
    free = fleet.free.copy()
    upg = fleet.units_per_gpu
    rows, width = free.shape
    if not rows or not width or max(containers[i].units for i in asking[:-1]) >= int(upg.min()):
        return None
    every = np.arange(rows)
    outcome = np.full(rows, FITS, dtype=np.int64)
    container = np.full(rows, -1, dtype=np.int64)
    numbers = np.zeros((rows, 4), dtype=np.int64)
    alive = np.ones(rows, dtype=np.bool_)
    used = np.zeros(free.shape, dtype=np.bool_)  # GPUs the containers before the last use
    positions = np.arange(width)
    top = int(upg.max())
    for index in asking[:-1]:
        share = containers[index].units
        total = row_sum(free)
        key = (free if policy == "binpack" else top - free) * width + positions
        key[free < share] = BIG
        gpu = key.argmin(axis=1)
        short = alive & (share > total)
        no_gpu = alive & ~short & (key[every, gpu] >= BIG)
        refused = (outcome, container, numbers)
        if short.any():
            record_refusal(refused, short, SHORT, index, share, total, fleet.unhealthy)
        if no_gpu.any():
            record_refusal(refused, no_gpu, NO_SINGLE_GPU, index, share, row_max(free), total)
        alive &= ~short & ~no_gpu
        placed = np.flatnonzero(alive)
        free[placed, gpu[placed]] -= share
        used[placed, gpu[placed]] = True
    last = asking[-1]
    units = containers[last].units
    left = with_free(fleet, free)
    final, joins = one_container_located(left, last, units, policy, locate=True)
    refused_last = alive & (final.outcome != FITS)
    outcome[refused_last] = final.outcome[refused_last]
    container[refused_last] = last
    numbers[refused_last] = final.numbers[refused_last]
    fits = alive & ~refused_last
    # The GPUs used: those before, the last container's whole GPUs (completely free
    # ones, so none of those before) and the GPU its remainder joins, once.
    joined_before = (joins >= 0) & used[every, np.maximum(joins, 0)]
    remainder = units % upg
    joined_free = final.left_on_used + remainder  # free units of the GPU it joins
    gpus_used = row_count(used) + final.gpus_used - joined_before
    # free units left on them: those before keep what they had (less the remainder
    # where it joins one of them), a GPU of its own what it had less the remainder
    before_left = row_sum(np.where(used, free, 0))
    left_on_used = before_left + final.left_on_used - np.where(joined_before, joined_free, 0)
    earlier = sum(containers[i].units for i in asking[:-1])
    return FleetPlacement(
        outcome,
        container,
        numbers,
        gpus_used=np.where(fits, gpus_used, 0),
        left_on_used=np.where(fits, left_on_used, 0),
        units_taken=np.where(fits, earlier + units, 0),
    )


def init_then_one(
    fleet: Fleet, *, first: int, share: int, second: int, units: int, policy: AllocationPolicy
) -> FleetPlacement:
    """An init container's share reused by the one container after it, in closed form.

    The replay's answer for this pod shape, with the init container asking less
    than a GPU on every row (the caller checks). The init container's ``share``
    goes to one GPU ``g`` (the tightest or freest that holds it); the next
    container reuses it there and needs ``units - share`` more. For
    ``units = w × U + q``, place_units then:

    * ``w = 0``: puts the rest on ``g`` (held GPUs come first) if it fits, else
      elsewhere, a split: refused;
    * ``g`` completely free before: takes ``g`` whole first, then ``w - 1``
      whole GPUs and the remainder as for one container, ``g``'s NUMA node
      ranked first (:func:`_beside_whole` with ``anchor``);
    * ``g`` partly used: takes ``w`` whole GPUs elsewhere; the rest, ``q -
      share``, must join ``g`` (held first) or the share is split. With ``q <
      share`` the whole-GPU loop stops one GPU short (the next whole GPU holds
      more than is left), and the rest, over a GPU's worth, fits on no partly
      used GPU: refused too.

    Refusals are place_pod's, quoting the free units left after the init
    container. Held to place_pod by ``tests/plugin/placement/test_fleet.py``.
    """
    free = fleet.free
    upg = fleet.units_per_gpu
    rows, width = free.shape
    every = np.arange(rows)
    total = row_sum(free)
    outcome = np.full(rows, FITS, dtype=np.int64)
    container = np.full(rows, -1, dtype=np.int64)
    numbers = np.zeros((rows, 4), dtype=np.int64)

    def refuse(mask: Bools, kind: int, index: int, *values: Ints | int) -> None:
        record_refusal((outcome, container, numbers), mask, kind, index, *values)

    # 1. The init container: its share on one GPU, the tightest or the freest.
    by_free = free if policy == "binpack" else int(upg.max()) - free
    key = by_free * width + np.arange(width)
    key[free < share] = BIG
    gpu = key.argmin(axis=1)
    placed_init = key[every, gpu] < BIG
    short_init = share > total
    refuse(short_init, SHORT, first, share, total, fleet.unhealthy)
    refuse(~short_init & ~placed_init, NO_SINGLE_GPU, first, share, row_max(free), total)
    on_gpu = free[every, gpu]
    if units <= share:  # everything it asks is reused
        return FleetPlacement(
            outcome,
            container,
            numbers,
            gpus_used=np.where(placed_init, 1, 0),
            left_on_used=np.where(placed_init, on_gpu - share, 0),
            units_taken=np.where(placed_init, share, 0),
        )

    # 2. The container after it: ``share`` held on ``gpu``, ``units - share`` to place.
    left_total = total - share
    short = placed_init & (units > total)
    refuse(short, SHORT, second, units - share, left_total, fleet.unhealthy)
    alive = placed_init & ~short
    whole, rest = units // upg, units % upg
    completely = row_count(free == upg[:, None])
    anchored = on_gpu == upg  # the init container's GPU was completely free
    fraction = whole == 0
    enough_whole = ~fraction & (completely >= whole)
    rest_beside = (rest == share) | ((rest > share) & (on_gpu >= rest))
    rest_anywhere = (
        (rest == 0)
        | (row_count((free < upg[:, None]) & (free >= rest[:, None])) > 0)
        | (completely > whole)
    )
    fits_anchored = enough_whole & anchored & rest_anywhere
    fits = alive & (
        (fraction & (on_gpu >= units)) | (enough_whole & ~anchored & rest_beside) | fits_anchored
    )
    refused = alive & ~fits
    if refused.any():
        after = free.copy()
        after[every, gpu] -= share
        completely_after = completely - anchored  # ``gpu`` is no longer completely free
        short_whole = refused & (whole > 0) & (completely_after < whole)
        refuse(short_whole, WHOLE, second, whole, completely_after, left_total)
        held = refused & ~short_whole
        refuse(held, HELD, second, share, units - share, row_max(after), left_total)

    # What the pod takes where it fits: ``units`` in all, on ``gpu``, whole GPUs and,
    # beside an anchor, the GPU the remainder joins.
    gpus_used = np.where(fraction, 1, whole + 1)
    left = np.where(fraction, on_gpu - units, on_gpu - rest)
    joined = np.flatnonzero(fits & fits_anchored & (rest > 0))
    if joined.size:
        anchor = fleet.numa[joined, gpu[joined]]
        beside, _ = _beside_whole(fleet, joined, whole[joined], rest[joined], policy, anchor=anchor)
        left[joined] = beside - rest[joined]
    exact = fits_anchored & (rest == 0)  # only whole GPUs
    return FleetPlacement(
        outcome,
        container,
        numbers,
        gpus_used=np.where(fits, np.where(exact, whole, gpus_used), 0),
        left_on_used=np.where(fits & ~exact, left, 0),
        units_taken=np.where(fits, units, 0),
    )


def _beside_whole(
    fleet: Fleet,
    rows: Ints,
    whole: Ints,
    remainder: Ints,
    policy: AllocationPolicy,
    *,
    anchor: Ints | None = None,
    locate: bool = False,
) -> tuple[Ints, Ints | None]:
    """Free units of the GPU a fraction joins when whole GPUs were taken first.

    place_units takes the whole GPUs from one NUMA node that has enough
    completely free ones (binpack: the fewest that suffice, spread: the most;
    ties to the lower node), or else from the largest groups down; the
    fraction then prefers a GPU on a NUMA node the whole GPUs use.

    ``anchor``: per row, the NUMA column of a completely free GPU the container
    already holds part of (an init container's share it reuses). place_units
    takes that GPU whole first and ranks its NUMA node before the others.

    With ``locate``, also that GPU's position when it is a partly used one (the
    lowest of equals on the NUMA nodes preferred, as place_units' key has it);
    -1 for a completely free GPU.
    """
    free = fleet.free[rows]
    upg = fleet.units_per_gpu[rows][:, None]
    width = free.shape[1]
    columns = np.arange(fleet.numa_columns)
    # (row, NUMA node) as one index: per-node counts by bincount, a GPU's node by a
    # gather, no (rows, GPUs, NUMA nodes) arrays
    cell = np.arange(rows.size)[:, None] * fleet.numa_columns + fleet.numa[rows]
    per_column = per_numa(cell[free == upg], rows.size, fleet.numa_columns)
    want = whole[:, None]
    enough = per_column >= want
    # A NUMA node's rank: (away from the anchor's, then fewer / more GPUs, then lower node)
    away = (columns != anchor[:, None]) if anchor is not None else np.ones_like(enough)
    rank = away * (2 * width + 2)
    home_key = rank + (per_column if policy == "binpack" else width - per_column)
    home = np.where(enough, home_key, BIG).argmin(axis=1)
    taken = np.zeros_like(per_column)
    taken[np.arange(rows.size), home] = whole
    if anchor is not None:
        # The anchor is one of the whole GPUs, taken first; the home node (another
        # only when the anchor's has too few) gives the others.
        moved = np.flatnonzero(home != anchor)
        taken[moved, home[moved]] -= 1
        taken[moved, anchor[moved]] += 1
    # No NUMA node has enough: the anchor's node, then the largest groups, ties to
    # the lower node.
    short = ~enough.any(axis=1)
    if short.any():
        order = np.argsort((rank + width - per_column)[short], axis=1, kind="stable")
        sizes = np.take_along_axis(per_column[short], order, axis=1)
        before = np.cumsum(sizes, axis=1) - sizes
        used = np.clip(want[short] - before, 0, sizes)
        spread_taken = np.zeros_like(sizes)
        np.put_along_axis(spread_taken, order, used, axis=1)
        taken[short] = spread_taken
    # The remainder: a partly used GPU that holds it, or a completely free one left
    # on a NUMA node; on the nodes the whole GPUs use if any GPU there holds it.
    fits = (free < upg) & (free >= remainder[:, None])
    used_node = taken > 0
    on_used = used_node.ravel()[cell]
    left_full = per_column > taken  # a completely free GPU stays on this NUMA node
    full_used = (used_node & left_full).any(axis=1)
    full_any = left_full.any(axis=1)
    top = upg[:, 0]
    if policy == "binpack":
        preferred = np.minimum(
            np.where(fits & on_used, free, BIG).min(axis=1), np.where(full_used, top, BIG)
        )
        anywhere = np.minimum(np.where(fits, free, BIG).min(axis=1), np.where(full_any, top, BIG))
        has_preferred = preferred < BIG
    else:
        preferred = np.maximum(
            np.where(fits & on_used, free, -1).max(axis=1), np.where(full_used, top, -1)
        )
        anywhere = np.maximum(np.where(fits, free, -1).max(axis=1), np.where(full_any, top, -1))
        has_preferred = preferred >= 0
    value: Ints = np.where(has_preferred, preferred, anywhere)
    if not locate:
        return value, None
    match = fits & (on_used | ~has_preferred[:, None]) & (free == value[:, None])
    gpu: Ints = np.where(value < top, match.argmax(axis=1), -1)
    return value, gpu
