"""``metagpu dev`` (what ``make run`` starts): the prompt, and one real session end to end."""

from __future__ import annotations

import base64
import json
import os
import queue
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from metagpu.dev_prompt import (
    Allocate,
    InjectXid,
    KillMpsDaemon,
    OtherPlugin,
    PromptError,
    Quit,
    Release,
    Schedule,
    ShowDevices,
    ShowHelp,
    ShowTop,
    parse_prompt,
)
from metagpu.dev_session import READY_LINE
from tests.conftest import REPO_ROOT


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param("", None, id="blank"),
        pytest.param("allocate 50", Allocate(units=50, asked="50"), id="units"),
        pytest.param("allocate 0.5", Allocate(units=50, asked="0.5"), id="fraction"),
        pytest.param("allocate 500m", Allocate(units=50, asked="500m"), id="milli"),
        pytest.param("ALLOCATE 1.5", Allocate(units=150, asked="1.5"), id="case-insensitive"),
        pytest.param("schedule 0.7", Schedule(units=70, asked="0.7"), id="schedule"),
        pytest.param("release 2", Release(number=2), id="release-one"),
        pytest.param("release all", Release(number=None), id="release-all"),
        pytest.param("devices", ShowDevices(), id="devices"),
        pytest.param("top", ShowTop(), id="top"),
        pytest.param("xid 0 79", InjectXid(gpu_index=0, xid=79), id="xid"),
        pytest.param("other 1", OtherPlugin(gpu_index=1), id="other"),
        pytest.param("other none", OtherPlugin(gpu_index=None), id="other-none"),
        pytest.param("mps kill", KillMpsDaemon(), id="mps-kill"),
        pytest.param("help", ShowHelp(), id="help"),
        pytest.param("quit", Quit(), id="quit"),
    ],
)
def test_prompt_commands(line: str, expected: object) -> None:
    assert parse_prompt(line, units_per_gpu=100) == expected


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        pytest.param("allocate 0.333", "try 0.33 or 0.34", id="not-whole-units"),
        pytest.param("allocate 0", "positive amount", id="zero"),
        pytest.param("allocate lots", "not a GPU amount", id="garbage"),
        pytest.param("allocate", "usage: allocate", id="missing-amount"),
        pytest.param("release x", "allocation number must be a whole number", id="bad-number"),
        pytest.param("release 0", ">= 1", id="release-zero"),
        pytest.param("xid 1", "usage: xid", id="xid-missing"),
        pytest.param("other", "usage: other", id="other-missing"),
        pytest.param("other -1", "GPU index must be a whole number", id="other-negative"),
        pytest.param("xid ² 79", "GPU index must be a whole number", id="xid-unicode-digit"),
        pytest.param("launch", "unknown command 'launch'", id="unknown"),
        pytest.param("mps", "usage: mps kill", id="mps-without-kill"),
        pytest.param("top 1", "usage: top", id="top-with-argument"),
        pytest.param("allocate " + "9" * 5000, "has 5000 digits; at most 9", id="huge-amount"),
        pytest.param("xid 0 " + "7" * 5000, "XID 777777777777… has 5000", id="huge-xid"),
        pytest.param("release " + "1" * 4301, "has 4301 digits", id="huge-release"),
        pytest.param("allocate ٣", "not a GPU amount", id="arabic-indic-digit"),
    ],
)
def test_prompt_errors_say_what_would_be_accepted(line: str, fragment: str) -> None:
    with pytest.raises(PromptError, match=fragment):
        parse_prompt(line, units_per_gpu=100)


class Session:
    """A ``metagpu dev`` subprocess whose stdout lines are read by a thread."""

    def __init__(self, run_dir: Path, *extra: str) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "metagpu.cli",
                "dev",
                "--run-dir",
                str(run_dir),
                "--listen",
                "127.0.0.1:0",
                *extra,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_line(self, predicate: str, *, timeout_s: float = 60) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (self.process.poll() is not None and self.lines.empty()):
                err = self.process.stderr.read() if self.process.poll() is not None else ""  # type: ignore[union-attr]
                raise AssertionError(
                    f"no line containing {predicate!r}; saw:\n" + "\n".join(self.seen) + err
                )
            try:
                line = self.lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            self.seen.append(line)
            if predicate in line:
                return line

    def send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    run = Session(tmp_path / "run")
    try:
        yield run
    finally:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait(timeout=30)


@pytest.mark.slow
def test_dev_session_end_to_end(session: Session, tmp_path: Path) -> None:
    session.wait_line(READY_LINE)
    url = session.wait_line("webhook ").split()[-1]
    # make run takes no arguments: its banner says how to start DRA mode (test_dev_dra.py)
    assert ".venv/bin/metagpu dev --dra" in session.wait_line("DRA mode ")
    ca_file = tmp_path / "run" / "webhook-tls" / "ca.crt"

    # The webhook answers over HTTPS that verifies against the CA it generated.
    review = (REPO_ROOT / "examples" / "admission-review-half-gpu.json").read_bytes()
    request = urllib.request.Request(
        url, data=review, headers={"Content-Type": "application/json"}, method="POST"
    )
    context = ssl.create_default_context(cafile=str(ca_file))
    with urllib.request.urlopen(request, context=context, timeout=30) as reply:
        answer = json.load(reply)["response"]
    assert answer["allowed"] is True
    patch = json.loads(base64.b64decode(answer["patch"]))
    assert any("cnvrg.io~1metagpu" in op["path"] for op in patch), patch

    # The demo allocation ran through the simulated kubelet and the real plugin.
    session.wait_line("#1 allocate 0.5 -> 50 units")
    session.wait_line("NVIDIA_VISIBLE_DEVICES=GPU-")
    session.wait_line("(released again)")

    # Commands on stdin: allocate, bad input, an XID that makes a GPU unhealthy.
    session.send("allocate 1.5")
    session.wait_line("#1 allocate 1.5 -> 150 units")
    # The scheduler extender's decision on the simulated node, then the kubelet's.
    session.send("schedule 0.7")
    session.wait_line("free units per GPU (extender's view)")
    assigned = session.wait_line("extender: assigned 70 on GPU ")
    placed = session.wait_line("#2 allocate 0.7 -> 70 units: 70 on GPU ")
    assert assigned.split("assigned ", 1)[1] == placed.split("units: ", 1)[1]
    # The node agent's picture of it (issue 30, item 5): 150 + 70 units as bars and rows.
    assert any(
        line.startswith("  live view    .venv/bin/metagpu top --socket ") for line in session.seen
    )
    session.send("top")
    session.wait_line("metagpu top  node (no name)  at ")
    full = session.wait_line("100/100 allocated")
    assert full.startswith("  units  [")
    session.wait_line("CONTAINER ")
    assert "mem advisory" in session.wait_line("  dev/alloc-")
    session.send("schedule 3.0")
    assert "needs 300 units, 180 free" in session.wait_line("extender: node refused:")
    session.send("allocate 0.333")
    session.wait_line("try 0.33 or 0.34")
    session.send("xid 3 79")
    session.wait_line("GPU 3 is now Unhealthy")
    session.send("devices")
    assert "allocatable: 300" in session.wait_line("allocatable:")

    # Another device plugin serving GPU 2 too (through the simulated PodResources API):
    # metagpu withdraws it, and gives it back when that plugin lets go.
    session.send("other 2")
    assert "(200 allocatable now)" in session.wait_line("nvidia.com/gpu now also advertises")
    session.send("other none")
    assert "300 units allocatable" in session.wait_line("no other device plugin now")

    session.process.send_signal(signal.SIGINT)
    session.wait_line("metagpu dev stopped")
    assert session.process.wait(timeout=60) == 0
    plugins_dir = tmp_path / "run" / "device-plugins"
    assert not list(plugins_dir.glob("*.sock")), "sockets left behind"


@pytest.fixture
def mps_session(short_tmp_path: Path) -> Iterator[Session]:
    """``--mps``: the stand-in daemon's socket lives in the run dir (unix paths < 108 bytes)."""
    run = Session(short_tmp_path / "run", "--mps")
    try:
        yield run
    finally:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait(timeout=30)


@pytest.mark.slow
def test_dev_session_supervises_mps_and_recovers_from_a_killed_daemon(
    mps_session: Session, short_tmp_path: Path
) -> None:
    """Issue 28, item 5: ``make run`` turns MPS on with the stand-in daemon on simulated
    GPUs, shows the daemon and each allocation's limits in ``devices``, and recovers from
    a killed daemon (its GPUs withdrawn, then the daemon restarted with its defaults)."""
    session = mps_session
    session.wait_line(READY_LINE)
    session.wait_line("(released again)")
    session.send("allocate 0.5")
    session.wait_line("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40960M")
    session.send("devices")
    assert "up (0 restart(s)" in session.wait_line("MPS: supervised daemon")
    assert "(enforced)" in session.wait_line("#1: memory limit per GPU")
    session.send("mps kill")
    session.wait_line("killed the MPS control daemon")
    assert "not answering" in session.wait_line("MPS control daemon not answering")
    session.wait_line("the plugin withdrew every GPU it serves meanwhile")
    assert "up (1 restart(s)" in session.wait_line("MPS: supervised daemon up")
    assert "allocatable: 400" in session.wait_line("allocatable:")
    session.process.send_signal(signal.SIGINT)
    session.wait_line("metagpu dev stopped")
    assert session.process.wait(timeout=60) == 0
    pid_file = short_tmp_path / "run" / "mps" / "nvidia-cuda-mps-control.pid"
    assert not pid_file.exists() or not _alive(int(pid_file.read_text()))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rpartition(")")[2].split()[:1] != ["Z"]
