"""PID reuse cannot take over an mgctl connection (``plugin.agent.peers``).

A real process connects to the agent's socket from a pod's container, hands
the connection to a child and exits. The test then gives its PID "to someone
else": ``<proc_root>/<pid>`` now says host root, which the agent would answer
with node scope. Requests the child sends on the inherited connection must be
refused, whichever way the agent pinned the peer (``SO_PEERPIDFD``, a pidfd
taken at accept, or the start time on kernels without pidfds).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from plugin.agent.api import ApiContext, ApiServer
from plugin.agent.peers import Peer, pin_peer
from plugin.agent.processes import read_proc_stat
from plugin.api.resources import AGENT_SOCKET_NAME
from tests.agent.builders import index_of, place_in_container, place_on_host, pod, ref, stat_line
from tests.agent.helpers import eventually

OPENER = (
    "import os, signal, socket, sys\n"
    "sys.stdin.readline()\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    "s.connect(sys.argv[1])\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\n"
    "child = os.fork()\n"
    "if child:\n"
    "    print(child, flush=True)\n"
    "    os.close(1)\n"  # only the child answers on stdout
    "    sys.stdin.readline()\n"  # the opener exits when told; its child keeps `s`
    "    os._exit(0)\n"
    "signal.sigwait({signal.SIGUSR1})\n"
    "s.sendall(b'GET /v1/processes HTTP/1.1\\r\\nHost: agent\\r\\nConnection: close\\r\\n\\r\\n')\n"
    "data = b''\n"
    "while chunk := s.recv(65536):\n"
    "    data += chunk\n"
    "sys.stdout.write(data.decode())\n"
)
"""stdin line 1: connect, fork, print the child's PID. Line 2: the opener exits.
SIGUSR1 to the child: it sends a request on the inherited connection."""

PINS: dict[str, Callable[[Path], Callable[..., Peer]]] = {
    "so-peerpidfd": lambda root: partial(pin_peer, proc_root=root),
    "pidfd-at-accept": lambda root: partial(pin_peer, proc_root=root, peer_pidfd=False),
    "start-time": lambda root: partial(pin_peer, proc_root=root, peer_pidfd=False, use_pidfd=False),
}


@dataclass
class Served:
    server: ApiServer
    proc_root: Path
    children: list[int]
    """PIDs of openers' children, killed at the end if a test left them waiting."""


@pytest.fixture(params=sorted(PINS))
async def served(
    request: pytest.FixtureRequest, short_tmp_path: Path, tmp_path: Path
) -> AsyncIterator[Served]:
    proc_root = tmp_path / "proc"
    index = index_of(pod("a"))
    ctx = ApiContext(
        snapshot=lambda: None,  # identified callers get 503: "no reading yet"
        lookup=index.lookup,
        pods_problem=lambda: None,
        proc_root=proc_root,
        agent_cgroup=None,
        node_name="node-a",
        version="1.2.3",
        backend="simulated",
    )
    server = ApiServer(ctx, short_tmp_path / AGENT_SOCKET_NAME, pin=PINS[request.param](proc_root))
    served = Served(server, proc_root, [])
    try:
        async with server:
            yield served
    finally:
        for pid in served.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def _send_line(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    await asyncio.to_thread(proc.stdin.flush)


@dataclass
class Opener:
    proc: subprocess.Popen[bytes]
    child: int


async def _open_and_hand_over(served: Served) -> Opener:
    """Start the opener in pod a's container; return once the agent has accepted it."""
    proc = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-I", "-S", "-c", OPENER, str(served.server.socket_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    place_in_container(served.proc_root, proc.pid, ref("a"))
    await _send_line(proc)
    assert proc.stdout is not None
    child = int(await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30))
    served.children.append(child)
    await eventually(lambda: len(served.server.peers) == 1, what="the connection is accepted")
    return Opener(proc, child)


async def _request(opener: Opener) -> tuple[int, dict[str, object]]:
    """Have the opener's child send its request; (HTTP status, JSON body)."""
    os.kill(opener.child, signal.SIGUSR1)
    stdout = opener.proc.stdout
    assert stdout is not None
    raw = (await asyncio.wait_for(asyncio.to_thread(stdout.read), 30)).decode()
    head, _, body = raw.partition("\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


async def test_a_connection_whose_opener_lives_is_answered(served: Served) -> None:
    opener = await _open_and_hand_over(served)
    try:
        status, body = await _request(opener)  # the opener still waits for its line 2
    finally:
        await _send_line(opener.proc)
        await asyncio.to_thread(opener.proc.wait, 30)
    assert status == 503, body  # identified (container scope); there is no reading yet
    assert "first reading" in str(body["message"])


async def test_a_reused_pid_does_not_inherit_the_connection(served: Served) -> None:
    opener = await _open_and_hand_over(served)
    pid = opener.proc.pid
    started = read_proc_stat(pid, proc_root=served.proc_root).start_ticks
    await _send_line(opener.proc)
    assert await asyncio.to_thread(opener.proc.wait, 30) == 0  # exited and reaped: PID is free
    # ...and now held by a host root process that started later.
    place_on_host(served.proc_root, pid)
    (served.proc_root / str(pid) / "stat").write_text(stat_line(pid, start_ticks=started + 1))

    status, body = await _request(opener)
    assert status == 403, body
    message = str(body["message"])
    assert f"the process that opened this connection (PID {pid}) has exited" in message
    assert "open a new connection" in message
    await eventually(lambda: len(served.server.peers) == 0, what="the peer is released")
