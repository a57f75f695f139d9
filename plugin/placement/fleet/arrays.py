"""The arrays every way of placing a pod on many nodes shares (numpy).

A :class:`Fleet` holds many nodes' GPUs as ``nodes × GPUs`` arrays, a
:class:`FleetPlacement` a pod's answer on each of them; the helpers are the
row-wise sums, counts and per-NUMA-node tallies the closed forms
(:mod:`.closed_forms`) and the replay (:mod:`.replay`) are built from, written
once here because on rows of a few GPUs the plain numpy spelling costs twice
as much (measured in their docstrings).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from plugin.placement.pod import GpuState
from plugin.placement.refusals import FITS

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

BIG: Final = np.int64(1) << 60
"""Larger than any key built here: "not a candidate" in a minimum, "last" in an order."""
_LIMIT: Final = 1 << 20
"""A node's units (GPUs x units per GPU) stay below this, so sort keys stay in an int64."""


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
        if self.numa_columns < 1:
            raise ValueError("numa_columns must be at least 1")
        if rows and int(self.units_per_gpu.min()) < 1:
            raise ValueError("units_per_gpu must be at least 1 on every node")
        if rows and int((self.units_per_gpu * max(self.free.shape[1], 1)).max()) >= _LIMIT:
            raise ValueError(f"a node's units (GPUs x units per GPU) must stay below {_LIMIT}")

    def subset(self, rows: Ints) -> Fleet:
        """These rows only (copies), e.g. the nodes that changed since an answer."""
        return Fleet(
            free=self.free[rows],
            numa=self.numa[rows],
            units_per_gpu=self.units_per_gpu[rows],
            unhealthy=self.unhealthy[rows],
            healthy=self.healthy[rows],
            numa_columns=self.numa_columns,
        )


@dataclass(frozen=True, slots=True)
class FleetPlacement:
    """A pod on every row of a :class:`Fleet`: fits or why not, and what it takes."""

    outcome: Ints
    """:data:`FITS` or the refusal's kind, per row."""
    container: Ints
    """Per row, the position (in the containers placed) of the container refused; -1."""
    numbers: Ints
    """Per row, the refusal's numbers (4 columns; what each means depends on the kind)."""
    gpus_used: Ints
    """Per row that fits, how many GPUs the pod takes units from."""
    left_on_used: Ints
    """Per row that fits, the free units those GPUs keep after the pod."""
    units_taken: Ints
    """Per row that fits, the units the pod takes in all (init containers' reused once)."""
    taken: Ints | None = None
    """Units taken from each GPU, from the replay of several containers (None for one
    container, whose closed form needs no per-GPU array)."""

    @property
    def fits(self) -> Bools:
        fits: Bools = self.outcome == FITS
        return fits

    def patch(self, rows: Ints, fresh: FleetPlacement) -> None:
        """Put ``fresh`` (the answer on ``Fleet.subset(rows)``) in place of those rows."""
        self.outcome[rows] = fresh.outcome
        self.container[rows] = fresh.container
        self.numbers[rows] = fresh.numbers
        self.gpus_used[rows] = fresh.gpus_used
        self.left_on_used[rows] = fresh.left_on_used
        self.units_taken[rows] = fresh.units_taken
        if self.taken is not None and fresh.taken is not None:
            self.taken[rows] = fresh.taken

    def refusal_keys(self, rows: Ints) -> Ints:
        """One line per row of ``rows``, equal exactly when the refusals' words are.

        Refusals repeat (many nodes lack the same thing), so a caller formats one
        text per distinct line (:func:`~plugin.placement.refusals.refusal_words`, with
        the pod's own containers) instead of one per node.
        """
        keys: Ints = np.column_stack((self.outcome[rows], self.container[rows], self.numbers[rows]))
        return keys


def with_taken(
    fleet: Fleet, outcome: Ints, container: Ints, numbers: Ints, taken: Ints
) -> FleetPlacement:
    """An answer from the units taken per GPU (0 on rows refused)."""
    used = taken > 0
    return FleetPlacement(
        outcome,
        container,
        numbers,
        gpus_used=row_count(used),
        left_on_used=row_sum(np.where(used, fleet.free - taken, 0)),
        units_taken=row_sum(taken),
        taken=taken,
    )


def blank_answer(rows: int) -> tuple[Ints, Ints, Ints]:
    """(outcome, container, numbers) for ``rows`` nodes before any refusal: every row
    fits, no container refused, no numbers; :func:`record_refusal` fills them in."""
    return (
        np.full(rows, FITS, dtype=np.int64),
        np.full(rows, -1, dtype=np.int64),
        np.zeros((rows, 4), dtype=np.int64),
    )


def record_refusal(
    answer: tuple[Ints, Ints, Ints], mask: Bools, kind: int, index: int, *values: Ints | int
) -> None:
    """Record a refusal on the rows of ``mask``: ``answer`` is (outcome, container,
    numbers) of a placement being built; ``values`` the numbers quoted, per row or one."""
    outcome, container, numbers = answer
    hit = np.flatnonzero(mask)
    if not hit.size:
        return
    outcome[hit], container[hit] = kind, index
    for column, value in enumerate(values):
        numbers[hit, column] = value[hit] if isinstance(value, np.ndarray) else value


def placed_where(
    answer: tuple[Ints, Ints, Ints],
    fits: Bools,
    *,
    gpus_used: Ints | int,
    left_on_used: Ints | int,
    units_taken: Ints | int,
) -> FleetPlacement:
    """A placement from (outcome, container, numbers) and what the pod takes on the
    rows it fits (0 on the others, as the scores expect)."""
    outcome, container, numbers = answer
    return FleetPlacement(
        outcome,
        container,
        numbers,
        gpus_used=np.where(fits, gpus_used, 0),
        left_on_used=np.where(fits, left_on_used, 0),
        units_taken=np.where(fits, units_taken, 0),
    )


def per_numa(cells: Ints, rows: int, columns: int) -> Ints:
    """How many of ``cells`` (row x NUMA node indexes) fall in each (row, NUMA node)."""
    counts: Ints = np.bincount(cells, minlength=rows * columns).reshape(rows, columns)
    return counts


def cells_of(fleet: Fleet) -> Ints:
    """Each GPU's (row, NUMA node) as one index into a flattened ``(rows, NUMA nodes)``
    array: counting per NUMA node is a bincount, looking a GPU's node up a gather."""
    cells: Ints = np.arange(fleet.free.shape[0])[:, None] * fleet.numa_columns + fleet.numa
    return cells


def row_sum(values: Ints) -> Ints:
    """Each row's sum. einsum, because ``sum(axis=1)`` over rows of a few GPUs costs
    twice as much (measured: 12 against 24 µs for 1,000 × 8)."""
    sums: Ints = np.einsum("ij->i", values)
    return sums


def row_count(mask: Bools) -> Ints:
    """Each row's number of True (as int64; einsum again, a quarter cheaper than sum)."""
    counts: Ints = np.einsum("ij->i", mask, dtype=np.int64, casting="safe")
    return counts


def row_max(values: Ints) -> Ints:
    """Each row's largest value, 0 for a row of no GPUs."""
    largest: Ints = np.maximum.reduce(values, axis=1, initial=0)
    return largest


NO_NUMA: Final = 1 << 40
"""Stands for "no NUMA node" where NUMA nodes are sorted: after every real one, as in
place_units."""


def numa_key(numa: int | None) -> int:
    """A GPU's NUMA node as a sortable int (None: :data:`NO_NUMA`, last)."""
    return NO_NUMA if numa is None else numa


def gpu_row(gpus: Sequence[GpuState]) -> tuple[list[int], list[int], int]:
    """One node's row: free units (0 for an unhealthy GPU, which offers nothing, as in
    place_pod), NUMA keys (:func:`numa_key`) and the number of healthy GPUs.

    The one conversion from GPUs to a row, for :func:`fleet_of` and the extender's
    rows (:mod:`plugin.extender.matrix`)."""
    free = [g.free if g.healthy else 0 for g in gpus]
    return free, [numa_key(g.numa) for g in gpus], sum(1 for g in gpus if g.healthy)


def fleet_of(nodes: Sequence[tuple[int, Sequence[GpuState]]]) -> Fleet:
    """A :class:`Fleet` from ``(units_per_gpu, GPUs)`` per node, built in one go.

    For tests and small callers; the extender keeps its arrays up to date row by
    row instead (:mod:`plugin.extender.matrix`), from the same :func:`gpu_row`.
    """
    width = max((len(gpus) for _, gpus in nodes), default=0)
    rows = [gpu_row(gpus) for _, gpus in nodes]
    keys = sorted({key for _, numa, _ in rows for key in numa} | {NO_NUMA})
    column = {key: pos for pos, key in enumerate(keys)}
    free = np.zeros((len(nodes), width), dtype=np.int64)
    numa = np.full((len(nodes), width), column[NO_NUMA], dtype=np.int64)
    for row, (row_free, row_numa, _) in enumerate(rows):
        free[row, : len(row_free)] = row_free
        numa[row, : len(row_numa)] = [column[key] for key in row_numa]
    healthy = np.array([count for _, _, count in rows], dtype=np.int64)
    return Fleet(
        free=free,
        numa=numa,
        units_per_gpu=np.array([upg for upg, _ in nodes], dtype=np.int64),
        unhealthy=np.array([len(gpus) for _, gpus in nodes], dtype=np.int64) - healthy,
        healthy=healthy,
        numa_columns=len(keys),
    )


def distinct_rows(keys: Ints) -> tuple[Ints, Ints]:
    """The distinct rows of ``keys`` and, per row, which of them it is.

    ``np.unique(axis=0)`` compares rows as opaque bytes and took 1.7 ms for 500
    refusals; sorting the int columns with ``lexsort`` takes a fraction of that.
    """
    if not keys.shape[0]:
        return keys, np.zeros(0, dtype=np.int64)
    order = np.lexsort(keys.T[::-1])
    ordered = keys[order]
    starts = np.ones(len(order), dtype=np.bool_)
    starts[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    inverse = np.empty(len(order), dtype=np.int64)
    inverse[order] = np.cumsum(starts) - 1
    distinct: Ints = ordered[starts]
    return distinct, inverse
