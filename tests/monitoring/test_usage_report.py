"""``metagpu usage``: the pure report (metagpu.usage) and the command against a real Prometheus.

The real server reads blocks that ``promtool tsdb create-blocks-from openmetrics``
wrote from a known history (backfill), so the figures are exact and the test
waits for nothing but the server's readiness: four pods hold 25 units each of
one GPU for the whole hour, a pod of another namespace half a GPU for the last
half hour, and kube-state-metrics' owners name their workloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest
import yaml

from metagpu.usage import (
    UsageError,
    UsageRow,
    Window,
    build_recommendations,
    gpu_hours_query,
    merge_gpu_hours,
    parse_duration_s,
    recommended_units,
    render_usage,
)
from tests.monitoring.catalog import (
    PROMETHEUS_MISSING,
    PROMTOOL_MISSING,
    exported_series,
    prometheus,
    promtool,
    unknown_names,
)
from tests.monitoring.test_prometheus_integration import free_port
from tests.webhook.waiting import eventually

GPU: Final = 'instance="n1:9400",job="agent",node="n1",gpu_uuid="GPU-0",gpu_index="0"'
OWNERS: Final = {
    ("ml", "a"): ("ReplicaSet", "trainer-7d9"),
    ("ml", "b"): ("ReplicaSet", "trainer-7d9"),
    ("ml", "c"): ("Job", "eval"),
    ("ml", "d"): ("Job", "eval"),
    ("team", "x"): ("StatefulSet", "x"),
}


# ------------------------------------------------------------------ pure
def test_durations() -> None:
    assert parse_duration_s("30d") == 30 * 86400
    assert parse_duration_s("1h30m") == 5400
    for bad in ("", "30", "d", "1.5h", "-1h", "0m"):
        with pytest.raises(UsageError):
            parse_duration_s(bad)


def test_the_window_ends_on_a_step_and_counts_exactly_its_steps() -> None:
    window = Window.ending(seconds=3600, step_s=60, at_s=1_700_000_123.9)
    assert window.end_s == 1_700_000_100
    assert window.subquery == "[3599999ms:60s]"
    with pytest.raises(UsageError):
        Window.ending(seconds=90, step_s=60, at_s=0)


@pytest.mark.parametrize(
    ("peak", "units_per_gpu", "want"),
    [(0.2, 100, 22), (0.0, 100, 1), (0.95, 100, 100), (1.0, 100, 100), (0.5, 8, 5)],
)
def test_recommended_units_are_whole_units_from_peak_memory_plus_headroom(
    peak: float, units_per_gpu: int, want: int
) -> None:
    # The same cases as the recording rule's (tests/monitoring/usage_test.yaml).
    assert recommended_units(memory_peak=peak, units_per_gpu=units_per_gpu) == want


def test_every_query_names_only_what_we_export() -> None:
    window = Window.ending(seconds=86400, step_s=60, at_s=0)
    exported = exported_series()
    for kind in ("allocated", "memory", "sm"):
        for by in ("namespace", "pod", "container", "node", "gpu-model"):
            query = gpu_hours_query(kind, group_by=by, window=window)
            assert unknown_names(query, exported) == [], query


def test_rows_merge_by_group_and_the_table_has_a_total() -> None:
    def sample(ns: str, value: float) -> dict[str, Any]:
        return {"metric": {"namespace": ns}, "value": [0, str(value)]}

    rows = merge_gpu_hours(
        "namespace",
        {
            "allocated": [sample("ml", 1.0), sample("team", 0.25)],
            "memory": [sample("ml", 0.2)],
            "sm": [],
        },
    )
    assert rows == [
        UsageRow((("namespace", "ml"),), allocated=1.0, memory=0.2),
        UsageRow((("namespace", "team"),), allocated=0.25),
    ]
    table = render_usage(rows, group_by="namespace", window_text="1h", fmt="table").splitlines()
    assert table[0].split() == [
        "NAMESPACE",
        "GPU-H",
        "ALLOCATED",
        "GPU-H",
        "MEMORY",
        "USED",
        "GPU-H",
        "SM",
        "USED",
    ]
    assert table[1].split() == ["ml", "1.000", "0.200", "0.000"]
    assert table[-1].split() == ["TOTAL", "1.250", "0.200", "0.000"]


def test_a_container_without_units_gets_no_recommendation() -> None:
    key = {"namespace": "ml", "pod": "p", "container": "c", "instance": "i", "gpu_uuid": "G"}
    answers = {
        "units": [{"metric": key, "value": [0, "0"]}],
        "memory_peak": [{"metric": key, "value": [0, "0.5"]}],
        "units_per_gpu": [{"metric": {"instance": "i", "gpu_uuid": "G"}, "value": [0, "100"]}],
    }
    assert build_recommendations(answers) == []


# ------------------------------------------------------------------ a real server
def openmetrics(end_s: int) -> str:
    lines = ["# TYPE metagpu_gpu_units_total gauge"]
    minutes = range(end_s - 70 * 60, end_s + 1, 60)
    lines += [f'metagpu_gpu_units_total{{{GPU},gpu_model="A100"}} 100 {t}' for t in minutes]
    lines.append("# TYPE metagpu_gpu_memory_total_bytes gauge")
    lines += [f'metagpu_gpu_memory_total_bytes{{{GPU},gpu_model="A100"}} 1000 {t}' for t in minutes]
    hour = range(end_s - 59 * 60, end_s + 1, 60)  # 60 one-minute samples ending at end_s
    half = range(end_s - 29 * 60, end_s + 1, 60)  # 30
    shares = [(f"ml/{p}", 25, hour) for p in "abcd"] + [("team/x", 50, half)]
    for family, value_of in (
        ("metagpu_container_units", lambda units, i: units),
        # ml/a uses 10% of the memory, 20% once; the others 10%.
        ("metagpu_container_memory_used_bytes", lambda units, i: 200 if i == 30 else 100),
        ("metagpu_container_utilization_ratio", lambda units, i: 0.5),
    ):
        lines.append(f"# TYPE {family} gauge")
        for name, units, times in shares:
            ns, pod = name.split("/")
            labels = (
                f'{GPU},namespace="{ns}",pod="{pod}",container="main",resource="cnvrg.io/metagpu"'
            )
            peaks = pod == "a"
            lines += [
                f"{family}{{{labels}}} {value_of(units, i if peaks else -1)} {t}"
                for i, t in enumerate(times)
            ]
    lines.append("# TYPE kube_pod_owner gauge")
    for (ns, pod), (kind, owner) in OWNERS.items():
        labels = f'namespace="{ns}",pod="{pod}",owner_kind="{kind}",owner_name="{owner}"'
        lines += [f"kube_pod_owner{{{labels}}} 1 {t}" for t in minutes]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def backfilled_prometheus(work: Path, end_s: int) -> Iterator[str]:
    server, tool = prometheus(), promtool()
    if server is None:
        pytest.skip(PROMETHEUS_MISSING)
    if tool is None:
        pytest.skip(PROMTOOL_MISSING)
    work.mkdir()
    (work / "history.om").write_text(openmetrics(end_s))
    subprocess.run(
        [
            tool,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(work / "history.om"),
            str(work / "data"),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (work / "prometheus.yml").write_text(yaml.safe_dump({"global": {"scrape_interval": "1m"}}))
    port = free_port()
    proc = subprocess.Popen(
        [
            server,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(work / "prometheus.log").open("w"),
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def metagpu_usage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "metagpu.cli", "usage", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    # Two hours back: the blocks are older than anything the server's head holds.
    end_s = (int(time.time()) // 60) * 60 - 2 * 3600
    with backfilled_prometheus(tmp_path_factory.mktemp("prometheus") / "p", end_s) as url:

        async def ready() -> bool:
            try:
                async with aiohttp.ClientSession() as session:
                    query = {"query": "count(metagpu_container_units)", "time": str(end_s)}
                    async with session.get(f"{url}/api/v1/query", params=query) as resp:
                        if resp.status != 200:  # 503 while the server starts
                            return False
                        body = await resp.json()
                return bool(body["data"]["result"])
            except aiohttp.ClientConnectionError:
                return False

        asyncio.run(eventually(ready, timeout_s=30))
        yield url, end_s


def test_four_quarter_shares_for_an_hour_are_one_gpu_hour(history: tuple[str, int]) -> None:
    url, end_s = history
    result = metagpu_usage("--prometheus", url, "--window", "1h", "--end", str(end_s), "-o", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["kind"] == "GpuUsage"
    items = {i["namespace"]: i for i in report["items"]}
    assert items["ml"]["gpuHoursAllocated"] == pytest.approx(1.0, abs=1e-12)
    assert items["team"]["gpuHoursAllocated"] == pytest.approx(0.25, abs=1e-12)
    # ml/a used 10% of the memory (20% for one minute); b, c, d 10% each.
    assert items["ml"]["gpuHoursMemoryUsed"] == pytest.approx((0.1 * 60 * 4 + 0.1) / 60)
    assert items["ml"]["gpuHoursSmUsed"] == pytest.approx(2.0)


def test_by_workload_joins_kube_state_metrics_owners_as_csv(history: tuple[str, int]) -> None:
    url, end_s = history
    result = metagpu_usage(
        "--prometheus", url, "--window", "1h", "--end", str(end_s), "--by", "workload", "-o", "csv"
    )
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    got = {(r["namespace"], r["owner_kind"], r["owner_name"]): r for r in rows}
    assert float(got[("ml", "ReplicaSet", "trainer-7d9")]["gpu_hours_allocated"]) == pytest.approx(
        0.5
    )
    assert float(got[("ml", "Job", "eval")]["gpu_hours_allocated"]) == pytest.approx(0.5)
    assert float(got[("team", "StatefulSet", "x")]["gpu_hours_allocated"]) == pytest.approx(0.25)


def test_rightsize_recommends_whole_units_with_the_evidence(history: tuple[str, int]) -> None:
    url, end_s = history
    result = metagpu_usage(
        "--prometheus", url, "--window", "1h", "--end", str(end_s), "--rightsize", "-o", "json"
    )
    assert result.returncode == 0, result.stderr
    items = {(i["namespace"], i["pod"]): i for i in json.loads(result.stdout)["items"]}
    a, x = items[("ml", "a")], items[("team", "x")]
    assert (a["units"], a["recommendedUnits"]) == (25, 22)  # peak 20% + 10%
    assert a["memoryPeak"] == pytest.approx(0.2)
    assert a["memoryP95"] == pytest.approx(0.1)
    assert a["smPeak"] == pytest.approx(0.5)
    assert (x["units"], x["recommendedUnits"]) == (50, 11)  # 10% + 10%
    table = metagpu_usage(
        "--prometheus", url, "--window", "1h", "--end", str(end_s), "--rightsize"
    ).stdout.splitlines()
    assert table[0].split()[:6] == ["NAMESPACE", "POD", "CONTAINER", "NODE", "GPU", "UNITS"]
    assert table[1].split()[:7] == ["team", "x", "main", "n1", "0", "50", "11"]  # biggest excess


def test_an_unreachable_prometheus_is_a_clear_failure() -> None:
    result = metagpu_usage("--prometheus", f"http://127.0.0.1:{free_port()}", "--window", "1h")
    assert result.returncode == 1
    assert "cannot reach Prometheus at http://127.0.0.1:" in result.stderr


def test_a_window_that_is_not_whole_steps_is_a_usage_error() -> None:
    result = metagpu_usage("--window", "90s", "--step", "1m")
    assert result.returncode == 2
    assert "whole number of steps" in result.stderr
