"""The webhook's per-request series: plain counters, exported as prometheus_client would.

:class:`webhook.metrics.ReviewStats` replaces ``Counter``/``Histogram`` on the
hot path; the scrape must not tell the difference. The reference here is a
registry with prometheus_client's own metrics fed the same observations.
"""

from __future__ import annotations

import prometheus_client.metrics
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from webhook.metrics import (
    LATENCY,
    LATENCY_BUCKETS_S,
    LATENCY_HELP,
    LOOKUPS,
    LOOKUPS_HELP,
    NAMESPACE_LOOKUPS,
    OUTCOMES,
    REQUESTS,
    REQUESTS_HELP,
    TARGETS,
    WebhookMetrics,
)

OBSERVATIONS = [
    ("allowed-mutated", "pod", 0.0012),
    ("allowed-mutated", "pod", 0.0005),  # on a bucket bound: counted in that bucket
    ("allowed-unchanged", "workload", 0.0),
    ("denied", "ephemeral-containers", 0.3),
    ("error", "invalid", 7.0),  # above the last bound: only +Inf
    ("error", "not-a-target", 0.01),  # counted as "other"
]
LOOKUP_RESULTS = ["disabled", "cache", "cache", "error"]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def reference() -> bytes:
    registry = CollectorRegistry()
    requests = Counter(REQUESTS, REQUESTS_HELP, ["outcome", "target"], registry=registry)
    latency = Histogram(
        LATENCY, LATENCY_HELP, ["outcome"], buckets=LATENCY_BUCKETS_S, registry=registry
    )
    lookups = Counter(LOOKUPS, LOOKUPS_HELP, ["result"], registry=registry)
    for o in OUTCOMES:
        latency.labels(outcome=o)
        for t in TARGETS:
            requests.labels(outcome=o, target=t)
    for r in NAMESPACE_LOOKUPS:
        lookups.labels(result=r)
    for outcome, target, seconds in OBSERVATIONS:
        known = target if target in TARGETS else "other"
        requests.labels(outcome=outcome, target=known).inc()
        latency.labels(outcome=outcome).observe(seconds)
    for result in LOOKUP_RESULTS:
        lookups.labels(result=result).inc()
    return generate_latest(registry)


def ours() -> bytes:
    metrics = WebhookMetrics()
    for outcome, target, seconds in OBSERVATIONS:
        metrics.observe(outcome, target, seconds)  # type: ignore[arg-type]
    for result in LOOKUP_RESULTS:
        metrics.namespace_lookup(result)  # type: ignore[arg-type]
    return metrics.exposition()


def samples(text: bytes) -> Samples:
    """``{(name, labels): value}`` of the per-request series; ``_created`` timestamps as 1."""
    out: Samples = {}
    for family in text_string_to_metric_families(text.decode()):
        if not family.name.startswith((REQUESTS, LATENCY, LOOKUPS)):
            continue
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            out[key] = 1.0 if s.name.endswith("_created") else s.value
    return out


def test_scrape_is_what_prometheus_client_metrics_give() -> None:
    expected, got = samples(reference()), samples(ours())
    assert got == expected
    assert ("metagpu_webhook_requests_total", (("outcome", "error"), ("target", "other"))) in got


def test_text_format_matches_line_for_line_apart_from_timestamps() -> None:
    def lines(text: bytes) -> list[str]:
        return sorted(
            line.rsplit(" ", 1)[0] if "_created" in line and not line.startswith("#") else line
            for line in text.decode().splitlines()
            # The certificate's and DRA mode's series are not per-request ones.
            if "tls_cert" not in line and "_dra_" not in line
        )

    assert lines(ours()) == lines(reference())


def test_disabling_created_series_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    # What prometheus_client.disable_created_metrics() does (it is untyped).
    monkeypatch.setattr(prometheus_client.metrics, "_use_created", False)
    assert b"_created" not in reference()
    assert b"_created" not in ours()


def test_dra_waiting_series_exist_at_zero_and_follow_leadership() -> None:
    """Every webhook exports DRA mode's series, at 0 until it leads, so ``max`` across
    replicas is the leader's figure; the label values are there before the first pass."""
    metrics = WebhookMetrics()
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    assert families["metagpu_webhook_dra_waiting_pods"].samples[0].value == 0
    assert families["metagpu_webhook_dra_unplaceable_pods"].samples[0].value == 0
    assert "(aggregate with max)" in families["metagpu_webhook_dra_waiting_pods"].documentation
    events = families["metagpu_webhook_dra_waiting_events"]
    assert {s.labels["result"] for s in events.samples if s.name.endswith("_total")} == {
        "written",
        "failed",
    }
    passes = families["metagpu_webhook_dra_waiting_pass_duration_seconds"]
    assert {s.labels["outcome"] for s in passes.samples} == {"ok", "error"}
    for family in families.values():  # bounded: no pod or namespace labels
        for sample in family.samples:
            assert not {"pod", "namespace"} & set(sample.labels), sample

    stats, waiting = metrics.dra_waiting, [1, 2, 3]
    stats.lead(lambda: len(waiting))
    stats.judged(2)
    get = metrics.registry.get_sample_value
    assert get("metagpu_webhook_dra_waiting_pods") == 3
    waiting.pop()  # read when scraped, not at the last pass
    assert get("metagpu_webhook_dra_waiting_pods") == 2
    assert get("metagpu_webhook_dra_unplaceable_pods") == 2
    stats.follow()
    assert get("metagpu_webhook_dra_waiting_pods") == 0
    assert get("metagpu_webhook_dra_unplaceable_pods") == 0
