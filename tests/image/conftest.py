"""The image smoke test's runner: the built image (``--image``), started the way this host can.

Skipped unless ``--image`` names a built image (``make image-test`` builds it and
passes it). Isolation, in order: ``podman run`` with real namespaces (its
default OCI runtime, then runc: crun refuses hosts with a hybrid cgroup
layout), else chroot into ``buildah mount`` of the image. Which one ran is
printed in the terminal summary.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.image.containers import ChrootRunner, PodmanRunner, Runner

_USED: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--image"):
        return
    skip = pytest.mark.skip(reason="runs the built image: `make image-test` (pytest --image REF)")
    for item in items:
        if item.get_closest_marker("image") is not None:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _USED:
        terminalreporter.write_line(f"image smoke test isolation: {line}")


def _namespaced(image: str, engine: str) -> Runner | None:
    if engine == "docker":
        return PodmanRunner(image, cli="docker")
    if shutil.which("podman") is None:
        return None
    for runtime in (None, "runc"):
        if runtime is not None and shutil.which(runtime) is None:
            continue
        runner = PodmanRunner(image, runtime=runtime)
        if runner.works():
            return runner
    return None


@pytest.fixture(scope="session")
def runner(request: pytest.FixtureRequest) -> Iterator[Runner]:
    image: str = request.config.getoption("--image")
    engine: str = request.config.getoption("--image-engine")
    isolation: str = request.config.getoption("--image-isolation")
    found = None if isolation == "chroot" else _namespaced(image, engine)
    if found is not None:
        _USED.append(found.isolation)
        yield found
        return
    if isolation == "namespaces":
        pytest.fail("--image-isolation namespaces: podman cannot start containers here")
    if shutil.which("buildah") is None:
        pytest.fail("neither podman nor buildah can run the image here (install buildah)")
    with ChrootRunner.of(image) as chroot:
        _USED.append(chroot.isolation)
        yield chroot
