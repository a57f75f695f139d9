"""The image smoke test's runner: the built image (``--image``), started the way this host can.

Skipped unless ``--image`` names a built image (``make image-test`` builds it and
passes it). Isolation, in order: ``podman run`` with real namespaces (its
default OCI runtime, then runc: crun refuses hosts with a hybrid cgroup
layout), else chroot into ``buildah mount`` of the image. Which one ran is
printed in the terminal summary.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.image.containers import Runner, choose_runner

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


@pytest.fixture(scope="session")
def runner(request: pytest.FixtureRequest) -> Iterator[Runner]:
    image: str = request.config.getoption("--image")
    engine: str = request.config.getoption("--image-engine")
    isolation: str = request.config.getoption("--image-isolation")
    try:
        chosen = choose_runner(image, engine, isolation)
        found = chosen.__enter__()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    _USED.append(found.isolation)
    try:
        yield found
    finally:
        chosen.__exit__(None, None, None)
