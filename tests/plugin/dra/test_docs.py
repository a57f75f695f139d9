"""docs/dra.md covers every DRA plugin setting, and its examples are what the code writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from plugin.api.settings import env_var_names
from plugin.dra.claims import ClaimRef
from plugin.dra.config import ENV_PREFIX, DraConfig
from plugin.dra.prepare import Preparer
from plugin.dra.slices import build_slice
from tests.conftest import REPO_ROOT
from tests.plugin.dra.fixtures import CAPTURED_GPUS, NODE, dra_config, load

DOC = (REPO_ROOT / "docs" / "dra.md").read_text()
SETTINGS = {
    var: path
    for var, path in env_var_names(DraConfig, ENV_PREFIX).items()
    if path[0] not in ("health", "mps") and path not in (("units",), ("memory",))
}


@pytest.mark.parametrize("var", sorted(SETTINGS))
def test_every_setting_is_in_the_table(var: str) -> None:
    assert f"| `{'.'.join(SETTINGS[var])}` | `{var}` |" in DOC


def test_the_health_section_is_the_device_plugins() -> None:
    assert "| `health.*` | `METAGPU_DRA_HEALTH__*` | as `device-plugin` |" in DOC


def test_the_mps_section_is_the_device_plugins() -> None:
    assert "| `mps.*` | `METAGPU_DRA_MPS__*` | as `device-plugin` |" in DOC


def block(language: str) -> str:
    match = re.search(rf"```{language}\n(.*?)```", DOC, re.S)
    assert match is not None, language
    return match.group(1)


def test_the_slice_example_is_the_slice_we_build(tmp_path: Path) -> None:
    plan = build_slice(CAPTURED_GPUS[:1], records={}, config=dra_config(tmp_path), node_name=NODE)
    shown = yaml.safe_load(re.sub(r"#.*", "", block("yaml")))
    assert shown == plan.body


def test_the_cdi_example_is_the_spec_we_write(tmp_path: Path) -> None:
    claim = load("claim-p50-a-50-units-40gi-allocated.json")
    meta = claim["metadata"]
    preparer = Preparer(config=dra_config(tmp_path), node_name=NODE)
    preparer.offer(CAPTURED_GPUS, withdrawn={})
    preparer.prepare(ClaimRef(meta["namespace"], meta["name"], meta["uid"]), claim)
    (path,) = tmp_path.glob("*.json")
    assert json.loads(block("json")) == json.loads(path.read_text())
