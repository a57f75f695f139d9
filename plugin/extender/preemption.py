"""Which pods to preempt so that a pod's every fraction fits on ONE GPU (pure).

kube-scheduler's DefaultPreemption counts ``cnvrg.io/metagpu`` per node. On a
node whose total is enough but no single GPU is (60 + 60 held on two GPUs of
100, a pod of 70), its dry run finds nothing to evict and drops the node
("expected at least one victim pod"); where the total is short it picks
victims by totals, which may free units on the wrong GPU. So the choice is
made here, on the ledger's GPUs, the way kube-scheduler makes it for whole
resources (``pkg/scheduler/framework/preemption/preemption.go``,
``defaultpreemption/default_preemption.go``):

* **on one node** (:func:`select_victims`, upstream ``SelectVictimsOnNode``):
  remove every pod of lower priority; if the pod does not fit even then, the
  node cannot help. Otherwise give pods back one by one, the most important
  first (higher priority, then the earlier start), those whose eviction would
  violate a PodDisruptionBudget before the others, keeping each that still
  lets the pod fit. What is left are the victims: no victim could be spared
  (a minimal set), lower priorities go first, and budgets are spared where
  another pod can go instead. "Fits" is :func:`plugin.placement.pod.place_pod`
  on the node's view with the victims' units given back, through the
  extender's placement memo: the same oracle filter and bind use.
* **between nodes** (:func:`pick_node`, upstream ``pickOneNodeForPreemption``):
  fewest budget violations, then the lowest highest-priority victim, then the
  lowest sum of priorities, then the fewest victims, then the latest start
  among the highest-priority victims, then the first node.

Never a pod of equal or higher priority, never for a pod with
``preemptionPolicy: Never``, never a pod already terminating (its units are
leaving anyway), never a pod whose priority the extender does not know.

On a node a supervised MPS daemon serves, "fits" also keeps one user per GPU
(:mod:`plugin.extender.mps_users`, as filter and bind do): a GPU stays closed to the
preemptor while any pod left on it runs as another user. So a victim that frees units
on a GPU another user's pod keeps is no victim worth having, and the victims chosen
empty a GPU of other users where the units alone would have looked enough.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from plugin.extender import mps_users
from plugin.extender.budgets import Budget, Disruptable, violations
from plugin.extender.decision import PlacementMemo, PodAsk
from plugin.extender.ledger import Holding, Ledger, NodeView
from plugin.extender.podfacts import PodDirectory, PodFacts
from plugin.placement.pod import PodPlacement

MIN_CANDIDATE_NODES = 100
"""Nodes with a plan after which the search stops (DefaultPreemption's
``minCandidateNodesAbsolute``)."""

MIN_CANDIDATE_NODES_PERCENT = 10
"""... or this share of the nodes, whichever is more (``minCandidateNodesPercentage``)."""

PRIORITY_OFFSET = 1 << 31
"""Added to each priority before summing, so negative priorities sum as upstream does."""


@dataclass(frozen=True, slots=True)
class Victim:
    uid: str
    namespace: str
    name: str
    priority: int
    units: Mapping[int, int]
    """GPU position → units the pod frees there."""
    started_at: str
    labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class NodePlan:
    """The victims on one node and where the preemptor goes once they are gone."""

    node: str
    victims: tuple[Victim, ...]
    """Highest priority first (``pickOneNodeForPreemption`` reads the first as the highest).
    Empty: the pod fits the node's GPUs as they are."""
    pdb_violations: int
    taken: Mapping[str, int]
    """GPU ID → units the preemptor takes there."""

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(g for g, n in self.taken.items() if n)


Budgets = Callable[[Iterable[str]], Sequence[Budget]]
"""The budgets of some namespaces (:meth:`plugin.extender.budgets.BudgetBook.in_namespaces`)."""

UserOf = Callable[[str], mps_users.User]
"""A holder's user by pod UID (the extender's directory), for MPS nodes."""

Place = Callable[[Mapping[int, int], frozenset[str]], PodPlacement]
"""Where the pod goes once ``released`` units (GPU position → units) are handed back by
the pods ``gone`` (their UIDs): the node's oracle for one preemptor."""


def _oracle(
    ask: PodAsk,
    view: NodeView,
    *,
    ledger: Ledger,
    memo: PlacementMemo,
    holdings: Sequence[Holding],
    user_of: UserOf | None,
    enforces: frozenset[str] | None,
) -> Place:
    """:data:`Place` for ``view``: place_pod through the memo, on an MPS node with the GPUs
    of other users' remaining pods taken away (:func:`plugin.extender.mps_users.for_pod`)."""

    def place(released: Mapping[int, int], gone: frozenset[str]) -> PodPlacement:
        seen = ledger.view_released(view, released) if any(released.values()) else view
        if user_of is not None and enforces:
            left = [h for h in holdings if h.pod_uid not in gone]
            blocked = mps_users.foreign_gpus(ask.user, left, user_of)
            if blocked:
                seen = mps_users.without(seen, blocked)
        return memo.place(ask, seen)

    return place


def select_victims(
    ask: PodAsk,
    preemptor: PodFacts,
    node: str,
    *,
    ledger: Ledger,
    directory: PodDirectory,
    budgets: Budgets,
    memo: PlacementMemo,
    spared: frozenset[str] = frozenset(),
    user_of: UserOf | None = None,
) -> NodePlan | str:
    """The victims on ``node`` for ``preemptor`` (see the module), or why the node cannot help.

    ``spared``: pods not to choose (their eviction was refused a moment ago). ``user_of``:
    the holders' users, so that an MPS node keeps one user per GPU (None: units only).
    """
    view = ledger.view_for(node, pod_uid=preemptor.uid, priority=preemptor.priority)
    if isinstance(view, str):
        return view
    enforces = ledger.enforces(node) if user_of is not None else None
    if enforces and ask.user == mps_users.MIXED:
        return mps_users.mixed_refusal()
    holdings = ledger.holdings(node)
    place = _oracle(
        ask, view, ledger=ledger, memo=memo, holdings=holdings, user_of=user_of, enforces=enforces
    )
    now = place({}, frozenset())
    if now.fits:
        return NodePlan(node, (), 0, _taken(now, view))
    candidates: list[Victim] = []
    for holding in holdings:
        facts = directory.get(holding.pod_uid)
        if (
            facts is None
            or facts.terminating
            or facts.priority >= preemptor.priority
            or holding.pod_uid in spared
        ):
            continue
        candidates.append(
            Victim(
                holding.pod_uid,
                facts.namespace or holding.namespace,
                facts.name or holding.pod,
                facts.priority,
                holding.units,
                facts.started_at,
                facts.labels,
            )
        )
    if not candidates:
        return "no pod of lower priority holds units on this node's GPUs"
    released = _sum_units(candidates)
    everything = place(released, frozenset(v.uid for v in candidates))
    if not everything.fits:
        return (
            f"preempting all {len(candidates)} lower-priority pod(s) here would not help: "
            f"{everything.refusal}"
        )
    # Most important first: higher priority, then started earlier (no start: least).
    ordered = sorted(candidates, key=lambda v: (-v.priority, v.started_at or "~"))
    flags = violations(
        [Disruptable(v.namespace, v.name, v.labels) for v in ordered],
        budgets({v.namespace for v in ordered}),
    )
    violating = [v for v, f in zip(ordered, flags, strict=True) if f]
    rest = [v for v, f in zip(ordered, flags, strict=True) if not f]
    for shortcut in (True, False):
        plan = _reprieve(place, violating, rest, released, everything, shortcut=shortcut)
        if plan is not None:
            victims, kept, final = plan
            return NodePlan(node, victims, kept, _taken(final, view))
    return "no set of lower-priority pods here lets the pod fit"  # pragma: no cover


def _reprieve(
    place: Place,
    violating: list[Victim],
    rest: list[Victim],
    released: dict[int, int],
    placed: PodPlacement,
    *,
    shortcut: bool,
) -> tuple[tuple[Victim, ...], int, PodPlacement] | None:
    """Give candidates back, most important first; the rest are the victims.

    ``shortcut``: a candidate holding units only on GPUs the current placement does not
    use is given back without asking place_pod (taking units the pod does not use cannot
    make it stop fitting: fitting is monotone in free units, and a GPU an MPS user rule
    closes is one the placement does not use either), so a node of 8 GPUs costs a few
    placements, not one per pod. The final placement is asked for all the same; should
    it not fit, the caller runs this again without the shortcut.
    """
    victims: list[Victim] = []
    violating_victims = 0
    gone = {v.uid for v in (*violating, *rest)}
    using = {int(pos) for pos, n in placed.taken.items() if n}
    for group, violates in ((violating, True), (rest, False)):
        for v in group:
            if shortcut and not using.intersection(v.units):
                released = {pos: n - v.units.get(pos, 0) for pos, n in released.items()}
                gone.discard(v.uid)
                continue
            trial = {pos: n - v.units.get(pos, 0) for pos, n in released.items()}
            attempt = place(trial, frozenset(gone - {v.uid}))
            if attempt.fits:
                released = trial  # reprieved: the pod fits with this one kept
                gone.discard(v.uid)
                using = {int(pos) for pos, n in attempt.taken.items() if n}
            else:
                victims.append(v)
                violating_victims += violates
    final = place(released, frozenset(gone))
    if not final.fits:
        return None
    victims.sort(key=lambda v: -v.priority)
    return tuple(victims), violating_victims, final


def pick_node(plans: Sequence[NodePlan]) -> NodePlan | None:
    """``pickOneNodeForPreemption`` over plans that each have victims."""
    best: list[NodePlan] = [p for p in plans if p.victims]
    for score in (
        lambda p: -p.pdb_violations,
        lambda p: -p.victims[0].priority,
        lambda p: -sum(v.priority + PRIORITY_OFFSET for v in p.victims),
        lambda p: -len(p.victims),
    ):
        if len(best) <= 1:
            break
        top = max(score(p) for p in best)
        best = [p for p in best if score(p) == top]
    if len(best) > 1:
        latest = max(_earliest_top_start(p) for p in best)
        best = [p for p in best if _earliest_top_start(p) == latest]
    return best[0] if best else None


def candidates_wanted(nodes: int) -> int:
    """How many nodes with a plan end the search (DefaultPreemption's numbers)."""
    return min(nodes, max(MIN_CANDIDATE_NODES, nodes * MIN_CANDIDATE_NODES_PERCENT // 100))


@dataclass(frozen=True, slots=True)
class Search:
    """The plan chosen among the nodes, and why the others could not help."""

    plan: NodePlan | None
    refused: Mapping[str, str]
    """Node → why no victims there would do (for the log, the first few)."""
    budget_blocked: int
    """Nodes that had a plan, but only one that violates a budget: the Eviction API
    would refuse it, so the extender does not try it."""


def search_nodes(
    ask: PodAsk,
    preemptor: PodFacts,
    names: Iterable[str],
    *,
    ledger: Ledger,
    directory: PodDirectory,
    budgets: Budgets,
    memo: PlacementMemo,
    spared: frozenset[str] = frozenset(),
    wanted: int,
    user_of: UserOf | None = None,
) -> Search:
    """The best node to evict on, among ``names`` (``DryRunPreemption`` then
    ``pickOneNodeForPreemption``), for the extender's own evictions: only plans that
    violate no budget, because the Eviction API refuses the others."""
    plans: list[NodePlan] = []
    refused: dict[str, str] = {}
    blocked = 0
    if not directory.any_below(preemptor.priority):
        return Search(None, {}, 0)
    for name in names:
        if not any(
            (facts := directory.get(h.pod_uid)) is not None and facts.priority < preemptor.priority
            for h in ledger.holdings(name)
        ):
            # no possible victim here: skip the view and the placement select_victims makes
            continue
        plan = select_victims(
            ask,
            preemptor,
            name,
            ledger=ledger,
            directory=directory,
            budgets=budgets,
            memo=memo,
            spared=spared,
            user_of=user_of,
        )
        if isinstance(plan, str):
            if len(refused) < 8:
                refused[name] = plan
            continue
        if not plan.victims:
            continue  # fits as it is (a nomination it sees through): no one to evict
        if plan.pdb_violations:
            blocked += 1
            continue
        plans.append(plan)
        if len(plans) >= wanted:
            break
    return Search(pick_node(plans), refused, blocked)


def _sum_units(victims: Iterable[Victim]) -> dict[int, int]:
    total: dict[int, int] = {}
    for v in victims:
        for pos, n in v.units.items():
            total[pos] = total.get(pos, 0) + n
    return total


def _taken(placed: PodPlacement, view: NodeView) -> dict[str, int]:
    return {view.gpus[int(pos)].id: n for pos, n in placed.taken.items() if n}


def _earliest_top_start(plan: NodePlan) -> str:
    top = plan.victims[0].priority
    starts = [v.started_at for v in plan.victims if v.priority == top and v.started_at]
    return min(starts) if starts else ""
