"""Prometheus metrics of the node agent, on a registry of its own.

The per-GPU and per-container gauges are rebuilt from each cycle's snapshot
(:meth:`AgentMetrics.update`) and served by a custom collector, rather than
kept in labelled ``Gauge`` objects: a container that goes away disappears from
the next scrape instead of lingering with its last value until someone
remembers to delete its label set. The counters and the cycle histogram are
ordinary prometheus-client objects on the same registry.

Units follow Prometheus conventions (bytes, ratios 0–1, seconds). ``container``
is a label of every per-container series, next to ``namespace``, ``pod`` and
``gpu_uuid``, so ``sum by (namespace)`` and joins with kube-state-metrics work.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from plugin.agent.accounting import MIB, Snapshot
from plugin.agent.enforcement import ENFORCEMENT_ACTIONS, EnforcementRecord
from plugin.api.limits import ENFORCED_WHEN_SUPERVISED

PREFIX: Final = "metagpu"
GPU_LABELS: Final = ("gpu_uuid", "gpu_index", "gpu_model", "resource")
CONTAINER_LABELS: Final = ("namespace", "pod", "container", "gpu_uuid", "gpu_index", "resource")
SOURCES: Final = ("gpus", "podresources", "pods")


class _SnapshotCollector(Collector):
    """Serves the families built by the last :meth:`AgentMetrics.update`."""

    def __init__(self) -> None:
        self.families: tuple[Metric, ...] = ()

    def collect(self) -> Iterable[Metric]:
        return self.families


class AgentMetrics:
    """Every metric the agent exports. One instance per agent; own registry."""

    def __init__(self, *, version: str = "unknown", backend: str = "", node: str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._snapshot = _SnapshotCollector()
        self.registry.register(self._snapshot)
        self.actions = Counter(
            f"{PREFIX}_enforcement_actions",
            "Memory enforcement actions taken, by action: report (an overrun started), "
            "kill (its processes were killed), kill_failed, kill_skipped (none of its "
            "processes was left to kill), resolved (back under the limit).",
            ["action"],
            registry=self.registry,
        )
        for action in ENFORCEMENT_ACTIONS:
            self.actions.labels(action)
        self.cycle_seconds = Histogram(
            f"{PREFIX}_agent_cycle_duration_seconds",
            "Time one accounting cycle took (read, join, enforce, export).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.registry,
        )
        self.last_cycle = Gauge(
            f"{PREFIX}_agent_last_cycle_timestamp_seconds",
            "When the last accounting cycle finished (Unix time); alert if it stops moving.",
            registry=self.registry,
        )
        self.source_up = Gauge(
            f"{PREFIX}_agent_source_up",
            "1 if the input was read in the last cycle, 0 if the agent is using old data.",
            ["source"],
            registry=self.registry,
        )
        info = Gauge(
            f"{PREFIX}_agent_info",
            "Always 1; labels say which agent version, GPU backend and node this is.",
            ["version", "backend", "node"],
            registry=self.registry,
        )
        info.labels(version, backend, node).set(1)

    def update(self, snapshot: Snapshot) -> None:
        """Rebuild the per-GPU and per-container families from ``snapshot``."""
        self._snapshot.families = tuple(build_families(snapshot))
        for source in SOURCES:
            self.source_up.labels(source).set(0 if source in snapshot.stale else 1)
        self.last_cycle.set(snapshot.taken_at)

    def count(self, records: Iterable[EnforcementRecord]) -> None:
        """Count what the enforcer did this cycle."""
        for record in records:
            self.actions.labels(record.action).inc()

    def render(self) -> bytes:
        """The text exposition format, as ``/metrics`` serves it."""
        return generate_latest(self.registry)


def mps_families(snapshot: Snapshot) -> Iterator[Metric]:
    """The node's MPS (the device plugin's board): what it enforces, and the supervised
    daemon's state and restarts (only while the plugin supervises one)."""
    mps = snapshot.mps
    info = GaugeMetricFamily(
        f"{PREFIX}_mps_info",
        "Always 1; mode is off (time-sliced GPUs), unsupervised (mps.enabled: limits "
        "handed out, nobody watches the daemon) or supervised (mps.supervise).",
        labels=("mode",),
    )
    info.add_metric((mps.mode,), 1)
    enforced = GaugeMetricFamily(
        f"{PREFIX}_node_limit_enforced",
        "1 if the node holds every container it admits to the limit at allocation "
        "(memory: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; fixed: the SM cap), else 0 (advice); "
        "the node label metagpu.io/enforces says the same.",
        labels=("limit",),
    )
    for limit in ENFORCED_WHEN_SUPERVISED:
        enforced.add_metric((limit,), 1 if limit in snapshot.enforces else 0)
    yield from (info, enforced)
    if mps.mode != "supervised" or mps.status is None:
        return
    up = GaugeMetricFamily(
        f"{PREFIX}_mps_daemon_up",
        "1 while the supervised MPS control daemon answers; 0 while it is starting, down "
        "or restarting (its GPUs are then withdrawn, check mps).",
        labels=("state",),
    )
    up.add_metric((mps.status.state,), 1 if mps.status.state == "up" else 0)
    restarts = CounterMetricFamily(
        f"{PREFIX}_mps_daemon_restarts",
        "Restarts of the supervised MPS control daemon since the device plugin started.",
    )
    restarts.add_metric((), mps.status.restarts)
    yield from (up, restarts)


def build_families(snapshot: Snapshot) -> Iterator[Metric]:
    """The per-GPU and per-container gauge families for one snapshot."""

    def gauge(name: str, doc: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)

    units_total = gauge("gpu_units_total", "Meta-device units the GPU is split into.", GPU_LABELS)
    units_alloc = gauge(
        "gpu_units_allocated", "Units the kubelet has assigned to containers.", GPU_LABELS
    )
    mem_total = gauge("gpu_memory_total_bytes", "GPU framebuffer memory.", GPU_LABELS)
    mem_used = gauge(
        "gpu_memory_used_bytes", "GPU memory in use, by any process or the driver.", GPU_LABELS
    )
    unattributed = gauge(
        "gpu_memory_unattributed_bytes",
        "GPU memory used by host processes, unknown containers or the driver.",
        GPU_LABELS,
    )
    util = gauge(
        "gpu_utilization_ratio", "SM utilisation over the driver's last sample (0-1).", GPU_LABELS
    )
    healthy = gauge(
        "gpu_healthy",
        "1 if the device plugin advertises the GPU Healthy (its published health board), "
        "else 0; without a board, 1 if the GPU was discovered and read this cycle.",
        GPU_LABELS,
    )
    health_info = gauge(
        "gpu_health_info",
        "Always 1: the GPU's health record, with state (Healthy/Unhealthy), check (which "
        "check withdrew it: xid, ecc, lost, driver, discovery, volatile-ecc, row-remap, "
        "retired-pages; empty while Healthy) and reason (what to do), as mgctl shows it.",
        (*GPU_LABELS, "state", "check", "reason"),
    )
    liveness = CounterMetricFamily(
        f"{PREFIX}_gpu_liveness_checks",
        "Liveness polls of the GPU by the device plugin since it started, by result "
        "(ok, failed); a failed poll withdraws the GPU.",
        labels=(*GPU_LABELS, "result"),
    )
    procs = gauge("gpu_processes", "Compute processes on the GPU.", GPU_LABELS)
    units_free = gauge(
        "gpu_units_free",
        "Units a new share could get: 0 on a GPU another device plugin hands out.",
        GPU_LABELS,
    )
    foreign = gauge(
        "gpu_foreign_claim",
        "1 per other resource that advertises or holds this GPU (another device plugin); "
        "on a GPU with a metagpu resource, its units are withdrawn.",
        (*GPU_LABELS, "other_resource"),
    )
    advertised = gauge(
        "gpu_units_advertised",
        "Units of the GPU the kubelet lists as allocatable for its metagpu resource: 0 "
        "while the device plugin is not registered with the kubelet or withdrew the GPU.",
        GPU_LABELS,
    )
    per_gpu_procs: dict[str, int] = {}
    for p in snapshot.processes:
        per_gpu_procs[p.gpu_uuid] = per_gpu_procs.get(p.gpu_uuid, 0) + 1
    for g in snapshot.gpus:
        values: tuple[str, ...] = (g.uuid, str(g.index), g.name, g.resource or "")
        units_total.add_metric(values, g.units_total)
        units_alloc.add_metric(values, g.units_allocated)
        mem_total.add_metric(values, g.memory_total_mib * MIB)
        if g.memory_used_mib is not None:
            mem_used.add_metric(values, g.memory_used_mib * MIB)
            unattributed.add_metric(values, g.unattributed_memory_mib * MIB)
        if g.utilization_percent is not None:
            util.add_metric(values, g.utilization_percent / 100)
        healthy.add_metric(values, 1 if g.healthy else 0)
        state = g.health.state if g.health else ("Healthy" if g.healthy else "Unhealthy")
        reason = g.health.reason if g.health else ("" if g.healthy else g.problem or "")
        check = g.health.check if g.health else ""
        health_info.add_metric((*values, state, check, reason), 1)
        if g.liveness is not None:
            liveness.add_metric((*values, "ok"), g.liveness[0])
            liveness.add_metric((*values, "failed"), g.liveness[1])
        if g.processes_known:
            procs.add_metric(values, per_gpu_procs.get(g.uuid, 0))
        units_free.add_metric(values, g.units_free)
        if g.units_advertised is not None and g.resource is not None:
            advertised.add_metric(values, g.units_advertised)
        for other in g.claim.resources if g.claim is not None else ():
            foreign.add_metric((*values, other), 1)
    yield from (units_total, units_alloc, mem_total, mem_used, unattributed, util, healthy, procs)
    yield from (health_info, liveness, units_free, foreign, advertised)
    yield from mps_families(snapshot)

    c_units = gauge("container_units", "Units of the GPU the container holds.", CONTAINER_LABELS)
    c_limit = gauge(
        "container_memory_limit_bytes",
        "GPU memory the container's share allows: units / units per GPU x GPU memory "
        "(a DRA share: the memory its claim was charged, from its CDI spec).",
        CONTAINER_LABELS,
    )
    c_used = gauge(
        "container_memory_used_bytes",
        "GPU memory the container's processes hold on the GPU.",
        CONTAINER_LABELS,
    )
    c_util = gauge(
        "container_utilization_ratio",
        "SM utilisation of the container's processes on the GPU (0-1), when known.",
        CONTAINER_LABELS,
    )
    c_procs = gauge(
        "container_processes", "The container's compute processes on the GPU.", CONTAINER_LABELS
    )
    c_over = gauge(
        "container_memory_over_limit",
        "1 while the container uses more GPU memory than its share allows.",
        CONTAINER_LABELS,
    )
    c_sm = gauge(
        "container_sm_limit_ratio",
        "The SM cap of a fixed container's share (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE / 100, "
        "plugin.api.limits); absent for balance and none, which have no cap.",
        CONTAINER_LABELS,
    )
    c_enforced = gauge(
        "container_limit_enforced",
        "1 where the node holds the container to the limit at allocation (a supervised MPS "
        "daemon), 0 where it is advice (memory: the agent reports or kills after the fact; "
        "sm: nothing caps it). limit is memory or sm (sm only for fixed containers).",
        (*CONTAINER_LABELS, "limit"),
    )
    c_peak = gauge(
        "container_memory_peak_bytes",
        "Peak GPU memory of the container's processes on the GPU over the agent's "
        "right-sizing window (agent.rightsizing_window_s; in memory, so it restarts with "
        "the agent: see container_rightsizing_covered_seconds).",
        CONTAINER_LABELS,
    )
    c_recommended = gauge(
        "container_recommended_units",
        "The share the container needs on the GPU: its window's peak memory plus 10%, in "
        "whole units (plugin.api.rightsizing, as metagpu:container_recommended_units:1d).",
        CONTAINER_LABELS,
    )
    c_covered = gauge(
        "container_rightsizing_covered_seconds",
        "How much of the right-sizing window the peak covers: less than the window after "
        "the agent restarted or for a younger share.",
        CONTAINER_LABELS,
    )
    enforces = snapshot.enforces
    for s in snapshot.shares:
        values = (
            s.key.namespace,
            s.key.pod,
            s.key.container,
            s.gpu_uuid,
            str(s.gpu_index),
            s.resource,
        )
        c_units.add_metric(values, s.units)
        if s.allocated:
            c_limit.add_metric(values, s.memory_limit_mib * MIB)
            c_over.add_metric(values, 1 if s.over_limit else 0)
            c_enforced.add_metric((*values, "memory"), 1 if "memory" in enforces else 0)
            cap = s.thread_percentage
            if cap is not None:
                c_sm.add_metric(values, cap / 100)
                c_enforced.add_metric((*values, "sm"), 1 if "fixed" in enforces else 0)
        c_used.add_metric(values, s.memory_used_mib * MIB)
        if s.utilization_percent is not None:
            c_util.add_metric(values, s.utilization_percent / 100)
        c_procs.add_metric(values, len(s.pids))
        peak = snapshot.peak_of(s) if s.allocated else None
        if peak is not None:
            c_peak.add_metric(values, peak.memory_peak_mib * MIB)
            c_recommended.add_metric(values, peak.recommended_units)
            c_covered.add_metric(values, peak.covered_s)
    yield from (c_units, c_limit, c_used, c_util, c_procs, c_over, c_sm, c_enforced)
    yield from (c_peak, c_recommended, c_covered)

    conflict = gauge(
        "share_conflict",
        "Units our container holds on a GPU that another resource's container holds too "
        "(both pods named); any series here means one GPU has two owners.",
        (*CONTAINER_LABELS, "other_resource", "other_namespace", "other_pod", "other_container"),
    )
    for c in snapshot.conflicts:
        s, o = c.share, c.other
        conflict.add_metric(
            (
                s.key.namespace,
                s.key.pod,
                s.key.container,
                s.gpu_uuid,
                str(s.gpu_index),
                s.resource,
                o.resource,
                o.namespace,
                o.pod,
                o.container,
            ),
            s.units,
        )
    yield conflict

    unresolved = gauge(
        "share_unresolved",
        "1 for each claim device of the DRA driver the agent cannot account for (no CDI "
        "spec for it, a GPU not on this node, ...): that container has no share metrics, "
        "no showback and no enforcement on it. mgctl names the reason.",
        ("namespace", "pod", "container", "claim", "device"),
    )
    for u in snapshot.unresolved:
        unresolved.add_metric((u.key.namespace, u.key.pod, u.key.container, u.claim, u.device), 1)
    yield unresolved
