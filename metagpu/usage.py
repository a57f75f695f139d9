"""Who used how much of the GPUs, and which shares are too big: queries and report.

The pure half of ``metagpu usage`` (:mod:`metagpu.usage_cli` talks to
Prometheus): PromQL for GPU-hours over a window, grouped by namespace, pod,
container, workload, node or GPU model; the right-sizing evidence per
container; the recommendation; and the table, CSV and JSON renderings.

GPU-hours are fractions of one GPU summed over the window at a fixed step,
the same arithmetic as the recording rules in chart/rules/metagpu-usage.yaml,
but over the raw series, so the report works without those rules installed:

    sum_over_time(<fraction>[window - 1ms : step]) * step_s / 3600

The window is one millisecond short of a whole number of steps and the end is
a multiple of the step, so exactly ``window / step`` steps count whether
Prometheus closes the range on the left (2.x) or not (3.x): four 25% shares
held over a one-hour window are one GPU-hour, not 61/60 of one.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from plugin.api.rightsizing import HEADROOM as HEADROOM  # noqa: PLC0414 - re-exported
from plugin.api.rightsizing import recommended_units as recommended_units  # noqa: PLC0414

GroupBy = Literal["namespace", "pod", "container", "workload", "node", "gpu-model"]
GROUP_LABELS: Final[dict[GroupBy, tuple[str, ...]]] = {
    "namespace": ("namespace",),
    "pod": ("namespace", "pod"),
    "container": ("namespace", "pod", "container"),
    "workload": ("namespace", "owner_kind", "owner_name"),
    "node": ("node",),
    "gpu-model": ("gpu_model",),
}
Kind = Literal["allocated", "memory", "sm"]
KINDS: Final[tuple[Kind, ...]] = ("allocated", "memory", "sm")
OutputFormat = Literal["table", "csv", "json"]

FRACTIONS: Final[dict[Kind, str]] = {
    "allocated": (
        "metagpu_container_units / on (instance, gpu_uuid) group_left (gpu_model) "
        "(metagpu_gpu_units_total > 0)"
    ),
    "memory": (
        "metagpu_container_memory_used_bytes / on (instance, gpu_uuid) group_left (gpu_model) "
        "(metagpu_gpu_memory_total_bytes > 0)"
    ),
    "sm": (
        "metagpu_container_utilization_ratio * on (instance, gpu_uuid) group_left (gpu_model) "
        "(metagpu_gpu_memory_total_bytes * 0 + 1)"
    ),
}
"""Per container and GPU, a fraction of that GPU (0-1): its share, its memory, its SM."""

OWNER_JOIN: Final = (
    " * on (namespace, pod) group_left (owner_kind, owner_name) "
    "max by (namespace, pod, owner_kind, owner_name) (kube_pod_owner)"
)
"""kube-state-metrics' pod owner, for ``--by workload``."""

_DURATION: Final = re.compile(r"([0-9]+)([smhdw])")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class UsageError(Exception):
    """A report that cannot be made: bad arguments or an answer Prometheus refused."""


def parse_duration_s(text: str) -> int:
    """``30d``, ``12h``, ``90m``, ``1w2d`` → seconds."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise UsageError(f"not a duration (e.g. 30d, 12h, 90m): {text!r}")
    seconds = sum(int(n) * _UNIT_S[u] for n, u in parts)
    if seconds <= 0:
        raise UsageError(f"a duration must be positive: {text!r}")
    return seconds


@dataclass(frozen=True)
class Window:
    """``seconds`` ending at ``end_s`` (a multiple of ``step_s``), sampled every ``step_s``."""

    seconds: int
    step_s: int
    end_s: int

    @classmethod
    def ending(cls, *, seconds: int, step_s: int, at_s: float) -> Window:
        """The window that ends at the last step at or before ``at_s``."""
        if step_s <= 0:
            raise UsageError(f"the step must be positive: {step_s} s")
        if seconds % step_s:
            raise UsageError(
                f"the window ({seconds} s) must be a whole number of steps ({step_s} s)"
            )
        return cls(seconds=seconds, step_s=step_s, end_s=int(at_s // step_s) * step_s)

    @property
    def subquery(self) -> str:
        """``[window - 1ms : step]``: exactly ``seconds / step_s`` steps (module docstring)."""
        return f"[{self.seconds * 1000 - 1}ms:{self.step_s}s]"


def gpu_hours_query(kind: Kind, *, group_by: GroupBy, window: Window) -> str:
    """GPU-hours of ``kind`` per group over ``window``."""
    fraction = FRACTIONS[kind]
    if group_by == "workload":
        fraction = f"({fraction}){OWNER_JOIN}"
    labels = ", ".join(GROUP_LABELS[group_by])
    return (
        f"sum by ({labels}) (sum_over_time(({fraction}){window.subquery})) * {window.step_s} / 3600"
    )


@dataclass(frozen=True)
class UsageRow:
    """One group's GPU-hours over the window."""

    labels: tuple[tuple[str, str], ...]
    allocated: float = 0.0
    memory: float = 0.0
    sm: float = 0.0


def merge_gpu_hours(
    group_by: GroupBy, results: Mapping[Kind, Sequence[Mapping[str, Any]]]
) -> list[UsageRow]:
    """Rows from the three queries' vectors (Prometheus' ``result`` lists), largest first."""
    names = GROUP_LABELS[group_by]
    values: dict[tuple[tuple[str, str], ...], dict[Kind, float]] = {}
    for kind, vector in results.items():
        for sample in vector:
            key = tuple((n, str(sample["metric"].get(n, ""))) for n in names)
            values.setdefault(key, {})[kind] = float(sample["value"][1])
    rows = [UsageRow(key, **found) for key, found in values.items()]
    return sorted(rows, key=lambda r: (-r.allocated, r.labels))


# ----------------------------------------------------------------- right-sizing
EVIDENCE: Final[dict[str, str]] = {
    "memory_peak": "max_over_time(({memory}){subquery})",
    "memory_p95": "quantile_over_time(0.95, ({memory}){subquery})",
    "sm_peak": "max_over_time(({sm}){subquery})",
    "sm_p95": "quantile_over_time(0.95, ({sm}){subquery})",
    "units": "max_over_time(metagpu_container_units[{seconds}s])",
}
UNITS_PER_GPU_QUERY: Final = (
    "max by (instance, gpu_uuid) (max_over_time(metagpu_gpu_units_total[{seconds}s]))"
)
SHARE_KEY: Final = ("namespace", "pod", "container", "instance", "gpu_uuid")


def evidence_queries(window: Window) -> dict[str, str]:
    """The right-sizing queries by name, for ``window``."""
    fill = {
        "memory": FRACTIONS["memory"],
        "sm": FRACTIONS["sm"],
        "subquery": window.subquery,
        "seconds": str(window.seconds),
    }
    queries = {name: template.format(**fill) for name, template in EVIDENCE.items()}
    queries["units_per_gpu"] = UNITS_PER_GPU_QUERY.format(**fill)
    return queries


@dataclass(frozen=True)
class Recommendation:
    """One container's share of one GPU, what it used, and the share it needs."""

    namespace: str
    pod: str
    container: str
    node: str
    gpu: str
    gpu_model: str
    units: int
    units_per_gpu: int
    recommended: int
    memory_peak: float
    memory_p95: float
    sm_peak: float | None
    sm_p95: float | None

    @property
    def excess(self) -> int:
        """Units held beyond the recommendation (negative: it needs more)."""
        return self.units - self.recommended


def build_recommendations(
    results: Mapping[str, Sequence[Mapping[str, Any]]],
) -> list[Recommendation]:
    """Join the :func:`evidence_queries` answers per container and GPU; biggest excess first."""

    def keyed(name: str) -> dict[tuple[str, ...], tuple[dict[str, str], float]]:
        return {
            tuple(str(s["metric"].get(k, "")) for k in SHARE_KEY): (
                s["metric"],
                float(s["value"][1]),
            )
            for s in results.get(name, ())
        }

    per_gpu = {
        (str(s["metric"].get("instance", "")), str(s["metric"].get("gpu_uuid", ""))): int(
            float(s["value"][1])
        )
        for s in results.get("units_per_gpu", ())
    }
    units, peaks = keyed("units"), keyed("memory_peak")
    p95s, sm_peaks, sm_p95s = keyed("memory_p95"), keyed("sm_peak"), keyed("sm_p95")
    found = []
    for key, (metric, held) in units.items():
        upg = per_gpu.get((key[3], key[4]))
        if not upg or held <= 0 or key not in peaks:
            continue  # not a share (no units), or no memory reading in the window
        labels, peak = peaks[key]
        found.append(
            Recommendation(
                namespace=key[0],
                pod=key[1],
                container=key[2],
                node=str(metric.get("node", "")),
                gpu=str(metric.get("gpu_index", key[4])),
                gpu_model=str(labels.get("gpu_model", "")),
                units=int(held),
                units_per_gpu=upg,
                recommended=recommended_units(memory_peak=peak, units_per_gpu=upg),
                memory_peak=peak,
                memory_p95=p95s[key][1] if key in p95s else peak,
                sm_peak=sm_peaks[key][1] if key in sm_peaks else None,
                sm_p95=sm_p95s[key][1] if key in sm_p95s else None,
            )
        )
    return sorted(found, key=lambda r: (-r.excess, r.namespace, r.pod, r.container, r.gpu))


# ----------------------------------------------------------------- rendering
def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = [list(header), *map(list, rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _csv(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue().rstrip("\n")


def render_usage(
    rows: Sequence[UsageRow], *, group_by: GroupBy, window_text: str, fmt: OutputFormat
) -> str:
    names = GROUP_LABELS[group_by]
    if fmt == "json":
        return json.dumps(
            {
                "kind": "GpuUsage",
                "window": window_text,
                "groupBy": group_by,
                "items": [
                    {
                        **dict(r.labels),
                        "gpuHoursAllocated": r.allocated,
                        "gpuHoursMemoryUsed": r.memory,
                        "gpuHoursSmUsed": r.sm,
                    }
                    for r in rows
                ],
            },
            indent=2,
        )
    header = [*names, "gpu_hours_allocated", "gpu_hours_memory_used", "gpu_hours_sm_used"]
    if fmt == "csv":
        return _csv(
            header, ([v for _, v in r.labels] + [r.allocated, r.memory, r.sm] for r in rows)
        )
    title = [n.upper() for n in names] + ["GPU-H ALLOCATED", "GPU-H MEMORY USED", "GPU-H SM USED"]
    body = (
        [v or "-" for _, v in r.labels] + [f"{r.allocated:.3f}", f"{r.memory:.3f}", f"{r.sm:.3f}"]
        for r in rows
    )
    total = UsageRow(
        (),
        sum(r.allocated for r in rows),
        sum(r.memory for r in rows),
        sum(r.sm for r in rows),
    )
    footer = [
        "TOTAL",
        *([""] * (len(names) - 1)),
        f"{total.allocated:.3f}",
        f"{total.memory:.3f}",
        f"{total.sm:.3f}",
    ]
    return _table(title, [*body, footer])


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def render_recommendations(
    rows: Sequence[Recommendation], *, window_text: str, fmt: OutputFormat
) -> str:
    if fmt == "json":
        return json.dumps(
            {
                "kind": "ShareRecommendations",
                "window": window_text,
                "headroom": HEADROOM,
                "items": [
                    {
                        "namespace": r.namespace,
                        "pod": r.pod,
                        "container": r.container,
                        "node": r.node,
                        "gpu": r.gpu,
                        "gpuModel": r.gpu_model,
                        "units": r.units,
                        "unitsPerGpu": r.units_per_gpu,
                        "recommendedUnits": r.recommended,
                        "memoryPeak": r.memory_peak,
                        "memoryP95": r.memory_p95,
                        "smPeak": r.sm_peak,
                        "smP95": r.sm_p95,
                    }
                    for r in rows
                ],
            },
            indent=2,
        )
    header = [
        "namespace",
        "pod",
        "container",
        "node",
        "gpu",
        "units",
        "recommended_units",
        "memory_peak",
        "memory_p95",
        "sm_peak",
        "sm_p95",
    ]
    if fmt == "csv":
        return _csv(
            header,
            (
                [
                    *(r.namespace, r.pod, r.container, r.node, r.gpu, r.units, r.recommended),
                    *(r.memory_peak, r.memory_p95, r.sm_peak, r.sm_p95),
                ]
                for r in rows
            ),
        )
    return _table(
        [h.upper().replace("_", " ") for h in header],
        (
            [
                *(r.namespace, r.pod, r.container, r.node or "-", r.gpu, str(r.units)),
                *(str(r.recommended), _percent(r.memory_peak), _percent(r.memory_p95)),
                *(_percent(r.sm_peak), _percent(r.sm_p95)),
            ]
            for r in rows
        ),
    )
