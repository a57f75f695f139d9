"""docs/device-plugin.md and docs/agent.md cover every plugin setting and the whole health
model (states, checks, keys, metrics), so the operator's tables cannot drift from the code."""

from __future__ import annotations

from typing import get_args

import pytest

from plugin.agent.metrics import build_families
from plugin.api.config import ENV_PREFIX, HealthConfig, PluginConfig
from plugin.api.settings import env_var_names
from plugin.gpu.health import Check, HealthState
from tests.conftest import REPO_ROOT

PLUGIN_DOC = (REPO_ROOT / "docs" / "device-plugin.md").read_text()
AGENT_DOC = (REPO_ROOT / "docs" / "agent.md").read_text()
_ALL = env_var_names(PluginConfig, ENV_PREFIX)
SETTINGS = {
    var: path
    for var, path in _ALL.items()
    # the agent's section is documented in agent.md; a section (health, mps) by its keys
    if path[0] != "agent"
    and not any(other != var and other.startswith(var + "__") for other in _ALL)
}


@pytest.mark.parametrize("var", sorted(SETTINGS))
def test_every_plugin_setting_is_in_the_configuration_reference(var: str) -> None:
    assert f"`{var}`" in PLUGIN_DOC
    assert f"| `{'.'.join(SETTINGS[var])}` |" in PLUGIN_DOC


@pytest.mark.parametrize("check", [c for c in get_args(Check) if c])
def test_every_check_is_in_the_health_model_table(check: str) -> None:
    assert f"| `{check}` |" in PLUGIN_DOC
    assert f"`{check}`" in AGENT_DOC  # the metric's label values


@pytest.mark.parametrize("state", get_args(HealthState))
def test_every_state_is_in_the_health_model_table(state: str) -> None:
    assert f"\n| {state} |" in PLUGIN_DOC


@pytest.mark.parametrize(
    "key", [name for name in HealthConfig.model_fields if name != "ignored_xids"]
)
def test_every_health_key_has_a_timing_or_check_row(key: str) -> None:
    if key == "enabled":
        assert "`health.enabled: false`" in PLUGIN_DOC
        return
    assert f"`health.{key}`" in PLUGIN_DOC.split("#### The health model", 1)[1]


def test_every_health_metric_is_documented_in_agent_md() -> None:
    from plugin.agent.accounting import EMPTY_SNAPSHOT

    names = {
        f.name for f in build_families(EMPTY_SNAPSHOT) if "health" in f.name or "liveness" in f.name
    }
    assert names == {
        "metagpu_gpu_healthy",
        "metagpu_gpu_health_info",
        "metagpu_gpu_liveness_checks",
    }
    for name in names:
        assert f"`{name}" in AGENT_DOC, name
