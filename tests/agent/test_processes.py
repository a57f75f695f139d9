"""Pinned processes (``plugin.agent.processes``): a handle never reaches a process that got
the PID number later, with pidfds and with the start-time fallback."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugin.agent.cgroups import ProcessGoneError
from plugin.agent.processes import (
    ProcStatError,
    open_process,
    parse_proc_stat,
    read_proc_stat,
)
from tests.agent.builders import place_on_host, stat_line


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


@pytest.mark.parametrize(
    ("text", "state", "start"),
    [
        pytest.param(stat_line(7, state="R", start_ticks=99), "R", 99, id="odd-command-name"),
        pytest.param(stat_line(7, state="Z", start_ticks=5), "Z", 5, id="zombie"),
    ],
)
def test_parse_proc_stat(text: str, state: str, start: int) -> None:
    stat = parse_proc_stat(text)
    assert (stat.state, stat.start_ticks) == (state, start)
    assert stat.exited == (state == "Z")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("", "not a /proc/<pid>/stat line", id="empty"),
        pytest.param("7 (x) S 1 2 3", "not a /proc/<pid>/stat line", id="short"),
        pytest.param(
            "7 (x) S " + " ".join(["0"] * 18 + ["soon"] + ["0"] * 30),
            "field 22 (starttime) is not a number: 'soon'",
            id="not-a-number",
        ),
    ],
)
def test_parse_proc_stat_rejects(text: str, message: str) -> None:
    with pytest.raises(ProcStatError) as err:
        parse_proc_stat(text)
    assert message in str(err.value)


def test_read_proc_stat_of_a_gone_process(tmp_path: Path) -> None:
    with pytest.raises(ProcessGoneError, match="process 12345 is gone"):
        read_proc_stat(12345, proc_root=tmp_path)


def test_a_pidfd_handle_never_signals_a_reaped_process(child: subprocess.Popen[bytes]) -> None:
    handle = open_process(child.pid, proc_root=Path("/proc"))
    assert handle.pinned_by == "pidfd"
    assert handle.alive()
    child.kill()
    child.wait(timeout=30)  # reaped: the number is free for anyone now
    assert not handle.alive()
    with pytest.raises(ProcessLookupError):
        handle.send(signal.SIGKILL)
    handle.close()
    handle.close()  # idempotent


def test_a_pidfd_handle_signals_its_process(child: subprocess.Popen[bytes]) -> None:
    with open_process(child.pid, proc_root=Path("/proc")) as handle:
        handle.send(signal.SIGTERM)
    assert child.wait(timeout=30) == -signal.SIGTERM


def test_the_start_time_fallback_refuses_a_replaced_process(
    tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    place_on_host(tmp_path, child.pid)  # copies the real stat file
    handle = open_process(child.pid, proc_root=tmp_path, use_pidfd=False)
    assert handle.pinned_by == "start-time"
    assert handle.alive()
    # The PID now belongs to a process that started later.
    real = read_proc_stat(child.pid, proc_root=Path("/proc"))
    (tmp_path / str(child.pid) / "stat").write_text(
        stat_line(child.pid, start_ticks=real.start_ticks + 1)
    )
    assert not handle.alive()
    with pytest.raises(ProcessLookupError, match="gone or was replaced"):
        handle.send(signal.SIGKILL)
    assert child.poll() is None  # the real process was never signalled


def test_the_start_time_fallback_signals_an_unchanged_process(
    tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    place_on_host(tmp_path, child.pid)
    with open_process(child.pid, proc_root=tmp_path, use_pidfd=False) as handle:
        handle.send(signal.SIGTERM)
    assert child.wait(timeout=30) == -signal.SIGTERM


@pytest.mark.parametrize("use_pidfd", [True, False], ids=["pidfd", "start-time"])
def test_open_process_of_a_gone_process(tmp_path: Path, use_pidfd: bool) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    with pytest.raises(ProcessGoneError):
        open_process(proc.pid, proc_root=tmp_path, use_pidfd=use_pidfd)


def test_the_start_time_fallback_does_not_pin_a_zombie(tmp_path: Path) -> None:
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "stat").write_text(stat_line(77, state="Z"))
    with pytest.raises(ProcessGoneError, match="process 77 has exited"):
        open_process(77, proc_root=tmp_path, use_pidfd=False)
