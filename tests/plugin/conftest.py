"""The plugin under test, run in-process against the simulated kubelet over real unix sockets."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from metagpu.kubelet_sim import KubeletSim
from plugin.api.config import PluginConfig
from plugin.deviceplugin.supervisor import Supervisor
from plugin.gpu.backend import GpuBackend
from plugin.gpu.simulated import SimulatedGpus
from tests.plugin.builders import gpus, gpus_file_spec, write_yaml

FAST: dict[str, Any] = {"health": {"event_timeout_s": 0.1, "recovery_s": 3600}}
"""Short event waits so stopping is quick; recovery off unless a test wants it."""


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    """Every task a test starts (servers, streams, watchers) is gone when it ends
    (kopf's ``_no_asyncio_pending_tasks``): a leaked task is a leaked socket."""
    yield
    current = asyncio.current_task()
    pending: list[asyncio.Task[object]] = []
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        pending = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        if not pending:
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"tasks still running after the test: {[t.get_name() for t in pending]}")


@dataclass
class PluginUnderTest:
    supervisor: Supervisor
    task: asyncio.Task[int]
    directory: Path
    gpus_file: Path
    backends: list[GpuBackend] = field(default_factory=list)

    @property
    def gpus(self) -> SimulatedGpus:
        """The simulated backend the plugin uses now (a reload opens a new one)."""
        backend = self.backends[-1]
        assert isinstance(backend, SimulatedGpus)
        return backend

    async def stop(self) -> int:
        self.supervisor.request_stop()
        return await asyncio.wait_for(self.task, 15)


async def wait_until(
    predicate: Callable[[], bool], *, timeout_s: float = 5.0, what: str = ""
) -> None:
    """Poll a condition that has no event to wait on (supervisor state)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}")
        await asyncio.sleep(0.01)


@asynccontextmanager
async def running_plugin(
    directory: Path,
    *,
    gpu_count: int = 4,
    spec: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    load: Callable[[], PluginConfig] | None = None,
    backend_factory: Callable[[PluginConfig], GpuBackend] | None = None,
    retry_interval_s: float = 30.0,
    open_api: Any = None,
    ownership_interval_s: float = 10.0,
) -> AsyncIterator[PluginUnderTest]:
    """Run the supervisor on simulated GPUs (``gpu_count`` on two NUMA nodes by default)."""
    gpus_file = write_yaml(
        directory.parent / f"{directory.name}-gpus.yaml",
        spec if spec is not None else gpus_file_spec(gpus(gpu_count, numa_nodes=2)),
    )
    settings = {**FAST, "device_plugins_dir": str(directory), "gpus_file": str(gpus_file)}
    settings.update(config or {})
    initial = PluginConfig.model_validate(settings)
    backends: list[GpuBackend] = []

    def factory(c: PluginConfig) -> GpuBackend:
        if backend_factory is not None:
            backend = backend_factory(c)
        else:
            assert c.gpus_file is not None
            backend = SimulatedGpus.from_file(c.gpus_file)
        backends.append(backend)
        return backend

    supervisor = Supervisor(
        load or (lambda: initial),
        config=initial,
        backend_factory=factory,
        retry_interval_s=retry_interval_s,
        socket_check_interval_s=0.2,
        open_api=open_api,
        ownership_interval_s=ownership_interval_s,
    )
    task = asyncio.create_task(supervisor.run(handle_signals=False), name="plugin-under-test")
    under_test = PluginUnderTest(supervisor, task, directory, gpus_file, backends)
    try:
        yield under_test
    finally:
        if not task.done():
            supervisor.request_stop()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), 15)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        gpus_file.unlink(missing_ok=True)


@asynccontextmanager
async def kubelet_and_plugin(
    root: Path, **kwargs: Any
) -> AsyncIterator[tuple[KubeletSim, PluginUnderTest]]:
    directory = root / "dp"
    directory.mkdir()
    async with KubeletSim(directory) as kubelet, running_plugin(directory, **kwargs) as plugin:
        yield kubelet, plugin
