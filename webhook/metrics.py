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
  policy falls back to the defaults (RBAC or API trouble).
"""

from __future__ import annotations

from typing import Final, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

Outcome = Literal["allowed-mutated", "allowed-unchanged", "denied", "error"]
OUTCOMES: Final[tuple[Outcome, ...]] = ("allowed-mutated", "allowed-unchanged", "denied", "error")

NamespaceLookup = Literal["cache", "get", "error", "disabled"]
NAMESPACE_LOOKUPS: Final[tuple[NamespaceLookup, ...]] = ("cache", "get", "error", "disabled")

TARGETS: Final = ("pod", "ephemeral-containers", "workload", "other", "invalid")
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


class WebhookMetrics:
    """Every series the webhook exports; label values pre-created so they show as 0."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "metagpu_webhook_requests",
            "AdmissionReview requests answered, by outcome and what they were about.",
            ["outcome", "target"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "metagpu_webhook_request_duration_seconds",
            "Time from the request body being read to the response being ready.",
            ["outcome"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
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
        self.namespace_lookups = Counter(
            "metagpu_webhook_namespace_lookups",
            "Namespace facts lookups, by where the answer came from.",
            ["result"],
            registry=self.registry,
        )
        self._request_children = {
            (o, t): self.requests.labels(outcome=o, target=t) for o in OUTCOMES for t in TARGETS
        }
        self._latency_children = {o: self.latency.labels(outcome=o) for o in OUTCOMES}
        self._lookup_children = {
            r: self.namespace_lookups.labels(result=r) for r in NAMESPACE_LOOKUPS
        }

    def observe(self, outcome: Outcome, target: str, seconds: float) -> None:
        """Count one answered request (the hot path: two dict lookups, no label parsing)."""
        child = self._request_children.get((outcome, target))
        if child is None:
            child = self._request_children[(outcome, "other")]
        child.inc()
        self._latency_children[outcome].observe(seconds)

    def namespace_lookup(self, result: NamespaceLookup) -> None:
        self._lookup_children[result].inc()

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)
