"""Where a request's units go, on per-GPU counts: the one placement decision (pure).

The device plugin (``GetPreferredAllocation``, through
:func:`plugin.placement.allocation.preferred_allocation`, which turns the
kubelet's meta-device IDs into counts and the answer back into IDs) and the
scheduler extender (which has counts from the node ledgers, never IDs) both
decide with :func:`place_units`. One implementation, so the GPU the extender
promises at bind is the GPU the plugin would pick on the same state.

The shape of an answer for ``size`` units with ``U`` units per GPU is
``size // U`` whole GPUs plus a remainder of ``size % U`` units:

1. **Whole GPUs** come from *completely free* GPUs, all on one NUMA node when
   one node has enough of them (binpack takes the node with the fewest free
   GPUs that suffices, spread the most).
2. **The remainder** goes to one GPU: binpack picks the tightest GPU that fits
   (the fullest), spread the freest. GPUs already holding ``must_include``
   units come first, then GPUs on the NUMA node(s) already used, then the
   policy, then NVML order.
3. **Only when no single GPU can hold the remainder** (or there were not enough
   completely free GPUs) is it split, over as few GPUs as possible (freest
   first). :func:`is_fraction_split` tells the caller.

Plain Python on lists of a few to a few dozen GPUs: the device plugin and the
bind decision place on one node at a time. Deciding one container on every node
of a cluster at once is :mod:`plugin.placement.fleet`, the same rules over
arrays, property-tested equal to this.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from plugin.api.config import AllocationPolicy


def is_fraction_split(units_held: Iterable[int], *, units_per_gpu: int) -> bool:
    """More than one GPU holds a partial share: a fraction is spread over GPUs.

    ``units_held`` is how many units an allocation takes from each GPU it
    touches; whole GPUs never count (1.5 GPUs as 100 + 50 is not a split)."""
    return sum(1 for n in units_held if 0 < n < units_per_gpu) > 1


def place_units(
    free: Sequence[int],
    held: Sequence[int],
    size: int,
    *,
    units_per_gpu: int,
    numa: Sequence[int | None],
    policy: AllocationPolicy,
) -> list[int]:
    """Units to take from each GPU so that, with ``held``, the request gets ``size``.

    ``free[i]``: units of GPU ``i`` that may be taken (healthy, unallocated);
    ``held[i]``: units of GPU ``i`` the request already has (the kubelet's
    ``must_include``, e.g. reused from an init container). The caller checks
    ``sum(held) <= size <= sum(held) + sum(free)``; a request that cannot be
    filled takes what there is.
    """
    ngpus = len(free)
    free = list(free)
    take = [0] * ngpus
    need = size - sum(held)
    touched = {pos for pos, n in enumerate(held) if n}
    used_numa = {numa[pos] for pos in touched}

    # 1. Whole GPUs from completely free GPUs.
    wanted = size // units_per_gpu
    if wanted and need > 0:
        whole = [pos for pos in range(ngpus) if free[pos] + held[pos] == units_per_gpu]
        for pos in order_whole(whole, wanted, numa=numa, touched=touched, policy=policy):
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

    if need > 0:
        # 2. The remainder on one GPU.
        fits = [pos for pos in range(ngpus) if free[pos] >= need]
        if fits:
            sign = 1 if policy == "binpack" else -1
            best = min(fits, key=lambda pos: (*preference(pos), sign * free[pos], pos))
            take[best] += need
        else:
            # 3. Split over as few GPUs as possible.
            for pos in sorted(range(ngpus), key=lambda pos: (-free[pos], *preference(pos), pos)):
                part = min(need, free[pos])
                take[pos] += part
                need -= part
                if need == 0:
                    break
    return take


def order_whole(
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
