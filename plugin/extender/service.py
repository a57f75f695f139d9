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
from plugin.extender.bulk import BulkDecisions
from plugin.extender.decision import (
    BindDecision,
    PlacementMemo,
    PodAsk,
    bind_decision,
    filter_nodes,
    prioritize,
)
from plugin.extender.ledger import Ledger, rfc3339
from plugin.extender.matrix import NodeMatrix
from plugin.extender.pods import PodSpecError, container_requests, placement_policy
from plugin.extender.protocol import (
    ExtenderArgs,
    ExtenderFilterResult,
    HostPriority,
    filter_result,
)

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
        ask = PodAsk(container_requests(pod, resource=self.resource), policy)
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
        return ask

    def remembered_ask(self, pod_uid: str) -> PodAsk | None:
        """The ask last read from this pod in a filter or prioritize call, if any."""
        return self._asks.get(pod_uid)

    # -------------------------------------------------------------- verbs
    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        names = args.node_names()
        try:
            ask = self.ask_of(args.Pod)
        except PodSpecError as exc:
            return filter_result(args, (), {}, error=f"cannot read the pod's request: {exc}")
        outcome = self.bulk.filter(ask, names) if self.bulk is not None else None
        if outcome is None:
            outcome = filter_nodes(ask, names, self.ledger, self.memo)
        return filter_result(
            args, outcome.passed, outcome.failed, unresolvable=outcome.unresolvable
        )

    def prioritize(self, args: ExtenderArgs) -> list[HostPriority]:
        names = args.node_names()
        try:
            ask = self.ask_of(args.Pod)
        except PodSpecError:
            return [{"Host": name, "Score": 0} for name in names]
        scores = self.bulk.prioritize(ask, names) if self.bulk is not None else None
        if scores is None:
            scores = prioritize(ask, names, self.ledger, self.memo)
        return [{"Host": name, "Score": score} for name, score in scores]

    def decide_bind(
        self, ask: PodAsk, *, node: str, pod_uid: str, namespace: str, pod: str, now: float
    ) -> BindDecision | str:
        """Decide and **reserve** (synchronously): the caller writes the pod next."""
        decision = bind_decision(
            ask,
            node=node,
            pod_uid=pod_uid,
            namespace=namespace,
            pod=pod,
            ledger=self.ledger,
            memo=self.memo,
            now=now,
            ttl_s=self.assume_timeout_s,
            assigned_at=rfc3339(now),
        )
        if not isinstance(decision, str):
            self.ledger.assume(decision.assumption)
        return decision
