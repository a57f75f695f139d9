"""``metagpu dra-plugin``: light to build, flags > env > file, and a clear refusal
without a node name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from metagpu.cli import main


def test_building_the_command_loads_no_grpc_nvml_or_api_client() -> None:
    code = (
        "import sys, metagpu.cli as c; "
        "c.build_parser(c.find_command('dra-plugin')); "
        "print([m for m in ('grpc', 'pynvml', 'kubernetes_asyncio') if m in sys.modules])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_print_config_follows_the_precedence(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "dra.yaml"
    config.write_text("units_per_gpu: 200\ncompute_policy: balance\ncdi_dir: /from/file\n")
    monkeypatch.setenv("NODE_NAME", "from-downward-api")
    monkeypatch.setenv("METAGPU_DRA_CDI_DIR", "/from/env")
    code = main(["dra-plugin", "--config", str(config), "--units-per-gpu", "300", "--print-config"])
    assert code == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["units_per_gpu"] == 300  # flag over file
    assert shown["cdi_dir"] == "/from/env"  # env over file
    assert shown["compute_policy"] == "balance"  # file over default
    assert shown["node_name"] == "from-downward-api"


def test_without_a_node_name_it_refuses_to_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.delenv("METAGPU_DRA_NODE_NAME", raising=False)
    assert main(["dra-plugin"]) == 2
    assert "node_name is required" in capsys.readouterr().err


def test_a_bad_policy_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("METAGPU_DRA_UNITS__MIN", "5")
    assert main(["dra-plugin", "--node-name", "n1", "--print-config"]) == 2
    assert "default is less than min" in capsys.readouterr().err
