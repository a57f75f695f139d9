"""docs/quotas.md shows what the code does: the companion, the warning, the defaults, Kueue."""

from __future__ import annotations

import re

import yaml

from tests.conftest import REPO_ROOT
from tests.webhook.quotas.builders import SETTINGS, quota
from webhook.config import QuotaMirrorConfig
from webhook.quotas.coverage import unmirrored_warning
from webhook.quotas.mirror import desired_companion

DOC = (REPO_ROOT / "docs" / "quotas.md").read_text()


def yaml_blocks() -> list[dict[str, object]]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC, flags=re.DOTALL)
    return [d for b in blocks for d in yaml.safe_load_all(b) if d]


def test_the_companion_shown_is_the_one_written() -> None:
    [shown] = [d for d in yaml_blocks() if d["kind"] == "ResourceQuota"]
    written = desired_companion(
        quota("gpus", {"requests.nvidia.com/gpu": "4"}, uid="<uid of gpus>"), SETTINGS
    )
    assert shown == written


def test_the_warning_shown_is_the_one_sent() -> None:
    assert f"Warning: {unmirrored_warning(['gpus'], SETTINGS)}\n" in DOC


def test_the_lease_defaults_shown_are_the_config_defaults() -> None:
    defaults = QuotaMirrorConfig()
    assert f"quota_mirror.lease_duration_s: {defaults.lease_duration_s}`" in DOC
    assert f"`renew_deadline_s: {defaults.renew_deadline_s:g}`" in DOC
    assert f"`retry_period_s: {defaults.retry_period_s:g}`" in DOC


def test_the_kueue_example_budgets_units() -> None:
    [queue] = [d for d in yaml_blocks() if d["kind"] == "ClusterQueue"]
    [group] = queue["spec"]["resourceGroups"]  # type: ignore[index]
    assert "cnvrg.io/metagpu" in group["coveredResources"]
    [flavor] = group["flavors"]
    quotas = {r["name"]: r["nominalQuota"] for r in flavor["resources"]}
    assert quotas["cnvrg.io/metagpu"] == 4 * SETTINGS.units_per_gpu
    flavors = {d["metadata"]["name"] for d in yaml_blocks() if d["kind"] == "ResourceFlavor"}  # type: ignore[index]
    assert flavor["name"] in flavors
