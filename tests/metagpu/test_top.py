"""``metagpu top``: the frame it draws (pure), and the real command driven in a pseudo-terminal.

The terminal tests run ``python -m metagpu.cli top`` as a child process on a
pty, against a real agent (simulated GPUs, shares from the PodResources
harness, its API on a unix socket), and read what a terminal would show
through a small VT100 model (:mod:`tests.harness.screen`): the bars and rows
and their numbers, a redraw after an allocation changes, a redraw at a new
width after a resize, and ``q`` leaving the shell's screen and terminal
modes as they were. Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import select
import signal
import struct
import sys
import termios
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from certs.kube import open_api_client
from metagpu.top_view import BAR_MAX, bar, render_error, render_screen
from plugin.agent.agent import AgentRuntime
from plugin.api.resources import AGENT_SOCKET_NAME
from tests.agent.builders import place_in_container, place_on_host, ref
from tests.agent.test_runtime import U0, U1, Env, R, child, env  # noqa: F401 - env is a fixture
from tests.harness.podresources import FakePodResources, running_pod_resources
from tests.harness.screen import Screen

Json = dict[str, Any]


# ------------------------------------------------------------------ renderer
def share(
    pod: str,
    percent: float,
    used: int | None,
    limit: int,
    *,
    sm: int | None = None,
    over: bool = False,
    enforced: bool = False,
    sm_cap: int | None = None,
    container: str = "main",
) -> Json:
    return {
        "namespace": "ml",
        "pod": pod,
        "container": container,
        "units": int(percent),
        "unitsPerGpu": 100,
        "sharePercent": percent,
        "memoryUsedMiB": used,
        "memoryLimitMiB": limit,
        "overLimit": over,
        "utilizationPercent": sm,
        "computePolicy": "fixed" if sm_cap is not None else "balance",
        "limits": {
            "memory": {"mib": limit, "enforced": enforced},
            "sm": None if sm_cap is None else {"percent": sm_cap, "enforced": enforced},
        },
    }


def gpu(
    index: int, *, allocated: int = 0, used: int | None = 0, sm: int | None = 0, **kw: Any
) -> Json:
    return {
        "index": index,
        "name": "NVIDIA A100-SXM4-80GB",
        "healthy": True,
        "unitsTotal": 100,
        "unitsAllocated": allocated,
        "memoryUsedMiB": used,
        "memoryTotalMiB": 81920,
        "utilizationPercent": sm,
        "shares": [],
        "otherOwner": None,
    } | kw


def node_doc(*items: Json, **kw: Any) -> Json:
    return {
        "kind": "DeviceList",
        "node": "node-a",
        "takenAt": "2026-11-27T08:00:00Z",
        "stale": [],
        "mps": {"mode": "off", "enforces": []},
        "caller": {"scope": "node", "pid": 1, "uid": 0},
        "items": list(items),
    } | kw


TWO_GPUS = node_doc(
    gpu(
        0,
        allocated=75,
        used=31000,
        sm=40,
        shares=[
            share("train-7f9c", 25.0, 30000, 20480, sm=30, over=True),
            share("notebook-0", 50.0, 1000, 40960, sm_cap=50),
        ],
    ),
    gpu(
        1,
        used=None,
        sm=None,
        healthy=False,
        problem="XID 79",
        health={"state": "Unhealthy", "reason": "XID 79: GPU has fallen off the bus"},
    ),
)


def test_bars_fill_in_proportion_and_say_when_unknown() -> None:
    assert bar(0.75, 20) == "[" + "█" * 15 + "░" * 5 + "]"
    assert bar(1.5, 4, ascii_only=True) == "[####]"
    assert bar(-1, 4, ascii_only=True) == "[....]"
    assert bar(None, 3) == "[???]"


def test_a_frame_has_three_bars_per_gpu_and_a_row_per_share() -> None:
    lines = render_screen(TWO_GPUS, width=100, ascii_only=True)
    assert lines[0] == "metagpu top  node node-a  at 2026-11-27T08:00:00Z"
    cells = BAR_MAX  # 100 columns: the widest bars
    assert "GPU 0  NVIDIA A100-SXM4-80GB  healthy" in lines
    assert f"  units  [{'#' * 30}{'.' * 10}]  75/100 allocated" in lines
    assert f"  memory [{'#' * 15}{'.' * 25}]  31,000 / 81,920 MiB" in lines
    assert f"  SM     [{'#' * 16}{'.' * 24}]  40%" in lines
    assert len("#" * 30 + "." * 10) == cells
    table = [line.split("  ") for line in lines if line.startswith("  ml/")]
    assert [[c.strip() for c in row if c.strip()] for row in table] == [
        ["ml/train-7f9c/main", "25%", "30,000 / 20,480 MiB OVER", "30%", "mem advisory, sm no cap"],
        ["ml/notebook-0/main", "50%", "1,000 / 40,960 MiB", "-", "mem advisory, sm 50% advisory"],
    ]
    assert "GPU 1  NVIDIA A100-SXM4-80GB  UNHEALTHY: XID 79: GPU has fallen off the bus" in lines
    assert f"  memory [{'?' * cells}]  - / 81,920 MiB" in lines
    assert f"  SM     [{'?' * cells}]  -" in lines


@pytest.mark.parametrize("width", [20, 28, 36, 44, 56, 72, 80, 100, 140])
def test_no_line_is_wider_than_the_terminal_and_every_bar_of_a_frame_is_as_wide(
    width: int,
) -> None:
    lines = render_screen(TWO_GPUS, width=width, hint="q quits, every 2s")
    assert all(len(line) <= width for line in lines), lines
    bars = {len(line.split("[", 1)[1].split("]")[0]) for line in lines if "  [" in line[:12]}
    assert len(bars) <= 1, lines


def test_a_narrow_terminal_keeps_the_numbers_and_drops_bars_then_columns() -> None:
    lines = render_screen(TWO_GPUS, width=36)
    assert "  units  75/100 allocated" in lines  # no room for a readable bar
    assert "  memory 31,000 / 81,920 MiB" in lines
    lines = render_screen(TWO_GPUS, width=46)
    header = next(line for line in lines if "CONTAINER" in line)
    columns = [c.strip() for c in header.split("  ") if c.strip()]
    assert columns == ["CONTAINER", "SHARE", "MEMORY USED / LIMIT"]  # SM and LIMITS dropped
    rows = [line.split("  ") for line in lines if line.startswith("  ~")]
    assert [[c.strip() for c in row if c.strip()] for row in rows] == [
        ["~-7f9c/main", "25%", "30,000 / 20,480 MiB OVER"],  # the ends kept
        ["~ook-0/main", "50%", "1,000 / 40,960 MiB"],
    ]


def test_a_frame_taller_than_the_terminal_says_what_did_not_fit() -> None:
    lines = render_screen(TWO_GPUS, width=100, height=6)
    assert len(lines) == 6
    assert lines[-1].startswith("... ")
    assert "more line(s): enlarge the terminal" in lines[-1]


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        pytest.param(node_doc(), "no GPUs on this node", id="no-gpus"),
        pytest.param(
            node_doc(noGpusReason="NVML found no GPUs"),
            "no GPUs on this node: NVML found no GPUs",
            id="no-gpus-with-reason",
        ),
        pytest.param(
            node_doc(
                caller={"scope": "container", "namespace": "ml", "pod": "a", "container": "c"}
            ),
            "this container holds no GPU units",
            id="container-without-shares",
        ),
    ],
)
def test_nothing_to_draw_says_so(doc: Json, expected: str) -> None:
    assert expected in render_screen(doc, width=80)


def test_header_names_stale_sources_the_mps_daemon_and_the_hint() -> None:
    doc = node_doc(
        gpu(0),
        stale=["podresources"],
        mps={
            "mode": "supervised",
            "enforces": ["memory"],
            "daemon": {"state": "up", "restarts": 2},
        },
    )
    lines = render_screen(doc, width=120, hint="q quits, every 2s")
    assert lines[0].endswith("STALE: podresources  (q quits, every 2s)")
    assert lines[1] == "MPS: supervised daemon up (2 restart(s)): enforces memory"


def test_enforced_limits_and_another_plugins_claim_are_shown() -> None:
    doc = node_doc(
        gpu(
            0,
            allocated=25,
            shares=[share("a", 25.0, 100, 20480, enforced=True, sm_cap=25)],
            otherOwner={"resources": ["nvidia.com/gpu"], "conflicts": []},
        )
    )
    lines = render_screen(doc, width=120)
    assert "  also handed out by nvidia.com/gpu: its units are withdrawn" in lines
    assert any(line.endswith("mem enforced, sm 25% enforced") for line in lines), lines


def test_a_container_sees_its_own_share_against_its_limit() -> None:
    doc = node_doc(
        {
            "index": 0,
            "name": "A100",
            "memoryTotalMiB": 81920,
            "share": share("a", 25.0, 10240, 20480, sm=12, enforced=True),
        },
        caller={"scope": "container", "namespace": "ml", "pod": "a", "container": "main"},
    )
    lines = render_screen(doc, width=80, ascii_only=True)
    assert "container ml/a/main" in lines[0]
    assert "GPU 0  A100  share 25%" in lines
    memory = next(line for line in lines if line.startswith("  memory"))
    assert memory.endswith("]  10,240 / 20,480 MiB")
    assert memory.count("#") == memory.count(".")
    assert "  limits mem enforced, sm no cap" in lines


def test_an_unreachable_agent_is_a_frame_too() -> None:
    lines = render_error("cannot reach the metagpu agent at /x: gone.\nCheck that:", width=30)
    assert lines[0] == "metagpu top"
    assert " ".join(line.strip() for line in lines[2:-2]).replace("- ", "-") == (
        "cannot reach the metagpu agent at /x: gone. Check that:"
    )
    assert all(len(line) <= 30 for line in lines)
    assert lines[-1] == "  (retrying)"


# ------------------------------------------------------------------ terminal
def test_the_screen_model_reads_what_a_terminal_would_show() -> None:
    # The model the pty tests trust: an in-place redraw over a longer frame, erase to
    # the end of line and below, the alternate screen, and escapes split across reads.
    screen = Screen(4, 10)
    screen.feed("shell$\r\n")
    screen.feed("\x1b[?1049h\x1b[?25l\x1b[Hlong line\r\nsecond\r\nthird")
    screen.feed("\x1b[Hab\x1b[K\r\ncd\x1b")
    screen.feed("[K\x1b[J")
    assert screen.lines() == ["ab", "cd", "", ""]
    assert screen.on_alt
    assert not screen.cursor_visible
    screen.feed("\x1b[?25h\x1b[?1049l\x1b[31mok\x1b[0m\x1b[5n")
    assert screen.lines()[:2] == ["shell$", "ok"]
    assert screen.unknown == ["CSI 5n"]


@dataclass
class Pty:
    """The parent's end of a pseudo-terminal and the screen it shows."""

    master: int
    screen: Screen

    def read_until(
        self, predicate: Callable[[Screen], bool], *, timeout_s: float, what: str
    ) -> None:
        """Feed the screen until ``predicate`` holds on it; fails after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not predicate(self.screen):
            left = deadline - time.monotonic()
            assert left > 0, f"the screen never showed {what}:\n{self.screen.text()}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError as exc:  # EIO: every slave end closed, the child is gone
                    raise AssertionError(
                        f"top exited before {what}:\n{self.screen.text()}"
                    ) from exc
                self.screen.feed(chunk.decode("utf-8", errors="replace"))

    def drain(self, *, timeout_s: float) -> None:
        """Read what is left once the child exited (until EIO: the pty is closed)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], deadline - time.monotonic())
            if not ready:
                continue
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.screen.feed(chunk.decode("utf-8", errors="replace"))
        raise AssertionError("the pseudo-terminal stayed open after top exited")


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def line_with(screen: Screen, start: str) -> str:
    return next((line for line in screen.lines() if line.startswith(start)), "")


@dataclass
class Node:
    env: Env
    kubelet: FakePodResources
    runtime: AgentRuntime

    @property
    def socket(self) -> str:
        return str(self.env.socket_dir / AGENT_SOCKET_NAME)


@pytest.fixture
async def node(env: Env) -> AsyncIterator[Node]:  # noqa: F811 - the fixture
    """A real agent on two simulated GPUs: ml/a (25 units, 30,000 MiB used) and ml/b
    (50 units, 1,000 MiB) on GPU 0; ml/a/side holds 10 units of GPU 1."""
    pa, pb = await child(env), await child(env)
    place_in_container(env.proc_root, pa, ref("a"))
    place_in_container(env.proc_root, pb, ref("b"))
    env.write_gpus([(pa, 30000), (pb, 1000)])
    async with running_pod_resources(env.kubelet_sock) as kubelet:
        kubelet.assign("ml", "a", "main", R, [f"{U0}::{u}" for u in range(25)])
        kubelet.assign("ml", "b", "main", R, [f"{U0}::{u}" for u in range(25, 75)])
        kubelet.assign("ml", "a", "side", R, [f"{U1}::{u}" for u in range(10)])
        async with AgentRuntime(env.config(), open_api=open_api_client) as rt:
            await rt.agent.next_cycle()
            yield Node(env, kubelet, rt)


CONTROLLING_TTY = (
    "import fcntl, os, sys, termios\n"
    "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)
"""Make the pty the child's controlling terminal, then become ``metagpu top``: the
kernel then sends it SIGWINCH on a resize and SIGINT on Ctrl-C, as a shell's terminal
would (a new session has no controlling terminal of its own)."""


async def start_top(
    node: Node | None, *args: str, socket: str = "", rows: int = 40, cols: int = 110
) -> tuple[Any, Pty]:
    """``metagpu top`` on a new pty against ``node``'s agent (or ``socket``)."""
    master, slave = os.openpty()
    set_size(slave, rows, cols)
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", CONTROLLING_TTY, "-m", "metagpu.cli", "top"),
        *("--socket", node.socket if node else socket, *args),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        start_new_session=True,
    )
    os.close(slave)
    if node is not None:
        place_on_host(node.env.proc_root, proc.pid)  # root on the node: node scope
    return proc, Pty(master, Screen(rows, cols))


async def test_top_in_a_pseudo_terminal_draws_refreshes_and_quits_on_q(node: Node) -> None:
    proc, pty = await start_top(node, "--interval", "0.2")
    shell_modes = termios.tcgetattr(pty.master)
    try:
        await asyncio.to_thread(
            pty.read_until,
            lambda s: (
                "ml/b/main" in s.text() and line_with(s, "  units").endswith("75/100 allocated")
            ),
            timeout_s=30,
            what="GPU 0's bars and shares",
        )
        screen = pty.screen
        assert screen.on_alt
        assert not screen.cursor_visible
        lines = screen.lines()
        assert lines[0].startswith("metagpu top  node node-a  at ")
        assert lines[0].endswith("(q quits, every 0.2s)")
        gpu0 = lines.index("GPU 0  NVIDIA A100-SXM4-80GB  healthy")
        units, memory, sm = lines[gpu0 + 1 : gpu0 + 4]
        assert units == f"  units  [{'█' * 30}{'░' * 10}]  75/100 allocated"
        assert memory == f"  memory [{'█' * 15}{'░' * 25}]  31,000 / 81,920 MiB"
        assert sm == f"  SM     [{'░' * 40}]  0%"  # the simulated GPU reports 0% SM
        rows = {line.split()[0]: line for line in lines if line.startswith("  ml/")}
        assert rows["ml/a/main"].split()[1:6] == ["25%", "30,000", "/", "20,480", "MiB"]
        assert "OVER" in rows["ml/a/main"]
        assert "mem advisory" in rows["ml/a/main"]
        assert rows["ml/b/main"].split()[1:5] == ["50%", "1,000", "/", "40,960"]
        assert rows["ml/a/side"].split()[1:5] == ["10%", "0", "/", "8,192"]
        gpu1 = lines.index("GPU 1  NVIDIA A100-SXM4-80GB  healthy")
        assert lines[gpu1 + 1].endswith("]  10/100 allocated")
        # Keys arrive one at a time without echo while it runs; the shell's modes are saved.
        live = termios.tcgetattr(pty.master)
        assert not live[3] & termios.ICANON
        assert not live[3] & termios.ECHO
        assert shell_modes[3] & termios.ICANON

        # An allocation changes: the next reading of the agent is on the screen.
        node.kubelet.assign("ml", "b", "extra", R, [f"{U1}::{u}" for u in range(10, 40)])
        await asyncio.to_thread(
            pty.read_until,
            lambda s: "ml/b/extra" in s.text(),
            timeout_s=30,
            what="the new share ml/b/extra",
        )
        gpu1 = pty.screen.lines().index("GPU 1  NVIDIA A100-SXM4-80GB  healthy")
        assert pty.screen.lines()[gpu1 + 1].endswith("]  40/100 allocated")

        os.write(pty.master, b"q")
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        await asyncio.to_thread(pty.drain, timeout_s=10)
        # The shell's screen and cursor are back, and so are its terminal modes.
        assert not pty.screen.on_alt
        assert pty.screen.cursor_visible
        assert pty.screen.unknown == []
        assert termios.tcgetattr(pty.master)[3] == shell_modes[3]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        os.close(pty.master)


async def test_a_resize_redraws_at_once_at_the_new_width(node: Node) -> None:
    # A minute between refreshes: only the resize (SIGWINCH from the kernel) can
    # bring the narrower frame within the deadline.
    proc, pty = await start_top(node, "--interval", "60")
    try:
        await asyncio.to_thread(
            pty.read_until, lambda s: "ml/a/main" in s.text(), timeout_s=30, what="a frame"
        )
        assert line_with(pty.screen, "  units").startswith("  units  [" + "█" * 30 + "░" * 10)
        pty.screen.resize(40, 50)
        set_size(pty.master, 40, 50)
        await asyncio.to_thread(
            pty.read_until,
            lambda s: line_with(s, "  units").startswith("  units  [" + "█" * 12 + "░" * 4 + "]"),
            timeout_s=20,
            what="bars 16 cells wide in 50 columns",
        )
        assert all(len(line) <= 50 for line in pty.screen.lines())
        os.write(pty.master, b"q")
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        os.close(pty.master)


async def test_q_quits_at_once_while_the_agent_does_not_answer(short_tmp_path: Path) -> None:
    # An agent that accepts and never answers: top says what it waits for, and q
    # ends it long before the request's 60 s timeout (requests run in a thread).
    answered = asyncio.Event()

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answered.wait()
        writer.close()

    path = str(short_tmp_path / "stalled.sock")
    server = await asyncio.start_unix_server(stall, path)
    proc, pty = await start_top(None, "--timeout", "60", socket=path)
    try:
        await asyncio.to_thread(
            pty.read_until,
            lambda s: f"waiting for the metagpu agent at {path}" in " ".join(s.lines()),
            timeout_s=30,
            what="that it waits for the agent",
        )
        os.write(pty.master, b"q")
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        await asyncio.to_thread(pty.drain, timeout_s=10)
        assert not pty.screen.on_alt
    finally:
        answered.set()
        server.close()
        await server.wait_closed()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        os.close(pty.master)


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
async def test_ctrl_c_and_sigterm_restore_the_terminal_too(node: Node, how: str) -> None:
    proc, pty = await start_top(node, "--interval", "5")
    shell_modes = termios.tcgetattr(pty.master)
    try:
        await asyncio.to_thread(
            pty.read_until, lambda s: "ml/a/main" in s.text(), timeout_s=30, what="a frame"
        )
        if how == "ctrl-c":
            os.write(pty.master, b"\x03")  # the line discipline turns it into SIGINT
        else:
            proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        await asyncio.to_thread(pty.drain, timeout_s=10)
        assert not pty.screen.on_alt
        assert pty.screen.cursor_visible
        assert "Traceback" not in pty.screen.text()
        assert termios.tcgetattr(pty.master)[3] == shell_modes[3]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        os.close(pty.master)


async def test_batch_mode_prints_plain_frames_for_scripts(node: Node) -> None:
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "metagpu.cli", "top", "--socket", node.socket),
        *("-n", "2", "--interval", "0.1"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONIOENCODING": "utf-8", "COLUMNS": "100"},
        start_new_session=True,
    )
    place_on_host(node.env.proc_root, proc.pid)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    text = out.decode()
    assert proc.returncode == 0, err.decode()
    assert "\x1b" not in text  # piped: no escape codes
    assert text.count("metagpu top  node node-a") == 2
    assert "  units  [" in text
    assert "75/100 allocated" in text
    assert all(len(line) <= 100 for line in text.splitlines())


async def test_batch_mode_without_an_agent_fails_with_the_reason(short_tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "metagpu.cli", "top", "--once"),
        *("--socket", str(short_tmp_path / "absent.sock")),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1
    assert out == b""
    assert "cannot reach the metagpu agent" in err.decode()
    assert "does not exist" in err.decode()
