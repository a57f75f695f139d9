"""Where every container of a pod lands on a node's GPUs, the way the kubelet will do it (pure).

The device plugin decides one container at a time (``GetPreferredAllocation``
knows no pod). The scheduler extender has to know beforehand whether *every*
container of a pod will get its share on one GPU, and which GPU that is. So
this module replays the kubelet's device manager over per-GPU counts
(``../shared/KUBELET-FACTS.md`` section 1, from ``pkg/kubelet/cm/devicemanager/
manager.go``) and decides each container with the plugin's own
:func:`~plugin.placement.units.place_units`:

* containers go in order: init containers in spec order, then app containers;
* a container first takes the *reusable* units of its pod (left by regular
  init containers), without asking the plugin; the rest is asked of the plugin
  with those in ``must_include``;
* a regular init container's units become reusable for the later containers;
  a native sidecar (init container with ``restartPolicy: Always``) keeps its
  units for the pod's life, as app containers do: theirs leave the reusable set.

Reusable units spread over several GPUs are handed out by the kubelet in no
fixed order (``UnsortedList``), so a container that takes only part of them
cannot be predicted; such a pod is refused with that reason rather than placed
on a guess. Topology Manager alignment is not modelled (see the docstring of
:mod:`plugin.placement.units` and KUBELET-FACTS section 1).

The replay is the policy's choice container by container. When it refuses a
later container, an earlier container's choice may be what made it fail (an
init container's share on a GPU where the next container's whole share does
not fit); :mod:`plugin.placement.plan_search` then looks for any plan the
kubelet would honour, in the policy's order, and the pod is refused only when
there is none (with the replay's reason).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from plugin.api.config import AllocationPolicy
from plugin.placement.plan_search import (
    SearchBudget,
    chain_prefix,
    chain_units,
    one_chain,
    reused_units,
    search_plan,
)
from plugin.placement.refusals import (
    HELD,
    NO_SINGLE_GPU,
    REUSE,
    SHORT,
    WHOLE,
    ContainerKind,
    RefusalKey,
    refusal_words,
)
from plugin.placement.units import is_fraction_split, place_units


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """One container's ask, in metagpu units (0: asks for none)."""

    name: str
    kind: ContainerKind
    units: int


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU as the placement sees it: free units now, health, NUMA node."""

    id: str
    free: int
    healthy: bool = True
    numa: int | None = None


@dataclass(frozen=True, slots=True)
class ContainerPlacement:
    """Where one container's units are: GPU ID → units (reused and newly taken)."""

    name: str
    kind: ContainerKind
    units: int
    gpus: Mapping[str, int]
    split: bool
    """More than one GPU holds a partial share of this container."""


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """The whole pod on one node: each container, and the units it takes from each GPU.

    ``refusal`` is None when every container gets its whole request with no
    fraction split; otherwise it says why, in words a user can act on (it
    becomes the FailedScheduling event through the scheduler extender).
    """

    containers: tuple[ContainerPlacement, ...]
    taken: Mapping[str, int] = field(default_factory=dict)
    """Units the pod takes from each GPU's free units (what a ledger must book)."""
    refusal: str | None = None
    refusal_key: RefusalKey | None = None
    """The refusal as numbers (:mod:`plugin.placement.refusals`): what the vectorised
    placement records per node, and the words are made from."""

    @property
    def fits(self) -> bool:
        return self.refusal is None


def pod_units(containers: Sequence[ContainerRequest]) -> int:
    """The pod's request as the scheduler counts it (KUBELET-FACTS section 2).

    App containers plus sidecars, or the largest regular init container plus
    the sidecars declared before it, whichever is larger.
    """
    total = sum(c.units for c in containers if c.kind != "init")
    sidecars_before = 0
    peak = 0
    for c in containers:
        if c.kind == "sidecar":
            sidecars_before += c.units
        elif c.kind == "init":
            peak = max(peak, c.units + sidecars_before)
    return max(total, peak)


def place_pod(
    containers: Sequence[ContainerRequest],
    gpus: Sequence[GpuState],
    *,
    units_per_gpu: int,
    policy: AllocationPolicy,
    budget: SearchBudget | None = None,
) -> PodPlacement:
    """The kubelet's allocation of ``containers`` (in pod order) on ``gpus``.

    The policy's replay; when that refuses a container after the first one asking,
    the reuse-aware replay (:func:`chain_replay`), then, for a pod that reuses
    nothing, the replay of its containers largest first (:func:`largest_first`);
    when those refuse too and another plan may exist (:func:`replays_are_exact`),
    the first plan :func:`~plugin.placement.plan_search.search_plan` finds. Every
    step is a plan the kubelet honours; refused, the pod gets the first replay's
    reason.

    Unhealthy GPUs offer nothing. Deterministic: same inputs, same answer.
    """
    replayed = _replay(containers, gpus, units_per_gpu=units_per_gpu, policy=policy)
    if not may_search(replayed.refusal_key, containers):
        return replayed
    raised = chain_replay(containers, gpus, units_per_gpu=units_per_gpu, policy=policy)
    if raised is not None and raised.fits:
        return raised
    reordered = largest_first(containers)
    if reordered is not None:
        again = _replay(reordered, gpus, units_per_gpu=units_per_gpu, policy=policy)
        if again.fits:
            order = {c.name: n for n, c in enumerate(containers)}
            mine = sorted(again.containers, key=lambda c: order[c.name])
            return PodPlacement(tuple(mine), again.taken)
    if replays_are_exact(containers):
        return replayed
    found = search_plan(
        [(c.kind, c.units) for c in containers],
        [g.free if g.healthy else 0 for g in gpus],
        [g.numa for g in gpus],
        units_per_gpu=units_per_gpu,
        policy=policy,
        budget=budget,
    )
    if found is None:
        return replayed
    plan, taken = found
    placed = tuple(
        _unsplit(c, mine, gpus) for c, mine in zip(containers, plan, strict=True) if c.units > 0
    )
    return PodPlacement(placed, _by_id(taken, gpus))


def largest_first(containers: Sequence[ContainerRequest]) -> list[ContainerRequest] | None:
    """A pod that reuses nothing (no init container asks), its containers asking largest
    first, or None (it reuses, or is in that order already).

    With nothing reused, what each container holds does not depend on the order the
    kubelet allocates in, and the device plugin follows each container's assignment:
    any order of deciding gives a plan the kubelet honours. Largest first is the
    classic bin-packing order (a small sidecar's share must not take the one GPU the
    app's share fits on)."""
    if any(c.kind == "init" and c.units > 0 for c in containers):
        return None
    asking = [c for c in containers if c.units > 0]
    ordered = sorted(asking, key=lambda c: -c.units)
    return ordered if ordered != asking else None


def replays_are_exact(containers: Sequence[ContainerRequest]) -> bool:
    """Whether a pod the replays refuse has no plan at all, so the search is not needed:
    one chain (every container asking is an init container whose units the next
    takes whole, or the chain's last). Any plan holds the last container's units,
    non-split, on GPUs whose every unit came from free units, so one exists exactly
    when that container alone fits, and place_units is exact for one container with
    nothing held (:func:`chain_replay` places it so).
    """
    return one_chain([(c.kind, c.units) for c in containers])


def raised_chains(containers: Sequence[ContainerRequest]) -> list[ContainerRequest] | None:
    """The pod with each reused init container raised to its chain's size
    (:func:`~plugin.placement.plan_search.chain_units`), or None when none is."""
    units = chain_units([(c.kind, c.units) for c in containers])
    if units is None:
        return None
    return [replace(c, units=n) for c, n in zip(containers, units, strict=True)]


def chain_replay(
    containers: Sequence[ContainerRequest],
    gpus: Sequence[GpuState],
    *,
    units_per_gpu: int,
    policy: AllocationPolicy,
) -> PodPlacement | None:
    """The reuse-aware replay: the policy's replay of :func:`raised_chains`' pod, each
    raised init container then given its own part of what it was placed on. None
    when no container is raised; refused with the raised pod's reason."""
    raised = raised_chains(containers)
    if raised is None:
        return None
    placed = _replay(raised, gpus, units_per_gpu=units_per_gpu, policy=policy)
    if not placed.fits:
        return placed
    index = {g.id: pos for pos, g in enumerate(gpus)}
    own: list[ContainerPlacement] = []
    for c, at in zip((c for c in containers if c.units > 0), placed.containers, strict=True):
        if at.units == c.units:
            own.append(at)
            continue
        share = [0] * len(gpus)
        for gpu, n in at.gpus.items():
            share[index[gpu]] = n
        own.append(_unsplit(c, chain_prefix(share, c.units, units_per_gpu=units_per_gpu), gpus))
    return PodPlacement(tuple(own), placed.taken)


def may_search(key: RefusalKey | None, containers: Sequence[ContainerRequest]) -> bool:
    """Whether another plan could place a pod the replay refused with ``key``.

    Not when it fits, nor when the first container asking is refused (nothing
    before it to choose differently; place_units is exact for one container with
    nothing held), nor when the node is short of units (every plan takes the same
    units in all: what each container reuses depends on sizes, not GPUs).
    """
    if key is None or key[0] == SHORT:
        return False
    first = next((i for i, c in enumerate(containers) if c.units > 0), len(containers))
    return key[1] > first


def _replay(
    containers: Sequence[ContainerRequest],
    gpus: Sequence[GpuState],
    *,
    units_per_gpu: int,
    policy: AllocationPolicy,
) -> PodPlacement:
    """The policy's placement, container by container, never reconsidered."""
    free = [g.free if g.healthy else 0 for g in gpus]
    numa = [g.numa for g in gpus]
    reusable = [0] * len(gpus)
    taken = [0] * len(gpus)
    placed: list[ContainerPlacement] = []
    for index, c in enumerate(containers):
        if c.units <= 0:
            continue
        held = reused_units(c.units, reusable)
        if held is None:
            spread_over = sum(1 for n in reusable if n)
            key: RefusalKey = (REUSE, index, c.units, sum(reusable), spread_over, 0)
            return _refused(placed, taken, gpus, key, containers)
        need = c.units - sum(held)
        if need > sum(free):
            return _refused(placed, taken, gpus, _short(index, need, free, gpus), containers)
        take = place_units(
            free, held, c.units, units_per_gpu=units_per_gpu, numa=numa, policy=policy
        )
        mine = [h + t for h, t in zip(held, take, strict=True)]
        split = is_fraction_split([n for n in mine if n], units_per_gpu=units_per_gpu)
        if split:
            why = _no_single_gpu(
                index, c, need=need, held=held, free=free, units_per_gpu=units_per_gpu
            )
            return _refused(placed, taken, gpus, why, containers)
        for pos, t in enumerate(take):
            free[pos] -= t
            taken[pos] += t
        for pos, h in enumerate(held):
            reusable[pos] -= h
        if c.kind == "init":
            for pos, n in enumerate(mine):
                reusable[pos] += n
        placed.append(_unsplit(c, mine, gpus))
    return PodPlacement(tuple(placed), _by_id(taken, gpus))


# ---------------------------------------------------------------- internals
def _by_id(counts: Sequence[int], gpus: Sequence[GpuState]) -> dict[str, int]:
    return {gpus[pos].id: n for pos, n in enumerate(counts) if n}


def _unsplit(
    c: ContainerRequest, mine: Sequence[int], gpus: Sequence[GpuState]
) -> ContainerPlacement:
    """``c`` placed with ``mine`` units on each GPU, no fraction split."""
    return ContainerPlacement(c.name, c.kind, c.units, _by_id(mine, gpus), split=False)


def _refused(
    placed: list[ContainerPlacement],
    taken: list[int],
    gpus: Sequence[GpuState],
    key: RefusalKey,
    containers: Sequence[ContainerRequest],
) -> PodPlacement:
    return PodPlacement(
        tuple(placed),
        _by_id(taken, gpus),
        refusal=refusal_words(key, containers),
        refusal_key=key,
    )


def _short(index: int, need: int, free: Sequence[int], gpus: Sequence[GpuState]) -> RefusalKey:
    unhealthy = sum(1 for g in gpus if not g.healthy)
    return (SHORT, index, need, sum(free), unhealthy, 0)


def _no_single_gpu(
    index: int,
    c: ContainerRequest,
    *,
    need: int,
    held: Sequence[int],
    free: Sequence[int],
    units_per_gpu: int,
) -> RefusalKey:
    """Why the container's share would be split: the words of a FailedScheduling event."""
    whole, remainder = divmod(c.units, units_per_gpu)
    largest = max(free, default=0)
    total = sum(free)
    completely = sum(1 for n in free if n == units_per_gpu)
    if whole and completely < whole:
        return (WHOLE, index, whole, completely, total, 0)
    if any(held):
        return (HELD, index, sum(held), need, largest, total)
    return (NO_SINGLE_GPU, index, remainder or need, largest, total, 0)
