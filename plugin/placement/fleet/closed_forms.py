"""Closed forms: the replay's answer for the common pod shapes in a few passes.

:func:`plugin.placement.pod.place_pod` replays the kubelet container by
container; over arrays that replay (:mod:`.replay`) costs about a hundred numpy
passes per container. For the shapes most pods have, the answer can be written
down directly:

* one container asking (:func:`one_container`);
* shares below a GPU in sidecars or app containers before one last container,
  none reusing another's units (:func:`without_reuse`);
* init containers, each reusing what the ones before hold (below a GPU or
  several GPUs), then one more container, after sidecars' shares or not
  (:func:`shares_then_inits_then_one`).

Each is held to place_pod by a hypothesis test of its own in
``tests/plugin/placement/test_fleet.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from plugin.api.config import AllocationPolicy
from plugin.placement.fleet.arrays import (
    BIG,
    Bools,
    Fleet,
    FleetPlacement,
    Ints,
    blank_answer,
    per_numa,
    placed_where,
    record_refusal,
    row_count,
    row_max,
    row_sum,
)
from plugin.placement.pod import ContainerRequest
from plugin.placement.refusals import FITS, HELD, NO_SINGLE_GPU, REUSE, SHORT, WHOLE


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
    answer = blank_answer(free.shape[0])
    total = row_sum(free)
    completely = row_count(free == upg[:, None])
    fits, whole, remainder = _refuse_alone(
        fleet, answer, index, units, total=total, completely=completely
    )
    remainder_free = np.zeros_like(total)
    gpu = np.full(free.shape[0], -1, dtype=np.int64)
    with_fraction = fits & (remainder > 0)
    alone = np.flatnonzero(with_fraction & (whole == 0))
    if alone.size:
        on = free[alone]
        pick, _ = share_gpu(on, remainder[alone], policy, int(upg.max()))
        remainder_free[alone] = on[np.arange(alone.size), pick]
        gpu[alone] = pick
    beside = np.flatnonzero(with_fraction & (whole > 0))
    if beside.size:
        remainder_free[beside], located = _beside_whole(
            fleet, beside, whole[beside], remainder[beside], policy, locate=locate
        )
        if located is not None:
            gpu[beside] = located
    placed = placed_where(
        answer,
        fits,
        gpus_used=whole + (remainder > 0),
        left_on_used=np.where(remainder > 0, remainder_free - remainder, 0),
        units_taken=units,
    )
    return placed, gpu


def _refuse_alone(
    fleet: Fleet,
    answer: tuple[Ints, Ints, Ints],
    index: int,
    units: int,
    *,
    total: Ints,
    completely: Ints,
) -> tuple[Bools, Ints, Ints]:
    """place_pod's refusals of a container placed with nothing held, in ``answer``.

    For ``units = w × U + r``: short of units in all; fewer than ``w`` completely
    free GPUs; or a remainder no partly used GPU holds and no completely free GPU
    is left for. Returns the rows it fits, ``w`` and ``r`` per row.
    """
    free = fleet.free
    upg = fleet.units_per_gpu
    whole, remainder = units // upg, units % upg
    partial_fit = (free < upg[:, None]) & (free >= remainder[:, None]) & (remainder[:, None] > 0)
    remainder_ok = (remainder == 0) | (row_count(partial_fit) > 0) | (completely > whole)
    short = units > total
    short_whole = ~short & (completely < whole)
    no_single = ~short & ~short_whole & ~remainder_ok
    record_refusal(answer, short, SHORT, index, units, total, fleet.unhealthy)
    record_refusal(answer, short_whole, WHOLE, index, whole, completely, total)
    if no_single.any():  # the largest free GPU, on the rows that quote it only
        largest = np.zeros_like(total)
        largest[no_single] = row_max(free[no_single])
        record_refusal(answer, no_single, NO_SINGLE_GPU, index, remainder, largest, total)
    return ~short & ~short_whole & ~no_single, whole, remainder


def share_gpu(
    free: Ints, share: Ints | int, policy: AllocationPolicy, top: int
) -> tuple[Ints, Bools]:
    """The GPU place_units gives a share below a GPU when nothing is held: the
    tightest that holds it (binpack) or the freest (spread; ``top`` is at least any
    free count), the lowest of equals; and per row whether any GPU holds it."""
    rows, width = free.shape
    key = (free if policy == "binpack" else top - free) * width + np.arange(width)
    key[free < (share[:, None] if isinstance(share, np.ndarray) else share)] = BIG
    gpu = key.argmin(axis=1)
    return gpu, key[np.arange(rows), gpu] < BIG


Tail = Callable[[Fleet], tuple[FleetPlacement, Ints]]
"""The containers after the shares, placed on what the shares left: their answer, and
per row the partly used GPU they take units from (-1: none, or a completely free one)."""


def without_reuse(
    fleet: Fleet,
    containers: Sequence[ContainerRequest],
    asking: Sequence[int],
    policy: AllocationPolicy,
) -> FleetPlacement | None:
    """Several containers, none reusing another's units (sidecars, app containers),
    each but the last asking less than a GPU on every row; None otherwise.

    The last container is :func:`one_container` on what the shares left, told
    where its remainder goes (:func:`shares_then`).
    """
    last = asking[-1]
    units = containers[last].units

    def tail(left: Fleet) -> tuple[FleetPlacement, Ints]:
        return one_container_located(left, last, units, policy, locate=True)

    return shares_then(fleet, containers, asking[:-1], policy, tail)


def shares_then(
    fleet: Fleet,
    containers: Sequence[ContainerRequest],
    shares: Sequence[int],
    policy: AllocationPolicy,
    tail: Tail,
) -> FleetPlacement | None:
    """Containers asking less than a GPU each, none reusing units, then ``tail`` on
    what they left; None where a share is a GPU or more on some row.

    place_pod places such containers one after another, each as a pod of its
    own on what the ones before left (place_units with nothing held ranks no
    NUMA node or GPU by what came before). A share below a GPU goes to the
    tightest or freest GPU that holds it: one argmin per container. ``tail``
    places the rest on what is left and says which partly used GPU it joins, so
    that the GPUs the pod uses are counted once: its whole GPUs were completely
    free, so none of the shares' GPUs.
    """
    free = fleet.free.copy()
    upg = fleet.units_per_gpu
    rows, width = free.shape
    if not rows or not width or max(containers[i].units for i in shares) >= int(upg.min()):
        return None
    every = np.arange(rows)
    answer = blank_answer(rows)
    outcome, container, numbers = answer
    alive = np.ones(rows, dtype=np.bool_)
    used = np.zeros(free.shape, dtype=np.bool_)  # GPUs the shares use
    top = int(upg.max())
    for index in shares:
        share = containers[index].units
        total = row_sum(free)
        gpu, holds = share_gpu(free, share, policy, top)
        short = alive & (share > total)
        no_gpu = alive & ~short & ~holds
        record_refusal(answer, short, SHORT, index, share, total, fleet.unhealthy)
        if no_gpu.any():
            record_refusal(answer, no_gpu, NO_SINGLE_GPU, index, share, row_max(free), total)
        alive &= ~short & ~no_gpu
        placed = np.flatnonzero(alive)
        free[placed, gpu[placed]] -= share
        used[placed, gpu[placed]] = True
    final, joins = tail(replace(fleet, free=free))
    refused_last = alive & (final.outcome != FITS)
    outcome[refused_last] = final.outcome[refused_last]
    container[refused_last] = final.container[refused_last]
    numbers[refused_last] = final.numbers[refused_last]
    fits = alive & ~refused_last
    # The GPUs used: the shares', the tail's whole GPUs and the partly used GPU it
    # joins, once. Free units left on them: the shares' GPUs keep what they had, less
    # what the tail took where it joined one of them.
    at = np.maximum(joins, 0)
    joined_before = (joins >= 0) & used[every, at]
    gpus_used = row_count(used) + final.gpus_used - joined_before
    before_left = row_sum(np.where(used, free, 0))
    left_on_used = before_left + final.left_on_used - np.where(joined_before, free[every, at], 0)
    earlier = sum(containers[i].units for i in shares)
    return placed_where(
        answer,
        fits,
        gpus_used=gpus_used,
        left_on_used=left_on_used,
        units_taken=earlier + final.units_taken,
    )


class Pool(NamedTuple):
    """Where an init container's units are on each row: what the next container reuses.

    The init container fits (it is never split), so its units are ``whole``
    whole GPUs and, for a ``rest``, one more GPU.
    """

    placed: Bools
    """Rows where it, and every container before it, fits."""
    whole: Ints
    """Its whole GPUs."""
    rest: Ints
    """Its units beyond whole GPUs, on ``gpu``."""
    gpu: Ints
    """The GPU holding ``rest``: its position (-1: no rest, or a completely free GPU
    beside whole ones, whose position no caller needs)."""
    column: Ints
    """That GPU's NUMA column (-1: no rest)."""
    gpu_free: Ints
    """That GPU's free units before the init container took its rest."""
    whole_per_column: Ints
    """Its whole GPUs per NUMA column."""


class Counts(NamedTuple):
    """Row-wise counts of a fleet's free units, computed once per placement."""

    total: Ints
    complete: Bools
    completely: Ints


def counts_of(fleet: Fleet) -> Counts:
    complete = fleet.free == fleet.units_per_gpu[:, None]
    return Counts(row_sum(fleet.free), complete, row_count(complete))


def _init_pool(
    fleet: Fleet,
    answer: tuple[Ints, Ints, Ints],
    counts: Counts,
    *,
    index: int,
    share: int,
    policy: AllocationPolicy,
) -> Pool:
    """An init container placed as a pod of its own (its refusals in ``answer``), and
    where its units went."""
    free = fleet.free
    upg = fleet.units_per_gpu
    rows = free.shape[0]
    # 1. The init container, by the one-container rules.
    placed_init, w_init, r_init = _refuse_alone(
        fleet, answer, index, share, total=counts.total, completely=counts.completely
    )

    # Where the init container's units are: its whole GPUs per NUMA column, and the
    # GPU its remainder went to (position, NUMA column, completely free before).
    numa_columns = fleet.numa_columns
    whole_before = np.zeros((rows, numa_columns), dtype=np.int64)
    g_gpu = np.full(rows, -1, dtype=np.int64)
    g_column = np.full(rows, -1, dtype=np.int64)
    g_free = np.zeros(rows, dtype=np.int64)  # its free units before
    alone = np.flatnonzero(placed_init & (w_init == 0) & (r_init > 0))
    if alone.size:
        g_gpu[alone], _ = share_gpu(free[alone], r_init[alone], policy, int(upg.max()))
        g_column[alone] = fleet.numa[alone, g_gpu[alone]]
        g_free[alone] = free[alone, g_gpu[alone]]
    beside = np.flatnonzero(placed_init & (w_init > 0))
    if beside.size:
        whole_before[beside], g_gpu[beside], g_column[beside], g_free[beside] = _whole_then_rest(
            fleet, beside, w_init[beside], r_init[beside], policy, pretaken=None
        )
    return Pool(placed_init, w_init, r_init, g_gpu, g_column, g_free, whole_before)


def _whole_then_rest(
    fleet: Fleet,
    rows: Ints,
    whole: Ints,
    rest: Ints,
    policy: AllocationPolicy,
    *,
    pretaken: Ints | None,
) -> tuple[Ints, Ints, Ints, Ints]:
    """A container's whole GPUs on ``rows`` and the GPU its rest joins beside them:
    its whole GPUs per NUMA column, and that GPU's position (-1 when completely free),
    NUMA column and free units before; -1, -1 and 0 on rows without a rest."""
    whole_gpus = _whole_gpus(fleet, rows, whole, policy, pretaken=pretaken)
    gpu = np.full(rows.size, -1, dtype=np.int64)
    column = np.full(rows.size, -1, dtype=np.int64)
    free = np.zeros(rows.size, dtype=np.int64)
    with_rest = np.flatnonzero(rest > 0)
    if with_rest.size:
        # on every row (rows without a rest are not read)
        value, located, located_column = _remainder_gpu(
            fleet, rows, rest, policy, whole_gpus, locate=True, locate_complete=True
        )
        assert located is not None
        assert located_column is not None
        gpu[with_rest] = located[with_rest]
        column[with_rest] = located_column[with_rest]
        free[with_rest] = value[with_rest]
    return whole_gpus.taken, gpu, column, free


def after_pool(
    fleet: Fleet,
    pool: Pool,
    answer: tuple[Ints, Ints, Ints],
    counts: Counts,
    *,
    share: int,
    second: int,
    units: int,
    policy: AllocationPolicy,
    grow: bool = False,
) -> tuple[FleetPlacement, Ints, Pool | None]:
    """The container after an init container, reusing its units (:class:`Pool`, of
    ``share`` units on every row placed; ``fleet.free`` from before the pool), as
    :func:`inits_then_one`'s docstring says. With
    ``grow``, also the pool this container leaves when it is an init container asking
    more than ``share`` (its own units, held by the next container in turn)."""
    free = fleet.free
    upg = fleet.units_per_gpu
    total, complete, completely = counts

    def refuse(mask: Bools, kind: int, index: int, *values: Ints | int) -> None:
        record_refusal(answer, mask, kind, index, *values)

    placed_init, w_init, r_init = pool.placed, pool.whole, pool.rest
    g_gpu, g_column, g_free = pool.gpu, pool.column, pool.gpu_free
    whole_before = pool.whole_per_column
    held_gpus = w_init + (r_init > 0)  # GPUs the init container's units go to
    has_g = g_column >= 0
    g_complete = has_g & (g_free == upg)

    if units <= share:  # it reuses part of the init container's units, or all
        many = placed_init & (held_gpus > 1) & (units < share)
        refuse(many, REUSE, second, units, share, held_gpus)
        fits = placed_init & ~many
        placed = placed_where(
            answer,
            fits,
            gpus_used=held_gpus,
            left_on_used=np.where(has_g, g_free - r_init, 0),
            units_taken=share,
        )
        kept = pool._replace(placed=fits) if grow else None
        return placed, np.where(fits, g_gpu, -1), kept

    # The container after it holds all of it and needs ``units - share`` more.
    more = units - share
    left_total = total - share
    short = placed_init & (units > total)
    refuse(short, SHORT, second, more, left_total, fleet.unhealthy)
    alive = placed_init & ~short
    whole, rest = units // upg, units % upg
    anchored = ~has_g | g_complete
    joins_g = anchored & has_g & (more < upg - r_init)  # the rest fits beside the share
    extra = whole - held_gpus
    rest_anywhere = (
        (rest == 0)
        | (row_count((free < upg[:, None]) & (free >= rest[:, None])) > 0)
        | (completely - held_gpus > extra)
    )
    fits_anchored = anchored & ~joins_g & (completely - held_gpus >= extra) & rest_anywhere
    more_whole, more_rest = more // upg, more % upg
    fits_partly = (
        has_g
        & ~g_complete
        & (r_init + more_rest < upg)
        & (completely - w_init >= more_whole)
        & ((more_rest == 0) | (g_free >= r_init + more_rest))
    )
    fits = alive & (joins_g | fits_anchored | fits_partly)
    refused = alive & ~fits
    if refused.any():
        completely_after = completely - w_init - g_complete
        short_whole = refused & (whole > 0) & (completely_after < whole)
        refuse(short_whole, WHOLE, second, whole, completely_after, left_total)
        # the largest free after it: its whole GPUs are full, ``g`` has its share less
        partly_free = np.where(complete, 0, free)
        on_g = np.flatnonzero(g_gpu >= 0)
        partly_free[on_g, g_gpu[on_g]] = 0  # counted below, less its share
        largest_after = np.maximum(
            row_max(partly_free),
            np.maximum(np.where(completely_after > 0, upg, 0), np.where(has_g, g_free - r_init, 0)),
        )
        held = refused & ~short_whole
        refuse(held, HELD, second, share, more, largest_after, left_total)

    # What the pod takes where it fits: ``units`` in all.
    gpus_used = np.where(joins_g, held_gpus, whole + (rest > 0))
    left = np.where(joins_g, upg - r_init - more, 0)
    gpus_used = np.where(fits_partly, w_init + 1 + more_whole, gpus_used)
    left = np.where(fits_partly, g_free - r_init - more_rest, left)
    # The partly used GPU: ``g`` where the rest joins it or it stays partly used (a
    # completely free ``g`` is no one's), else the one the rest joins beside whole GPUs.
    joined = np.where(fits & (joins_g | fits_partly), g_gpu, -1)
    joined_rest = np.flatnonzero(fits & fits_anchored & (rest > 0))
    if joined_rest.size:
        pretaken = whole_before[joined_rest]
        with_g = np.flatnonzero(has_g[joined_rest])
        pretaken[with_g, g_column[joined_rest[with_g]]] += 1
        value, located = _beside_whole(
            fleet,
            joined_rest,
            whole[joined_rest],
            rest[joined_rest],
            policy,
            pretaken=pretaken,
            locate=True,
        )
        left[joined_rest] = value - rest[joined_rest]
        assert located is not None
        joined[joined_rest] = located
    placed = placed_where(
        answer,
        fits,
        gpus_used=gpus_used,
        left_on_used=left,
        units_taken=units,
    )
    if not grow:
        return placed, joined, None
    return (
        placed,
        joined,
        _grown(
            fleet,
            pool,
            policy,
            fits=fits,
            beside_g=fits & (joins_g | fits_partly),
            anchored=fits & fits_anchored,
            whole=whole,
            rest=rest,
        ),
    )


def _grown(
    fleet: Fleet,
    pool: Pool,
    policy: AllocationPolicy,
    *,
    fits: Bools,
    beside_g: Bools,
    anchored: Bools,
    whole: Ints,
    rest: Ints,
) -> Pool:
    """The pool an init container leaves that asked more than the pool it held: its
    own ``whole`` GPUs and ``rest`` (``units`` divided by the GPU size, per row).

    * its rest joined the pool's GPU ``g`` (which was completely free, or was partly
      used and then every new whole GPU came from elsewhere): ``g`` again;
    * ``g`` became whole (or there was none): every whole GPU in that order, and the
      rest on the GPU place_units picks beside them, as for one container.
    """
    g_gpu, g_column, g_free, before = pool.gpu, pool.column, pool.gpu_free, pool.whole_per_column
    # Where the rest joined ``g``, the whole GPUs' NUMA nodes are never read again:
    # ``g`` was partly used before the pool (every later container joins it or is
    # refused; the whole GPUs' places only steer a rest that goes elsewhere) or it is
    # still completely free, and the whole GPUs are the pool's own.
    per_column = np.where(beside_g[:, None], before, 0)
    gpu = np.where(beside_g, g_gpu, -1)
    column = np.where(beside_g, g_column, -1)
    gpu_free = np.where(beside_g, g_free, 0)
    whole_rows = np.flatnonzero(anchored)
    if whole_rows.size:
        pretaken = before[whole_rows].copy()
        with_g = np.flatnonzero(g_column[whole_rows] >= 0)
        pretaken[with_g, g_column[whole_rows[with_g]]] += 1
        (
            per_column[whole_rows],
            gpu[whole_rows],
            column[whole_rows],
            gpu_free[whole_rows],
        ) = _whole_then_rest(
            fleet, whole_rows, whole[whole_rows], rest[whole_rows], policy, pretaken=pretaken
        )
    return Pool(fits, whole, rest, gpu, column, gpu_free, per_column)


def shares_then_inits_then_one(
    fleet: Fleet,
    containers: Sequence[ContainerRequest],
    asking: Sequence[int],
    policy: AllocationPolicy,
) -> FleetPlacement | None:
    """Shares below a GPU in sidecars or app containers (none reused), then init
    containers and one last container: :func:`inits_then_one` on what the shares left
    (:func:`shares_then`; the sidecars' units are not reusable, and place_units ranks
    nothing by where they went); None where that is not the shape."""
    first_init = next((n for n, i in enumerate(asking) if containers[i].kind == "init"), None)
    if first_init is None:
        return None
    shares, chain = asking[:first_init], asking[first_init:]
    if len(chain) < 2 or any(containers[i].kind != "init" for i in chain[:-1]):
        return None
    rows, width = fleet.free.shape
    if not rows or not width:
        return None

    def tail(left: Fleet) -> tuple[FleetPlacement, Ints]:
        return inits_then_one(left, containers, chain, policy)

    if not shares:
        placed, _ = tail(fleet)
        return placed
    return shares_then(fleet, containers, shares, policy, tail)


def inits_then_one(
    fleet: Fleet,
    containers: Sequence[ContainerRequest],
    asking: Sequence[int],
    policy: AllocationPolicy,
) -> tuple[FleetPlacement, Ints]:
    """Init containers one after another, then one more container, in closed form
    (``asking``: their positions; the init containers first); and per row the one
    partly used GPU they take units from (-1: none, or it was completely free: all
    :func:`shares_then` needs to know).

    The first init container is placed as a pod of its own (:func:`_init_pool`). An
    init container asking no more than the units held reuses part of them (or all)
    and leaves them held: only place_pod's REUSE refusal can come of it. One asking
    more holds them all and takes the rest, and its units are then the ones held.
    So the chain is :func:`after_pool` step after step, each step growing the pool
    (:func:`_grown`), and the last container a final step.

    One step: the units held (the pool, ``share`` of them) are ``w_i`` whole GPUs
    (the set ``A``) and, for a remainder ``r_i``, one GPU ``g``. The next container
    asks ``units``:

    * fewer than the init container held: it reuses part of them, which the
      kubelet picks in no fixed order when they lie on several GPUs (refused,
      place_pod's REUSE), else it simply reuses them;
    * more, ``d = units - share`` more: it holds all of them and place_units
      takes the GPUs held first. Where ``g`` was completely free (or there is
      no ``g``), the held GPUs become whole ones (``g`` too once ``d`` reaches
      its free rest; before that the rest joins ``g``) and the others are placed
      as for one container, the held GPUs' NUMA nodes ranked first
      (:func:`_beside_whole` with ``pretaken``). Where ``g`` was partly used, the
      ``d // U`` whole GPUs come from elsewhere and the rest, ``d % U``, must
      join ``g`` or the share is split: refused.

    Refusals are place_pod's, quoting the free units left after the init
    container. Held to place_pod by ``tests/plugin/placement/test_fleet.py``.
    """
    answer = blank_answer(fleet.free.shape[0])
    counts = counts_of(fleet)
    first = asking[0]
    size = containers[first].units
    pool = _init_pool(fleet, answer, counts, index=first, share=size, policy=policy)
    for index in asking[1:-1]:
        units = containers[index].units
        _, _, grown = after_pool(
            fleet,
            pool,
            answer,
            counts,
            share=size,
            second=index,
            units=units,
            policy=policy,
            grow=True,
        )
        assert grown is not None
        pool, size = grown, max(size, units)
    last = asking[-1]
    placed, joined, _ = after_pool(
        fleet,
        pool,
        answer,
        counts,
        share=size,
        second=last,
        units=containers[last].units,
        policy=policy,
    )
    return placed, joined


def _beside_whole(
    fleet: Fleet,
    rows: Ints,
    whole: Ints,
    remainder: Ints,
    policy: AllocationPolicy,
    *,
    pretaken: Ints | None = None,
    locate: bool = False,
) -> tuple[Ints, Ints | None]:
    """Free units of the GPU a fraction joins when whole GPUs were taken first.

    place_units takes the whole GPUs from one NUMA node that has enough
    completely free ones (binpack: the fewest that suffice, spread: the most;
    ties to the lower node), or else from the largest groups down; the
    fraction then prefers a GPU on a NUMA node the whole GPUs use.

    ``pretaken``: per row and NUMA column, completely free GPUs the container
    already holds whole (an init container's units it reuses): place_units
    takes them first and ranks their NUMA nodes before the others.

    With ``locate``, also that GPU's position when it is a partly used one (the
    lowest of equals on the NUMA nodes preferred, as place_units' key has it);
    -1 for a completely free GPU.
    """
    whole_gpus = _whole_gpus(fleet, rows, whole, policy, pretaken=pretaken)
    value, gpu, _ = _remainder_gpu(fleet, rows, remainder, policy, whole_gpus, locate=locate)
    return value, gpu


class _WholeGpus(NamedTuple):
    """Where a container's whole GPUs are, per NUMA column, on some rows."""

    cell: Ints
    """Each GPU's (row, NUMA column) as one index (the rows' own numbering)."""
    per_column: Ints
    """Completely free GPUs per NUMA column, before."""
    taken: Ints
    """Whole GPUs the container holds per NUMA column, after (``pretaken`` included)."""


def _whole_gpus(
    fleet: Fleet,
    rows: Ints,
    whole: Ints,
    policy: AllocationPolicy,
    *,
    pretaken: Ints | None,
) -> _WholeGpus:
    """place_units' whole-GPU step on ``rows``, as counts per NUMA column."""
    free = fleet.free[rows]
    upg = fleet.units_per_gpu[rows][:, None]
    width = free.shape[1]
    # (row, NUMA node) as one index: per-node counts by bincount, a GPU's node by a
    # gather, no (rows, GPUs, NUMA nodes) arrays
    cell = np.arange(rows.size)[:, None] * fleet.numa_columns + fleet.numa[rows]
    per_column = per_numa(cell[free == upg], rows.size, fleet.numa_columns)
    want = whole[:, None]
    enough = per_column >= want
    held = pretaken if pretaken is not None else np.zeros_like(per_column)
    # A NUMA node's rank: (no GPU held there, then fewer / more GPUs, then lower node)
    rank = (held == 0) * (2 * width + 2)
    home_key = rank + (per_column if policy == "binpack" else width - per_column)
    home = np.where(enough, home_key, BIG).argmin(axis=1)
    # The GPUs held come first; the rest come from the home node when it has enough
    # (it then has enough besides those held there), else from the nodes in rank order.
    extra = whole - row_sum(held)
    taken = held.copy()
    taken[np.arange(rows.size), home] += extra
    short = ~enough.any(axis=1)
    if short.any():
        order = np.argsort((rank + width - per_column)[short], axis=1, kind="stable")
        sizes = np.take_along_axis((per_column - held)[short], order, axis=1)
        before = np.cumsum(sizes, axis=1) - sizes
        used = np.clip(extra[short][:, None] - before, 0, sizes)
        spread_taken = np.zeros_like(sizes)
        np.put_along_axis(spread_taken, order, used, axis=1)
        taken[short] = held[short] + spread_taken
    return _WholeGpus(cell, per_column, taken)


def _remainder_gpu(
    fleet: Fleet,
    rows: Ints,
    remainder: Ints,
    policy: AllocationPolicy,
    whole_gpus: _WholeGpus,
    *,
    locate: bool,
    locate_complete: bool = False,
) -> tuple[Ints, Ints | None, Ints | None]:
    """The GPU a remainder joins beside whole GPUs: its free units, and with ``locate``
    its position when partly used (-1 for a completely free one) and, with
    ``locate_complete`` too, its NUMA column either way."""
    free = fleet.free[rows]
    upg = fleet.units_per_gpu[rows][:, None]
    cell, per_column, taken = whole_gpus
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
        return value, None, None
    looked_at = on_used | ~has_preferred[:, None]
    match = fits & looked_at & (free == value[:, None])
    partly = value < top
    gpu: Ints = np.where(partly, match.argmax(axis=1), -1)
    if not locate_complete:
        return value, gpu, None
    numa = fleet.numa[rows]
    every = np.arange(rows.size)
    column: Ints = np.where(partly, numa[every, np.maximum(gpu, 0)], -1)
    whole_rows = np.flatnonzero(~partly)
    if whole_rows.size:
        # A completely free GPU: the lowest left on the NUMA nodes looked at. The
        # whole GPUs taken on a node are its first completely free ones by position.
        complete = free[whole_rows] == upg[whole_rows]
        place = np.zeros(complete.shape, dtype=np.int64)  # rank among its node's
        for node in range(fleet.numa_columns):
            on_node = complete & (numa[whole_rows] == node)
            place += np.where(on_node, np.cumsum(on_node, axis=1) - 1, 0)
        local = np.arange(whole_rows.size)[:, None] * fleet.numa_columns + numa[whole_rows]
        gone = taken[whole_rows].ravel()[local]  # whole GPUs taken on each GPU's node
        left = complete & looked_at[whole_rows] & (place >= gone)
        first = left.argmax(axis=1)
        column[whole_rows] = numa[whole_rows, first]
    return value, gpu, column
