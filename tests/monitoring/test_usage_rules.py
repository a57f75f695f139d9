"""The usage and right-sizing recording rules (chart/rules/metagpu-usage.yaml) under promtool.

tests/monitoring/usage_test.yaml holds the arithmetic: four 25% shares for an
hour are one GPU-hour, half a GPU for half an hour a quarter, memory and SM
used add up the same way, and the recommended share is whole units between 1
and the whole GPU.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from tests.monitoring.catalog import (
    PROMTOOL_MISSING,
    USAGE_RULES_FILE,
    exported_series,
    promtool,
    unknown_names,
)

TESTS_FILE: Final = Path(__file__).with_name("usage_test.yaml")


def groups() -> list[dict[str, Any]]:
    return yaml.safe_load(USAGE_RULES_FILE.read_text())["groups"]  # type: ignore[no-any-return]


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = promtool()
    if tool is None:
        pytest.skip(PROMTOOL_MISSING)
    return subprocess.run([tool, *args], capture_output=True, text=True, check=False, timeout=120)


def test_promtool_check_rules_accepts_the_usage_rules() -> None:
    result = run_promtool("check", "rules", str(USAGE_RULES_FILE))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_of_the_usage_rules_pass() -> None:
    result = run_promtool("test", "rules", str(TESTS_FILE))
    assert result.returncode == 0, result.stdout + result.stderr


def test_gpu_hours_are_one_minute_samples_over_sixty() -> None:
    # The "/ 60" of every GPU-hours rule holds only while its group runs every minute.
    (usage,) = [g for g in groups() if g["name"] == "metagpu-usage"]
    assert usage["interval"] == "1m"
    hours = [r for r in usage["rules"] if "_hours:" in r["record"]]
    assert hours
    assert all(r["expr"].rstrip().endswith("/ 60") for r in hours)


def test_every_rule_reads_only_metrics_and_labels_we_export() -> None:
    recorded = {r["record"] for g in groups() for r in g["rules"]}
    exported = exported_series()
    problems = {}
    for group in groups():
        for rule in group["rules"]:
            # Recording rules may read one another; everything else must be exported.
            expr = rule["expr"]
            for name in recorded:
                expr = expr.replace(name, "metagpu_container_units")
            if unknown := unknown_names(expr, exported):
                problems[rule["record"]] = unknown
    assert problems == {}
