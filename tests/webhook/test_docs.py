"""docs/webhook.md and examples/webhook-config.yaml cover every setting, so they cannot drift."""

from __future__ import annotations

import pytest
import yaml

from plugin.api.settings import env_var_names
from tests.conftest import REPO_ROOT
from webhook.config import ENV_PREFIX, WebhookConfig
from webhook.metrics import WebhookMetrics

DOC = (REPO_ROOT / "docs" / "webhook.md").read_text()
SETTINGS = env_var_names(WebhookConfig, ENV_PREFIX)


@pytest.mark.parametrize("var", sorted(SETTINGS))
def test_every_setting_is_documented(var: str) -> None:
    assert var in DOC
    assert f"`{'.'.join(SETTINGS[var])}`" in DOC


def test_example_config_lists_every_key_with_its_default() -> None:
    example = yaml.safe_load((REPO_ROOT / "examples" / "webhook-config.yaml").read_text())
    assert WebhookConfig.model_validate(example) == WebhookConfig()
    assert set(example) == set(WebhookConfig.model_fields)


def test_every_metric_is_in_the_metrics_table() -> None:
    metrics = WebhookMetrics()
    metrics.watch_connections(lambda: 0, {}, {})
    suffix = {"counter": "_total"}
    names = {f.name + suffix.get(f.type, "") for f in metrics.registry.collect()}
    assert {n for n in names if f"| `{n}` |" not in DOC} == set()
