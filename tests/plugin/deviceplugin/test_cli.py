"""``metagpu device-plugin`` flags: each maps to a config field, flags win, the module is light."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from metagpu.cli import build_parser, find_command
from plugin.deviceplugin.cli import load
from tests.conftest import REPO_ROOT


def parse(*argv: str) -> argparse.Namespace:
    return build_parser(find_command("device-plugin")).parse_args(list(argv))


def test_no_flags_means_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("METAGPU_PLUGIN_CONFIG_FILE", raising=False)
    config = load(parse())
    assert config.units_per_gpu == 100
    assert config.resources[0].name == "cnvrg.io/metagpu"


def test_every_flag_reaches_its_field(tmp_path: Path) -> None:
    config = load(
        parse(
            "--device-plugins-dir",
            str(tmp_path),
            "--gpus-file",
            "examples/gpus.yaml",
            "--resource-name",
            "example.com/gpu-share",
            "--units-per-gpu",
            "10",
            "--allocation-policy",
            "spread",
            "--allow-split-fraction",
            "--device-id-strategy",
            "index",
            "--device-list-strategy",
            "volume-mounts",
            "--no-fail-on-init-error",
            "--no-health-checks",
            "--mps",
        )
    )
    assert config.device_plugins_dir == tmp_path
    assert config.gpus_file == Path("examples/gpus.yaml")
    assert [r.name for r in config.resources] == ["example.com/gpu-share"]
    assert config.units_per_gpu == 10
    assert config.allocation_policy == "spread"
    assert config.allow_split_fraction
    assert config.device_id_strategy == "index"
    assert config.device_list_strategy == "volume-mounts"
    assert not config.fail_on_init_error
    assert not config.health.enabled
    assert config.mps.enabled


def test_flags_beat_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("units_per_gpu: 10\ndevice_id_strategy: index\nallocation_policy: spread\n")
    monkeypatch.setenv("METAGPU_PLUGIN_CONFIG_FILE", str(file))
    monkeypatch.setenv("METAGPU_PLUGIN_UNITS_PER_GPU", "20")
    monkeypatch.setenv("METAGPU_PLUGIN_ALLOCATION_POLICY", "binpack")
    config = load(parse("--units-per-gpu", "30"))
    assert (config.units_per_gpu, config.allocation_policy, config.device_id_strategy) == (
        30,
        "binpack",
        "index",
    )


def test_importing_the_command_loads_no_grpc_or_nvml() -> None:
    code = (
        "import sys, plugin.deviceplugin.cli; "
        "print(sorted(m for m in "
        "('grpc', 'pynvml', 'plugin.deviceplugin.supervisor', 'plugin._pb') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_node_name_falls_back_to_node_name_but_the_config_name_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("METAGPU_PLUGIN_CONFIG_FILE", raising=False)
    monkeypatch.delenv("METAGPU_PLUGIN_PLACEMENT__NODE_NAME", raising=False)
    monkeypatch.setenv("NODE_NAME", "node-a")
    assert load(parse()).placement.node_name == "node-a"
    monkeypatch.setenv("METAGPU_PLUGIN_PLACEMENT__NODE_NAME", "node-b")
    assert load(parse()).placement.node_name == "node-b"


def test_the_umbrella_command_hands_in_the_kubernetes_credentials() -> None:
    # ``metagpu device-plugin`` is served by metagpu.device_plugin, which passes
    # certs.kube's loader (plugin/ may not import certs).
    import metagpu.device_plugin as umbrella

    (command,) = umbrella.COMMANDS
    assert find_command("device-plugin") is command
