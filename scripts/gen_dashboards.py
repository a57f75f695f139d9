"""Write the Grafana dashboards in ``chart/dashboards/`` from the panels declared here.

Two dashboards (docs/monitoring.md, "Dashboards"):

* ``metagpu-cluster.json``: GPUs by node (units allocated, memory and SM used,
  health, conflicts), shares per namespace, scheduling (the extender's
  refusals, binds, preemptions), DRA mode's waiting and unplaceable pods and
  unresolved shares, webhook and extender latency and errors, the certificate's
  time left, the agents' inputs;
* ``metagpu-node.json``: one node's GPUs and, per GPU, the containers holding
  shares with their memory used against their limit.

Every query reads raw exported metrics (no recording rules needed) and the
``node`` label the chart's ServiceMonitor adds. Both dashboards take the
Prometheus data source as the variable ``datasource``, so they import into any
Grafana. The chart ships the files in a ConfigMap for Grafana's sidecar
(``monitoring.dashboards.enabled``); tests/monitoring/test_dashboards.py checks
each query against promtool and the metrics the components export.

Usage:
    scripts/gen_dashboards.py           write both files
    scripts/gen_dashboards.py --check   exit 1 (with a diff) if either is out of date
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any, Final

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
DASHBOARDS_DIR: Final = REPO_ROOT / "chart" / "dashboards"
DS: Final = {"type": "prometheus", "uid": "${datasource}"}
RATE: Final = "$__rate_interval"
NODE: Final = 'node=~"$node"'
GPU: Final = 'node=~"$node", gpu_index=~"$gpu"'

Panel = dict[str, Any]


class Layout:
    """Hands out panel IDs and grid positions, 24 columns wide, row by row."""

    def __init__(self) -> None:
        self.panels: list[Panel] = []
        self._id = 0
        self._x = 0
        self._y = 0
        self._row_h = 0

    def _place(self, w: int, h: int) -> dict[str, int]:
        if self._x + w > 24:
            self._x, self._y = 0, self._y + self._row_h
            self._row_h = 0
        pos = {"x": self._x, "y": self._y, "w": w, "h": h}
        self._x += w
        self._row_h = max(self._row_h, h)
        return pos

    def row(self, title: str) -> None:
        self._x, self._y = 0, self._y + self._row_h
        self._row_h = 0
        self._id += 1
        self.panels.append(
            {
                "type": "row",
                "id": self._id,
                "title": title,
                "collapsed": False,
                "gridPos": self._place(24, 1),
                "panels": [],
            }
        )
        self._x, self._y, self._row_h = 0, self._y + 1, 0

    def add(
        self,
        kind: str,
        title: str,
        targets: list[tuple[str, str]],
        *,
        w: int,
        h: int = 8,
        unit: str = "short",
        description: str = "",
        instant: bool = False,
        options: dict[str, Any] | None = None,
        transformations: list[dict[str, Any]] | None = None,
        max_value: float | None = None,
    ) -> None:
        self._id += 1
        defaults: dict[str, Any] = {"unit": unit}
        if max_value is not None:
            defaults |= {"min": 0, "max": max_value}
        panel: Panel = {
            "type": kind,
            "id": self._id,
            "title": title,
            "description": description,
            "datasource": DS,
            "gridPos": self._place(w, h),
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": options or {},
            "targets": [
                {
                    "refId": chr(ord("A") + i),
                    "datasource": DS,
                    "expr": expr,
                    "legendFormat": legend,
                    "instant": instant,
                    "range": not instant,
                    **({"format": "table"} if kind == "table" else {}),
                }
                for i, (expr, legend) in enumerate(targets)
            ],
        }
        if transformations:
            panel["transformations"] = transformations
        self.panels.append(panel)


def _variables(*, per_node: bool) -> list[dict[str, Any]]:
    variables: list[dict[str, Any]] = [
        {
            "name": "datasource",
            "label": "Prometheus",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
        }
    ]
    node_query = "label_values(metagpu_gpu_units_total, node)"
    variables.append(
        {
            "name": "node",
            "label": "Node",
            "type": "query",
            "datasource": DS,
            "query": {"query": node_query, "refId": "node"},
            "definition": node_query,
            "refresh": 2,
            "includeAll": not per_node,
            "multi": not per_node,
            "allValue": ".*",
            "current": {},
            "sort": 1,
        }
    )
    if per_node:
        gpu_query = 'label_values(metagpu_gpu_units_total{node=~"$node"}, gpu_index)'
        variables.append(
            {
                "name": "gpu",
                "label": "GPU",
                "type": "query",
                "datasource": DS,
                "query": {"query": gpu_query, "refId": "gpu"},
                "definition": gpu_query,
                "refresh": 2,
                "includeAll": True,
                "multi": True,
                "allValue": ".*",
                "current": {},
                "sort": 3,
            }
        )
    return variables


def _dashboard(uid: str, title: str, layout: Layout, *, per_node: bool) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "tags": ["metagpu", "gpu"],
        "timezone": "browser",
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": _variables(per_node=per_node)},
        "annotations": {"list": []},
        "links": [
            {
                "title": "metagpu dashboards",
                "type": "dashboards",
                "tags": ["metagpu"],
                "asDropdown": True,
            }
        ],
        "panels": layout.panels,
    }


def _merge() -> list[dict[str, Any]]:
    return [{"id": "merge", "options": {}}]


def _hide(*fields: str) -> dict[str, Any]:
    return {
        "id": "organize",
        "options": {"excludeByName": dict.fromkeys(("Time", *fields), True)},
    }


def cluster() -> dict[str, Any]:
    p = Layout()
    p.row("Capacity")
    p.add(
        "stat",
        "GPUs served",
        [(f"count(metagpu_gpu_units_total{{{NODE}}} > 0)", "")],
        w=4,
        h=4,
        description="GPUs a metagpu resource splits into units.",
    )
    p.add(
        "stat",
        "Units allocated",
        [
            (
                f"sum(metagpu_gpu_units_allocated{{{NODE}}}) "
                f"/ sum(metagpu_gpu_units_total{{{NODE}}})",
                "",
            )
        ],
        w=4,
        h=4,
        unit="percentunit",
        description="Units the kubelet assigned, of all units.",
    )
    p.add(
        "stat",
        "Unhealthy GPUs",
        [(f'count(metagpu_gpu_healthy{{{NODE}, resource!=""}} == 0) or vector(0)', "")],
        w=4,
        h=4,
        description="GPUs the device plugin withdrew (MetagpuGpuUnhealthy, MetagpuGpuLost).",
    )
    p.add(
        "stat",
        "GPUs claimed by another plugin",
        [(f'count(metagpu_gpu_foreign_claim{{{NODE}, resource!=""}}) or vector(0)', "")],
        w=4,
        h=4,
        description="GPUs metagpu serves that another device plugin also advertises or holds.",
    )
    p.add(
        "stat",
        "Shares with two owners",
        [(f"count(metagpu_share_conflict{{{NODE}}}) or vector(0)", "")],
        w=4,
        h=4,
        description="Our containers on a GPU another resource's container holds too.",
    )
    p.add(
        "stat",
        "Webhook certificate left",
        [("min(metagpu_webhook_tls_cert_not_after_seconds > 0) - time()", "")],
        w=4,
        h=4,
        unit="s",
        description="Time until the certificate the webhook serves expires.",
    )

    p.row("GPUs by node")
    p.add(
        "timeseries",
        "Units allocated by node",
        [
            (
                f"sum by (node) (metagpu_gpu_units_allocated{{{NODE}}}) "
                f"/ sum by (node) (metagpu_gpu_units_total{{{NODE}}} > 0)",
                "{{node}}",
            )
        ],
        w=8,
        unit="percentunit",
        max_value=1,
    )
    p.add(
        "timeseries",
        "GPU memory used by node",
        [
            (
                f"sum by (node) (metagpu_gpu_memory_used_bytes{{{NODE}}}) "
                f"/ sum by (node) (metagpu_gpu_memory_total_bytes{{{NODE}}})",
                "{{node}}",
            )
        ],
        w=8,
        unit="percentunit",
        max_value=1,
    )
    p.add(
        "timeseries",
        "SM utilisation by node",
        [(f"avg by (node) (metagpu_gpu_utilization_ratio{{{NODE}}})", "{{node}}")],
        w=8,
        unit="percentunit",
        max_value=1,
    )
    p.add(
        "table",
        "GPUs",
        [
            (f"metagpu_gpu_units_total{{{NODE}}}", "units"),
            (f"metagpu_gpu_units_allocated{{{NODE}}}", "allocated"),
            (f"metagpu_gpu_units_free{{{NODE}}}", "free"),
            (f"metagpu_gpu_memory_used_bytes{{{NODE}}}", "memory used"),
            (f"metagpu_gpu_utilization_ratio{{{NODE}}}", "SM"),
            (f"metagpu_gpu_healthy{{{NODE}}}", "healthy"),
        ],
        w=24,
        h=10,
        instant=True,
        description="One row per GPU: units (total, allocated, free), memory used, SM, health.",
        transformations=[*_merge(), _hide("__name__", "job", "instance", "gpu_uuid")],
    )
    p.add(
        "table",
        "Unhealthy GPUs and why",
        [(f'metagpu_gpu_health_info{{{NODE}, state="Unhealthy"}}', "")],
        w=12,
        instant=True,
        transformations=[_hide("__name__", "job", "instance", "Value")],
    )
    p.add(
        "table",
        "Conflicts with other device plugins",
        [
            (f'metagpu_gpu_foreign_claim{{{NODE}, resource!=""}}', ""),
            (f"metagpu_share_conflict{{{NODE}}}", ""),
        ],
        w=12,
        instant=True,
        transformations=[_hide("__name__", "job", "instance")],
    )

    p.row("Shares")
    share = (
        f"metagpu_container_units{{{NODE}}} / on (instance, gpu_uuid) group_left () "
        f"(metagpu_gpu_units_total{{{NODE}}} > 0)"
    )
    p.add(
        "timeseries",
        "GPUs allocated per namespace",
        [(f"sum by (namespace) ({share})", "{{namespace}}")],
        w=8,
        description="Shares as GPUs: units held / units per GPU (four 25% shares = 1).",
    )
    p.add(
        "timeseries",
        "GPU memory used per namespace",
        [(f"sum by (namespace) (metagpu_container_memory_used_bytes{{{NODE}}})", "{{namespace}}")],
        w=8,
        unit="bytes",
    )
    p.add(
        "timeseries",
        "SM used per namespace (GPUs)",
        [
            (
                f"sum by (namespace) (metagpu_container_utilization_ratio{{{NODE}}})",
                "{{namespace}}",
            )
        ],
        w=8,
        description="Sum of the containers' SM utilisation, in GPUs.",
    )
    p.add(
        "table",
        "Containers over their memory share",
        [(f"metagpu_container_memory_over_limit{{{NODE}}} == 1", "")],
        w=12,
        instant=True,
        transformations=[_hide("__name__", "job", "instance", "Value")],
    )
    p.add(
        "timeseries",
        "Memory enforcement actions",
        [
            (
                f"sum by (action) (increase(metagpu_enforcement_actions_total{{{NODE}}}[{RATE}]))",
                "{{action}}",
            )
        ],
        w=12,
    )

    p.row("Right-sizing")
    memory = (
        f"metagpu_container_memory_used_bytes{{{NODE}}} / on (instance, gpu_uuid) group_left () "
        f"(metagpu_gpu_memory_total_bytes{{{NODE}}} > 0)"
    )
    # [1d:]: steps of the server's evaluation interval, so a pod minutes old has a peak too
    # (a coarser fixed step would leave it empty until its first aligned step).
    peak = f"max_over_time(({memory})[1d:])"
    p.add(
        "table",
        "Shares against the day's peak memory",
        [
            (f"metagpu_container_units{{{NODE}}} > 0", "units"),
            (
                f"clamp_min(ceil(clamp_max({peak} * 1.1, 1) * on (instance, gpu_uuid) "
                f"group_left () (metagpu_gpu_units_total{{{NODE}}} > 0) - 1e-9), 1)",
                "recommended units",
            ),
            (peak, "peak memory"),
        ],
        w=24,
        h=10,
        instant=True,
        description="Per container and GPU: units held, the share it needs (the last day's "
        "peak memory + 10%, in whole units, as metagpu:container_recommended_units:1d and "
        "`metagpu usage --rightsize`), and that peak as a fraction of the GPU.",
        transformations=[*_merge(), _hide("__name__", "job", "instance", "gpu_uuid")],
    )

    p.row("Scheduling")
    p.add(
        "timeseries",
        "Nodes the extender refused",
        [("sum(rate(metagpu_extender_filtered_out_nodes_total[" + RATE + "]))", "refused nodes/s")],
        w=8,
        unit="ops",
        description="Nodes the filter refused because the pod's GPUs would not fit there "
        "(the pod's Events name the reason per node).",
    )
    p.add(
        "timeseries",
        "Pending pods: why no node fits",
        [
            (
                "sum by (reason) (rate(metagpu_extender_unschedulable_total[" + RATE + "]))",
                "{{reason}}",
            )
        ],
        w=8,
        unit="ops",
        description="Filter calls that passed no node, by the rule that refused the most "
        "nodes (no_single_gpu: no GPU has the fraction free; too_few_whole_gpus; "
        "too_few_units; reused_gpu_full and reuse_spread: an init container's units; "
        "no_usable_ledger: agents not reporting; cannot_cap_fixed: a fixed pod and no "
        "MPS node). kube-scheduler retries pending pods, so these are attempts per "
        "second; the pod's FailedScheduling event has the figures per node.",
    )
    p.add(
        "timeseries",
        "Binds",
        [("sum by (outcome) (rate(metagpu_extender_binds_total[" + RATE + "]))", "{{outcome}}")],
        w=8,
        unit="ops",
    )
    p.add(
        "timeseries",
        "Reservations and preemptions",
        [
            ("sum(metagpu_extender_assumed_pods)", "assumed pods"),
            ("sum(metagpu_extender_nominations)", "nominations"),
            (
                "sum(increase(metagpu_extender_assumptions_expired_total[" + RATE + "]))",
                "expired",
            ),
            (
                "sum by (path, outcome) (increase(metagpu_extender_preemptions_total["
                + RATE
                + "]))",
                "preemption {{path}} {{outcome}}",
            ),
        ],
        w=8,
    )

    p.row("DRA mode")
    p.add(
        "timeseries",
        "DRA pods waiting",
        [
            ("max(metagpu_webhook_dra_waiting_pods)", "waiting (Unschedulable)"),
            ("max(metagpu_webhook_dra_unplaceable_pods)", "no GPU can take the share"),
        ],
        w=12,
        description="Pending pods naming resource claims that the scheduler marked "
        "Unschedulable, and of those the ones no GPU of the DRA pool has room for "
        "(MetagpuDraPodsUnplaceable; `kubectl describe pod` shows their NoGpuShareFits "
        "Event). The leading webhook replica counts them, the others report 0: max. "
        "0 outside DRA mode.",
    )
    # `or on () vector(0)`: a 0 where every share resolves (or no node is in DRA mode),
    # per node otherwise, rather than a panel with no data.
    p.add(
        "timeseries",
        "DRA shares the agents cannot resolve",
        [
            (
                f"count by (node) (metagpu_share_unresolved{{{NODE}}}) or on () vector(0)",
                "{{node}}",
            )
        ],
        w=12,
        description="Claim devices of the DRA driver whose share the node's agent cannot "
        "tell (no CDI spec, an unreadable one, a GPU not on the node): no share metrics, "
        "showback or enforcement for those containers (MetagpuDraShareUnresolved; "
        "`mgctl` lists them under unresolvedShares with the reason).",
    )

    p.row("Latency and errors")
    p.add(
        "timeseries",
        "Extender p99 by verb",
        [
            (
                "histogram_quantile(0.99, sum by (verb, le) "
                "(rate(metagpu_extender_request_duration_seconds_bucket[" + RATE + "])))",
                "{{verb}}",
            )
        ],
        w=6,
        unit="s",
    )
    p.add(
        "timeseries",
        "Extender errors by verb",
        [
            (
                'sum by (verb) (rate(metagpu_extender_requests_total{outcome="error"}['
                + RATE
                + "]))",
                "{{verb}}",
            )
        ],
        w=6,
        unit="ops",
    )
    p.add(
        "timeseries",
        "Webhook p99 by outcome",
        [
            (
                "histogram_quantile(0.99, sum by (outcome, le) "
                "(rate(metagpu_webhook_request_duration_seconds_bucket[" + RATE + "])))",
                "{{outcome}}",
            )
        ],
        w=6,
        unit="s",
    )
    p.add(
        "timeseries",
        "Webhook answers by outcome",
        [
            (
                "sum by (outcome) (rate(metagpu_webhook_requests_total[" + RATE + "]))",
                "{{outcome}}",
            )
        ],
        w=6,
        unit="ops",
    )

    p.row("Agents")
    p.add(
        "timeseries",
        "Seconds since the last accounting cycle",
        [(f"time() - metagpu_agent_last_cycle_timestamp_seconds{{{NODE}}}", "{{node}}")],
        w=12,
        unit="s",
        description="Over 120 s: the node's ledger is stale (MetagpuNodeLedgerStale).",
    )
    p.add(
        "timeseries",
        "Agent inputs up",
        [(f"metagpu_agent_source_up{{{NODE}}}", "{{node}} {{source}}")],
        w=12,
        max_value=1,
    )
    return _dashboard("metagpu-cluster", "metagpu / Cluster", p, per_node=False)


def node() -> dict[str, Any]:
    p = Layout()
    p.row("GPUs")
    p.add(
        "bargauge",
        "Units allocated",
        [
            (
                f"metagpu_gpu_units_allocated{{{GPU}}} / (metagpu_gpu_units_total{{{GPU}}} > 0)",
                "GPU {{gpu_index}}",
            )
        ],
        w=8,
        unit="percentunit",
        max_value=1,
        instant=True,
    )
    p.add(
        "bargauge",
        "Memory used",
        [
            (
                f"metagpu_gpu_memory_used_bytes{{{GPU}}} / metagpu_gpu_memory_total_bytes{{{GPU}}}",
                "GPU {{gpu_index}}",
            )
        ],
        w=8,
        unit="percentunit",
        max_value=1,
        instant=True,
    )
    p.add(
        "bargauge",
        "SM used",
        [(f"metagpu_gpu_utilization_ratio{{{GPU}}}", "GPU {{gpu_index}}")],
        w=8,
        unit="percentunit",
        max_value=1,
        instant=True,
    )
    p.add(
        "timeseries",
        "Memory used per GPU",
        [
            (f"metagpu_gpu_memory_used_bytes{{{GPU}}}", "GPU {{gpu_index}} used"),
            (f"metagpu_gpu_memory_unattributed_bytes{{{GPU}}}", "GPU {{gpu_index}} not in a pod"),
        ],
        w=12,
        unit="bytes",
    )
    p.add(
        "timeseries",
        "SM utilisation per GPU",
        [(f"metagpu_gpu_utilization_ratio{{{GPU}}}", "GPU {{gpu_index}}")],
        w=12,
        unit="percentunit",
        max_value=1,
    )
    p.add(
        "table",
        "Health",
        [(f"metagpu_gpu_health_info{{{GPU}}}", "")],
        w=24,
        h=6,
        instant=True,
        transformations=[_hide("__name__", "job", "instance", "Value")],
    )

    p.row("Containers")
    p.add(
        "table",
        "Containers and their shares",
        [
            (f"metagpu_container_units{{{GPU}}}", "units"),
            (
                f"metagpu_container_units{{{GPU}}} / on (instance, gpu_uuid) group_left () "
                f"(metagpu_gpu_units_total{{{GPU}}} > 0)",
                "share",
            ),
            (f"metagpu_container_memory_used_bytes{{{GPU}}}", "memory used"),
            (f"metagpu_container_memory_limit_bytes{{{GPU}}}", "memory limit"),
            (f"metagpu_container_utilization_ratio{{{GPU}}}", "SM"),
            (f"metagpu_container_processes{{{GPU}}}", "processes"),
        ],
        w=24,
        h=10,
        instant=True,
        description="One row per container and GPU: units held, the share of the GPU, "
        "memory used against the share's limit, SM, processes.",
        transformations=[*_merge(), _hide("__name__", "job", "instance", "gpu_uuid")],
    )
    p.add(
        "timeseries",
        "Memory used against the limit",
        [
            (
                f"metagpu_container_memory_used_bytes{{{GPU}}}",
                "{{namespace}}/{{pod}}/{{container}} used",
            ),
            (
                f"metagpu_container_memory_limit_bytes{{{GPU}}}",
                "{{namespace}}/{{pod}}/{{container}} limit",
            ),
        ],
        w=12,
        unit="bytes",
    )
    p.add(
        "timeseries",
        "SM utilisation per container",
        [
            (
                f"metagpu_container_utilization_ratio{{{GPU}}}",
                "{{namespace}}/{{pod}}/{{container}}",
            )
        ],
        w=12,
        unit="percentunit",
        max_value=1,
    )

    p.row("Agent")
    p.add(
        "timeseries",
        "Inputs up",
        [(f"metagpu_agent_source_up{{{NODE}}}", "{{source}}")],
        w=12,
        max_value=1,
    )
    p.add(
        "timeseries",
        "Accounting cycle p99",
        [
            (
                "histogram_quantile(0.99, sum by (le) "
                f"(rate(metagpu_agent_cycle_duration_seconds_bucket{{{NODE}}}[{RATE}])))",
                "p99",
            )
        ],
        w=12,
        unit="s",
    )
    return _dashboard("metagpu-node", "metagpu / Node", p, per_node=True)


DASHBOARDS: Final = {"metagpu-cluster.json": cluster, "metagpu-node.json": node}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a file is out of date")
    args = parser.parse_args(argv)
    stale = False
    for name, build in DASHBOARDS.items():
        path = DASHBOARDS_DIR / name
        text = render(build)
        if args.check:
            current = path.read_text() if path.is_file() else ""
            if current != text:
                stale = True
                sys.stdout.writelines(
                    difflib.unified_diff(
                        current.splitlines(keepends=True),
                        text.splitlines(keepends=True),
                        f"{path} (committed)",
                        f"{path} (generated)",
                    )
                )
        else:
            DASHBOARDS_DIR.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("chart/dashboards is out of date: run scripts/gen_dashboards.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
