"""The preferred-allocation policy (pure): which meta-devices a container should get.

The kubelet calls ``GetPreferredAllocation`` with the meta-devices that are
still unallocated (``available``), the ones it has already decided on
(``must_include``, e.g. reused from an init container) and how many it needs.
Everything is derived from those lists and the static :class:`DeviceTable`;
nothing is remembered between calls, so a plugin restart, a kubelet restart
or a kubelet that ignored an earlier answer can never make the policy wrong.

The decision itself is :func:`plugin.placement.units.place_units`, on per-GPU
counts, shared with the scheduler extender: whole GPUs from completely free
GPUs, the remainder on one GPU, a split only when no single GPU can hold it.
This module turns the kubelet's IDs into those counts and the answer back into
IDs.

"Satisfiable" means what the kubelet means: ``len(must_include) <= size <=
len(available ∪ must_include)``. Such a request always gets an answer even
when the only answers split a fraction, whatever ``allow_split_fraction``
says: the kubelet allocates regardless of the hint, so whether a split is
allowed is decided where it can be enforced, at ``Allocate`` (the device
plugin's servicer). The answer reports :attr:`Placement.fraction_split` so the
caller can warn.

An optional ``assigned`` hook lets the device plugin answer with the scheduler
extender's assignment instead of the policy when one fits the request.

Deterministic: the same inputs (in any order) give the same answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from plugin.api.config import AllocationPolicy
from plugin.api.resources import DeviceId, ReplicaId
from plugin.placement.devices import DeviceError, DeviceTable, UnknownDeviceError
from plugin.placement.units import is_fraction_split, place_units


class AllocationError(DeviceError):
    """A request no answer can satisfy (more devices than exist, ``must_include``
    larger than the request, a negative size)."""


@dataclass(frozen=True)
class Placement:
    """An allocation and what it means in GPUs."""

    ids: tuple[ReplicaId, ...]
    """The chosen meta-devices, ordered by GPU (NVML order) then unit."""
    units_by_gpu: Mapping[DeviceId, int]
    """Units taken from each GPU, in GPU order."""
    fraction_split: bool
    """More than one GPU holds a partial share: the fraction is split."""
    assigned: bool = False
    """The counts came from the ``assigned`` hook (the extender's assignment),
    not from the placement policy."""


AssignedCounts = Callable[[Sequence[int], Sequence[int]], Sequence[int] | None]
"""``(free, must_on) -> take`` per GPU (table order), or None: the device plugin's
hook that answers with the scheduler extender's assignment when one matches."""


def preferred_allocation(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    table: DeviceTable,
    policy: AllocationPolicy,
    assigned: AssignedCounts | None = None,
) -> Placement:
    """Choose exactly ``size`` meta-devices from ``available ∪ must_include``.

    ``assigned`` is asked first with the request's per-GPU counts (free units,
    units already in ``must_include``); counts it returns are used when they
    are valid for this request (each within the GPU's free units, ``size`` in
    all), else the policy decides (:func:`~plugin.placement.units.place_units`).

    Raises :class:`UnknownDeviceError` for an ID not in ``table`` and
    :class:`AllocationError` for an unsatisfiable request.

    The decision works on per-GPU *counts*: the request becomes one boolean
    per table row (:class:`~plugin.placement.row_index.RowIndex`, in numpy), counted per
    GPU by rows of a reshaped array; IDs are only materialised for the GPUs
    chosen. That keeps a 16 GPU × 1000 unit node with 11,000 available IDs at
    a few milliseconds.
    """
    if size < 0:
        raise AllocationError(f"allocation_size must be >= 0: {size}")
    must = list(dict.fromkeys(must_include))
    must_rows = _rows(must, table)
    if len(must) > size:
        raise AllocationError(
            f"must_include holds {len(must)} devices but allocation_size is {size}"
        )
    ngpus = len(table.gpus)
    units = table.units_per_gpu
    # One bool per table row: available and not already in must_include.
    # Duplicates in ``available`` fall together here, as in a set.
    pool = np.zeros(len(table), dtype=np.bool_)
    pool[_rows(available, table)] = True
    pool[must_rows] = False
    pool_by_gpu = pool.reshape(ngpus, units)
    free: list[int] = pool_by_gpu.sum(axis=1).tolist()
    must_units: list[list[int]] = [[] for _ in range(ngpus)]
    for row in must_rows.tolist():
        must_units[row // units].append(row % units)
    must_on = [len(held) for held in must_units]
    candidates = len(must) + sum(free)
    if size > candidates:
        raise AllocationError(
            f"allocation_size {size} is more than the {candidates} devices available"
        )

    if assigned is not None:
        given = assigned(free, must_on)
        if given is not None and _valid_take(given, free=free, held=must_on, size=size):
            placement = _materialise(
                table, take=given, must_units=must_units, pool_by_gpu=pool_by_gpu
            )
            return Placement(
                placement.ids, placement.units_by_gpu, placement.fraction_split, assigned=True
            )
    take = place_units(
        free,
        must_on,
        size,
        units_per_gpu=units,
        numa=[g.numa_node for g in table.gpus],
        policy=policy,
    )
    return _materialise(table, take=take, must_units=must_units, pool_by_gpu=pool_by_gpu)


def _valid_take(
    take: Sequence[int], *, free: Sequence[int], held: Sequence[int], size: int
) -> bool:
    return (
        len(take) == len(free)
        and all(0 <= t <= f for t, f in zip(take, free, strict=True))
        and sum(take) + sum(held) == size
    )


def _rows(ids: Sequence[str], table: DeviceTable) -> npt.NDArray[np.intp]:
    """The table rows of ``ids``; :class:`UnknownDeviceError` naming the first
    ID ``table`` does not have."""
    try:
        return table.rows.of(ids)
    except KeyError as exc:
        raise UnknownDeviceError(exc.args[0], resource=table.resource) from None


def _materialise(
    table: DeviceTable,
    *,
    take: Sequence[int],
    must_units: Sequence[Sequence[int]],
    pool_by_gpu: npt.NDArray[np.bool_],
) -> Placement:
    """The IDs for the decided counts: ``must_include`` plus the lowest
    available units of each GPU, ordered by GPU then unit."""
    ids: list[ReplicaId] = []
    counts: dict[DeviceId, int] = {}
    for pos, gpu in enumerate(table.gpus):
        extra, fixed = take[pos], must_units[pos]
        if not extra and not fixed:
            continue
        chosen = np.flatnonzero(pool_by_gpu[pos])[:extra].tolist() if extra else []
        names = table.ids_by_gpu[pos]
        ids.extend(names[unit] for unit in sorted([*fixed, *chosen]))
        counts[gpu.device_id] = extra + len(fixed)
    split = is_fraction_split(counts.values(), units_per_gpu=table.units_per_gpu)
    return Placement(ids=tuple(ids), units_by_gpu=counts, fraction_split=split)
