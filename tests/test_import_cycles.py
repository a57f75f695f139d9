"""scripts/check_import_cycles.py: finds real circles in generated packages, and none here."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "check_import_cycles.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_import_cycles", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_package(root: Path, name: str, modules: dict[str, str]) -> None:
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    for module, source in modules.items():
        (package / f"{module}.py").write_text(source)


def run_script(root: Path, *packages: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *packages],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_a_lazy_import_back_is_a_circle(tmp_path: Path) -> None:
    """The shape plugin/dev.py and plugin/dev_session.py had: one side imports late."""
    write_package(
        tmp_path,
        "cycledemo",
        {
            "cli": "def run() -> None:\n    from cycledemo import session\n",
            "session": "from cycledemo.cli import run\n",
            "other": "import cycledemo.cli\n",
        },
    )
    result = run_script(tmp_path, "cycledemo")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "cycledemo.cli -> cycledemo.session -> cycledemo.cli" in result.stdout
    assert "other" not in result.stdout  # it imports into the circle but is not on it


def test_a_circle_across_top_level_packages(tmp_path: Path) -> None:
    write_package(tmp_path, "cyclea", {"x": "import cycleb.y\n"})
    write_package(tmp_path, "cycleb", {"y": "from cyclea import x\n"})
    result = run_script(tmp_path, "cyclea", "cycleb")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "cyclea.x -> cycleb.y -> cyclea.x" in result.stdout


def test_an_acyclic_package_passes(tmp_path: Path) -> None:
    write_package(
        tmp_path,
        "acyclicdemo",
        {"a": "import acyclicdemo.b\n", "b": "import acyclicdemo.c\n", "c": ""},
    )
    result = run_script(tmp_path, "acyclicdemo")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no import circles" in result.stdout


def test_an_unknown_package_is_a_clear_error(tmp_path: Path) -> None:
    result = run_script(tmp_path, "no_such_package_here")
    assert result.returncode == 2
    assert "no_such_package_here" in result.stderr


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"a"}}, [["a", "a"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c", "a"]]),
        ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b", "a"], ["c", "d", "c"]]),
        ({"a": {"b", "c"}, "b": {"c"}, "c": set()}, []),
    ],
)
def test_find_cycles(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert load_script().find_cycles(graph) == expected


def test_this_repository_has_no_circle() -> None:
    result = run_script(REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
