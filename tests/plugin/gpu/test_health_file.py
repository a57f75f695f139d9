"""The plugin's published health board: written atomically, read back, refused when wrong."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from plugin.api.provenance import Stamp, Writer, current_writer
from plugin.gpu.backend import GpuEvent, MemoryHealth, RemappedRows
from plugin.gpu.health import RecoveryChecks, memory_problems
from plugin.gpu.health_file import (
    HEALTH_FILE_NAME,
    VALID_FOR_S,
    BoardPublisher,
    HealthFileError,
    PublishedBoard,
    read_board,
)
from plugin.gpu.health_monitor import HealthBoard
from plugin.gpu.mps import MpsNode, MpsStatus
from tests.plugin.builders import gpu, uuid_for
from tests.plugin.conftest import running_plugin


async def test_the_board_round_trips_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / HEALTH_FILE_NAME
    board = HealthBoard(wall=lambda: 1_700_000_000.0)
    publisher = BoardPublisher(path)
    board.add_listener(publisher)
    board.set_gpus([gpu(0), gpu(1)])
    board.record(GpuEvent(uuid_for(1), "xid", xid=79))
    board.count_liveness({uuid_for(0): True})
    published = read_board(path)
    assert published is not None
    by_uuid = published.by_uuid()
    assert by_uuid[uuid_for(0)].info == gpu(0)
    assert by_uuid[uuid_for(0)].health == board.record_of(uuid_for(0))
    assert by_uuid[uuid_for(1)].health.reason == "XID 79"
    assert by_uuid[uuid_for(1)].health.since == 1_700_000_000.0
    assert (by_uuid[uuid_for(0)].liveness_ok, by_uuid[uuid_for(0)].liveness_failed) == (1, 0)
    assert os.listdir(tmp_path) == [HEALTH_FILE_NAME]  # no temp file left


async def test_a_failed_write_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    publisher = BoardPublisher(tmp_path / "missing" / HEALTH_FILE_NAME)
    board = HealthBoard()
    board.add_listener(publisher)
    board.set_gpus([gpu(0)])
    board.record(GpuEvent(uuid_for(0), "xid", xid=79))
    assert caplog.text.count("cannot publish GPU health") == 1
    (tmp_path / "missing").mkdir()
    board.count_liveness({uuid_for(0): True})
    assert "works again" in caplog.text
    assert publisher.writes == 1


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not JSON"),
        ('{"kind": "Other"}', "not a GpuHealthBoard"),
        ('{"kind": "GpuHealthBoard", "apiVersion": "v9", "gpus": []}', "different releases"),
        ('{"kind": "GpuHealthBoard", "apiVersion": "v1", "writtenAt": 1}', "malformed"),
    ],
)
def test_a_bad_board_is_refused_with_a_reason(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / HEALTH_FILE_NAME
    path.write_text(text)
    with pytest.raises(HealthFileError, match=problem):
        read_board(path)


def test_a_state_the_reader_does_not_know_is_refused(tmp_path: Path) -> None:
    path = tmp_path / HEALTH_FILE_NAME
    item = {
        "uuid": "GPU-x",
        "index": 0,
        "name": "n",
        "memoryMiB": 1,
        "minorNumber": 0,
        "pciBusId": "",
        "state": "Sort of",
    }
    doc = {"kind": "GpuHealthBoard", "apiVersion": "v1", "writtenAt": 1, "gpus": [item]}
    path.write_text(json.dumps(doc))
    with pytest.raises(HealthFileError, match="neither Healthy nor Unhealthy"):
        read_board(path)


CLEAN = MemoryHealth(
    volatile_uncorrected_ecc=0,
    remapped_rows=RemappedRows(0, 0, pending=False, failure=False),
    retired_pages_pending=False,
)
UNSUPPORTED = MemoryHealth(
    volatile_uncorrected_ecc=None, remapped_rows=None, retired_pages_pending=None
)
DAMAGED = MemoryHealth(
    volatile_uncorrected_ecc=4,
    remapped_rows=RemappedRows(0, 2, pending=True, failure=False),
    retired_pages_pending=True,
)


def test_memory_problems_say_what_to_do() -> None:
    assert memory_problems(CLEAN, RecoveryChecks()) == []
    assert memory_problems(UNSUPPORTED, RecoveryChecks()) == []  # skipped, not failed
    problems = memory_problems(DAMAGED, RecoveryChecks())
    assert [c for c, _ in problems] == ["row-remap", "volatile-ecc", "retired-pages"]
    assert problems[0][1] == "row remap pending: reset the GPU (nvidia-smi -r) or reboot the node"
    off = RecoveryChecks(volatile_ecc=False, row_remap=False, retired_pages=False)
    assert memory_problems(DAMAGED, off) == []


# ------------------------------------------------ issue 32: provenance of the file
ME = Writer(boot_id="boot-a", pid=4242, start_ticks=5000)


def test_the_board_names_its_writer_and_how_long_it_holds(tmp_path: Path) -> None:
    path = tmp_path / HEALTH_FILE_NAME
    board = HealthBoard(wall=lambda: 1_700_000_000.0)
    board.add_listener(BoardPublisher(path, writer=ME, valid_for_s=30.0))
    board.set_gpus([gpu(0)])
    published = read_board(path)
    assert published is not None
    assert published.stamp == Stamp(writer=ME, written_at=1_700_000_000.0, valid_for_s=30.0)
    doc = json.loads(path.read_text())
    assert doc["writer"] == {"bootId": "boot-a", "pid": 4242, "startTicks": 5000}


def test_the_plugin_removes_only_the_board_it_wrote(tmp_path: Path) -> None:
    path = tmp_path / HEALTH_FILE_NAME
    old, new = BoardPublisher(path, writer=ME), BoardPublisher(path, writer=ME_NEXT)
    board = HealthBoard()
    board.set_gpus([gpu(0)])
    old(board)
    new(board)  # a newer plugin (a rolling update) wrote over it
    assert not old.remove()
    assert path.exists()
    assert new.remove()
    assert not path.exists()
    assert not new.remove()  # nothing there: still no error


ME_NEXT = Writer(boot_id="boot-a", pid=4243, start_ticks=6000)


async def test_the_running_plugin_refreshes_its_board_and_removes_it_at_exit(
    short_tmp_path: Path,
) -> None:
    directory = short_tmp_path / "dp"
    directory.mkdir()
    path = directory / HEALTH_FILE_NAME
    path.write_text('{"kind": "GpuHealthBoard", "apiVersion": "v1"}')  # an earlier install's
    async with running_plugin(directory, gpu_count=1) as plugin:
        plugin.supervisor.board_refresh_s = 0.05
        first = await eventually_board(path, lambda b: b.stamp is not None)
        assert first.stamp is not None
        assert first.stamp.writer == current_writer()
        later = await eventually_board(
            path, lambda b: b.stamp is not None and b.written_at > first.written_at
        )
        assert later.stamp is not None
        assert later.stamp.valid_for_s == VALID_FOR_S
    assert not path.exists()


async def eventually_board(
    path: Path, ok: Callable[[PublishedBoard], bool], *, timeout_s: float = 10.0
) -> PublishedBoard:
    """Wait (bounded) for the file to hold a board ``ok`` accepts."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            board = read_board(path)
        except HealthFileError:
            board = None
        if board is not None and ok(board):
            return board
        assert asyncio.get_running_loop().time() < deadline, "the board never got there"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    ("node", "enforces"),
    [
        pytest.param(MpsNode(), [], id="off"),
        pytest.param(MpsNode(mode="unsupervised"), [], id="someone-elses-daemon"),
        pytest.param(
            MpsNode(mode="supervised", status=MpsStatus(state="down", reason="gone", restarts=2)),
            ["memory", "fixed"],
            id="supervised-down-still-admits-nobody-unlimited",
        ),
        pytest.param(
            MpsNode(mode="supervised", status=MpsStatus(state="stopped")), [], id="stopped"
        ),
    ],
)
def test_the_board_says_what_the_node_enforces(
    tmp_path: Path, node: MpsNode, enforces: list[str]
) -> None:
    path = tmp_path / HEALTH_FILE_NAME
    board = HealthBoard(wall=lambda: 1_700_000_000.0)
    board.add_listener(BoardPublisher(path))
    board.set_gpus([gpu(0)])
    board.set_mps_node(node)
    assert json.loads(path.read_text())["mps"]["enforces"] == enforces
    published = read_board(path)
    assert published is not None
    assert published.mps == node


def test_a_board_without_mps_means_nothing_is_enforced(tmp_path: Path) -> None:
    """Boards of releases before the ``mps`` section, and modes this reader does not know."""
    path = tmp_path / HEALTH_FILE_NAME
    board = HealthBoard(wall=lambda: 1_700_000_000.0)
    board.add_listener(BoardPublisher(path))
    board.set_gpus([gpu(0)])
    for section in (None, {"mode": "from-the-future", "enforces": ["memory"]}):
        document = json.loads(path.read_text())
        document.pop("mps", None)
        if section is not None:
            document["mps"] = section
        path.write_text(json.dumps(document))
        published = read_board(path)
        assert published is not None
        assert published.mps == MpsNode()
        assert published.mps.enforces == ()
