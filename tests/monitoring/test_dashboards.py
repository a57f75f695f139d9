"""The Grafana dashboards (chart/dashboards/*.json) are well formed and query what we export.

Each query is checked twice: promtool parses it (every panel expression as a
recording rule of a generated rules file, Grafana's variables replaced by what
Grafana would send), and every metric and label it names is one the agent,
extender or webhook exports (tests.monitoring.catalog), so a renamed metric
fails here. The files are what scripts/gen_dashboards.py writes, and the chart
ships them unchanged.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from tests.install.chart import find, one, render
from tests.monitoring.catalog import (
    PROMTOOL_MISSING,
    REPO_ROOT,
    exported_series,
    promtool,
    unknown_names,
)

DASHBOARDS_DIR: Final = REPO_ROOT / "chart" / "dashboards"
FILES: Final = sorted(DASHBOARDS_DIR.glob("*.json"))
GRAFANA_VARIABLES: Final = {
    "$__rate_interval": "5m",
    "$node": ".*",
    "$gpu": ".*",
}
"""What Grafana puts in place of each variable (All is ``.*``, our allValue)."""


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable."""
    exprs = [
        (f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"])
        for p in panels(dashboard)
        for t in p.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["definition"])
            assert match, variable["definition"]
            exprs.append((f"variable {variable['name']}", match.group(1)))
    return exprs


def substitute(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"a Grafana variable the test does not know: {expr}"
    return expr


def test_there_are_a_cluster_and_a_node_dashboard() -> None:
    assert [p.name for p in FILES] == ["metagpu-cluster.json", "metagpu-node.json"]


def test_the_files_are_what_the_generator_writes() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "gen_dashboards.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_panel_ids_are_unique_and_panels_do_not_overlap(path: Path) -> None:
    dashboard = load(path)
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in panels(dashboard):
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24
        mine = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & mine, f"panel {panel['id']} overlaps another"
        cells |= mine


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_query_uses_the_datasource_variable(path: Path) -> None:
    dashboard = load(path)
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert (variable["name"], variable["query"]) == ("datasource", "prometheus")
    wanted = {"type": "prometheus", "uid": "${datasource}"}
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == wanted, panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target["datasource"] == wanted, panel["title"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert variable["datasource"] == wanted


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_query_reads_only_metrics_and_labels_we_export(path: Path) -> None:
    exported = exported_series()
    problems = {
        where: unknown
        for where, expr in expressions(load(path))
        if (unknown := unknown_names(expr, exported))
    }
    assert problems == {}


def rules_file(tmp_path: Path, exprs: list[tuple[str, str]]) -> Path:
    rules = [
        {"record": f"dashboard:query_{i}", "expr": substitute(expr)}
        for i, (_, expr) in enumerate(exprs)
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    return path


def check_rules(path: Path) -> subprocess.CompletedProcess[str]:
    tool = promtool()
    if tool is None:
        pytest.skip(PROMTOOL_MISSING)
    return subprocess.run(
        [tool, "check", "rules", str(path)], capture_output=True, text=True, check=False, timeout=60
    )


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_promtool_parses_every_query(path: Path, tmp_path: Path) -> None:
    exprs = expressions(load(path))
    result = check_rules(rules_file(tmp_path, exprs))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_the_parse_check_fails_on_a_broken_query(tmp_path: Path) -> None:
    result = check_rules(rules_file(tmp_path, [("broken", "sum by (node (metagpu_gpu_healthy)")]))
    assert result.returncode != 0


def test_the_chart_ships_the_files_unchanged_only_when_asked() -> None:
    assert find(render(), "ConfigMap", "metagpu-dashboards") == []
    values = {
        "monitoring": {
            "dashboards": {
                "enabled": True,
                "namespace": "grafana",
                "annotations": {"grafana_folder": "GPUs"},
            }
        }
    }
    config_map = one(render(values), "ConfigMap", "metagpu-dashboards")
    assert config_map["metadata"]["namespace"] == "grafana"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "GPUs"}
    assert config_map["data"] == {p.name: p.read_text().rstrip("\n") for p in FILES}
