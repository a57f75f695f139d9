"""The supervised MPS daemon through the real subprocess path, against the documented stand-in.

``MpsControl`` runs ``plugin/gpu/mps_standin.py`` exactly as it runs
``nvidia-cuda-mps-control``: ``-d`` to start, the front end with one command on
stdin for every ask. The GPUs are simulated and record compute-mode changes as
NVML reports them. Nothing sleeps for time to pass: every wait is for a status
change, bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import plugin.gpu.mps_standin
from plugin.gpu.backend import ComputeModeControl
from plugin.gpu.health_monitor import HealthBoard
from plugin.gpu.mps import Backoff, MpsGpu
from plugin.gpu.mps_control import MpsControl
from plugin.gpu.mps_supervisor import STATE_FILE_NAME, MpsSupervisor
from plugin.gpu.simulated import SimulatedGpu, SimulatedGpus, SimulatedGpusFile

UUID_A = "GPU-0b8a5e3c-1f6e-4a53-9c1e-2d7b8f1a0c01"
UUID_B = "GPU-7d2f9a41-3c8b-4e1d-8f0a-5b6c7d8e9f02"
STANDIN = (sys.executable, str(Path(plugin.gpu.mps_standin.__file__)))
WAIT_S = 15.0


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths must stay under 108 bytes; pytest's tmp_path can exceed that."""
    path = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def simulated(**fields: object) -> SimulatedGpus:
    """Two GPUs; ``fields`` apply to the second (``fail="compute_mode"``)."""
    gpus = [
        SimulatedGpu(uuid=UUID_A, name="NVIDIA A100-SXM4-80GB", memory_mib=81920),
        SimulatedGpu.model_validate(
            {"uuid": UUID_B, "name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, **fields}
        ),
    ]
    return SimulatedGpus(SimulatedGpusFile(gpus=gpus))


MPS_GPUS = [MpsGpu(UUID_A, 0, 81920), MpsGpu(UUID_B, 1, 40960)]


def control_of(directory: Path, command: tuple[str, ...] = STANDIN) -> MpsControl:
    return MpsControl(
        command=command, pipe_directory=directory / "pipe", log_directory=directory / "log"
    )


@asynccontextmanager
async def supervised(
    control: MpsControl, modes: ComputeModeControl | None, *, timeout_s: float = 5.0
) -> AsyncIterator[tuple[MpsSupervisor, HealthBoard]]:
    board = HealthBoard()
    board.set_gpus([])
    sup = MpsSupervisor(
        control,
        board,
        modes=modes,
        health_interval_s=0.05,
        command_timeout_s=timeout_s,
        start_timeout_s=timeout_s,
        backoff=Backoff(initial_s=0.05, max_s=0.2),
    )
    try:
        yield sup, board
    finally:
        await sup.stop()


async def until(sup: MpsSupervisor, condition: Callable[[], bool]) -> None:
    """Wait for ``condition`` on status changes (no polling sleep), at most WAIT_S."""
    async with asyncio.timeout(WAIT_S):
        while True:
            changed = sup.changed
            if condition():
                return
            await changed.wait()


def commands(control: MpsControl) -> list[str]:
    log = control.log_directory / "control.log"
    return [
        line.split("Cmd:", 1)[1].strip() for line in log.read_text().splitlines() if "Cmd:" in line
    ]


def alive(pid: int) -> bool:
    """Running, and not a zombie (the daemonized stand-in is nobody's child here)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False  # exited between the two looks
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


async def test_start_sets_modes_and_defaults_then_stop_restores(short_dir: Path) -> None:
    gpus = simulated()
    control = control_of(short_dir)
    async with supervised(control, gpus) as (sup, board):
        await sup.serve(MPS_GPUS)
        assert sup.status.state == "up", sup.status.reason
        pid = control.daemon_pid()
        assert pid is not None
        assert alive(pid)
        assert gpus.compute_mode(UUID_A) == gpus.compute_mode(UUID_B) == "Exclusive_Process"
        originals = json.loads((control.log_directory / STATE_FILE_NAME).read_text())
        assert originals == {UUID_A: "Default", UUID_B: "Default"}
        sent = commands(control)
        assert "set_default_active_thread_percentage 100" in sent
        assert "set_default_device_pinned_mem_limit 0 81920M" in sent
        assert "set_default_device_pinned_mem_limit 1 40960M" in sent
        assert "get_default_device_pinned_mem_limit 1" in sent  # read back, not trusted
        assert board.mps == {}
    # stopped: no daemon, the modes as they were, no state left behind
    assert not alive(pid)
    assert control.daemon_pid() is None
    assert gpus.compute_mode(UUID_A) == gpus.compute_mode(UUID_B) == "Default"
    assert gpus.compute_mode_changes[-2:] == [(UUID_A, "Default"), (UUID_B, "Default")]
    assert not (control.log_directory / STATE_FILE_NAME).exists()
    assert commands(control)[-1] == "quit"


async def test_killed_daemon_withdraws_gpus_then_restarts_with_defaults(short_dir: Path) -> None:
    gpus = simulated()
    control = control_of(short_dir)
    async with supervised(control, gpus) as (sup, board):
        await sup.serve(MPS_GPUS)
        board.set_gpus([])  # the board only needs the mps withdrawals here
        first = control.daemon_pid()
        assert first is not None
        seen_down: list[dict[str, str]] = []

        def down() -> bool:
            if sup.status.state == "down":
                seen_down.append(dict(board.mps))
                return True
            return False

        os.kill(first, signal.SIGKILL)
        await until(sup, down)
        withdrawn = seen_down[0]
        assert set(withdrawn) == {UUID_A, UUID_B}
        assert "MPS control daemon not answering" in withdrawn[UUID_A]
        assert "restarting in" in withdrawn[UUID_A]
        assert board.snapshot().unhealthy.keys() >= {UUID_A, UUID_B}

        assert board.mps_node.status is not None
        assert board.mps_node.enforces == ("memory", "fixed")  # nothing is admitted unlimited

        await until(sup, lambda: sup.status.state == "up")
        assert sup.status.restarts == 1
        # what the board file tells the node agent (daemon up, restarts)
        assert board.mps_node.mode == "supervised"
        assert board.mps_node.status == sup.status
        second = control.daemon_pid()
        assert second is not None
        assert second != first
        assert board.mps == {}
        # the defaults died with the daemon ("lost if a quit command is executed"):
        # the new one got them again
        assert commands(control).count("set_default_device_pinned_mem_limit 0 81920M") == 2
        assert gpus.compute_mode(UUID_A) == "Exclusive_Process"
    assert control.daemon_pid() is None
    assert gpus.compute_mode(UUID_A) == "Default"
    assert not board.mps_node.enforces  # stopped: its GPUs are DEFAULT again


async def test_records_show_the_mps_check(short_dir: Path) -> None:
    gpus = simulated()
    control = control_of(short_dir)
    async with supervised(control, gpus) as (sup, board):
        board.set_gpus(gpus.devices())
        await sup.serve(MPS_GPUS)
        assert board.records()[UUID_A].healthy
        pid = control.daemon_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await until(sup, lambda: sup.status.state == "down")
        record = board.records()[UUID_B]
        assert (record.state, record.check) == ("Unhealthy", "mps")
        assert "new containers would get no memory or compute limits" in record.reason
        await until(sup, lambda: sup.status.state == "up")
        assert board.records()[UUID_B].healthy


async def test_a_gpu_whose_mode_cannot_be_set_is_withdrawn_alone(short_dir: Path) -> None:
    gpus = simulated(fail="compute_mode")
    control = control_of(short_dir)
    async with supervised(control, gpus) as (sup, board):
        await sup.serve(MPS_GPUS)
        assert sup.status.state == "up"
        assert list(board.mps) == [UUID_B]
        assert "EXCLUSIVE_PROCESS" in board.mps[UUID_B]
        assert "Insufficient Permissions" in board.mps[UUID_B]
        assert gpus.compute_mode(UUID_A) == "Exclusive_Process"


async def test_a_daemon_left_from_an_earlier_run_is_quit_first(short_dir: Path) -> None:
    control = control_of(short_dir)
    await asyncio.to_thread(control.prepare_directories)
    await control.start_daemon(timeout_s=5)
    await control.ask("set_default_active_thread_percentage 10", timeout_s=5)
    leftover = control.daemon_pid()
    assert leftover is not None
    async with supervised(control, simulated()) as (sup, _board):
        await sup.serve(MPS_GPUS)
        assert sup.status.state == "up"
        assert control.daemon_pid() not in (None, leftover)
        reply = await control.ask("get_default_active_thread_percentage", timeout_s=5)
        assert float(reply) == 100.0
    assert not alive(leftover)


async def test_modes_left_changed_by_a_crash_are_restored_from_the_state_file(
    short_dir: Path,
) -> None:
    gpus = simulated()
    gpus.set_compute_mode(UUID_A, "Exclusive_Process")  # a plugin died while serving
    control = control_of(short_dir)
    control.log_directory.mkdir(parents=True)
    (control.log_directory / STATE_FILE_NAME).write_text(json.dumps({UUID_A: "Prohibited"}))
    async with supervised(control, gpus) as (sup, _board):
        await sup.serve(MPS_GPUS)
    assert gpus.compute_mode(UUID_A) == "Prohibited"  # what it had before the crashed run
    assert gpus.compute_mode(UUID_B) == "Default"


async def test_a_missing_program_keeps_the_gpus_withdrawn_and_retries(short_dir: Path) -> None:
    control = control_of(short_dir, command=(str(short_dir / "no-such-mps-control"),))
    gpus = simulated()
    async with supervised(control, gpus) as (sup, board):
        await sup.serve(MPS_GPUS)
        assert sup.status.state == "down"
        assert "cannot run" in board.mps[UUID_A]
        first = sup.status.since
        await until(sup, lambda: sup.status.since != first)  # the backoff ran, it tried again
        assert sup.status.state == "down"
    assert gpus.compute_mode(UUID_A) == "Default"


async def test_without_mode_control_the_modes_are_left_alone(short_dir: Path) -> None:
    gpus = simulated()
    control = control_of(short_dir)
    async with supervised(control, None) as (sup, board):
        await sup.serve(MPS_GPUS)
        assert sup.status.state == "up"
        assert board.mps == {}
    assert gpus.compute_mode_changes == []
