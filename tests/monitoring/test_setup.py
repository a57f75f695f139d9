"""scripts/install_promtool.sh: links promtool and prometheus where they are, and where
they are not and cannot be installed, says so and lets the setup go on."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Final

import pytest

from tests.monitoring.catalog import REPO_ROOT, promtool

SCRIPT: Final = REPO_ROOT / "scripts" / "install_promtool.sh"


def run(bindir: Path, path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/bash", str(SCRIPT), str(bindir)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={"PATH": path},
    )


def test_without_promtool_and_without_root_it_says_what_to_install(tmp_path: Path) -> None:
    shims = tmp_path / "shims"
    shims.mkdir()
    fake_id = shims / "id"
    fake_id.write_text("#!/bin/sh\necho 1000\n")  # not root: apt-get is out of reach
    fake_id.chmod(0o755)
    result = run(tmp_path / "bin", str(shims))
    assert result.returncode == 0, result.stderr
    assert "SKIPPED" in result.stderr
    assert "install prometheus/promtool 2.x" in result.stderr
    assert not (tmp_path / "bin" / "promtool").exists()


def test_with_promtool_on_path_it_links_it(tmp_path: Path) -> None:
    tool = promtool()
    if tool is None:
        pytest.skip("no promtool here to link")
    result = run(tmp_path / "bin", os.environ["PATH"] + os.pathsep + str(Path(tool).parent))
    assert result.returncode == 0, result.stderr
    linked = tmp_path / "bin" / "promtool"
    assert linked.is_symlink()
    assert "promtool, version" in result.stderr
