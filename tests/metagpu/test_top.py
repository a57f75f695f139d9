"""``metagpu top``: the frame it draws, and the command driven in a pseudo-terminal.

The terminal test runs the real command as a child process on a pty, against
a real agent (simulated GPUs, shares from the PodResources harness), reads
the screen it draws (the text after the last clear-screen sequence), then
presses ``q`` and checks it leaves the alternate screen and exits 0.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import select
import struct
import sys
import termios
import time

from certs.kube import open_api_client
from metagpu.top import CLEAR, ENTER_SCREEN, LEAVE_SCREEN, bar, render_screen
from plugin.agent.agent import AgentRuntime
from plugin.api.resources import AGENT_SOCKET_NAME
from tests.agent.builders import place_in_container, place_on_host, ref
from tests.agent.test_runtime import U0, U1, Env, R, child, env  # noqa: F401 - env is a fixture
from tests.harness.podresources import running_pod_resources

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_bars_fill_in_proportion_and_say_when_unknown() -> None:
    assert bar(0.75, 20) == "[" + "█" * 15 + "░" * 5 + "]"
    assert bar(1.5, 4, ascii_only=True) == "[####]"
    assert bar(0.0, 4, ascii_only=True) == "[....]"
    assert bar(None, 3) == "[???]"


def test_a_frame_has_three_bars_per_gpu_and_a_row_per_share() -> None:
    doc = {
        "kind": "DeviceList",
        "node": "node-a",
        "takenAt": "2026-11-27T08:00:00Z",
        "stale": [],
        "items": [
            {
                "index": 0,
                "name": "A100",
                "healthy": True,
                "unitsTotal": 100,
                "unitsAllocated": 75,
                "memoryUsedMiB": 40960,
                "memoryTotalMiB": 81920,
                "utilizationPercent": 40,
                "shares": [
                    {
                        "namespace": "ml",
                        "pod": "a",
                        "container": "main",
                        "sharePercent": 25.0,
                        "memoryUsedMiB": 30000,
                        "memoryLimitMiB": 20480,
                        "overLimit": True,
                        "utilizationPercent": 30,
                    },
                    {
                        "namespace": "ml",
                        "pod": "b",
                        "container": "main",
                        "sharePercent": 50.0,
                        "memoryUsedMiB": 1000,
                        "memoryLimitMiB": 40960,
                        "overLimit": False,
                        "utilizationPercent": None,
                    },
                ],
            },
            {"index": 1, "name": "A100", "healthy": False, "problem": "XID 79", "shares": []},
        ],
    }
    lines = render_screen(doc, width=56, ascii_only=True)  # bars of 20 cells
    assert lines[0].startswith("metagpu top  node node-a")
    assert "GPU 0  A100  healthy" in lines
    assert "  units  [###############.....]  75/100" in lines
    assert "  memory [##########..........]  40960/81920 MiB" in lines
    assert "  SM     [########............]  40%" in lines
    rows = [line.split() for line in lines if line.startswith("  ml/")]
    assert rows == [
        ["ml/a/main", "25%", "30000/20480", "OVER", "30%"],
        ["ml/b/main", "50%", "1000/40960", "-"],
    ]
    assert "GPU 1  A100  UNHEALTHY: XID 79" in lines
    assert "  SM     [????????????????????]  -" in lines
    assert all(len(line) <= 56 for line in lines)


def _read_until(fd: int, wanted: list[str], *, timeout_s: float) -> str:
    """Everything the child wrote, once the last frame holds every ``wanted`` text."""
    seen = b""
    deadline = time.monotonic() + timeout_s
    while True:
        screen = ANSI.sub("", seen.decode(errors="replace").rsplit(CLEAR, 1)[-1])
        if CLEAR in seen.decode(errors="replace") and all(w in screen for w in wanted):
            return seen.decode(errors="replace")
        left = deadline - time.monotonic()
        assert left > 0, f"the screen never showed {wanted}:\n{screen}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError as exc:  # EIO: the child exited and closed the terminal
                raise AssertionError(f"metagpu top exited early:\n{screen}") from exc


async def test_top_in_a_pseudo_terminal_draws_the_node_and_quits_on_q(
    env: Env,  # noqa: F811 - the fixture
) -> None:
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
            master, slave = os.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
            sock = str(env.socket_dir / AGENT_SOCKET_NAME)
            proc = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "metagpu.cli", "top", "--interval", "0.1"),
                *("--socket", sock),
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env={**os.environ, "PYTHONIOENCODING": "utf-8"},
                start_new_session=True,
            )
            os.close(slave)
            place_on_host(env.proc_root, proc.pid)  # root on the node: node scope
            try:
                out = await asyncio.to_thread(
                    _read_until,
                    master,
                    ["GPU 0", "GPU 1", "75/100", "ml/a/main", "ml/b/main", "OVER", "10/100"],
                    timeout_s=30,
                )
                assert out.startswith(ENTER_SCREEN)
                screen = ANSI.sub("", out.rsplit(CLEAR, 1)[-1])
                assert "█" in screen  # a UTF-8 terminal gets block bars
                os.write(master, b"q")
                assert await asyncio.wait_for(proc.wait(), 10) == 0
                rest = b""
                while True:
                    try:
                        chunk = os.read(master, 65536)
                    except OSError:
                        break
                    if not chunk:
                        break
                    rest += chunk
                assert LEAVE_SCREEN in (out + rest.decode(errors="replace"))
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                os.close(master)
