"""The alert rules (chart/rules/metagpu-alerts.yaml) under real promtool.

``promtool check rules`` parses every expression and template; ``promtool test
rules`` runs tests/monitoring/alerts_test.yaml, where every alert has a case
that fires (labels and rendered annotations checked) and one that does not.
Without promtool these tests skip and say how to install it (`make tools`).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from tests.monitoring.catalog import (
    PROMTOOL_MISSING,
    REPO_ROOT,
    RULES_FILE,
    exported_series,
    promtool,
    unknown_names,
)

TESTS_FILE: Final = Path(__file__).with_name("alerts_test.yaml")
RUNBOOK: Final = REPO_ROOT / "docs" / "monitoring.md"
RUNBOOK_PREFIX: Final = "https://github.com/metagpu/metagpu/blob/main/docs/monitoring.md#"


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = promtool()
    if tool is None:
        pytest.skip(PROMTOOL_MISSING)
    return subprocess.run([tool, *args], capture_output=True, text=True, check=False, timeout=120)


def test_promtool_check_rules_accepts_the_rules_file() -> None:
    result = run_promtool("check", "rules", str(RULES_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_promtool_unit_tests_of_every_alert_pass() -> None:
    result = run_promtool("test", "rules", str(TESTS_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_fail_when_an_alert_does_not_do_what_they_expect(
    tmp_path: Path,
) -> None:
    # The unit tests can fail: the same cases against rules whose threshold moved.
    broken = RULES_FILE.read_text().replace(
        "metagpu_container_memory_over_limit == 1", "metagpu_container_memory_over_limit == 2"
    )
    assert broken != RULES_FILE.read_text()
    (tmp_path / "rules.yaml").write_text(broken)
    cases = yaml.safe_load(TESTS_FILE.read_text())
    cases["rule_files"] = [str(tmp_path / "rules.yaml")]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(cases))
    result = run_promtool("test", "rules", str(tmp_path / "tests.yaml"))
    assert result.returncode != 0
    assert "MetagpuContainerOverMemoryShare" in result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    cases = yaml.safe_load(TESTS_FILE.read_text())["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in cases:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - firing == set(), "alerts no test sees firing"
    assert names - quiet == set(), "alerts no test sees quiet"
    assert (firing | quiet) - names == set(), "tests of alerts that do not exist"


def test_every_firing_case_checks_the_rendered_annotations() -> None:
    cases = yaml.safe_load(TESTS_FILE.read_text())["tests"]
    for case in cases:
        for check in case.get("alert_rule_test", []):
            for expected in check.get("exp_alerts") or []:
                assert set(expected.get("exp_annotations", {})) == {
                    "summary",
                    "description",
                    "runbook_url",
                }, (case["name"], check["alertname"])


@pytest.mark.parametrize("rule", alerts(), ids=lambda r: r["alert"])
def test_alert_reads_only_metrics_and_labels_we_export(rule: dict[str, Any]) -> None:
    assert unknown_names(rule["expr"], exported_series()) == []


def test_the_name_check_catches_a_renamed_metric_or_label() -> None:
    exported = exported_series()
    assert unknown_names("metagpu_gpu_units_totl > 0", exported) == [
        "metric metagpu_gpu_units_totl"
    ]
    assert unknown_names('metagpu_gpu_healthy{gpu="x"} == 0', exported) == [
        "label gpu of metagpu_gpu_healthy"
    ]
    assert unknown_names("sum by (pod) (metagpu_gpu_units_total)", exported) == [
        "grouping label pod"
    ]


@pytest.mark.parametrize("rule", alerts(), ids=lambda r: r["alert"])
def test_alert_has_a_severity_and_a_runbook_section(rule: dict[str, Any]) -> None:
    assert rule["labels"]["severity"] in {"critical", "warning", "info"}
    url = rule["annotations"]["runbook_url"]
    assert url.startswith(RUNBOOK_PREFIX)
    anchor = url.removeprefix(RUNBOOK_PREFIX)
    headings = re.findall(r"^#+ (.+)$", RUNBOOK.read_text(), flags=re.MULTILINE)
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}
    assert anchor in anchors, f"docs/monitoring.md has no section for #{anchor}"
