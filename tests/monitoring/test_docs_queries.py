"""Every PromQL example in docs/monitoring.md parses (promtool) and names what we export.

Each ```promql block holds expressions, each after its own comment line.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Final

import pytest
import yaml

from tests.monitoring.catalog import (
    PROMTOOL_MISSING,
    REPO_ROOT,
    USAGE_RULES_FILE,
    exported_series,
    promtool,
    unknown_names,
)

DOC: Final = REPO_ROOT / "docs" / "monitoring.md"
FOREIGN: Final = {"kube_pod_owner"}
"""kube-state-metrics' series the examples join with, by name."""


def doc_queries() -> list[str]:
    queries: list[str] = []
    for block in re.findall(r"```promql\n(.*?)```", DOC.read_text(), flags=re.DOTALL):
        current: list[str] = []
        for line in block.splitlines():
            if line.startswith("#"):
                if current:
                    queries.append("\n".join(current))
                current = []
            elif line.strip():
                current.append(line)
        if current:
            queries.append("\n".join(current))
    return queries


def test_there_are_examples() -> None:
    assert len(doc_queries()) >= 5


def test_promtool_parses_every_example(tmp_path: Path) -> None:
    tool = promtool()
    if tool is None:
        pytest.skip(PROMTOOL_MISSING)
    rules = [{"record": f"doc:query_{i}", "expr": q} for i, q in enumerate(doc_queries())]
    path = tmp_path / "doc-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "doc", "rules": rules}]}))
    result = subprocess.run(
        [tool, "check", "rules", str(path)], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_example_names_only_what_we_export_or_record() -> None:
    recorded = {
        r["record"]
        for g in yaml.safe_load(USAGE_RULES_FILE.read_text())["groups"]
        for r in g["rules"]
    }
    for name in re.findall(r"metagpu:[a-z0-9_:]+", "\n".join(doc_queries())):
        assert name in recorded, name
    exported = exported_series()
    owner_labels = {"grouping label owner_kind", "grouping label owner_name"}
    for query in doc_queries():
        checked = query
        for name in recorded | FOREIGN:
            checked = checked.replace(name, "metagpu_container_units")
        # owner_kind and owner_name are kube_pod_owner's labels (replaced above).
        assert [p for p in unknown_names(checked, exported) if p not in owner_labels] == [], query
