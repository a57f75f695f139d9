"""The extender's verbs on decoded requests: filter, prioritize and the bind decision (pure).

No transport here: the HTTP shell (:mod:`plugin.extender.server`) decodes the
body, calls these, and encodes the answer; the binder
(:mod:`plugin.extender.binder`) adds the two API writes around
:meth:`ExtenderCore.decide_bind`. Tests and ``metagpu dev`` call it directly.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from plugin.api.config import AllocationPolicy
from plugin.api.resources import ANNOTATION_COMPUTE_POLICY
from plugin.extender import mps_users
from plugin.extender.budgets import BudgetBook
from plugin.extender.bulk import BulkDecisions
from plugin.extender.config import PreemptionConfig
from plugin.extender.decision import (
    BindDecision,
    FilterOutcome,
    PlacementMemo,
    PodAsk,
    bind_decision,
    cap_refusal,
    capable_nodes,
    decide,
    filter_nodes,
    prioritize,
    score,
)
from plugin.extender.ledger import Ledger, NodeView, Nomination, rfc3339
from plugin.extender.matrix import NodeMatrix
from plugin.extender.mps_users import pod_user
from plugin.extender.podfacts import PodDirectory, PodFacts, pod_facts
from plugin.extender.pods import PodSpecError, container_requests, placement_policy
from plugin.extender.preemption import NodePlan, candidates_wanted, search_nodes, select_victims
from plugin.extender.preemption_book import PreemptionBook, Proposal, nomination
from plugin.extender.protocol import (
    ExtenderArgs,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
    MetaVictimsResult,
    filter_result,
)
from plugin.placement.refusals import REASON_NAMES

logger = logging.getLogger(__name__)

ASK_CACHE_SIZE = 4096
"""Pods whose request the extender remembers between filter and bind (by UID)."""

BIND_SHAPES_PER_ASK = 256
"""Node shapes whose placement the memo keeps per ask when filter uses the arrays."""


class ExtenderCore:
    """The ledger, the placement memo and the namespace policies, with the three verbs."""

    def __init__(
        self,
        *,
        resource: str,
        default_policy: AllocationPolicy = "binpack",
        assume_timeout_s: float = 300.0,
        ledger: Ledger | None = None,
        bulk: bool = True,
        preemption: PreemptionConfig | None = None,
    ) -> None:
        self.resource = resource
        self.default_policy: AllocationPolicy = default_policy
        self.assume_timeout_s = assume_timeout_s
        self.ledger = ledger if ledger is not None else Ledger(resource=resource)
        self.bulk: BulkDecisions | None = BulkDecisions(NodeMatrix(self.ledger)) if bulk else None
        """Filter and prioritize on every node at once; None places node by node (tests
        compare the two)."""
        self.memo = self._new_memo()
        self.namespace_annotations: dict[str, Mapping[str, str]] = {}
        """Namespace name → its annotations (only namespaces that have any)."""
        self._asks: OrderedDict[str, PodAsk] = OrderedDict()
        self._distinct_asks: dict[PodAsk, PodAsk] = {}
        self._priorities: OrderedDict[str, int] = OrderedDict()
        """Pod UID → priority, from the pods filter and prioritize were sent (for bind)."""
        self.preemption = preemption if preemption is not None else PreemptionConfig()
        self.directory = PodDirectory()
        """Priority, labels and state of the GPU pods bound to nodes (from the pod watch)."""
        self.budgets = BudgetBook()
        self.budgets_ready = True
        """False until the cache has listed the budgets: no preemption before, so a pod a
        budget protects is never chosen because its budget was not known yet."""
        self.book = PreemptionBook()

    def forget_answers(self) -> None:
        """Drop every kept placement (benchmarks start each figure from none)."""
        self.memo = self._new_memo()
        if self.bulk is not None:
            self.bulk = BulkDecisions(self.bulk.matrix)

    def _new_memo(self) -> PlacementMemo:
        """Node by node, the memo is what makes filter affordable; with the arrays it
        serves bind (one node) and clusters the arrays are not built for, and is kept
        small: every answer it keeps is a few objects the collector walks."""
        if self.bulk is None:
            return PlacementMemo()
        return PlacementMemo(shapes_per_ask=BIND_SHAPES_PER_ASK)

    def warm(self) -> None:
        """Build the vectorised path's rows now, after the first list of nodes, so the
        first pod scheduled does not pay for writing every node's row."""
        if self.bulk is not None:
            self.bulk.matrix.sync()

    # --------------------------------------------------------------- asks
    def ask_of(self, pod: Mapping[str, Any]) -> PodAsk:
        """The pod's containers and policy; :class:`PodSpecError` when unreadable."""
        meta = pod.get("metadata") or {}
        namespace = meta.get("namespace") or ""
        policy, warning = placement_policy(
            pod,
            namespace_annotations=self.namespace_annotations.get(namespace),
            default=self.default_policy,
        )
        if warning:
            logger.warning(warning, extra={"namespace": namespace, "pod": meta.get("name")})
        annotations = meta.get("annotations") or {}
        fixed = (
            isinstance(annotations, Mapping)
            and annotations.get(ANNOTATION_COMPUTE_POLICY) == "fixed"
        )
        requests = container_requests(pod, resource=self.resource)
        user = pod_user(pod, asking={c.name for c in requests if c.units})
        ask = PodAsk(requests, policy, fixed, user)
        # One object per distinct ask: the pods of a workload ask alike, and the asks
        # remembered for bind are then a few objects for the collector, not thousands.
        ask = self._distinct_asks.setdefault(ask, ask)
        if len(self._distinct_asks) > ASK_CACHE_SIZE:
            self._distinct_asks.clear()
        uid = meta.get("uid")
        if isinstance(uid, str) and uid:
            self._asks[uid] = ask
            self._asks.move_to_end(uid)
            if len(self._asks) > ASK_CACHE_SIZE:
                self._asks.popitem(last=False)
            priority = (pod.get("spec") or {}).get("priority")
            self._priorities[uid] = priority if isinstance(priority, int) else 0
            self._priorities.move_to_end(uid)
            if len(self._priorities) > ASK_CACHE_SIZE:
                self._priorities.popitem(last=False)
        return ask

    def remembered_ask(self, pod_uid: str) -> PodAsk | None:
        """The ask last read from this pod in a filter or prioritize call, if any."""
        return self._asks.get(pod_uid)

    # -------------------------------------------------------------- verbs
    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        return self.filter_with_reason(args)[0]

    def filter_with_reason(self, args: ExtenderArgs) -> tuple[ExtenderFilterResult, str | None]:
        """filter's answer and, when it passes no node, why in one word (the rule that
        refused the most nodes, or ``no_usable_ledger`` / ``cannot_cap_fixed`` /
        ``unreadable_pod``): the label of ``metagpu_extender_unschedulable_total``."""
        result, outcome, uncapped = self._filter(args)
        if result["NodeNames"]:
            return result, None
        if outcome is None:
            return result, "unreadable_pod"
        counts = {REASON_NAMES.get(kind, "other"): n for kind, n in outcome.refused_by.items()}
        if outcome.unresolvable:
            counts["no_usable_ledger"] = len(outcome.unresolvable)
        if uncapped:
            counts["cannot_cap_fixed"] = len(uncapped)
        if not counts:
            return result, "no_nodes"
        return result, max(sorted(counts), key=lambda reason: counts[reason])

    def _filter(
        self, args: ExtenderArgs
    ) -> tuple[ExtenderFilterResult, FilterOutcome | None, Mapping[str, str]]:
        names = args.node_names()
        try:
            ask = self.ask_of(args.Pod)
        except PodSpecError as exc:
            error = f"cannot read the pod's request: {exc}"
            return filter_result(args, (), {}, error=error), None, {}
        # A node that cannot cap a fixed pod is refused before placement, for both
        # paths alike; preemption cannot help there, so it is unresolvable.
        names, uncapped = capable_nodes(ask, names, self.ledger)
        outcome = self.bulk.filter(ask, names) if self.bulk is not None else None
        if outcome is None:
            outcome = filter_nodes(ask, names, self.ledger, self.memo)
        outcome = self._through_nominations(ask, args.Pod, outcome)
        outcome = self._own_users_gpus(ask, args.Pod, outcome)
        result = filter_result(
            args,
            outcome.passed,
            outcome.failed,
            unresolvable={**outcome.unresolvable, **uncapped},
        )
        return result, outcome, uncapped

    def prioritize(self, args: ExtenderArgs) -> list[HostPriority]:
        names = args.node_names()
        try:
            ask = self.ask_of(args.Pod)
        except PodSpecError:
            return [{"Host": name, "Score": 0} for name in names]
        scores = self.bulk.prioritize(ask, names) if self.bulk is not None else None
        if scores is None:
            scores = prioritize(ask, names, self.ledger, self.memo)
        seen = self._nominated_views(args.Pod)
        if seen:
            scores = [
                (name, _score(ask, seen[name], self.memo) if name in seen else found)
                for name, found in scores
            ]
        if self.ledger.any_enforcing():
            facts = pod_facts(args.Pod)
            scores = [
                (name, self._score_own_users(ask, facts, name, found)) for name, found in scores
            ]
        return [{"Host": name, "Score": found} for name, found in scores]

    # ------------------------------------------------- MPS: one user per GPU
    def _user_of(self, pod_uid: str) -> int | None:
        facts = self.directory.get(pod_uid)
        return facts.user if facts is not None else None

    def _own_users_view(
        self, ask: PodAsk, facts: PodFacts, name: str
    ) -> tuple[NodeView, set[int]] | str | None:
        """The node as this pod may use it on an MPS node (:mod:`plugin.extender.mps_users`),
        or why it may not at all; None where nothing changes (no MPS, nothing taken)."""
        enforces = self.ledger.enforces(name)
        if not enforces:
            return None
        view = self.ledger.view_for(name, pod_uid=facts.uid, priority=facts.priority)
        if isinstance(view, str):
            return None
        own = mps_users.for_pod(
            ask.user,
            view,
            enforces=enforces,
            holdings=self.ledger.holdings(name),
            user_of=self._user_of,
        )
        if not isinstance(own, str) and not own[1]:
            return None
        return own

    def _own_users_gpus(
        self, ask: PodAsk, pod: Mapping[str, Any], outcome: FilterOutcome
    ) -> FilterOutcome:
        """On MPS nodes, the nodes that passed decided again with only the GPUs whose
        MPS clients run as the pod's user (or nobody's); a pod that could only wait for
        another user's clients is refused with why."""
        if not self.ledger.any_enforcing():
            return outcome
        facts = pod_facts(pod)
        passed: list[str] = []
        failed = dict(outcome.failed)
        unresolvable = dict(outcome.unresolvable)
        refused_by = dict(outcome.refused_by)
        for name in outcome.passed:
            own = self._own_users_view(ask, facts, name)
            if own is None:
                passed.append(name)
            elif isinstance(own, str):
                unresolvable[name] = own
            else:
                view, blocked = own
                placed = self.memo.place(ask, view)
                if placed.refusal is None or placed.refusal_key is None:
                    passed.append(name)
                else:
                    failed[name] = mps_users.foreign_refusal(placed.refusal, blocked, ask.user)
                    kind = placed.refusal_key[0]
                    refused_by[kind] = refused_by.get(kind, 0) + 1
        return FilterOutcome(tuple(passed), failed, unresolvable, refused_by)

    def _score_own_users(self, ask: PodAsk, facts: PodFacts, name: str, found: int) -> int:
        own = self._own_users_view(ask, facts, name)
        if own is None:
            return found
        if isinstance(own, str):
            return 0
        return _score(ask, own[0], self.memo)

    # -------------------------------------------------------- nominations
    def _nominated_views(self, pod: Mapping[str, Any]) -> dict[str, NodeView | str]:
        """Nodes holding units nominated for a preemptor that this pod sees through (its
        own, or of lower priority), with the node as this pod sees it. Empty unless a
        preemption is under way: the shared answers stand for every other pod."""
        if not self.ledger.nominations():
            return {}
        facts = pod_facts(pod)
        through = self.ledger.sees_through(pod_uid=facts.uid, priority=facts.priority)
        return {
            n.node: self.ledger.view_for(n.node, pod_uid=facts.uid, priority=facts.priority)
            for n in through
        }

    def _through_nominations(
        self, ask: PodAsk, pod: Mapping[str, Any], outcome: FilterOutcome
    ) -> FilterOutcome:
        seen = self._nominated_views(pod)
        if not seen:
            return outcome
        passed = [n for n in outcome.passed if n not in seen]
        failed = {n: why for n, why in outcome.failed.items() if n not in seen}
        asked = set(outcome.passed) | set(outcome.failed)
        for name, view in seen.items():
            if name not in asked:
                continue
            placed = decide(ask, view, self.memo)
            if isinstance(placed, str):
                failed[name] = placed
            elif placed.refusal is None:
                passed.append(name)
            else:
                failed[name] = placed.refusal
        return FilterOutcome(tuple(passed), failed, outcome.unresolvable, outcome.refused_by)

    def decide_bind(
        self, ask: PodAsk, *, node: str, pod_uid: str, namespace: str, pod: str, now: float
    ) -> BindDecision | str:
        """Decide and **reserve** (synchronously): the caller writes the pod next."""
        decision = bind_decision(
            ask,
            node=node,
            pod_uid=pod_uid,
            priority=self._priorities.get(pod_uid),
            namespace=namespace,
            pod=pod,
            ledger=self.ledger,
            memo=self.memo,
            now=now,
            ttl_s=self.assume_timeout_s,
            assigned_at=rfc3339(now),
            user_of=self._user_of,
        )
        if not isinstance(decision, str):
            self.ledger.assume(decision.assumption)
        return decision

    # ---------------------------------------------------------- preemption
    def preempt(self, args: ExtenderPreemptionArgs, *, now: float) -> ExtenderPreemptionResult:
        """``preemptVerb``: per node kube-scheduler offers, the victims that let the pod's
        every fraction fit on one GPU, or the node dropped (never an empty list).

        The victims are the extender's own choice among the node's pods (kube-scheduler
        accepts any pod of that node, ``convertPodUIDToPod``): it replaces the GPU pods
        the scheduler picked by totals, and keeps the pods it picked that hold no GPU
        units (chosen for CPU, memory or ports, which the extender does not see).
        """
        preemptor = pod_facts(args.Pod)
        answer: dict[str, MetaVictimsResult] = {}
        if (
            not self.preemption.enabled
            or not self.budgets_ready
            or not preemptor.may_preempt
            or not preemptor.uid
        ):
            return {"NodeNameToMetaVictims": answer}
        try:
            ask = self.ask_of(args.Pod)
        except PodSpecError:
            return {"NodeNameToMetaVictims": answer}
        spared = self.book.spared(now)
        for node, (offered, offered_violations) in args.offered().items():
            if cap_refusal(ask, self.ledger.enforces(node)) is not None:
                continue  # no victim makes a node cap SMs
            plan = select_victims(
                ask,
                preemptor,
                node,
                ledger=self.ledger,
                directory=self.directory,
                budgets=self.budgets.in_namespaces,
                memo=self.memo,
                spared=spared,
                user_of=self._user_of,
            )
            if isinstance(plan, str):
                continue
            gpu_pods = {h.pod_uid for h in self.ledger.holdings(node)}
            others = [uid for uid in offered if uid not in gpu_pods]
            if not plan.victims:
                if offered:  # the GPUs have room; the scheduler's own reasons stand
                    answer[node] = _meta(offered, offered_violations)
                continue
            answer[node] = _meta(
                [v.uid for v in plan.victims] + others,
                plan.pdb_violations + (offered_violations if others else 0),
            )
            self.book.expect(preemptor, plan)
        if answer:
            taken = self.book.take_over(preemptor.uid)
            if taken is not None:
                self.ledger.withdraw(preemptor.uid)
        return {"NodeNameToMetaVictims": answer}

    def consider_preemption(
        self, args: ExtenderArgs, result: ExtenderFilterResult, *, now: float
    ) -> Proposal | None:
        """After a filter that passed no node: the extender's own preemption for the pod, if
        it may preempt and some node's GPUs would fit it without lower-priority pods.

        Nominated at once (the freed units are held from now on); the caller hands the
        proposal to the evictor, which waits ``handover_s`` first. The chosen node's
        refusal in ``result`` says what is being done.
        """
        if (
            not self.preemption.enabled
            or not self.budgets_ready
            or result["NodeNames"]
            or result["Error"]
        ):
            return None
        preemptor = pod_facts(args.Pod)
        if (
            not preemptor.may_preempt
            or not preemptor.uid
            or self.ledger.nomination(preemptor.uid) is not None
            or self.book.proposal(preemptor.uid) is not None
        ):
            return None
        failed = list(result["FailedNodes"])
        if not failed:
            return None
        try:
            ask = self.ask_of(args.Pod)
        except PodSpecError:
            return None
        found = search_nodes(
            ask,
            preemptor,
            failed,
            ledger=self.ledger,
            directory=self.directory,
            budgets=self.budgets.in_namespaces,
            memo=self.memo,
            spared=self.book.spared(now),
            wanted=candidates_wanted(len(failed)),
            user_of=self._user_of,
        )
        plan = found.plan
        if plan is None:
            if found.budget_blocked:
                logger.info(
                    "no preemption: every plan would violate a PodDisruptionBudget",
                    extra={
                        "namespace": preemptor.namespace,
                        "pod": preemptor.name,
                        "nodes": found.budget_blocked,
                    },
                )
            return None
        self.ledger.nominate(
            nomination(preemptor, plan, now=now, ttl_s=self.preemption.nomination_timeout_s)
        )
        proposal = Proposal(preemptor, plan, now + self.preemption.handover_s)
        self.book.propose(proposal)
        result["FailedNodes"][plan.node] = (
            f"{result['FailedNodes'][plan.node]}; {preempting_words(plan)}"
        )
        return proposal

    def victim_leaving(self, victim_uid: str, *, now: float) -> Nomination | None:
        """A pod started terminating or went away: nominate its preemptor if it was a
        victim named through ``preemptVerb``."""
        found = self.book.victim_leaving(
            victim_uid, now=now, ttl_s=self.preemption.nomination_timeout_s
        )
        if found is not None and self.ledger.nomination(found.pod_uid) is None:
            self.ledger.nominate(found)
            return found
        return None


def preempting_words(plan: NodePlan) -> str:
    """What the FailedScheduling event says about the extender's own preemption."""
    names = ", ".join(f"{v.namespace}/{v.name}" for v in plan.victims[:5])
    more = f" and {len(plan.victims) - 5} more" if len(plan.victims) > 5 else ""
    return (
        f"metagpu is preempting {len(plan.victims)} lower-priority pod(s) ({names}{more}) "
        f"to free GPU {', '.join(plan.gpus)} for this pod"
    )


def _meta(uids: list[str], violations: int) -> MetaVictimsResult:
    return {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": violations}


def _score(ask: PodAsk, view: NodeView | str, memo: PlacementMemo) -> int:
    if isinstance(view, str):
        return 0
    placed = memo.place(ask, view)
    return score(placed, view, ask.policy)
