"""Preemptions under way: who evicts whom, and for whom the freed units are held (pure).

Two paths lead to victims (``docs/scheduler.md``, "Preemption"):

* **the scheduler's** (``preemptVerb``): the extender names the victims, kube-scheduler
  picks one node and deletes them. The extender does not learn which node it picked,
  so it keeps an :class:`Expectation` per victim it named; when one of them starts
  terminating or is deleted, the preemptor is nominated on that victim's node
  (:meth:`PreemptionBook.victim_leaving`);
* **the extender's own** (no node passes the filter, and kube-scheduler's dry run
  cannot see why): a :class:`Proposal` is made in the filter and nominated at once;
  after ``handover_s`` (kube-scheduler's PostFilter, in the same scheduling cycle,
  calls ``preemptVerb`` first if its own dry run found victims anywhere) the
  evictor evicts the victims, unless the verb took over (:meth:`take_over`).

Everything is bounded: :data:`MAX_ENTRIES` expectations, proposals and spared pods.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from plugin.extender.ledger import Nomination
from plugin.extender.podfacts import PodFacts
from plugin.extender.preemption import NodePlan

MAX_ENTRIES = 4096


@dataclass(frozen=True, slots=True)
class Proposal:
    """The extender's own preemption for one pod: evict ``plan.victims`` after the hand-over."""

    preemptor: PodFacts
    plan: NodePlan
    evict_at: float
    """Wall-clock time after which the evictor may evict (the hand-over to the scheduler)."""


@dataclass(frozen=True, slots=True)
class Expectation:
    """A victim named to kube-scheduler through the verb, and what to nominate if it goes."""

    preemptor: PodFacts
    plan: NodePlan


class PreemptionBook:
    def __init__(self) -> None:
        self._proposals: dict[str, Proposal] = {}
        self._expected: OrderedDict[str, Expectation] = OrderedDict()
        self._spared: OrderedDict[str, float] = OrderedDict()

    # ------------------------------------------------------------ proposals
    def propose(self, proposal: Proposal) -> None:
        self._proposals[proposal.preemptor.uid] = proposal
        while len(self._proposals) > MAX_ENTRIES:
            del self._proposals[next(iter(self._proposals))]

    def proposal(self, preemptor_uid: str) -> Proposal | None:
        return self._proposals.get(preemptor_uid)

    def finish(self, proposal: Proposal) -> None:
        """The evictor is done with it (evicted, or gave up)."""
        if self._proposals.get(proposal.preemptor.uid) is proposal:
            del self._proposals[proposal.preemptor.uid]

    def take_over(self, preemptor_uid: str) -> Proposal | None:
        """kube-scheduler preempts for this pod itself: drop the extender's own plan."""
        return self._proposals.pop(preemptor_uid, None)

    # --------------------------------------------------------- expectations
    def expect(self, preemptor: PodFacts, plan: NodePlan) -> None:
        for victim in plan.victims:
            self._expected[victim.uid] = Expectation(preemptor, plan)
            self._expected.move_to_end(victim.uid)
        while len(self._expected) > MAX_ENTRIES:
            self._expected.popitem(last=False)

    def victim_leaving(self, victim_uid: str, *, now: float, ttl_s: float) -> Nomination | None:
        """A pod started terminating or was deleted: the nomination to make, if it was a
        victim named through the verb (once per preemptor and node)."""
        found = self._expected.pop(victim_uid, None)
        if found is None:
            return None
        plan, pod = found.plan, found.preemptor
        for other in plan.victims:  # the node is known now: the others need no lookup
            self._expected.pop(other.uid, None)
        return nomination(pod, plan, now=now, ttl_s=ttl_s)

    # ---------------------------------------------------------------- spared
    def spare(self, victim_uid: str, *, until: float) -> None:
        """The API refused to evict this pod (its budget): choose others for a while."""
        self._spared[victim_uid] = until
        self._spared.move_to_end(victim_uid)
        while len(self._spared) > MAX_ENTRIES:
            self._spared.popitem(last=False)

    def spared(self, now: float) -> frozenset[str]:
        for uid in [u for u, until in self._spared.items() if until <= now]:
            del self._spared[uid]
        return frozenset(self._spared)


def nomination(pod: PodFacts, plan: NodePlan, *, now: float, ttl_s: float) -> Nomination:
    return Nomination(
        pod_uid=pod.uid,
        namespace=pod.namespace,
        pod=pod.name,
        node=plan.node,
        priority=pod.priority,
        taken=dict(plan.taken),
        victims=frozenset(v.uid for v in plan.victims),
        expires_at=now + ttl_s,
    )
