"""Fixtures shared by every test package.

Component-specific fixtures live in each package's own ``conftest.py``; only
what two or more components need is here.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.kube_api import FakeKubeApi, running_kube_api

REPO_ROOT = Path(__file__).resolve().parent.parent
ADMISSION_FIXTURES = REPO_ROOT / "tests" / "fixtures" / "admission"
"""AdmissionReview requests captured from a real kube-apiserver v1.36 (see its README).
A copy of ``../shared/fixtures/admission`` so a fresh clone is self-contained;
``tests/test_fixtures_copy.py`` fails if the copy drifts from the shared one."""

UNIX_PATH_MAX = 107  # sun_path is 108 bytes including the NUL


def pytest_addoption(parser: pytest.Parser) -> None:
    """Options of the image smoke test (tests/image), which ``make image-test`` passes."""
    group = parser.getgroup("image", "image smoke test (tests/image; run by make image-test)")
    group.addoption("--image", metavar="REF", help="the built image to run (skipped without it)")
    group.addoption(
        "--image-engine",
        default="podman",
        metavar="ENGINE",
        help="the engine that built it: podman or buildah share containers/storage and run it "
        "(podman with real namespaces where it can, else chroot); docker runs it itself",
    )
    group.addoption(
        "--image-isolation",
        choices=("auto", "namespaces", "chroot"),
        default="auto",
        help="auto: real namespaces (podman) where they work, else chroot (buildah mount)",
    )


def load_admission_fixture(name: str) -> dict[str, Any]:
    """One captured AdmissionReview request body, parsed."""
    data: dict[str, Any] = json.loads((ADMISSION_FIXTURES / name).read_text())
    return data


def admission_fixture_names() -> list[str]:
    """Every captured AdmissionReview file name, sorted."""
    return sorted(p.name for p in ADMISSION_FIXTURES.glob("*.json"))


@pytest.fixture
def short_tmp_path() -> Iterator[Path]:
    """A temp dir short enough for unix sockets (pytest's tmp_path can exceed 108 bytes).

    Same reason as aiohttp's ``unix_sockname`` fixture: sun_path is tiny.
    """
    with tempfile.TemporaryDirectory(prefix="mg-", dir="/tmp") as d:
        path = Path(d)
        assert len(str(path / ("x" * 40))) < UNIX_PATH_MAX
        yield path


@pytest.fixture
async def kube_api() -> AsyncIterator[tuple[FakeKubeApi, str]]:
    """A fake API server on loopback: ``(state, base_url)``."""
    async with running_kube_api() as served:
        yield served


@pytest.fixture
def kube_config_env(kube_api: tuple[FakeKubeApi, str], tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig file pointing at :func:`kube_api`; sets ``KUBECONFIG`` for the test."""
    _, url = kube_api
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "fake", "user": {"token": "test-token"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                "current-context": "fake",
            }
        )
    )
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(path)
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old
