"""Shared node files are trusted only while provably current (issue 32, item 1).

:func:`judge` is pure and table-driven; :class:`ProcessProbe` runs over a fake
procfs, including a writer in another PID namespace (the device plugin's pod)
seen from the host's (the agent's ``hostPID``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from plugin.api.provenance import (
    ProcessProbe,
    ProvenanceError,
    Stamp,
    Writer,
    current_writer,
    judge,
    read_start_ticks,
)
from tests.agent.builders import BOOT_ID, fake_boot, stat_line

WRITER = Writer(boot_id=BOOT_ID, pid=1, start_ticks=5000)
NOW = 1_700_000_000.0


def stamp(*, writer: Writer = WRITER, age_s: float = 1.0, valid_for_s: float = 30.0) -> Stamp:
    return Stamp(writer=writer, written_at=NOW - age_s, valid_for_s=valid_for_s)


@pytest.mark.parametrize(
    ("given", "boot_id", "running", "expected"),
    [
        pytest.param(stamp(), BOOT_ID, True, None, id="current"),
        pytest.param(None, BOOT_ID, True, "does not say which process", id="no stamp"),
        pytest.param(stamp(), None, True, "boot ID cannot be read", id="boot unknown"),
        pytest.param(stamp(), "another-boot", True, "before this node last booted", id="reboot"),
        pytest.param(stamp(age_s=95), BOOT_ID, True, "refreshed 95 s ago", id="past its bound"),
        pytest.param(stamp(age_s=-95), BOOT_ID, True, "in the future", id="from the future"),
        pytest.param(stamp(), BOOT_ID, False, "process 1 (started 5000", id="writer gone"),
    ],
)
def test_a_file_is_current_only_while_every_check_holds(
    given: Stamp | None, boot_id: str | None, running: bool, expected: str | None
) -> None:
    reason = judge(given, boot_id=boot_id, now=NOW, running=lambda _: running)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None
        assert expected in reason


def test_the_stamp_round_trips_and_a_bad_one_is_refused() -> None:
    s = stamp()
    assert Stamp.from_json(s.to_json()) == s
    assert Stamp.from_json({"writtenAt": 1}) is None
    with pytest.raises(ProvenanceError, match="malformed"):
        Stamp.from_json({"writer": {"bootId": "x"}, "writtenAt": 1, "validForS": 1})
    with pytest.raises(ProvenanceError, match="positive"):
        Stamp.from_json(s.to_json() | {"validForS": 0})


def test_this_process_is_a_running_writer_on_this_boot() -> None:
    me = current_writer()
    assert me.pid == os.getpid()
    probe = ProcessProbe()
    assert probe.boot_id() == me.boot_id
    assert probe.running(me)
    assert not probe.running(Writer(me.boot_id, me.pid, me.start_ticks + 1))


def test_the_start_time_is_read_past_a_command_name_with_parentheses(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "stat").write_text(stat_line(7, start_ticks=123456))
    assert read_start_ticks(7, tmp_path) == 123456


def process(proc: Path, host_pid: int, *, start_ticks: int, nspid: str) -> None:
    d = proc / str(host_pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(stat_line(host_pid, start_ticks=start_ticks))
    (d / "status").write_text(f"Name:\tmetagpu\nNSpid:\t{nspid}\n")


def test_a_writer_in_another_pid_namespace_is_found_by_its_start_time(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_boot(proc)
    process(proc, 1, start_ticks=1, nspid="1")  # the host's init: same inner PID, not it
    process(proc, 4100, start_ticks=5000, nspid="4100")  # same start, another inner PID
    process(proc, 4242, start_ticks=5000, nspid="4242\t1")  # the plugin, PID 1 in its pod
    probe = ProcessProbe(proc)
    assert probe.running(WRITER)
    # Found once; then checked by its host PID. The pod restarts: a new PID 1 there.
    (proc / "4242" / "stat").write_text(stat_line(4242, start_ticks=9000))
    assert not probe.running(WRITER)
    assert not probe.running(WRITER)  # gone for good, without another search


def test_a_writer_nobody_runs_is_not_running(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    process(proc, 1, start_ticks=1, nspid="1")
    assert not ProcessProbe(proc).running(WRITER)
    assert not ProcessProbe(tmp_path / "no-proc").running(WRITER)
    assert ProcessProbe(tmp_path / "no-proc").boot_id() is None
