"""Prometheus metrics of the webhook, in a registry of its own.

A private :class:`~prometheus_client.CollectorRegistry` (not the global
default) so two webhooks in one test process, or the webhook and the device
plugin in ``metagpu dev``, never collide on metric names.

What an operator alerts on:

* ``metagpu_webhook_requests_total{outcome="error"}`` rising: malformed
  reviews (a misconfigured API server or a client that is not one);
* ``..._request_duration_seconds`` p99 approaching the webhook's
  ``timeoutSeconds``;
* ``metagpu_webhook_tls_cert_not_after_seconds - time()`` under a week: the
  certificate is not being renewed;
* ``metagpu_webhook_namespace_lookups_total{result="error"}``: namespace
  policy falls back to the defaults (RBAC or API trouble);
* ``max(metagpu_webhook_dra_unplaceable_pods) > 0`` for a while: in DRA mode,
  pods wait for a GPU share no GPU can take (:class:`DraWaitingStats`).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from typing import Final, Literal

import prometheus_client.metrics
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

Outcome = Literal["allowed-mutated", "allowed-unchanged", "denied", "error"]
OUTCOMES: Final[tuple[Outcome, ...]] = ("allowed-mutated", "allowed-unchanged", "denied", "error")

NamespaceLookup = Literal["cache", "get", "error", "disabled"]
NAMESPACE_LOOKUPS: Final[tuple[NamespaceLookup, ...]] = ("cache", "get", "error", "disabled")

TARGETS: Final = ("pod", "pod-update", "ephemeral-containers", "workload", "other", "invalid")
"""Label values for ``target``: a closed set, so a hostile client cannot grow the series."""

LATENCY_BUCKETS_S: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
"""From half a millisecond (a cached pod mutation) to the API server's 10 s webhook timeout."""

METRICS_CONTENT_TYPE: Final = CONTENT_TYPE_LATEST

REQUESTS: Final = "metagpu_webhook_requests"
REQUESTS_HELP: Final = "AdmissionReview requests answered, by outcome and what they were about."
LATENCY: Final = "metagpu_webhook_request_duration_seconds"
LATENCY_HELP: Final = (
    "Time from the request reaching the handler to the response being ready, "
    "receiving the body included."
)
LOOKUPS: Final = "metagpu_webhook_namespace_lookups"
LOOKUPS_HELP: Final = "Namespace facts lookups, by where the answer came from."

EventResult = Literal["written", "failed"]
EVENT_RESULTS: Final[tuple[EventResult, ...]] = ("written", "failed")
PassOutcome = Literal["ok", "error"]
PASS_OUTCOMES: Final[tuple[PassOutcome, ...]] = ("ok", "error")

DRA_WAITING: Final = "metagpu_webhook_dra_waiting_pods"
DRA_WAITING_HELP: Final = (
    "DRA mode: Pending pods the scheduler marked Unschedulable that name resource claims, "
    "as tracked by the replica leading the claim-template controller; 0 on the others and "
    "with dra.explain_waiting off (aggregate with max)."
)
DRA_UNPLACEABLE: Final = "metagpu_webhook_dra_unplaceable_pods"
DRA_UNPLACEABLE_HELP: Final = (
    "DRA mode: of the waiting pods, those no node's GPUs can take (a NoGpuShareFits Event "
    "says why), as of the leader's last completed pass; 0 on the others (aggregate with max)."
)
DRA_EVENTS: Final = "metagpu_webhook_dra_waiting_events"
DRA_EVENTS_HELP: Final = (
    "DRA mode: NoGpuShareFits Events this replica wrote on waiting pods, or failed to write, "
    "while leading."
)
DRA_PASS: Final = "metagpu_webhook_dra_waiting_pass_duration_seconds"
DRA_PASS_HELP: Final = (
    "DRA mode: one pass over the waiting pods (list slices and claims, judge, write Events), "
    "by outcome (error: a list failed or the pass timed out); observed only while leading."
)
DRA_PASS_BUCKETS_S: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""From a pass over a handful of nodes (milliseconds) to the 60 s a pass's lists and judgement
may take (``webhook.dra_waiting.PASS_TIMEOUT_S``); about 100 ms at 1,000 nodes of 8 GPUs."""


class WebhookMetrics:
    """Every series the webhook exports; label values pre-created so they show as 0.

    The per-request series (requests, latency, namespace lookups) are plain
    numbers in :class:`ReviewStats`, turned into Prometheus samples only when
    scraped: ``prometheus_client``'s counters take a lock and several calls
    per increment, and the three series a review updates cost about 5 us of
    server CPU that way, 2 us this way (``docs/benchmarks.md``). The exposition
    is the same as with its ``Counter`` and ``Histogram`` (``_total``,
    ``_bucket``, ``_count``, ``_sum``, ``_created``).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.stats = ReviewStats()
        self.registry.register(self.stats)
        self.cert_not_after = Gauge(
            "metagpu_webhook_tls_cert_not_after_seconds",
            "notAfter of the certificate new TLS handshakes get, as a Unix time.",
            registry=self.registry,
        )
        self.cert_reloads = Counter(
            "metagpu_webhook_tls_cert_reloads",
            "Times a rotated certificate was picked up without a restart.",
            registry=self.registry,
        )
        self.cert_rejections = Counter(
            "metagpu_webhook_tls_cert_rejections",
            "Rotated certificate files refused (the previous certificate kept serving); "
            "/readyz says why.",
            registry=self.registry,
        )
        self.dra_waiting = DraWaitingStats(self.registry)
        # Bound once: the hot path below is two dict lookups and three additions.
        self.observe = self.stats.observe
        self.namespace_lookup = self.stats.namespace_lookup

    def watch_connections(
        self,
        open_connections: Callable[[], int],
        refused: Mapping[str, int],
        closed: Mapping[str, int],
    ) -> None:
        """Export the listener's connection figures (live mappings, read when scraped)."""
        self.registry.register(_ConnectionFigures(open_connections, refused, closed))

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)


class ReviewStats(Collector):
    """Counts and latencies of answered reviews, as plain numbers; a Prometheus collector.

    Updated only from the event loop's thread (the handlers), read when scraped.
    """

    def __init__(self) -> None:
        self.created = time.time()
        self.requests = {(o, t): 0 for o in OUTCOMES for t in TARGETS}
        self.latency_counts = {o: [0] * (len(LATENCY_BUCKETS_S) + 1) for o in OUTCOMES}
        """Per outcome, how many answers fell in each bucket (not cumulative; +Inf last)."""
        self.latency_sums = dict.fromkeys(OUTCOMES, 0.0)
        self.lookups = dict.fromkeys(NAMESPACE_LOOKUPS, 0)

    def observe(self, outcome: Outcome, target: str, seconds: float) -> None:
        """Count one answered request that took ``seconds`` (an unknown target counts as other)."""
        key = (outcome, target)
        if key in self.requests:
            self.requests[key] += 1
        else:
            self.requests[(outcome, "other")] += 1
        self.latency_counts[outcome][bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.latency_sums[outcome] += seconds

    def namespace_lookup(self, result: NamespaceLookup) -> None:
        self.lookups[result] += 1

    def collect(self) -> Iterator[Metric]:
        created = self.created if _created_series_enabled() else None
        requests = CounterMetricFamily(REQUESTS, REQUESTS_HELP, labels=("outcome", "target"))
        for (outcome, target), count in self.requests.items():
            requests.add_metric((outcome, target), count, created=created)
        yield requests
        latency = HistogramMetricFamily(LATENCY, LATENCY_HELP, labels=("outcome",))
        for outcome in OUTCOMES:
            cumulative, buckets = 0, []
            for bound, count in zip(_BUCKET_LABELS, self.latency_counts[outcome], strict=True):
                cumulative += count
                buckets.append((bound, float(cumulative)))
            latency.add_metric((outcome,), buckets, self.latency_sums[outcome])
            if created is not None:
                latency.add_sample(LATENCY + "_created", {"outcome": outcome}, created)
        yield latency
        lookups = CounterMetricFamily(LOOKUPS, LOOKUPS_HELP, labels=("result",))
        for result, count in self.lookups.items():
            lookups.add_metric((result,), count, created=created)
        yield lookups


class DraWaitingStats(Collector):
    """The series of DRA mode's waiting-pod explainer (:mod:`webhook.dra_waiting`).

    Registered by every webhook, in every mode, so the series always exist and read 0
    where nothing is explained: a dashboard or alert over ``max(...)`` then sees the one
    leader's figures across replicas, and a failover does not make the series vanish.

    The tracked-pod count is read live when scraped (:meth:`lead` hands over a callable),
    not copied at each pass, so it follows the Pod watch between passes. The Event and
    pass series are ``prometheus_client`` objects: they change a few times a minute, off
    the admission hot path.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._tracked: Callable[[], int] | None = None
        self._unplaceable = 0
        self.events = Counter(DRA_EVENTS, DRA_EVENTS_HELP, ("result",), registry=registry)
        for result in EVENT_RESULTS:
            self.events.labels(result)
        self.passes = Histogram(
            DRA_PASS, DRA_PASS_HELP, ("outcome",), buckets=DRA_PASS_BUCKETS_S, registry=registry
        )
        for outcome in PASS_OUTCOMES:
            self.passes.labels(outcome)
        registry.register(self)

    def lead(self, tracked: Callable[[], int]) -> None:
        """This replica explains from now on; ``tracked()`` is how many pods wait."""
        self._tracked = tracked

    def follow(self) -> None:
        """This replica stopped explaining (lost the Lease, shut down): report 0 again."""
        self._tracked = None
        self._unplaceable = 0

    def judged(self, unplaceable: int) -> None:
        """A pass found ``unplaceable`` pods no node's GPUs can take."""
        self._unplaceable = unplaceable

    def event(self, result: EventResult) -> None:
        self.events.labels(result).inc()

    def passed(self, outcome: PassOutcome, seconds: float) -> None:
        self.passes.labels(outcome).observe(seconds)

    def collect(self) -> Iterator[Metric]:
        tracked = self._tracked() if self._tracked is not None else 0
        yield GaugeMetricFamily(DRA_WAITING, DRA_WAITING_HELP, value=tracked)
        yield GaugeMetricFamily(DRA_UNPLACEABLE, DRA_UNPLACEABLE_HELP, value=self._unplaceable)


class _ConnectionFigures(Collector):
    """Open connections, and those refused or closed by the listener, by why."""

    def __init__(
        self,
        open_connections: Callable[[], int],
        refused: Mapping[str, int],
        closed: Mapping[str, int],
    ) -> None:
        self._open = open_connections
        self._refused = refused
        self._closed = closed

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "metagpu_webhook_connections_open", "Client connections open now.", value=self._open()
        )
        refused = CounterMetricFamily(
            "metagpu_webhook_connections_refused",
            "Connections closed on accept: over max_connections (full) or over "
            "max_connections_per_client (client).",
            labels=("why",),
        )
        for why, count in self._refused.items():
            refused.add_metric((why,), count)
        yield refused
        closed = CounterMetricFamily(
            "metagpu_webhook_connections_closed",
            "Connections the webhook closed, by which deadline (or drain) closed them.",
            labels=("why",),
        )
        for why, count in self._closed.items():
            closed.add_metric((why,), count)
        yield closed


_BUCKET_LABELS: Final = (*(repr(float(b)) for b in LATENCY_BUCKETS_S), "+Inf")
"""``le`` label values, written as ``prometheus_client`` writes them (``0.0005``, ``1.0``)."""


def _created_series_enabled() -> bool:
    """Follow ``prometheus_client.disable_created_metrics()``, as its own metrics do."""
    return bool(getattr(prometheus_client.metrics, "_use_created", True))
