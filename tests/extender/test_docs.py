"""docs/scheduler.md covers every extender setting, so the table cannot drift."""

from __future__ import annotations

import pytest

from plugin.api.settings import env_var_names
from plugin.extender.config import ENV_PREFIX, ExtenderConfig
from tests.conftest import REPO_ROOT

DOC = (REPO_ROOT / "docs" / "scheduler.md").read_text()
SETTINGS = env_var_names(ExtenderConfig, ENV_PREFIX)


@pytest.mark.parametrize("var", sorted(SETTINGS))
def test_every_setting_is_documented(var: str) -> None:
    assert var in DOC
    assert f"`{'.'.join(SETTINGS[var])}`" in DOC


def test_every_metric_is_documented() -> None:
    from plugin.extender.metrics import ExtenderMetrics

    names = {m.name for m in ExtenderMetrics().registry.collect()}
    for name in names:
        suffix = "_total" if name + "_total" in DOC else ""
        assert f"`{name}{suffix}" in DOC, name
