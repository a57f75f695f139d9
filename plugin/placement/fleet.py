"""One container's placement on every node at once (numpy): place_pod's answer, vectorised.

Why: the scheduler extender's filter and prioritize see every candidate node
for every pod (1,000 and more), and :func:`plugin.placement.pod.place_pod`
costs tens of microseconds of plain Python per node. Most pods ask for GPUs in
one container (init containers and sidecars without GPUs do not count), and
for them place_pod's answer is a handful of per-node sums and maxima, which
numpy computes for all nodes in a few passes over an ``nodes × GPUs`` array.

Exactly place_pod's answer, not an approximation: for a container of ``s``
units with ``U`` units per GPU (``w = s // U`` whole GPUs plus ``r = s % U``),
on the free units of the healthy GPUs (:func:`~plugin.placement.units.place_units`
with nothing held):

* ``s`` above the total free → refused, :func:`~plugin.placement.pod.short_text`;
* fewer than ``w`` completely free GPUs → refused,
  :func:`~plugin.placement.pod.whole_text`;
* ``r > 0`` and no GPU left after the whole ones holds ``r`` (neither a
  partly used GPU with ``r`` free nor one more completely free GPU) → refused,
  :func:`~plugin.placement.pod.no_single_gpu_text`;
* otherwise it fits, and the remainder goes where place_units puts it: on the
  NUMA nodes the whole GPUs came from when one of them can hold it, then the
  tightest GPU (binpack) or the freest (spread). The free units of that GPU
  are what the extender's binpack score needs.

``tests/placement/test_fleet.py`` checks all of it against place_pod on random
nodes (hypothesis); the module never decides anything place_pod would not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from plugin.api.config import AllocationPolicy
from plugin.placement.pod import (
    ContainerKind,
    GpuState,
    container_label,
    no_single_gpu_text,
    short_text,
    whole_text,
)

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

FITS: Final = 0
SHORT: Final = 1
"""Refused: fewer free units on the node's healthy GPUs than the container asks."""
WHOLE: Final = 2
"""Refused: fewer completely free GPUs than the container's whole-GPU part."""
NO_SINGLE_GPU: Final = 3
"""Refused: no one GPU can hold the fraction."""

_BIG: Final = np.int64(1) << 40
_BITS: Final = 20
"""Refusal numbers are packed three to an int64 key (:meth:`FleetPlacement.refusal_keys`):
each below 2**20, which :class:`Fleet` checks (a node's units, GPUs x units per GPU)."""


@dataclass(frozen=True, slots=True)
class Fleet:
    """Many nodes' GPUs as arrays, one row per node, GPUs padded to a common width.

    ``free[n, g]`` is 0 for an unhealthy GPU (it offers nothing, as in place_pod)
    and for padding; ``numa[n, g]`` is the GPU's NUMA node as a column
    ``0..numa_columns-1`` in place_units' order of NUMA nodes (ascending, "no NUMA
    node" last).
    """

    free: Ints
    numa: Ints
    units_per_gpu: Ints
    unhealthy: Ints
    """Unhealthy GPUs per node (the refusal names them)."""
    healthy: Ints
    """Healthy GPUs per node (the spread score's capacity)."""
    numa_columns: int

    def __post_init__(self) -> None:
        rows = self.free.shape[0]
        if self.free.ndim != 2 or self.numa.shape != self.free.shape:
            raise ValueError("free and numa must be (nodes, GPUs) arrays of one shape")
        for name in ("units_per_gpu", "unhealthy", "healthy"):
            if getattr(self, name).shape != (rows,):
                raise ValueError(f"{name} must hold one number per node")
        if rows and int(self.units_per_gpu.min()) < 1:
            raise ValueError("units_per_gpu must be at least 1 on every node")
        if rows and int((self.units_per_gpu * self.free.shape[1]).max()) >= 1 << _BITS:
            raise ValueError(f"a node's units (GPUs x units per GPU) must stay below {1 << _BITS}")


@dataclass(frozen=True, slots=True)
class FleetPlacement:
    """One container of ``units`` on every row of a :class:`Fleet`."""

    units: int
    outcome: Ints
    """:data:`FITS`, :data:`SHORT`, :data:`WHOLE` or :data:`NO_SINGLE_GPU` per row."""
    whole: Ints
    """Whole GPUs the container takes on each row (``units // units_per_gpu``)."""
    remainder: Ints
    """Units of the fraction (``units % units_per_gpu``), on one GPU."""
    remainder_free: Ints
    """Free units, before the pod, of the GPU the fraction goes to (rows that fit
    with a fraction; 0 elsewhere)."""
    total: Ints
    largest: Ints
    completely: Ints
    unhealthy: Ints

    @property
    def fits(self) -> Bools:
        fits: Bools = self.outcome == FITS
        return fits

    def refusal_keys(self, rows: Ints) -> Ints:
        """One int per row of ``rows`` that holds everything its refusal's words say.

        Refusals repeat (many nodes lack the same thing), so a caller formats one
        text per distinct key (:meth:`refusal`) instead of one per node.
        """
        outcome = self.outcome[rows]
        first = np.select(
            [outcome == SHORT, outcome == WHOLE],
            [self.unhealthy[rows], self.whole[rows]],
            self.remainder[rows],
        )
        second = np.where(outcome == WHOLE, self.completely[rows], self.largest[rows])
        return (
            (outcome << (3 * _BITS)) | (first << (2 * _BITS)) | (second << _BITS) | self.total[rows]
        )

    def refusal(self, key: int, *, name: str, kind: ContainerKind) -> str:
        """The words place_pod gives for the refusal behind ``key`` (:meth:`refusal_keys`)."""
        mask = (1 << _BITS) - 1
        outcome, first = key >> (3 * _BITS), (key >> (2 * _BITS)) & mask
        second, total = (key >> _BITS) & mask, key & mask
        label = container_label(name, kind)
        if outcome == SHORT:
            return short_text(label, self.units, total, first)
        if outcome == WHOLE:
            return whole_text(label, first, second, total)
        return no_single_gpu_text(first, second, total)


def place_container(fleet: Fleet, units: int, policy: AllocationPolicy) -> FleetPlacement:
    """place_pod's answer for one container of ``units`` (> 0) on every row."""
    if units <= 0:
        raise ValueError(f"units must be positive, got {units}")
    free = fleet.free
    upg = fleet.units_per_gpu
    whole = units // upg
    remainder = units % upg
    total = free.sum(axis=1)
    largest = free.max(axis=1, initial=0)
    full = free == upg[:, None]
    completely = full.sum(axis=1)
    partial_fit = (free < upg[:, None]) & (free >= remainder[:, None]) & (remainder[:, None] > 0)
    remainder_ok = (remainder == 0) | partial_fit.any(axis=1) | (completely > whole)
    outcome = np.select(
        [units > total, completely < whole, ~remainder_ok],
        [SHORT, WHOLE, NO_SINGLE_GPU],
        FITS,
    ).astype(np.int64)
    remainder_free = np.zeros_like(total)
    with_fraction = (outcome == FITS) & (remainder > 0)
    # No whole GPUs: no NUMA preference, the tightest (binpack) or freest GPU that holds it.
    alone = np.flatnonzero(with_fraction & (whole == 0))
    if alone.size:
        candidates = free[alone] >= remainder[alone, None]
        if policy == "binpack":
            remainder_free[alone] = np.where(candidates, free[alone], _BIG).min(axis=1)
        else:
            remainder_free[alone] = largest[alone]
    beside = np.flatnonzero(with_fraction & (whole > 0))
    if beside.size:
        remainder_free[beside] = _beside_whole(
            fleet, beside, whole[beside], remainder[beside], policy
        )
    return FleetPlacement(
        units=units,
        outcome=outcome,
        whole=whole,
        remainder=remainder,
        remainder_free=remainder_free,
        total=total,
        largest=largest,
        completely=completely,
        unhealthy=fleet.unhealthy,
    )


def _beside_whole(
    fleet: Fleet, rows: Ints, whole: Ints, remainder: Ints, policy: AllocationPolicy
) -> Ints:
    """Free units of the GPU a fraction joins when whole GPUs were taken first.

    place_units takes the whole GPUs from one NUMA node that has enough
    completely free ones (binpack: the fewest that suffice, spread: the most;
    ties to the lower node), or else from the largest groups down; the
    fraction then prefers a GPU on a NUMA node the whole GPUs use.
    """
    free = fleet.free[rows]
    upg = fleet.units_per_gpu[rows][:, None]
    columns = np.arange(fleet.numa_columns)
    on = fleet.numa[rows][:, :, None] == columns  # (rows, GPUs, columns)
    full = free == upg
    per_column = (on & full[:, :, None]).sum(axis=1)  # completely free GPUs per NUMA node
    want = whole[:, None]
    enough = per_column >= want
    if policy == "binpack":
        home = np.where(enough, per_column, _BIG).argmin(axis=1)
    else:
        home = np.where(enough, per_column, -1).argmax(axis=1)
    taken = np.zeros_like(per_column)
    taken[np.arange(rows.size), home] = whole
    # No NUMA node has enough: the largest groups first, ties to the lower node.
    short = ~enough.any(axis=1)
    if short.any():
        order = np.argsort(-per_column[short], axis=1, kind="stable")
        sizes = np.take_along_axis(per_column[short], order, axis=1)
        before = np.cumsum(sizes, axis=1) - sizes
        used = np.clip(want[short] - before, 0, sizes)
        spread_taken = np.zeros_like(sizes)
        np.put_along_axis(spread_taken, order, used, axis=1)
        taken[short] = spread_taken
    left_full = per_column > taken  # a completely free GPU stays on this NUMA node
    fits = (free < upg) & (free >= remainder[:, None])
    if policy == "binpack":
        partial = np.where(on & fits[:, :, None], free[:, :, None], _BIG).min(axis=1)
        best = np.minimum(partial, np.where(left_full, upg, _BIG))
        preferred = np.where(taken > 0, best, _BIG).min(axis=1)
        tightest: Ints = np.where(preferred < _BIG, preferred, best.min(axis=1))
        return tightest
    partial = np.where(on & fits[:, :, None], free[:, :, None], -1).max(axis=1)
    best = np.where(left_full, upg, partial)
    preferred = np.where(taken > 0, best, -1).max(axis=1)
    freest: Ints = np.where(preferred >= 0, preferred, best.max(axis=1))
    return freest


NO_NUMA: Final = 1 << 40
"""Stands for "no NUMA node" where NUMA nodes are sorted: after every real one, as in
place_units."""


def numa_key(numa: int | None) -> int:
    """A GPU's NUMA node as a sortable int (None: :data:`NO_NUMA`, last)."""
    return NO_NUMA if numa is None else numa


def fleet_of(nodes: Sequence[tuple[int, Sequence[GpuState]]]) -> Fleet:
    """A :class:`Fleet` from ``(units_per_gpu, GPUs)`` per node, in plain Python.

    For tests and small callers; the extender keeps its arrays up to date row by
    row instead (:mod:`plugin.extender.matrix`), with the same numbers.
    """
    width = max((len(gpus) for _, gpus in nodes), default=0)
    keys = sorted({numa_key(g.numa) for _, gpus in nodes for g in gpus} | {NO_NUMA})
    column = {key: pos for pos, key in enumerate(keys)}
    free = np.zeros((len(nodes), width), dtype=np.int64)
    numa = np.full((len(nodes), width), column[NO_NUMA], dtype=np.int64)
    for row, (_, gpus) in enumerate(nodes):
        for pos, g in enumerate(gpus):
            free[row, pos] = g.free if g.healthy else 0
            numa[row, pos] = column[numa_key(g.numa)]
    return Fleet(
        free=free,
        numa=numa,
        units_per_gpu=np.array([upg for upg, _ in nodes], dtype=np.int64),
        unhealthy=np.array([sum(not g.healthy for g in gpus) for _, gpus in nodes], np.int64),
        healthy=np.array([sum(g.healthy for g in gpus) for _, gpus in nodes], np.int64),
        numa_columns=len(keys),
    )
