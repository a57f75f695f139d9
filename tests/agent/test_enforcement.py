"""Memory enforcement end to end on the simulated GPU backend.

The "GPU processes" are real child processes; the simulated GPUs list them
with their memory (``live_pids_only``: a killed process disappears, as from
NVML). Allocations come from the PodResources harness over gRPC, the pod
index knows the pod, ``<proc_root>/<pid>/cgroup`` places the children in its
container, and Events go to the fake API server over HTTP. Time is a fake
monotonic clock, so "after the grace period" needs no sleeping.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from certs.kube import open_api_client
from plugin.agent.agent import Agent
from plugin.agent.containers import PodIndex
from plugin.agent.kube import KubeEventSink
from plugin.agent.podresources import PodResourcesReader
from plugin.agent.processes import ProcessHandle, open_process
from plugin.api.config import PluginConfig
from plugin.gpu.simulated import SimulatedGpu, SimulatedGpus, SimulatedGpusFile
from tests.agent.builders import A100, gpu_uuid, index_of, place_in_container, pod, ref
from tests.harness.kube_api import FakeKubeApi
from tests.harness.podresources import FakePodResources, running_pod_resources

R = "cnvrg.io/metagpu"
U0 = gpu_uuid(0)
LIMIT_MIB = 20480  # 25 units of 100 on 80 GiB


@dataclass
class Rig:
    agent: Agent
    backend: SimulatedGpus
    kubelet: FakePodResources
    fake_api: FakeKubeApi
    children: list[asyncio.subprocess.Process]
    proc_root: Path
    clock: list[float]
    index: PodIndex

    def use(self, *mib: int) -> None:
        """The children hold this much GPU memory each."""
        self.backend.update(
            U0,
            processes=[
                {"pid": c.pid, "used_memory_mib": m}
                for c, m in zip(self.children, mib, strict=True)
            ],
        )

    async def cycle_at(self, t: float) -> list[str]:
        self.clock[0] = t
        result = await self.agent.cycle()
        return [type(d).__name__ for d in result.decisions]

    def events(self) -> list[dict[str, Any]]:
        return self.fake_api.objects("events.k8s.io/v1", "Event", "ml")

    def alive(self) -> list[bool]:
        return [c.returncode is None for c in self.children]


async def _child() -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(120)"
    )


@pytest.fixture
async def api(kube_config_env: Path) -> AsyncIterator[client.ApiClient]:
    async with open_api_client() as (api, _source):
        yield api


@pytest.fixture
async def make_rig(
    short_tmp_path: Path,
    tmp_path: Path,
    kube_api: tuple[FakeKubeApi, str],
    api: client.ApiClient,
) -> AsyncIterator[Callable[..., Awaitable[Rig]]]:
    closers: list[Callable[[], Awaitable[None]]] = []

    async def make(policy: str, grace_s: float = 30, cooldown_s: float = 600) -> Rig:
        proc_root = tmp_path / "proc"
        children = [await _child(), await _child()]
        for c in children:
            place_in_container(proc_root, c.pid, ref("a"))
        backend = SimulatedGpus(
            SimulatedGpusFile(
                live_pids_only=True,
                gpus=[SimulatedGpu(uuid=U0, name=A100, memory_mib=81920)],
            )
        )
        sock = short_tmp_path / "kubelet.sock"
        serving = running_pod_resources(sock)
        kubelet = await serving.__aenter__()
        kubelet.assign("ml", "a", "main", R, [f"{U0}::{u}" for u in range(25)])
        clock = [0.0]
        config = PluginConfig.model_validate(
            {
                "agent": {
                    "memory_enforcement": policy,
                    "kill_grace_s": grace_s,
                    "report_cooldown_s": cooldown_s,
                    "proc_root": str(proc_root),
                    "node_name": "node-a",
                }
            }
        )
        podresources = PodResourcesReader(sock, timeout_s=5)
        index = index_of(pod("a"))
        agent = Agent(
            config,
            backend=backend,
            allocations=podresources,
            index=index,
            events=KubeEventSink(api),
            monotonic=lambda: clock[0],
        )
        rig = Rig(agent, backend, kubelet, kube_api[0], children, proc_root, clock, index)

        async def close() -> None:
            await podresources.close()
            await serving.__aexit__(None, None, None)
            for c in children:
                if c.returncode is None:
                    c.kill()
                await c.wait()

        closers.append(close)
        return rig

    try:
        yield make
    finally:
        for close in closers:
            await close()


async def test_report_records_an_event_and_kills_nothing(
    make_rig: Any, caplog: pytest.LogCaptureFixture
) -> None:
    rig: Rig = await make_rig("report")
    rig.use(15000, 10000)  # 25,000 MiB of a 20,480 MiB share
    with caplog.at_level(logging.WARNING, logger="plugin.agent.enforcement"):
        assert await rig.cycle_at(0) == ["Report"]
        assert await rig.cycle_at(600) == []
    assert rig.alive() == [True, True]
    (event,) = rig.events()
    assert event["reason"] == "GpuMemoryOverLimit"
    assert event["action"] == "Report"
    assert event["type"] == "Warning"
    assert event["regarding"]["name"] == "a"
    assert event["regarding"]["uid"] == ref("a").pod_uid
    note = event["note"]
    assert "25,000 MiB" in note
    assert "20,480 MiB" in note
    assert "policy report: nothing was done" in note
    assert "GPU memory over the limit" in caplog.text
    assert rig.agent.metrics.actions.labels("report")._value.get() == 1
    assert rig.agent.snapshot is not None
    assert rig.agent.snapshot.shares[0].over_limit


async def test_kill_after_grace(make_rig: Any) -> None:
    rig: Rig = await make_rig("kill", grace_s=30)
    rig.use(15000, 10000)
    assert await rig.cycle_at(0) == ["Report"]
    assert await rig.cycle_at(10) == []
    assert await rig.cycle_at(29.9) == []
    assert rig.alive() == [True, True]
    assert await rig.cycle_at(30) == ["Kill"]
    codes = [await asyncio.wait_for(c.wait(), 10) for c in rig.children]
    assert codes == [-signal.SIGKILL, -signal.SIGKILL]
    # NVML (live_pids_only) no longer lists them: the overrun is over.
    assert await rig.cycle_at(35) == ["Resolved"]

    reasons = [(e["reason"], e["action"]) for e in rig.events()]
    assert sorted(reasons) == [("GpuMemoryLimitEnforced", "Kill"), ("GpuMemoryOverLimit", "Report")]
    kill = next(e for e in rig.events() if e["action"] == "Kill")
    pids = ", ".join(str(c.pid) for c in rig.children)
    assert "used 25,000 MiB" in kill["note"]
    assert "allows 20,480 MiB" in kill["note"]
    assert f"killed PIDs {pids} with SIGKILL" in kill["note"]
    assert kill["reportingInstance"] == "node-a"
    assert rig.agent.metrics.actions.labels("kill")._value.get() == 1
    assert rig.fake_api.verbs_used() == {("events.k8s.io", "events", "create")}


async def test_no_kill_while_under_the_limit(make_rig: Any) -> None:
    rig: Rig = await make_rig("kill", grace_s=0)
    rig.use(10240, LIMIT_MIB - 10240)  # exactly at the limit is allowed
    for t in (0, 60, 120):
        assert await rig.cycle_at(t) == []
    assert rig.alive() == [True, True]
    assert rig.events() == []


async def test_no_kill_if_the_overrun_ends_before_the_grace_period(make_rig: Any) -> None:
    rig: Rig = await make_rig("kill", grace_s=30, cooldown_s=0)
    rig.use(15000, 10000)
    assert await rig.cycle_at(0) == ["Report"]
    rig.use(5000, 5000)  # the job freed its cache
    assert await rig.cycle_at(20) == ["Resolved"]
    rig.use(15000, 10000)  # over again: a new grace period starts
    assert await rig.cycle_at(40) == ["Report"]
    assert await rig.cycle_at(69) == []
    assert rig.alive() == [True, True]
    assert [e["action"] for e in rig.events()] == ["Report", "Report"]


async def test_a_job_swinging_around_its_limit_gets_one_event_per_cooldown(
    make_rig: Any, caplog: pytest.LogCaptureFixture
) -> None:
    rig: Rig = await make_rig("report", cooldown_s=600)
    with caplog.at_level(logging.WARNING, logger="plugin.agent.enforcement"):
        for t in range(0, 600, 10):  # over, under, over, under... every other cycle
            rig.use(15000, 10000) if t % 20 == 0 else rig.use(5000, 5000)
            await rig.cycle_at(t)
    assert [e["action"] for e in rig.events()] == ["Report"]
    assert caplog.text.count("GPU memory over the limit") == 1
    # Every overrun is still counted.
    assert rig.agent.metrics.actions.labels("report")._value.get() == 30
    rig.use(15000, 10000)
    await rig.cycle_at(600)  # the cooldown is over: reported again
    assert [e["action"] for e in rig.events()] == ["Report", "Report"]


async def test_a_reused_pid_is_not_killed(make_rig: Any) -> None:
    rig: Rig = await make_rig("kill", grace_s=0)
    rig.use(15000, 10000)
    # Between the reading and the kill, the second PID "now belongs" to another container.
    other = ref("b")
    rig.index.replace([pod("a"), pod("b")])
    victim = rig.children[1].pid

    def open_then_move(pid: int, *, proc_root: Path) -> ProcessHandle:
        handle = open_process(pid, proc_root=proc_root)
        if pid == victim:
            place_in_container(rig.proc_root, victim, other)
        return handle

    rig.agent.enforcer._open_process = open_then_move
    assert await rig.cycle_at(0) == ["Report", "Kill"]
    assert await asyncio.wait_for(rig.children[0].wait(), 10) == -signal.SIGKILL
    assert rig.children[1].returncode is None
    kill = next(e for e in rig.events() if e["action"] == "Kill")
    assert f"Skipped (PID now belongs to another process): {victim}" in kill["note"]


async def test_a_kill_that_found_no_process_is_not_called_enforced(make_rig: Any) -> None:
    rig: Rig = await make_rig("kill", grace_s=0)
    rig.use(15000, 10000)
    # Both PIDs change hands between the reading and the kill.
    rig.index.replace([pod("a"), pod("b")])

    def open_then_move(pid: int, *, proc_root: Path) -> ProcessHandle:
        handle = open_process(pid, proc_root=proc_root)
        place_in_container(rig.proc_root, pid, ref("b"))
        return handle

    rig.agent.enforcer._open_process = open_then_move
    assert await rig.cycle_at(0) == ["Report", "Kill"]
    assert rig.alive() == [True, True]
    assert [e["reason"] for e in rig.events()] == ["GpuMemoryOverLimit"]
    assert rig.agent.metrics.actions.labels("kill_skipped")._value.get() == 1
    assert rig.agent.metrics.actions.labels("kill")._value.get() == 0
