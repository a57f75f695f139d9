"""A whole pod's plan when the policy's container-by-container choice leads nowhere (pure).

Why: :func:`plugin.placement.pod.place_pod` decides the containers of a pod in
the kubelet's order, each by the policy (:func:`~plugin.placement.units.place_units`).
That greedy choice can make a later container unplaceable although another
choice for an earlier one would have placed the whole pod. The case seen on a
real cluster (issue 27): GPU 0 has 40 units free, GPU 1 100; an init container
of 30 then an app container of 50. Binpack puts the 30 on GPU 0 (the tightest),
the kubelet then hands those 30 to the app container (KUBELET-FACTS section 1),
which needs 20 more on the same GPU: no room, refused. Put on GPU 1, the 30 and
then the 50 fit. Nothing forces the greedy choice: the scheduler extender
chooses every container's GPUs and the device plugin follows that assignment
for each container, init containers included.

So this module searches, depth first, for a plan the kubelet would honour:

* each container, in the kubelet's order, first takes its pod's *reusable*
  units (a regular init container's units, for the containers after it) without
  the plugin being asked; taking only part of reusable units that lie on several
  GPUs is unpredictable (the kubelet picks from an unordered set), so such a
  branch is dead;
* the rest of the container's units go wherever the plan says (the device plugin
  answers ``GetPreferredAllocation`` with the assignment), as long as the
  container ends up with at most one GPU partly used: ``size // U`` whole GPUs and
  the ``size % U`` remainder on one GPU.

Those are all the shapes a container may take, so the candidates for one
container are few: which GPU holds the remainder (every GPU already holding part
of the container must be whole or be that GPU), whole GPUs among the completely
free ones. Completely free GPUs are interchangeable for feasibility (same free
units, nothing of this pod on them), and so are GPUs with the same free units
and held units as a remainder's home, so one of each kind is tried. Failed
states are remembered by their sorted ``(free, reusable)`` pairs, so symmetric
branches are explored once.

The order of the search is the policy's: each container's first candidate is
place_units' own answer when that is not a split, then the others, the GPUs
already holding its units first, then tightest (binpack) or freest (spread),
then by position. The first plan found is returned, so a pod the greedy replay
places gets exactly that placement, and only the containers that must move do.

The search is bounded, per node (:data:`MAX_EXPANSIONS`) and per decision over
all nodes (:class:`SearchBudget`); a node where it runs out is refused with the
greedy refusal, like a node with no plan. Real pods, a handful of containers on
up to 16 GPUs, stay far below both.

Before searching, place_pod tries one cheaper plan, the one that fixes the case
above: :func:`chain_units` raises every regular init container whose units the
next container takes whole to that container's units, so the policy places the
init container where the whole chain's share fits; :func:`chain_prefix` then
gives each init container of the chain its own part of that share. It is a
replay like the first, so the vectorised placement computes it with the same
closed forms, on every node at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Final

from plugin.api.config import AllocationPolicy
from plugin.placement.refusals import ContainerKind
from plugin.placement.units import is_fraction_split, order_whole, place_units

MAX_EXPANSIONS: Final = 1_000
"""Container placements tried on one node before the search gives up there."""

MAX_CALL_EXPANSIONS: Final = 10_000
"""Container placements tried over all the nodes of one decision (a filter call), shared
through a :class:`SearchBudget`: a pod of dozens of containers, each tried on every GPU of
hundreds of nodes without a plan, would otherwise hold a filter call for minutes (measured:
31 sidecars on the 1,000-node benchmark cluster, 336 s). About 15 µs each: at most about
0.15 s per call, for pods far from what real workloads ask (pods of two or three containers
asking take a few dozen per node)."""


@dataclass(slots=True)
class SearchBudget:
    """Container placements still allowed to the searches of one decision."""

    left: int = MAX_CALL_EXPANSIONS


Plan = list[list[int]]
"""Per container (in the order given), the units it holds on each GPU (reused + taken)."""


def search_plan(
    asks: Sequence[tuple[ContainerKind, int]],
    free: Sequence[int],
    numa: Sequence[int | None],
    *,
    units_per_gpu: int,
    policy: AllocationPolicy,
    budget: SearchBudget | None = None,
) -> tuple[Plan, list[int]] | None:
    """The first plan in the policy's order, as (each container's units per GPU, units
    taken from each GPU), or None when none exists (or the search ran out of
    :data:`MAX_EXPANSIONS`, or of ``budget``, shared by the nodes of one decision).

    ``asks``: ``(kind, units)`` per container in the kubelet's order (0 units: asks
    none); ``free``: free units per GPU (0 for an unhealthy GPU).

    A pod that reuses nothing (no init container asks) is searched largest container
    first: with nothing reused, what a container holds does not depend on the order
    the kubelet allocates in, and the largest first fails soonest where nothing fits.
    """
    order = list(range(len(asks)))
    if not any(kind == "init" and n > 0 for kind, n in asks):
        order.sort(key=lambda pos: -asks[pos][1])
    search = _Search(
        [asks[pos] for pos in order],
        numa,
        units_per_gpu=units_per_gpu,
        policy=policy,
        budget=budget if budget is not None else SearchBudget(),
    )
    found = search.run(list(free), [0] * len(free))
    if found is None:
        return None
    searched, taken = found
    plan: Plan = [[] for _ in asks]
    for pos, mine in zip(order, searched, strict=True):
        plan[pos] = mine
    return plan, taken


class _Search:
    def __init__(
        self,
        asks: Sequence[tuple[ContainerKind, int]],
        numa: Sequence[int | None],
        *,
        units_per_gpu: int,
        policy: AllocationPolicy,
        budget: SearchBudget,
    ) -> None:
        self.asks = asks
        self.budget = budget
        self.numa = numa
        self.upg = units_per_gpu
        self.policy: AllocationPolicy = policy
        self.failed: set[tuple[int, tuple[tuple[int, int], ...]]] = set()
        self.expansions = 0

    def run(self, free: list[int], reusable: list[int]) -> tuple[Plan, list[int]] | None:
        taken = [0] * len(free)
        plan: Plan = []
        if self._descend(0, free, reusable, taken, plan):
            return plan, taken
        return None

    def _descend(
        self, index: int, free: list[int], reusable: list[int], taken: list[int], plan: Plan
    ) -> bool:
        while index < len(self.asks) and self.asks[index][1] <= 0:
            plan.append([0] * len(free))
            index += 1
        if index == len(self.asks):
            return True
        state = (index, tuple(sorted(zip(free, reusable, strict=True))))
        if state in self.failed or self._spent():
            return False
        kind, units = self.asks[index]
        held = reused_units(units, reusable)
        if held is not None:
            for take in self._candidates(units, free, held):
                self.expansions += 1
                self.budget.left -= 1
                mine = [h + t for h, t in zip(held, take, strict=True)]
                next_free = [f - t for f, t in zip(free, take, strict=True)]
                next_reusable = [r - h for r, h in zip(reusable, held, strict=True)]
                if kind == "init":
                    next_reusable = [r + m for r, m in zip(next_reusable, mine, strict=True)]
                next_taken = [a + t for a, t in zip(taken, take, strict=True)]
                depth = len(plan)
                plan.append(mine)
                if self._descend(index + 1, next_free, next_reusable, next_taken, plan):
                    taken[:] = next_taken
                    return True
                del plan[depth:]
                if self._spent():
                    return False
        self.failed.add(state)
        return False

    def _spent(self) -> bool:
        return self.expansions >= MAX_EXPANSIONS or self.budget.left <= 0

    def _candidates(self, units: int, free: Sequence[int], held: Sequence[int]) -> list[list[int]]:
        """The takes that leave the container with at most one GPU partly used: the
        policy's own answer first, then one of each kind of alternative."""
        need = units - sum(held)
        if need > sum(free):
            return []
        if need == 0:
            split = is_fraction_split(held, units_per_gpu=self.upg)
            return [] if split else [[0] * len(free)]
        out: list[list[int]] = []
        first = place_units(
            free, held, units, units_per_gpu=self.upg, numa=self.numa, policy=self.policy
        )
        mine = [h + t for h, t in zip(held, first, strict=True)]
        if not is_fraction_split(mine, units_per_gpu=self.upg):
            out.append(first)
        whole, remainder = divmod(units, self.upg)
        homes: list[int | None] = [None]
        if remainder:
            sign = 1 if self.policy == "binpack" else -1
            fitting = [
                pos for pos in range(len(free)) if held[pos] <= remainder <= held[pos] + free[pos]
            ]
            fitting.sort(key=lambda pos: (held[pos] == 0, sign * free[pos], pos))
            seen: set[tuple[int, int]] = set()
            homes = []
            for pos in fitting:
                kind = (free[pos], held[pos])
                if kind not in seen:
                    seen.add(kind)
                    homes.append(pos)
        for home in homes:
            take = self._with_home(home, whole, remainder, free, held)
            if take is not None and take not in out:
                out.append(take)
        return out

    def _with_home(
        self,
        home: int | None,
        whole: int,
        remainder: int,
        free: Sequence[int],
        held: Sequence[int],
    ) -> list[int] | None:
        """``whole`` whole GPUs and the remainder on ``home``: every GPU already holding
        units of the container is one of them; the others are completely free GPUs in
        place_units' order of whole GPUs."""
        upg = self.upg
        take = [0] * len(free)
        forced = [pos for pos, h in enumerate(held) if h and pos != home]
        if len(forced) > whole or any(held[pos] + free[pos] < upg for pos in forced):
            return None
        for pos in forced:
            take[pos] = upg - held[pos]
        spare = [
            pos for pos in range(len(free)) if not held[pos] and free[pos] == upg and pos != home
        ]
        wanted = whole - len(forced)
        if wanted > len(spare):
            return None
        touched = set(forced) | ({home} if home is not None else set())
        order = order_whole(spare, wanted, numa=self.numa, touched=touched, policy=self.policy)
        for pos in order[:wanted]:
            take[pos] = upg
        if home is not None:
            take[home] = remainder - held[home]
        return take


def reused_units(units: int, reusable: Sequence[int]) -> list[int] | None:
    """The units the kubelet hands a container of ``units`` from its pod's reusable ones
    (KUBELET-FACTS section 1), per GPU; None when it would take part of units lying on
    several GPUs (it picks them from an unordered set: unpredictable)."""
    total = sum(reusable)
    if units < total and sum(1 for n in reusable if n) > 1:
        return None
    held = [0] * len(reusable)
    left = units
    for pos, n in enumerate(reusable):
        part = min(n, left)
        held[pos] = part
        left -= part
    return held


def chain_units(asks: Sequence[tuple[ContainerKind, int]]) -> list[int] | None:
    """Units per container for the reuse-aware replay, or None when no container changes.

    A regular init container that takes every reusable unit before it (so it holds
    only its own, fully predictable units) and whose units the next container asking
    takes whole gets that container's units (transitively along a chain of such init
    containers): placed by the policy with the size of the whole chain's last
    container, it lands where that container fits. Reuse depends on sizes only, so
    the replay of the raised pod takes exactly the units a real plan takes: the
    chain's last container holds the same GPUs, the init containers a part of them
    (:func:`chain_prefix`).
    """
    units = [n for _, n in asks]
    raised = list(units)
    for here, after, linked in reversed(_links(asks)):
        if linked:
            raised[here] = raised[after]
    return raised if raised != units else None


def one_chain(asks: Sequence[tuple[ContainerKind, int]]) -> bool:
    """Every container asking, but the last, is an init container linked to the next
    (:func:`chain_units`): the whole pod is one chain."""
    links = _links(asks)
    return bool(links) and all(linked for _, _, linked in links)


def independent_items(asks: Sequence[tuple[ContainerKind, int]]) -> list[int] | None:
    """The pod as independent items when every init container asking is linked to the
    next (:func:`chain_units`): each chain's last container's units, and every other
    container's. None when some container takes only part of its pod's reusable units
    or an init container's units are not taken whole.

    Each init container of a chain holds part of what its chain's last container
    holds, so a plan exists exactly when the items, each as ``size // U`` whole GPUs
    from completely free ones and the remainder on one GPU, fit the node together.
    """
    links = _links(asks)
    linked = {here for here, _, ok in links if ok}
    asking = [pos for pos, (_, n) in enumerate(asks) if n > 0]
    if any(asks[pos][0] == "init" and pos not in linked for pos in asking):
        return None
    units = chain_units(asks) or [n for _, n in asks]
    return [units[pos] for pos in asking if pos not in linked]


def _links(asks: Sequence[tuple[ContainerKind, int]]) -> list[tuple[int, int, bool]]:
    """For each container asking and the next one asking: whether the first is a
    regular init container taking every reusable unit before it whose units the next
    takes whole."""
    asking = [pos for pos, (_, n) in enumerate(asks) if n > 0]
    pool = 0
    whole_pool: dict[int, bool] = {}
    for pos in asking:
        kind, n = asks[pos]
        whole_pool[pos] = n >= pool
        pool -= min(n, pool)
        if kind == "init":
            pool += n
    return [
        (
            here,
            after,
            asks[here][0] == "init" and whole_pool[here] and asks[after][1] >= asks[here][1],
        )
        for here, after in pairwise(asking)
    ]


def chain_prefix(share: Sequence[int], size: int, *, units_per_gpu: int) -> list[int]:
    """The first ``size`` units of ``share`` (units per GPU), whole GPUs first, then the
    one partly used: nested for growing sizes, and never a split (``size % U`` units
    land on one GPU)."""
    order = sorted(range(len(share)), key=lambda pos: (share[pos] < units_per_gpu, pos))
    out = [0] * len(share)
    left = size
    for pos in order:
        part = min(left, share[pos])
        out[pos] = part
        left -= part
    return out
