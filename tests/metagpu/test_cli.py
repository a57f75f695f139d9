"""The metagpu dispatcher: listing, errors, and lazy loading of components."""

from __future__ import annotations

import subprocess
import sys

import pytest

from metagpu.cli import COMMAND_MODULES, main, usage


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMAND_MODULES:
        assert f"  {name}" in out


def test_no_arguments_prints_usage_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert capsys.readouterr().out.strip() == usage()


def test_unknown_command_names_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'serve'" in err
    assert "webhook" in err
    assert "device-plugin" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("metagpu ")


@pytest.mark.parametrize("name", sorted(COMMAND_MODULES))
def test_every_command_has_help(name: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "metagpu.cli", name, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"usage: metagpu {name}" in result.stdout
    assert "--log-format" in result.stdout


@pytest.mark.parametrize(
    ("command", "forbidden"),
    [
        pytest.param("webhook", ("grpc", "pynvml"), id="webhook-never-loads-grpc-or-nvml"),
        pytest.param("mutate", ("grpc", "pynvml", "aiohttp"), id="mutate-is-offline"),
        pytest.param("certs", ("grpc", "pynvml"), id="certs-never-loads-grpc-or-nvml"),
        pytest.param("device-plugin", ("aiohttp",), id="plugin-never-loads-aiohttp"),
        pytest.param(
            "cleanup",
            ("grpc", "pynvml", "kubernetes_asyncio", "aiohttp"),
            id="cleanup-help-loads-no-api-client",
        ),
    ],
)
def test_building_a_command_imports_only_its_component(
    command: str, forbidden: tuple[str, ...]
) -> None:
    code = (
        "import sys, metagpu.cli as c; "
        f"c.build_parser(c.find_command({command!r})); "
        f"print([m for m in {forbidden!r} if m in sys.modules])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
