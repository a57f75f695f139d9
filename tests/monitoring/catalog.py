"""What metagpu exports, read from its own metric objects, and what PromQL names.

:func:`exported_series` builds the agent's, the extender's and the webhook's
registries the way the components do and lists every sample name with the
labels it carries, so a renamed metric or label fails the checks of the
alert rules and dashboards. :func:`promql_references` pulls the metric names,
matcher labels and grouping labels out of an expression (a regex over PromQL,
not a parser: promtool and Prometheus parse it; this only checks names).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from prometheus_client import CollectorRegistry

from plugin.agent.accounting import EMPTY_SNAPSHOT
from plugin.agent.metrics import AgentMetrics
from plugin.extender.metrics import VERBS, ExtenderMetrics
from plugin.gpu.mps import MpsNode, MpsStatus
from webhook.metrics import WebhookMetrics

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
RULES_FILE: Final = REPO_ROOT / "chart" / "rules" / "metagpu-alerts.yaml"
USAGE_RULES_FILE: Final = REPO_ROOT / "chart" / "rules" / "metagpu-usage.yaml"
TARGET_LABELS: Final = frozenset({"job", "instance", "node"})
"""Labels Prometheus adds to every scraped series: job and instance always; node
by the chart's ServiceMonitor relabelling (docs/monitoring.md asks plain scrape
configs for the same)."""
TARGET_METRICS: Final = {"up": TARGET_LABELS}
"""Series Prometheus makes per target."""

PROMTOOL_MISSING: Final = (
    "promtool is not installed: `make tools` installs it (Debian's prometheus package, "
    "with apt-get as root); elsewhere install prometheus/promtool 2.x and put it on PATH"
)
PROMETHEUS_MISSING: Final = PROMTOOL_MISSING.replace("promtool is", "prometheus is")


def promtool() -> str | None:
    """The promtool to run: .tools/bin first (what `make tools` links), then PATH."""
    return _tool("promtool")


def prometheus() -> str | None:
    """The Prometheus server binary, found the same way."""
    return _tool("prometheus")


def _tool(name: str) -> str | None:
    local = REPO_ROOT / ".tools" / "bin" / name
    if local.is_file():
        return str(local)
    return shutil.which(name)


def _families(registry: CollectorRegistry) -> dict[str, frozenset[str]]:
    series: dict[str, set[str]] = {}
    for family in registry.collect():
        labels = set(getattr(family, "_labelnames", ()) or ())
        for sample in family.samples:
            labels |= set(sample.labels)
        labels.discard("le")
        if family.type == "counter":
            series[f"{family.name}_total"] = labels
        elif family.type == "histogram":
            series[f"{family.name}_bucket"] = labels | {"le"}
            series[f"{family.name}_sum"] = labels
            series[f"{family.name}_count"] = labels
        else:
            series[family.name] = labels
    return {name: frozenset(labels) for name, labels in series.items()}


def exported_series() -> dict[str, frozenset[str]]:
    """Every sample name the components export → its label names (without target labels)."""
    agent = AgentMetrics(version="test", backend="simulated", node="node-a")
    # A node whose plugin supervises the MPS daemon also exports the daemon's series.
    mps = MpsNode(mode="supervised", status=MpsStatus(state="up"))
    agent.update(dataclasses.replace(EMPTY_SNAPSHOT, mps=mps))
    extender = ExtenderMetrics()
    for verb in VERBS:
        extender.duration.labels(verb).observe(0.001)
    webhook = WebhookMetrics()
    webhook.watch_connections(lambda: 0, {"full": 0}, {"idle": 0})
    series: dict[str, frozenset[str]] = {}
    for registry in (agent.registry, extender.registry, webhook.registry):
        series |= _families(registry)
    return series


@dataclass(frozen=True)
class References:
    """What one PromQL expression names."""

    metrics: frozenset[str]
    matchers: frozenset[tuple[str, str]]
    """(metric, label) of each label matcher inside a selector's braces."""
    grouping: frozenset[str]
    """Labels of by/without/on/ignoring/group_left/group_right clauses."""


_SELECTOR: Final = re.compile(r"\b(metagpu_[a-z0-9_]+|up)\b\s*(\{[^}]*\})?")
_MATCHER: Final = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING: Final = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_STRING: Final = re.compile(r'"(?:[^"\\]|\\.)*"')


def promql_references(expr: str) -> References:
    metrics, matchers, grouping = set(), set(), set()
    for match in _SELECTOR.finditer(expr):
        metric, braces = match.group(1), match.group(2)
        metrics.add(metric)
        if braces:
            for label in _MATCHER.findall(_STRING.sub('""', braces)):
                matchers.add((metric, label))
    for match in _GROUPING.finditer(expr):
        grouping |= {label.strip() for label in match.group(1).split(",") if label.strip()}
    return References(frozenset(metrics), frozenset(matchers), frozenset(grouping))


def unknown_names(expr: str, exported: dict[str, frozenset[str]]) -> list[str]:
    """Metrics and labels ``expr`` names that no component exports (empty: all known)."""
    known = {**exported, **TARGET_METRICS}
    refs = promql_references(expr)
    problems = [f"metric {m}" for m in sorted(refs.metrics) if m not in known]
    for metric, label in sorted(refs.matchers):
        if metric in known and label not in known[metric] | TARGET_LABELS:
            problems.append(f"label {label} of {metric}")
    used = set().union(*(known.get(m, frozenset()) for m in refs.metrics)) | TARGET_LABELS
    problems += [f"grouping label {label}" for label in sorted(refs.grouping - used)]
    return problems
