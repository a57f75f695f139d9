"""The extender's three decisions, filter, prioritize and bind, on the ledger (pure).

Every decision is :func:`plugin.placement.pod.place_pod` on a node's view
(reported holders plus assumptions): the device plugin's own placement,
replayed the kubelet's way, so a node passes the filter exactly when the
plugin will put every fraction of the pod on one GPU, and the GPUs bind
records are the GPUs the plugin would pick.

Speed: a filter call covers every candidate node (1,000 and more on a large
cluster), and place_pod is plain Python. Its answer depends only on the pod's
containers, the policy and the per-GPU (free, healthy, NUMA) counts, so
:class:`PlacementMemo` remembers answers by exactly that key, with GPUs named by
position: idle nodes, and nodes in the same state, cost one placement between
them. Nothing else is cached, so the memo cannot go stale.

Filter and prioritize do not come here node by node unless the cluster is
one the arrays cannot hold: :mod:`plugin.extender.bulk` decides every node at
once, and :func:`fleet_scores` is :func:`score` over arrays. Bind, one node,
uses this module.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from plugin.api.config import AllocationPolicy
from plugin.api.scheduling import ContainerAssignment, PodAssignment
from plugin.extender import mps_users
from plugin.extender.ledger import Assumption, Ledger, NodeView
from plugin.extender.reasons import node_reasons
from plugin.placement.fleet import Fleet, FleetPlacement, Ints
from plugin.placement.plan_search import SearchBudget
from plugin.placement.pod import ContainerRequest, GpuState, PodPlacement, place_pod, pod_units
from plugin.placement.refusals import RefusalKey

MAX_EXTENDER_PRIORITY = 10
"""``k8s.io/kube-scheduler/extender/v1`` MaxExtenderPriority: scores are 0..10 (the
scheduler multiplies by the extender's weight and by MaxNodeScore / 10)."""


@dataclass(frozen=True, slots=True)
class PodAsk:
    """What one pod asks for, read once per request."""

    containers: tuple[ContainerRequest, ...]
    policy: AllocationPolicy
    sm_cap: bool = False
    """The pod's compute policy is ``fixed``: only a node that caps SMs may take it
    (:func:`cap_refusal`). Placement never reads it: the check is the node's, made
    before placement on the filter's and bind's paths alike."""
    user: int | None = None
    """The UID its GPU containers run as (:func:`plugin.extender.mps_users.pod_user`:
    None unknown, -1 mixed). Placement never reads it either: on an MPS node it decides
    which GPUs the pod may use (one user's MPS clients per GPU)."""

    @property
    def units(self) -> int:
        return pod_units(self.containers)


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    passed: tuple[str, ...]
    failed: dict[str, str]
    """The pod does not fit the node's GPUs now (preempting pods there could help)."""
    unresolvable: dict[str, str]
    """The node has no usable GPU ledger: preemption cannot help, so the scheduler skips
    it in its preemption phase (``FailedAndUnresolvableNodes``)."""
    refused_by: Mapping[int, int] = field(default_factory=dict)
    """Refusal kind (:mod:`plugin.placement.refusals`) → nodes of ``failed`` it refused:
    why a pod that fits nowhere waits, for the metrics."""


class PlacementMemo:
    """place_pod answers by pod ask and node shape (see :attr:`NodeView.shape`), bounded.

    Two levels. place_pod never decides by a container's name (names only appear in
    the refusal's words), so answers are computed once per *sizes* of an ask, with
    placeholder names, and shared by every pod of those sizes (the pods of two
    workloads that both ask for 0.5 GPU); each real ask then gets them with its own
    names put back in the refusal, remembered per ask so the hot loop is one dict
    lookup per node. Containers in an answer keep placeholder names:
    :func:`container_name` gives the real one.
    """

    def __init__(self, *, asks: int = 256, shapes_per_ask: int = 1 << 14) -> None:
        self._asks = asks
        self._shapes_per_ask = shapes_per_ask
        self._memo: OrderedDict[PodAsk, dict[int, PodPlacement]] = OrderedDict()
        self._sized: OrderedDict[PodAsk, dict[int, PodPlacement]] = OrderedDict()
        self._sized_of: dict[PodAsk, PodAsk] = {}
        self.hits = 0
        self.misses = 0

    def for_ask(self, ask: PodAsk) -> dict[int, PodPlacement]:
        """The answers known for ``ask`` (one lookup per request, then int keys per node)."""
        return _lru(self._memo, ask, self._asks)

    def place(
        self,
        ask: PodAsk,
        view: NodeView,
        known: dict[int, PodPlacement] | None = None,
        *,
        budget: SearchBudget | None = None,
    ) -> PodPlacement:
        """place_pod on ``view``, with GPUs named by their position (``"0"``, ``"1"``...);
        ``budget``: the whole-pod search's, shared by the nodes of one call."""
        if view.shape < 0:
            # a view made for one pod (plugin.extender.mps_users): no shape to share; GPUs
            # named by position as in every answer of the memo
            return place_pod(
                ask.containers,
                [
                    GpuState(_POSITIONS[pos], g.free, g.healthy, g.numa)
                    for pos, g in enumerate(view.gpus)
                ],
                units_per_gpu=view.units_per_gpu,
                policy=ask.policy,
                budget=budget,
            )
        if known is None:
            known = self.for_ask(ask)
        found = known.get(view.shape)
        if found is not None:
            self.hits += 1
            return found
        sized = self._sized_of.get(ask)
        if sized is None:
            if len(self._sized_of) >= self._asks:
                self._sized_of.clear()
            sized = self._sized_of[ask] = _sized(ask)
        answers = _lru(self._sized, sized, self._asks)
        anonymous_answer = answers.get(view.shape)
        if anonymous_answer is None:
            self.misses += 1
            anonymous = [
                GpuState(_POSITIONS[pos], g.free, g.healthy, g.numa)
                for pos, g in enumerate(view.gpus)
            ]
            anonymous_answer = place_pod(
                sized.containers,
                anonymous,
                units_per_gpu=view.units_per_gpu,
                policy=ask.policy,
                budget=budget,
            )
            if len(answers) >= self._shapes_per_ask:
                answers.clear()
            answers[view.shape] = anonymous_answer
        else:
            self.hits += 1
        placed = _named(anonymous_answer, ask)
        if len(known) >= self._shapes_per_ask:
            known.clear()
        known[view.shape] = placed
        return placed


def _lru(
    table: OrderedDict[PodAsk, dict[int, PodPlacement]], key: PodAsk, size: int
) -> dict[int, PodPlacement]:
    found = table.get(key)
    if found is None:
        found = table[key] = {}
        if len(table) > size:
            table.popitem(last=False)
    else:
        table.move_to_end(key)
    return found


def _placeholder(pos: int) -> str:
    """A container name no pod can have (names are DNS labels), to put real ones back."""
    return f"\x00{pos}\x00"


def _sized(ask: PodAsk) -> PodAsk:
    """``ask`` with its containers renamed by position: the key answers are shared by."""
    return PodAsk(
        tuple(replace(c, name=_placeholder(pos)) for pos, c in enumerate(ask.containers)),
        ask.policy,
        ask.sm_cap,
    )


def _named(placed: PodPlacement, ask: PodAsk) -> PodPlacement:
    """A placeholder-named answer with ``ask``'s names back in its refusal.

    Only the refusal's words: the containers keep their placeholder names, which
    :func:`container_name` maps back where a name is needed (bind). A placement
    that fits is shared as is, so the hot loop copies nothing for it.
    """
    refusal = placed.refusal
    if refusal is None:
        return placed
    for pos, c in enumerate(ask.containers):
        refusal = refusal.replace(_placeholder(pos), c.name)
    return PodPlacement(placed.containers, placed.taken, refusal, placed.refusal_key)


def container_name(ask: PodAsk, placed_name: str) -> str:
    """The real name of a container in a memo answer (placeholders are by position)."""
    if placed_name.startswith("\x00") and placed_name.endswith("\x00"):
        return ask.containers[int(placed_name[1:-1])].name
    return placed_name


_POSITIONS = tuple(str(n) for n in range(1024))


FIXED_NEEDS_CAP = (
    "metagpu.io/compute-policy fixed needs a node that caps SMs "
    "(metagpu.io/enforces=memory.fixed: a supervised MPS daemon); this one does not"
)
"""One sentence for every such node, so kube-scheduler counts them as one reason."""


def cap_refusal(ask: PodAsk, enforces: frozenset[str] | None) -> str | None:
    """Why a node that enforces ``enforces`` may not take the pod, before placement
    (None: it may, or its ledger is unusable and placement says why)."""
    if not ask.sm_cap or enforces is None or "fixed" in enforces:
        return None
    return FIXED_NEEDS_CAP


def capable_nodes(
    ask: PodAsk, names: Sequence[str], ledger: Ledger
) -> tuple[list[str], dict[str, str]]:
    """``names`` split into the nodes placement may decide and those refused by
    :func:`cap_refusal` (with its words). The filter runs it before both its paths,
    node by node and over arrays, so they give the same answer."""
    if not ask.sm_cap:
        return list(names), {}
    kept: list[str] = []
    refused: dict[str, str] = {}
    for name in names:
        why = cap_refusal(ask, ledger.enforces(name))
        if why is None:
            kept.append(name)
        else:
            refused[name] = why
    return kept, refused


def decide(
    ask: PodAsk,
    view: NodeView | str,
    memo: PlacementMemo,
    known: dict[int, PodPlacement] | None = None,
) -> PodPlacement | str:
    """The pod on one node: its placement (fits or refused), or why the node has no view."""
    if isinstance(view, str):
        return view
    return memo.place(ask, view, known)


def filter_nodes(
    ask: PodAsk, names: Iterable[str], ledger: Ledger, memo: PlacementMemo
) -> FilterOutcome:
    """Nodes where every container fits the plugin's way; the rest with place_pod's reason
    (:func:`plugin.extender.reasons.node_reasons`: summarised when there are many)."""
    passed: list[str] = []
    refused: dict[str, RefusalKey] = {}
    unresolvable: dict[str, str] = {}
    known = memo.for_ask(ask)
    view_of = ledger.view
    budget = SearchBudget()
    for name in names:
        # The hot loop of the extender (every candidate node, every pod): a memo hit
        # costs two dict lookups and no call into place_pod.
        view = view_of(name)
        if isinstance(view, str):
            unresolvable[name] = view
            continue
        outcome = known.get(view.shape)
        if outcome is None:
            outcome = memo.place(ask, view, known, budget=budget)
        else:
            memo.hits += 1
        if outcome.refusal_key is None:
            passed.append(name)
        else:
            refused[name] = outcome.refusal_key
    distinct = list(dict.fromkeys(refused.values()))
    words = dict(zip(distinct, node_reasons(distinct, ask.containers), strict=True))
    failed = {name: words[key] for name, key in refused.items()}
    refused_by = Counter(key[0] for key in refused.values())
    return FilterOutcome(tuple(passed), failed, unresolvable, dict(refused_by))


def score(placement: PodPlacement, view: NodeView, policy: AllocationPolicy) -> int:
    """0..10: binpack (GPU level) or spread (node level); 0 where the pod does not fit.

    * **binpack**: over the GPUs the pod takes units from, the mean share of a
      GPU left free after it, inverted: a node whose GPU the fraction fills
      exactly scores 10, so fractions fill gaps and whole GPUs stay whole
      elsewhere (the fragmentation issue 14 measured);
    * **spread**: the share of the node's healthy units still free after the
      pod: the emptiest node scores highest.

    In integers, rounded half to even at the end: exact, so :func:`fleet_scores`
    (the same over arrays) gives every node the same score to the last unit.
    """
    if placement.refusal is not None or not placement.taken:
        return 0
    upg = view.units_per_gpu
    if policy == "spread":
        capacity = upg * sum(1 for g in view.gpus if g.healthy)
        free = sum(g.free for g in view.gpus if g.healthy) - sum(placement.taken.values())
        if not capacity:
            return 0
        return _bounded(_rounded(MAX_EXTENDER_PRIORITY * free, capacity))
    touched = [(int(pos), taken) for pos, taken in placement.taken.items() if taken]
    left = sum(view.gpus[pos].free - taken for pos, taken in touched)
    whole = upg * len(touched)
    return _bounded(_rounded(MAX_EXTENDER_PRIORITY * (whole - left), whole))


def _rounded(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` rounded half to even, in integers (denominator > 0)."""
    quotient, rest = divmod(numerator, denominator)
    if 2 * rest > denominator or (2 * rest == denominator and quotient % 2):
        quotient += 1
    return quotient


def _bounded(value: int) -> int:
    return max(0, min(MAX_EXTENDER_PRIORITY, value))


def fleet_scores(placed: FleetPlacement, fleet: Fleet, policy: AllocationPolicy) -> Ints:
    """:func:`score` for a pod on every row of a fleet, in the same integer steps."""
    if policy == "spread":
        numerator = MAX_EXTENDER_PRIORITY * (np.einsum("ij->i", fleet.free) - placed.units_taken)
        denominator = fleet.units_per_gpu * fleet.healthy
    else:
        denominator = fleet.units_per_gpu * placed.gpus_used
        numerator = MAX_EXTENDER_PRIORITY * (denominator - placed.left_on_used)
    safe = np.maximum(denominator, 1)
    quotient, rest = np.divmod(numerator, safe)
    quotient += (2 * rest > safe) | ((2 * rest == safe) & (quotient % 2 == 1))
    scores = np.minimum(np.maximum(quotient, 0), MAX_EXTENDER_PRIORITY)
    counted: Ints = np.where(placed.fits & (denominator > 0) & (placed.gpus_used > 0), scores, 0)
    return counted


def prioritize(
    ask: PodAsk, names: Iterable[str], ledger: Ledger, memo: PlacementMemo
) -> list[tuple[str, int]]:
    """``(node, score)`` for every name, in the order given."""
    scores: list[tuple[str, int]] = []
    known = memo.for_ask(ask)
    by_shape: dict[int, int] = {}
    view_of = ledger.view
    budget = SearchBudget()
    for name in names:
        view = view_of(name)
        if isinstance(view, str):
            scores.append((name, 0))
            continue
        found = by_shape.get(view.shape)
        if found is None:
            placed = memo.place(ask, view, known, budget=budget)
            found = by_shape[view.shape] = score(placed, view, ask.policy)
        scores.append((name, found))
    return scores


@dataclass(frozen=True, slots=True)
class BindDecision:
    """What bind records on the pod and reserves in the ledger."""

    assignment: PodAssignment
    assumption: Assumption


def bind_decision(
    ask: PodAsk,
    *,
    node: str,
    pod_uid: str,
    namespace: str,
    pod: str,
    ledger: Ledger,
    memo: PlacementMemo,
    now: float,
    ttl_s: float,
    assigned_at: str,
    priority: int | None = None,
    user_of: Callable[[str], int | None] | None = None,
) -> BindDecision | str:
    """The GPUs each container gets on ``node`` (place_pod's answer), or why none can.

    Pure and synchronous: the caller reserves with ``ledger.assume`` before its
    first await. A pod that already holds an assumption (a retried bind) is
    decided without it, so a retry never competes with itself. Units nominated for
    a preemptor are free to that pod and to pods of higher ``priority`` only
    (:meth:`Ledger.view_for`). With ``user_of`` (a pod UID's user), a node a supervised
    MPS daemon serves offers only the GPUs whose holders run as the pod's user
    (:mod:`plugin.extender.mps_users`).
    """
    refused = cap_refusal(ask, ledger.enforces(node))
    if refused is not None:
        return refused
    previous = ledger.forget(pod_uid)
    try:
        view = ledger.view_for(node, pod_uid=pod_uid, priority=priority)
        blocked: set[int] = set()
        if user_of is not None and not isinstance(view, str):
            own = mps_users.for_pod(
                ask.user,
                view,
                enforces=ledger.enforces(node),
                holdings=ledger.holdings(node),
                user_of=user_of,
            )
            if isinstance(own, str):
                return own
            view, blocked = own
        outcome = decide(ask, view, memo)
    finally:
        if previous is not None:
            ledger.assume(previous)
    if isinstance(outcome, str) or isinstance(view, str):
        return str(outcome)
    if outcome.refusal is not None:
        if blocked:
            return mps_users.foreign_refusal(outcome.refusal, blocked, ask.user)
        return outcome.refusal
    ids = _ids(view.gpus)
    containers = tuple(
        ContainerAssignment(
            container=container_name(ask, c.name),
            kind=c.kind,
            units=c.units,
            gpus={ids[int(pos)]: n for pos, n in c.gpus.items()},
        )
        for c in outcome.containers
    )
    taken = {ids[int(pos)]: n for pos, n in outcome.taken.items() if n}
    assignment = PodAssignment(
        node=node, containers=containers, taken=taken, assigned_at=assigned_at
    )
    return BindDecision(assignment, Assumption(pod_uid, namespace, pod, node, taken, now + ttl_s))


def _ids(gpus: Sequence[GpuState]) -> list[str]:
    return [g.id for g in gpus]
