"""Who holds what on every GPU, as the extender must see it (pure).

Two sources, like kube-scheduler's cache with its assumed pods:

* **reported**: each node's :class:`~plugin.api.scheduling.NodeLedger`
  (annotation ``metagpu.io/gpu-ledger``, written by the node agent from what
  the kubelet really allocated, with GPU health);
* **assumed**: assignments this extender made at bind (or found on pods,
  annotation ``metagpu.io/assigned-gpus``, after a restart) that the node has
  not reported yet. An assumption is dropped when the node reports the pod,
  when the pod goes away or ends, or when it is older than the assume timeout
  (a node that never reports must not hold its units forever).

A pod reported once is *settled*: later events about it never assume it again,
so a ledger that drops the pod's holders (it ended) and a pod update that
arrives after it cannot resurrect a reservation.

Two more things hold or release units, for preemption
(:mod:`plugin.extender.preemption`):

* **nominated**: units a preempting pod is to get once its victims are gone,
  kept for a bounded time, like kube-scheduler's nominated pods: pods of lower
  or equal priority see them as taken, the preemptor itself and pods of higher
  priority do not (:meth:`Ledger.view_for`);
* **departed**: a pod deleted from the API whose node still reports it (the
  agent reports within its interval): its units are free for placement at once,
  as the kubelet's device manager frees the devices of pods that are no longer
  active, so a preemptor does not wait for the next report.

Times are wall-clock seconds passed in by the caller (the annotation carries
an RFC 3339 bind time, and a restarted extender must judge it the same way).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from pydantic import ValidationError

from plugin.api.scheduling import NodeLedger, PodAssignment
from plugin.placement.pod import GpuState

NO_LEDGER = "metagpu agent has not reported this node's GPUs (no metagpu.io/gpu-ledger annotation)"


STALE_AFTER_REFRESHES: Final = 3
"""A ledger is stale once its agent missed this many promised rewrites (its clock and the
extender's may differ by a little; an agent restart takes one period at most)."""

MAX_SHAPES = 1 << 16
"""Distinct node shapes interned before the table starts over (bounded memory)."""


@dataclass(frozen=True, slots=True)
class Assumption:
    """Units a pod holds on one node's GPUs that the node has not reported yet."""

    pod_uid: str
    namespace: str
    pod: str
    node: str
    taken: Mapping[str, int]
    """GPU ID → units the pod takes there (:attr:`PodPlacement.taken`)."""
    expires_at: float


MAX_NOMINATIONS = 1024
"""Preemptors whose room is held at once (bounded memory); the oldest goes first."""


@dataclass(frozen=True, slots=True)
class Nomination:
    """Units held on one node for a pod whose victims are being evicted."""

    pod_uid: str
    namespace: str
    pod: str
    node: str
    priority: int
    taken: Mapping[str, int]
    """GPU ID → units the preemptor will take there."""
    victims: frozenset[str]
    """The victims' pod UIDs (for the log and the events)."""
    expires_at: float


@dataclass(frozen=True, slots=True)
class Holding:
    """One pod's units on one node, per GPU position, as reported or assumed."""

    pod_uid: str
    namespace: str
    pod: str
    units: Mapping[int, int]
    """GPU position on the node → units the pod holds there."""
    assumed: bool


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node's GPUs as placement sees them: reported holders plus assumptions."""

    node: str
    units_per_gpu: int
    gpus: tuple[GpuState, ...]
    generation: int
    """Changes whenever anything this view is built from changes."""
    shape: int
    """The per-GPU (free, healthy, NUMA) counts and units per GPU, interned: two views
    with the same shape get the same placement from place_pod (GPU IDs aside)."""


ReportedGpu = tuple[str, int, int, bool, int | None]
"""One GPU as its node reported it: (GPU ID, units, units held, healthy, NUMA node)."""


@dataclass(slots=True)
class _Node:
    """One node's report, kept as plain tuples rather than the parsed pydantic models.

    The collector walks every object a long-lived process keeps that can hold
    others. A NodeLedger kept per node was about 60 of them (a model, its
    ``__dict__`` and fields set, per GPU and per holder); at 1,000 nodes that
    made each full pass 30-40 ms, landing on a filter call every few hundred.
    Tuples of strings and numbers are dropped from the collector's lists at
    its first pass over them; what is left is this object, ``reported`` and the
    view (``tests/benchmarks/extender.py`` prints the passes).
    """

    raw: str | None = None
    """The annotation as last seen: Node heartbeats send a MODIFIED event every few
    seconds with the same ledger, which is then neither parsed again nor re-viewed."""
    units_per_gpu: int = 0
    gpus: tuple[ReportedGpu, ...] | None = None
    """The node's GPUs by index; None when its ledger is missing or unusable."""
    problem: str | None = None
    reported: frozenset[str] = frozenset()
    """Pods the node reports holding units (their UIDs)."""
    holdings: tuple[tuple[int, str, int, str, str], ...] = ()
    """(GPU position, pod UID, units, namespace, pod) per pod and GPU, as reported."""
    generation: int = 0
    view: NodeView | None = None
    enforces: frozenset[str] = frozenset()
    """What the node holds every container to (``memory``, ``fixed``); empty when its
    ledger does not say (an earlier agent, a node without a supervised MPS daemon)."""
    refresh_s: float | None = None
    """How often the node's agent promises to rewrite its ledger, unchanged or not
    (annotation ``metagpu.io/gpu-ledger-refresh-s``); None: an agent that makes no such
    promise (an earlier release), whose ledger is trusted however old."""
    observed: float = 0.0
    """The ledger's ``observedAt``, epoch seconds."""
    stale: str | None = None
    """Why the ledger is no longer trusted (its agent stopped rewriting it), or None."""


class Ledger:
    """The extender's whole picture; all methods are synchronous (no I/O, no awaits).

    Being synchronous is what makes bind safe under concurrency: a bind
    decides and reserves (:meth:`assume`) before its first await, so a second
    bind for the same node always sees the first one's units as taken.
    """

    def __init__(self, *, resource: str) -> None:
        self.resource = resource
        self._nodes: dict[str, _Node] = {}
        self._enforcing: set[str] = set()
        """Nodes whose ledger lists something in ``enforces`` (an MPS node)."""
        self._assumed: dict[str, Assumption] = {}
        self._settled: set[str] = set()
        self._generation = 0
        self._shapes: dict[tuple[int, tuple[tuple[int, bool, int | None], ...]], int] = {}
        self._shape_epoch = 0
        self._changed: set[str] = set()
        self._changed_overflow = False
        self._nominated: dict[str, Nomination] = {}
        self._departed: set[str] = set()
        self._reported_on: dict[str, str] = {}
        """Pod UID → the node that reports it (to find a departed pod's node)."""

    # ------------------------------------------------------------ reports
    def set_node(
        self, name: str, annotation: str | None, *, refresh_s: float | None = None
    ) -> None:
        """A node's ledger annotation as last seen (None: the node has none), and how often
        its agent promises to rewrite it (None: no promise; see :meth:`mark_stale`)."""
        node = self._nodes.get(name)
        if (
            node is not None
            and node.raw == annotation
            and node.refresh_s == refresh_s
            and (node.gpus is not None or node.problem)
        ):
            return
        node = self._nodes.setdefault(name, _Node())
        before = node.reported
        node.raw = annotation
        node.refresh_s = refresh_s
        node.stale = None
        node.observed = 0.0
        node.gpus, node.problem, node.reported, node.holdings = None, None, frozenset(), ()
        node.enforces = frozenset()
        if annotation is None:
            node.problem = NO_LEDGER
        else:
            try:
                ledger = NodeLedger.model_validate_json(annotation)
            except ValidationError as exc:
                node.problem = (
                    "metagpu agent's GPU ledger on this node cannot be read "
                    f"({exc.error_count()} problem(s), first: {exc.errors()[0]['msg']})"
                )
            else:
                if ledger.resource != self.resource:
                    node.problem = (
                        f"the node's GPU ledger is for {ledger.resource}, "
                        f"this extender places {self.resource}"
                    )
                else:
                    node.units_per_gpu = ledger.units_per_gpu
                    node.enforces = frozenset(ledger.enforces)
                    node.observed = _epoch(ledger.observed_at)
                    node.gpus = tuple(
                        (g.uuid, g.units, g.used, g.healthy, g.numa)
                        for g in sorted(ledger.gpus, key=lambda g: g.index)
                    )
                    node.reported = frozenset(h.pod_uid for gpu in ledger.gpus for h in gpu.holders)
                    node.holdings = _holdings(ledger)
        if node.enforces and node.gpus is not None:
            self._enforcing.add(name)
        else:
            self._enforcing.discard(name)
        for uid in before - node.reported:
            if self._reported_on.get(uid) == name:
                del self._reported_on[uid]
            self._departed.discard(uid)
        for uid in node.reported:
            self._reported_on[uid] = name
        for uid in list(self._assumed):
            if self._assumed[uid].node == name and uid in node.reported:
                self._settle(uid)
        for uid in node.reported:
            self._settled.add(uid)
        self._touch(name)

    def any_enforcing(self) -> bool:
        """Some node's GPUs are served by a supervised MPS daemon (one dict check per
        filter call on clusters without MPS)."""
        return bool(self._enforcing)

    def enforces(self, name: str) -> frozenset[str] | None:
        """What ``name`` holds containers to, or None when its ledger is missing or
        unusable (then placement says why, as for any pod)."""
        node = self._nodes.get(name)
        if node is None or node.gpus is None:
            return None
        return node.enforces

    def drop_node(self, name: str) -> None:
        """The Node object is gone."""
        gone = self._nodes.pop(name, None)
        self._enforcing.discard(name)
        self._note_change(name)
        for uid in [u for u, a in self._assumed.items() if a.node == name]:
            del self._assumed[uid]
        for uid in [u for u, n in self._nominated.items() if n.node == name]:
            del self._nominated[uid]
        if gone is not None:
            for uid in gone.reported:
                self._departed.discard(uid)
                if self._reported_on.get(uid) == name:
                    del self._reported_on[uid]

    # --------------------------------------------------------- assumptions
    def assume(self, assumption: Assumption) -> None:
        """Reserve ``assumption.taken`` on its node until reported, forgotten or expired."""
        old = self._assumed.get(assumption.pod_uid)
        self._assumed[assumption.pod_uid] = assumption
        self._settled.discard(assumption.pod_uid)
        nominated = self._nominated.pop(assumption.pod_uid, None)
        if nominated is not None and nominated.node != assumption.node:
            self._touch(nominated.node)
        if old is not None and old.node != assumption.node:
            self._touch(old.node)
        self._touch(assumption.node)

    def forget(self, pod_uid: str) -> Assumption | None:
        """Drop a pod's reservation (bind failed, pod deleted or ended)."""
        gone = self._assumed.pop(pod_uid, None)
        if gone is not None:
            self._touch(gone.node)
        return gone

    def pod_gone(self, pod_uid: str) -> None:
        """The pod was deleted: forget it entirely; units its node still reports are
        free from now on (*departed*) until the node's next report drops them."""
        self.forget(pod_uid)
        self._settled.discard(pod_uid)
        node = self._reported_on.get(pod_uid)
        if node is not None and pod_uid not in self._departed:
            self._departed.add(pod_uid)
            self._touch(node)

    # --------------------------------------------------------- nominations
    def nominate(self, nomination: Nomination) -> None:
        """Hold ``nomination.taken`` on its node for the preemptor until it is bound
        (:meth:`assume`), withdrawn, or the nomination expires."""
        old = self._nominated.pop(nomination.pod_uid, None)
        if old is not None:
            self._touch(old.node)
        while len(self._nominated) >= MAX_NOMINATIONS:
            oldest = next(iter(self._nominated))
            self._touch(self._nominated.pop(oldest).node)
        self._nominated[nomination.pod_uid] = nomination
        self._touch(nomination.node)

    def withdraw(self, pod_uid: str) -> Nomination | None:
        gone = self._nominated.pop(pod_uid, None)
        if gone is not None:
            self._touch(gone.node)
        return gone

    def nomination(self, pod_uid: str) -> Nomination | None:
        return self._nominated.get(pod_uid)

    def nominations(self) -> list[Nomination]:
        return list(self._nominated.values())

    def expire_nominations(self, now: float) -> list[Nomination]:
        gone = [n for n in self._nominated.values() if n.expires_at <= now]
        for n in gone:
            self.withdraw(n.pod_uid)
        return gone

    def sees_through(self, *, pod_uid: str, priority: int | None) -> list[Nomination]:
        """Nominations a pod does not see as taken: its own, and those of lower priority
        (kube-scheduler adds only nominated pods of equal or higher priority to a node
        when it filters, ``addGENominatedPods``). Empty almost always: one dict check."""
        if not self._nominated:
            return []
        return [
            n
            for n in self._nominated.values()
            if n.pod_uid == pod_uid or (priority is not None and priority > n.priority)
        ]

    def holdings(self, name: str) -> list[Holding]:
        """Every pod holding units on the node: reported (less the departed) and assumed."""
        node = self._nodes.get(name)
        if node is None or node.gpus is None:
            return []
        position = {gpu[0]: pos for pos, gpu in enumerate(node.gpus)}
        found: dict[str, Holding] = {}
        for pos, uid, units, namespace, pod in node.holdings:
            if uid in self._departed or uid in self._assumed:
                continue
            held = found.get(uid)
            merged = dict(held.units) if held is not None else {}
            merged[pos] = merged.get(pos, 0) + units
            found[uid] = Holding(uid, namespace, pod, merged, assumed=False)
        for a in self._assumed.values():
            if a.node != name:
                continue
            taken = {position[g]: n for g, n in a.taken.items() if g in position and n}
            if taken:
                found[a.pod_uid] = Holding(a.pod_uid, a.namespace, a.pod, taken, assumed=True)
        return list(found.values())

    def observe_pod(
        self,
        *,
        pod_uid: str,
        namespace: str,
        pod: str,
        node_name: str | None,
        phase: str | None,
        annotation: str | None,
        now: float,
        ttl_s: float,
    ) -> None:
        """A pod as the watch saw it: (re)build its assumption from its annotation.

        Assumed only when it is bound to the node its assignment names (an
        annotation left by a bind that failed half-way is ignored), still
        running or pending, never reported by that node, and younger than
        ``ttl_s``.
        """
        if phase in ("Succeeded", "Failed"):
            self.pod_gone(pod_uid)
            return
        if annotation is None or pod_uid in self._settled or pod_uid in self._assumed:
            return
        try:
            assignment = PodAssignment.model_validate_json(annotation)
        except ValidationError:
            return
        if not node_name or assignment.node != node_name:
            return
        node = self._nodes.get(node_name)
        if node is not None and pod_uid in node.reported:
            self._settled.add(pod_uid)
            return
        expires_at = _epoch(assignment.assigned_at) + ttl_s
        if expires_at <= now:
            return
        taken: dict[str, int] = dict(assignment.taken)
        if not taken:
            taken = _taken_from_containers(assignment)
        self.assume(Assumption(pod_uid, namespace, pod, node_name, taken, expires_at))

    def expire(self, now: float) -> list[Assumption]:
        """Drop assumptions past their deadline; returns them (for a log line each)."""
        gone = [a for a in self._assumed.values() if a.expires_at <= now]
        for a in gone:
            self.forget(a.pod_uid)
        return gone

    def assumed(self) -> Iterator[Assumption]:
        return iter(list(self._assumed.values()))

    def assumption(self, pod_uid: str) -> Assumption | None:
        return self._assumed.get(pod_uid)

    # ------------------------------------------------------------- views
    @property
    def node_count(self) -> int:
        return len(self._nodes)

    def node_names(self) -> list[str]:
        return list(self._nodes)

    def has_node(self, name: str) -> bool:
        """The Node object exists (with or without a usable ledger)."""
        return name in self._nodes

    def take_changed(self) -> set[str] | None:
        """Nodes whose view (or existence) changed since the last call; None: assume all did.

        For the one derived index kept beside the ledger
        (:class:`plugin.extender.matrix.NodeMatrix`). Bounded: past twice the
        node count (plus a margin) the names are dropped and the answer is "all".
        """
        changed, overflow = self._changed, self._changed_overflow
        self._changed, self._changed_overflow = set(), False
        return None if overflow else changed

    def mark_stale(self, now: float) -> list[str]:
        """Stop trusting the ledgers whose agents broke their promise to rewrite them
        (``refresh_s``) for :data:`STALE_AFTER_REFRESHES` periods: the agent is down or
        cannot reach the API server, and its last word about the node's GPUs and their
        holders may be false by now (a GPU lost, pods gone). Returns the nodes newly
        marked. A rewritten ledger (:meth:`set_node`) is trusted again."""
        marked: list[str] = []
        for name, node in self._nodes.items():
            if node.refresh_s is None or node.gpus is None or node.stale is not None:
                continue
            age = now - node.observed
            if age > STALE_AFTER_REFRESHES * node.refresh_s:
                node.stale = (
                    f"metagpu agent has not refreshed this node's GPU ledger for {age:.0f}s "
                    f"(it promised every {node.refresh_s:g}s): the agent is down or cannot "
                    "reach the API server, so its GPUs are not trusted until it reports again"
                )
                self._touch(name)
                marked.append(name)
        return marked

    def view(self, name: str) -> NodeView | str:
        """The node's GPUs for placement, or why there is nothing to place on."""
        node = self._nodes.get(name)
        if node is None:
            return NO_LEDGER
        if node.view is not None:  # the common case, first
            return node.view
        if node.stale is not None:
            return node.stale
        if node.gpus is None:
            return node.problem or NO_LEDGER
        node.view = self._build_view(name, node, ())
        return node.view

    def view_for(self, name: str, *, pod_uid: str, priority: int | None) -> NodeView | str:
        """:meth:`view` as one pod sees it: without the nominations it sees through
        (:meth:`sees_through`). The shared view when there are none on this node."""
        if not self._nominated:
            return self.view(name)
        skip = tuple(
            n for n in self.sees_through(pod_uid=pod_uid, priority=priority) if n.node == name
        )
        node = self._nodes.get(name)
        if not skip or node is None or node.gpus is None or node.stale is not None:
            return self.view(name)
        return self._build_view(name, node, skip)

    def view_released(self, view: NodeView, released: Mapping[int, int]) -> NodeView:
        """``view`` with ``released`` units (GPU position → units) handed back: what the
        node looks like once those holders are gone (capped at the GPU's units)."""
        gpus = tuple(
            GpuState(
                g.id, min(view.units_per_gpu, g.free + released.get(pos, 0)), g.healthy, g.numa
            )
            if released.get(pos)
            else g
            for pos, g in enumerate(view.gpus)
        )
        return NodeView(
            view.node, view.units_per_gpu, gpus, -1, self._shape(view.units_per_gpu, gpus)
        )

    def _build_view(self, name: str, node: _Node, skip: tuple[Nomination, ...]) -> NodeView:
        assert node.gpus is not None
        extra: dict[str, int] = {}
        for a in self._assumed.values():
            if a.node != name:
                continue
            for gpu, units in a.taken.items():
                extra[gpu] = extra.get(gpu, 0) + units
        for n in self._nominated.values():
            if n.node != name or n in skip:
                continue
            for gpu, units in n.taken.items():
                extra[gpu] = extra.get(gpu, 0) + units
        if self._departed:
            for pos, uid, units, _ns, _pod in node.holdings:
                if uid in self._departed:
                    gpu_id = node.gpus[pos][0]
                    extra[gpu_id] = extra.get(gpu_id, 0) - units
        gpus = tuple(
            GpuState(
                id=uuid,
                free=max(0, min(units, units - used - extra.get(uuid, 0))),
                healthy=healthy,
                numa=numa,
            )
            for uuid, units, used, healthy, numa in node.gpus
        )
        generation = node.generation if not skip else -1
        return NodeView(
            name, node.units_per_gpu, gpus, generation, self._shape(node.units_per_gpu, gpus)
        )

    def _shape(self, units_per_gpu: int, gpus: tuple[GpuState, ...]) -> int:
        key = (units_per_gpu, tuple((g.free, g.healthy, g.numa) for g in gpus))
        if len(self._shapes) >= MAX_SHAPES:
            # Start over under a new epoch, so no id handed out before means a new shape.
            self._shapes.clear()
            self._shape_epoch += 1
        return self._shapes.setdefault(key, (self._shape_epoch << 20) | len(self._shapes))

    # ---------------------------------------------------------- internals
    def _settle(self, uid: str) -> None:
        self.forget(uid)
        self._settled.add(uid)

    def _touch(self, name: str) -> None:
        node = self._nodes.get(name)
        if node is not None:
            self._generation += 1
            node.generation = self._generation
            node.view = None
            self._note_change(name)

    def _note_change(self, name: str) -> None:
        if self._changed_overflow:
            return
        self._changed.add(name)
        if len(self._changed) > 2 * len(self._nodes) + 1024:
            self._changed.clear()
            self._changed_overflow = True


def _holdings(ledger: NodeLedger) -> tuple[tuple[int, str, int, str, str], ...]:
    """Each pod's units per GPU position (its containers' summed), in GPU order."""
    units: dict[tuple[int, str], int] = {}
    names: dict[str, tuple[str, str]] = {}
    for pos, gpu in enumerate(sorted(ledger.gpus, key=lambda g: g.index)):
        for h in gpu.holders:
            units[(pos, h.pod_uid)] = units.get((pos, h.pod_uid), 0) + h.units
            names[h.pod_uid] = (h.namespace, h.pod)
    return tuple((pos, uid, n, *names[uid]) for (pos, uid), n in units.items())


def _taken_from_containers(assignment: PodAssignment) -> dict[str, int]:
    """The pod's units per GPU from its containers, for an annotation without ``taken``.

    App containers and sidecars hold theirs for the pod's life; an init
    container's units are reused by later containers, so it adds only what
    exceeds them on its GPU.
    """
    taken: dict[str, int] = {}
    for c in assignment.containers:
        if c.kind != "init":
            for gpu, units in c.gpus.items():
                taken[gpu] = taken.get(gpu, 0) + units
    for c in assignment.containers:
        if c.kind == "init":
            for gpu, units in c.gpus.items():
                taken[gpu] = max(taken.get(gpu, 0), units)
    return taken


def _epoch(timestamp: str) -> float:
    """RFC 3339 to epoch seconds; an empty or unreadable time counts as long ago."""
    if not timestamp:
        return 0.0
    try:
        parsed = dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def rfc3339(epoch_s: float) -> str:
    """Epoch seconds as the RFC 3339 UTC time the annotation carries."""
    return dt.datetime.fromtimestamp(epoch_s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
