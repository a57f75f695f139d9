"""Prometheus metrics of the scheduler extender, in a registry of its own.

What an operator watches:

* ``metagpu_extender_requests_total{verb, outcome="error"}``: malformed
  requests or a cache that is not synced (the scheduler retries the pod);
* ``metagpu_extender_request_duration_seconds`` against the scheduler's
  extender ``httpTimeout``;
* ``metagpu_extender_binds_total{outcome="failed"}``: binds the API refused;
* ``metagpu_extender_assumed_pods``: reservations the nodes have not reported
  yet (should return to 0 within seconds of each bind);
* ``metagpu_extender_assumptions_expired_total``: nodes that never reported
  a bound pod (agent down or stale ledger);
* ``metagpu_extender_preemptions_total{path, outcome}``: preemptions for fractions,
  by who evicts (``scheduler``: kube-scheduler deleted the victims the extender
  named; ``extender``: the extender evicted them itself) and how it ended;
* ``metagpu_extender_evictions_total{outcome}``: the extender's Eviction API calls
  (``refused``: a PodDisruptionBudget said no, 429);
* ``metagpu_extender_nominations``: units held for preemptors right now.
"""

from __future__ import annotations

from typing import Final, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from plugin.placement.refusals import REASON_NAMES

Verb = Literal["filter", "prioritize", "bind", "preempt"]
VERBS: Final[tuple[Verb, ...]] = ("filter", "prioritize", "bind", "preempt")

PreemptionPath = Literal["scheduler", "extender"]
PreemptionOutcome = Literal["nominated", "evicted", "handed_over", "refused", "failed"]
PREEMPTION_OUTCOMES: Final[dict[PreemptionPath, tuple[PreemptionOutcome, ...]]] = {
    "scheduler": ("nominated",),
    "extender": ("nominated", "evicted", "handed_over", "refused", "failed"),
}
EvictionOutcome = Literal["evicted", "gone", "refused", "failed"]
EVICTION_OUTCOMES: Final[tuple[EvictionOutcome, ...]] = ("evicted", "gone", "refused", "failed")
METRICS_CONTENT_TYPE: Final = CONTENT_TYPE_LATEST

LATENCY_BUCKETS_S: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


UNSCHEDULABLE_REASONS: Final = (
    *REASON_NAMES.values(),
    "no_usable_ledger",
    "cannot_cap_fixed",
    "unreadable_pod",
    "no_nodes",
    "other",
)
"""Every value of ``metagpu_extender_unschedulable_total``'s ``reason`` (exposed at 0 from
the start, so a rate over them exists before the first pod waits)."""


class ExtenderMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "metagpu_extender_requests",
            "Extender requests by verb and outcome (ok, error).",
            ("verb", "outcome"),
            registry=self.registry,
        )
        self.duration = Histogram(
            "metagpu_extender_request_duration_seconds",
            "Time to answer one extender request.",
            ("verb",),
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.nodes_failed = Counter(
            "metagpu_extender_filtered_out_nodes",
            "Nodes the filter refused (the pod's GPUs would not fit the plugin's way).",
            registry=self.registry,
        )
        self.unschedulable = Counter(
            "metagpu_extender_unschedulable",
            "Filter calls that passed no node, by why: the rule that refused the most nodes "
            "(too_few_units, too_few_whole_gpus, no_single_gpu, reuse_spread, "
            "reused_gpu_full), no_usable_ledger, cannot_cap_fixed, unreadable_pod, no_nodes. "
            "kube-scheduler retries a pending pod, so this counts attempts, not pods.",
            ("reason",),
            registry=self.registry,
        )
        self.binds = Counter(
            "metagpu_extender_binds",
            "Binds by outcome (bound, refused: no fit any more, failed: the API said no).",
            ("outcome",),
            registry=self.registry,
        )
        self.assumed = Gauge(
            "metagpu_extender_assumed_pods",
            "Pods bound by the extender that their node has not reported yet.",
            registry=self.registry,
        )
        self.expired = Counter(
            "metagpu_extender_assumptions_expired",
            "Reservations dropped because the node did not report the pod in time.",
            registry=self.registry,
        )
        self.nodes = Gauge(
            "metagpu_extender_nodes",
            "Nodes the extender knows (with or without a GPU ledger).",
            registry=self.registry,
        )
        self.preemptions = Counter(
            "metagpu_extender_preemptions",
            "Preemptions for fractions by path (scheduler: kube-scheduler deleted the victims "
            "the extender named; extender: the extender evicted them) and outcome.",
            ("path", "outcome"),
            registry=self.registry,
        )
        self.evictions = Counter(
            "metagpu_extender_evictions",
            "Eviction API calls of the extender by outcome (refused: a PodDisruptionBudget).",
            ("outcome",),
            registry=self.registry,
        )
        self.nominations = Gauge(
            "metagpu_extender_nominations",
            "Preemptors whose freed GPU units are held for them now.",
            registry=self.registry,
        )
        for path, outcomes in PREEMPTION_OUTCOMES.items():
            for preemption in outcomes:
                self.preemptions.labels(path, preemption)
        for eviction in EVICTION_OUTCOMES:
            self.evictions.labels(eviction)
        for verb in VERBS:
            for outcome in ("ok", "error"):
                self.requests.labels(verb, outcome)
        for outcome in ("bound", "refused", "failed"):
            self.binds.labels(outcome)
        for reason in UNSCHEDULABLE_REASONS:
            self.unschedulable.labels(reason)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
