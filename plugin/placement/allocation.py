"""The preferred-allocation policy (pure): which meta-devices a container should get.

The kubelet calls ``GetPreferredAllocation`` with the meta-devices that are
still unallocated (``available``), the ones it has already decided on
(``must_include``, e.g. reused from an init container) and how many it needs.
Everything is derived from those lists and the static :class:`DeviceTable`;
nothing is remembered between calls, so a plugin restart, a kubelet restart
or a kubelet that ignored an earlier answer can never make the policy wrong.

The shape of an answer for ``size`` units with ``U`` units per GPU is
``size // U`` whole GPUs plus a remainder of ``size % U`` units:

1. **Whole GPUs** come from *completely free* GPUs (every unit available),
   all on one NUMA node when one node has enough of them (binpack takes the
   node with the fewest free GPUs that suffices, keeping big nodes intact;
   spread takes the node with the most).
2. **The remainder** goes to one GPU: binpack picks the tightest GPU that
   fits (the fullest), spread the freest. GPUs already holding
   ``must_include`` devices come first, then GPUs on the NUMA node(s) already
   used, then the policy, then NVML order.
3. **Only when no single GPU can hold the remainder** (or there were not
   enough completely free GPUs) is it split, over as few GPUs as possible
   (freest first).

"Satisfiable" means what the kubelet means: ``len(must_include) <= size <=
len(available ∪ must_include)``. Such a request always gets an answer even
when the only answers split a fraction, whatever ``allow_split_fraction``
says: the kubelet allocates regardless of the hint, and an error here would
make it fail the pod's admission (``UnexpectedAdmissionError``). The answer
reports :attr:`Placement.fraction_split` so the caller can warn.

Deterministic: the same inputs (in any order) give the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from plugin.api.config import AllocationPolicy
from plugin.api.resources import DeviceId, ReplicaId
from plugin.placement.devices import DeviceError, DeviceTable, UnknownDeviceError


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


def is_fraction_split(units_held: Iterable[int], *, units_per_gpu: int) -> bool:
    """More than one GPU holds a partial share: a fraction is spread over GPUs.

    ``units_held`` is how many units an allocation takes from each GPU it
    touches; whole GPUs never count (1.5 GPUs as 100 + 50 is not a split)."""
    return sum(1 for n in units_held if n < units_per_gpu) > 1


def preferred_allocation(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    table: DeviceTable,
    policy: AllocationPolicy,
) -> Placement:
    """Choose exactly ``size`` meta-devices from ``available ∪ must_include``.

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

    take = [0] * ngpus  # units to add per GPU, on top of must_include
    need = size - len(must)
    numa = [g.numa_node for g in table.gpus]
    touched = {pos for pos, n in enumerate(must_on) if n}
    used_numa = {numa[pos] for pos in touched}

    # 1. Whole GPUs from completely free GPUs.
    wanted = size // units
    if wanted and need:
        whole = [pos for pos in range(ngpus) if free[pos] + must_on[pos] == units]
        for pos in _order_whole(whole, wanted, numa=numa, touched=touched, policy=policy):
            if wanted == 0:
                break
            if free[pos] > need:
                continue
            take[pos], need = free[pos], need - free[pos]
            free[pos] = 0
            wanted -= 1
            touched.add(pos)
            used_numa.add(numa[pos])

    def preference(pos: int) -> tuple[bool, bool]:
        return (pos not in touched, bool(used_numa) and numa[pos] not in used_numa)

    if need:
        # 2. The remainder on one GPU.
        fits = [pos for pos in range(ngpus) if free[pos] >= need]
        if fits:
            sign = 1 if policy == "binpack" else -1
            best = min(fits, key=lambda pos: (*preference(pos), sign * free[pos], pos))
            take[best] += need
            need = 0
        else:
            # 3. Split over as few GPUs as possible.
            for pos in sorted(range(ngpus), key=lambda pos: (-free[pos], *preference(pos), pos)):
                part = min(need, free[pos])
                take[pos] += part
                need -= part
                if need == 0:
                    break

    return _materialise(table, take=take, must_units=must_units, pool_by_gpu=pool_by_gpu)


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


def _order_whole(
    whole: list[int],
    wanted: int,
    *,
    numa: Sequence[int | None],
    touched: set[int],
    policy: AllocationPolicy,
) -> list[int]:
    """Completely free GPUs in the order whole-GPU parts should use them.

    GPUs that already hold ``must_include`` devices first; then a NUMA node
    that can hold all ``wanted`` GPUs (binpack: the smallest such group,
    spread: the largest); then the other nodes, largest first.
    """
    if not whole:
        return []
    groups: dict[int | None, list[int]] = {}
    for pos in whole:
        groups.setdefault(numa[pos], []).append(pos)

    def node_key(node: int | None) -> tuple[bool, int]:
        return (node is None, node if node is not None else 0)

    home_nodes = {numa[pos] for pos in touched}
    sizes = {node: len(members) for node, members in groups.items()}
    enough = [node for node, n in sizes.items() if n >= wanted]
    if enough:
        sign = 1 if policy == "binpack" else -1
        home = min(
            enough, key=lambda node: (node not in home_nodes, sign * sizes[node], node_key(node))
        )
    else:
        home = min(sizes, key=lambda node: (node not in home_nodes, -sizes[node], node_key(node)))
    rest = sorted(
        (node for node in groups if node != home),
        key=lambda node: (node not in home_nodes, -sizes[node], node_key(node)),
    )
    ordered = list(groups[home])
    for node in rest:
        ordered.extend(groups[node])
    return sorted(ordered, key=lambda pos: pos not in touched)
