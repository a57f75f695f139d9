"""mgctl ↔ agent over a real unix socket, identity by SO_PEERCRED.

Each mgctl is a real subprocess running the *installed* copy of mgctl with
``python -I -S`` (no site-packages, no PYTHONPATH: the standard library only).
It waits on stdin until the test has written ``<proc_root>/<its pid>/cgroup``,
which places it in a pod's container (or on the host) as far as the agent can
tell; then it connects and the agent identifies it by the kernel's peer
credentials.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
import pytest
import yaml

from plugin.agent.accounting import Allocation, Snapshot, build_snapshot
from plugin.agent.api import SOCKET_MODE, ApiContext, ApiServer, install_mgctl
from plugin.agent.containers import ContainerRef, PodIndex
from plugin.agent.usage_history import UsageHistory
from plugin.api.resources import AGENT_SOCKET_NAME, ENV_AGENT_SOCKET
from tests.agent.builders import (
    gpu,
    gpu_uuid,
    index_of,
    key,
    place_in_container,
    place_on_host,
    pod,
    reading,
    ref,
)
from tests.agent.helpers import eventually, run_mgctl, start_mgctl

R = "cnvrg.io/metagpu"
U0 = gpu_uuid(0)


@dataclass
class Node:
    """A served agent API over a fixed snapshot, with real 'GPU processes'."""

    socket: Path
    mgctl: Path
    proc_root: Path
    index: PodIndex
    victims: dict[str, asyncio.subprocess.Process]
    snapshot: Snapshot | None

    def pid(self, name: str) -> int:
        return self.victims[name].pid

    async def mgctl_as(
        self,
        place: Callable[[int], None],
        *args: str,
        uid: int | None = None,
        socket: Path | None = None,
    ) -> tuple[int, str, str]:
        return await run_mgctl(
            self.mgctl,
            *args,
            place=place,
            uid=uid,
            env={ENV_AGENT_SOCKET: str(socket or self.socket)},
        )

    def in_container(self, cref: ContainerRef) -> Callable[[int], None]:
        return lambda pid: place_in_container(self.proc_root, pid, cref)

    def on_host(self) -> Callable[[int], None]:
        return lambda pid: place_on_host(self.proc_root, pid)


async def _sleeper() -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(120)"
    )


@pytest.fixture
async def node(short_tmp_path: Path, tmp_path: Path) -> AsyncIterator[Node]:
    proc_root = tmp_path / "proc"
    index = index_of(pod("a"), pod("b"))
    a, b = ref("a"), ref("b")
    victims = {"a": await _sleeper(), "b": await _sleeper()}
    place_in_container(proc_root, victims["a"].pid, a)
    place_in_container(proc_root, victims["b"].pid, b)
    pa, pb = victims["a"].pid, victims["b"].pid
    snapshot = build_snapshot(
        [reading(gpu(0), [(pa, 3000), (pb, 9000), (4242, 100)])],
        [
            Allocation(key("a"), R, tuple(f"{U0}::{u}" for u in range(25))),
            Allocation(key("b"), R, tuple(f"{U0}::{u}" for u in range(25, 75))),
        ],
        {pa: a.container_id, pb: b.container_id, 4242: None},
        directory=index,
        units_per_gpu=100,
        gpu_resources={U0: R},
        resources=[R],
        taken_at=1_700_000_000,
    )
    os.chmod(short_tmp_path, 0o755)  # like /var/run: others may traverse it
    socket_dir = short_tmp_path / "run"
    n = Node(
        socket=socket_dir / AGENT_SOCKET_NAME,
        mgctl=install_mgctl(socket_dir, version="9.9.9"),
        proc_root=proc_root,
        index=index,
        victims=victims,
        snapshot=snapshot,
    )
    ctx = ApiContext(
        snapshot=lambda: n.snapshot,
        lookup=index.lookup,
        pods_problem=lambda: None,
        proc_root=proc_root,
        agent_cgroup=None,
        node_name="node-a",
        version="1.2.3",
        backend="simulated",
    )
    try:
        async with ApiServer(ctx, n.socket):
            yield n
    finally:
        for proc in victims.values():
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


def test_installed_mgctl_is_executable(node: Node) -> None:
    assert node.mgctl.read_text().startswith("#!/usr/bin/env python3\n")
    assert os.access(node.mgctl, os.X_OK)
    assert '_EMBEDDED_VERSION = "9.9.9"' in node.mgctl.read_text()
    assert node.socket.stat().st_mode & 0o777 == SOCKET_MODE
    # As a script, standard library only (-I: no PYTHONPATH, no script dir; -S: no site).
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(node.mgctl), "--help"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: mgctl" in done.stdout


@pytest.mark.skipif(shutil.which("python3") is None, reason="no python3 on PATH for the shebang")
def test_installed_mgctl_runs_through_its_shebang(node: Node) -> None:
    done = subprocess.run(
        [str(node.mgctl), "get", "nonsense"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert done.returncode == 2
    assert "invalid choice: 'nonsense'" in done.stderr


async def test_container_sees_only_its_own_processes(node: Node) -> None:
    code, out, err = await node.mgctl_as(
        node.in_container(ref("a")), "get", "processes", "-o", "json"
    )
    assert code == 0, err
    doc = json.loads(out)
    assert [p["pid"] for p in doc["items"]] == [node.pid("a")]
    assert doc["caller"]["scope"] == "container"
    assert doc["caller"]["pod"] == "a"
    assert str(node.pid("b")) not in out
    assert "4242" not in out


async def test_container_table_is_readable(node: Node) -> None:
    code, out, err = await node.mgctl_as(node.in_container(ref("a")), "get", "processes")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(
        "node node-a  ·  container ml/a/main  ·  reading of 2023-11-14T22:13:20Z"
    )
    header, row = lines[2], lines[3]
    for column in ("GPU", "PID", "NAMESPACE", "POD", "CONTAINER", "MEMORY", "LIMIT", "SHARE"):
        assert column in header
    assert "3,000 MiB" in row
    assert "20,480 MiB" in row
    assert "25 units (25%)" in row
    assert header.index("MEMORY") < header.index("LIMIT")


async def test_container_devices_show_only_its_share(node: Node) -> None:
    code, out, err = await node.mgctl_as(
        node.in_container(ref("b")), "get", "devices", "-o", "yaml"
    )
    assert code == 0, err
    doc = yaml.safe_load(out)
    (item,) = doc["items"]
    assert item["share"]["units"] == 50
    assert item["share"]["memoryLimitMiB"] == 40960
    assert "unitsAllocated" not in item
    assert "shares" not in item
    code, table, _ = await node.mgctl_as(node.in_container(ref("b")), "get", "devices")
    assert "50 units (50%)" in table
    assert "9,000 / 40,960 MiB" in table


async def test_a_container_right_sizes_its_own_share_over_the_socket(node: Node) -> None:
    assert node.snapshot is not None
    history = UsageHistory(window_s=86400)
    history.record(node.snapshot, now_s=0)
    node.snapshot = replace(
        node.snapshot, usage_peaks=history.record(node.snapshot, now_s=2 * 3600 + 300)
    )
    code, out, err = await node.mgctl_as(node.in_container(ref("b")), "get", "rightsize")
    assert code == 0, err
    header, row = out.splitlines()[2:4]
    assert "RECOMMENDED" in header
    assert "NAMESPACE" not in header  # its own share only
    # 9,000 of 81,920 MiB is 11.0%, + 10% is 12.1%: 13 of 100 units
    assert "9,000 MiB (11.0%)" in row
    assert "13 units" in row
    assert "-37 units" in row
    assert "last 2 h 5 min (since the agent started)" in row
    assert "3,000 MiB" not in out  # a's peak is a's business
    assert "a restart of the agent starts it over" in out


async def test_container_may_not_kill_another_containers_process(node: Node) -> None:
    victim = node.pid("b")
    code, out, err = await node.mgctl_as(node.in_container(ref("a")), "kill", str(victim))
    assert code == 3, (out, err)
    assert "refused by the metagpu agent" in err
    assert f"PID {victim} is not a GPU process of your container (ml/a/main)" in err
    assert node.victims["b"].returncode is None
    os.kill(victim, 0)  # still alive


async def test_container_kills_its_own_process(node: Node) -> None:
    victim = node.victims["a"]
    code, out, err = await node.mgctl_as(node.in_container(ref("a")), "kill", str(victim.pid))
    assert code == 0, err
    assert f"sent SIGKILL to GPU process {victim.pid}" in out
    assert await asyncio.wait_for(victim.wait(), 10) == -signal.SIGKILL


async def test_stranger_container_is_refused(node: Node) -> None:
    def stranger(pid: int) -> None:
        d = node.proc_root / str(pid)
        d.mkdir(parents=True)
        (d / "cgroup").write_text(f"0::/system.slice/docker-{'e' * 64}.scope\n")

    code, out, err = await node.mgctl_as(stranger, "get", "processes")
    assert code == 3
    assert "is not a container of any pod on node node-a" in err
    assert out == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to be (and to drop) host root")
async def test_host_root_sees_the_node_and_non_root_is_refused(node: Node) -> None:
    code, out, err = await node.mgctl_as(node.on_host(), "get", "processes", "-o", "json")
    assert code == 0, err
    assert sorted(p["pid"] for p in json.loads(out)["items"]) == sorted(
        [node.pid("a"), node.pid("b"), 4242]
    )
    code, out, err = await node.mgctl_as(node.on_host(), "get", "devices")
    assert code == 0
    assert "whole node (host root)" in out
    assert "ml" in out
    code, out, err = await node.mgctl_as(node.on_host(), "get", "processes", uid=65534)
    assert code == 3, err
    assert "host process running as UID 65534" in err


async def test_a_command_line_is_shown_only_while_its_pid_is_the_listed_process(
    node: Node,
) -> None:
    for name in ("a", "b"):
        (node.proc_root / str(node.pid(name)) / "cmdline").write_bytes(b"python\0train.py\0")
    # The reading is a cycle old; since then b's PID went to a process in a's container.
    place_in_container(node.proc_root, node.pid("b"), ref("a"))
    code, out, err = await node.mgctl_as(node.on_host(), "get", "processes", "-o", "json")
    assert code == 0, err
    commands = {p["pid"]: p["command"] for p in json.loads(out)["items"]}
    assert commands[node.pid("a")] == "python train.py"
    assert commands[node.pid("b")] == ""  # not b's command line any more
    assert commands[4242] == ""  # gone


async def test_host_root_cannot_kill_non_gpu_processes(node: Node) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    code, _, err = await node.mgctl_as(node.on_host(), "kill", "1")
    assert code == 4
    assert "PID 1 is not a GPU process" in err


async def test_version(node: Node) -> None:
    code, out, err = await node.mgctl_as(node.in_container(ref("a")), "version")
    assert code == 0, err
    assert "mgctl:  9.9.9 (API v1)" in out
    assert "agent:  1.2.3 (API v1) on node node-a, GPU backend simulated" in out


async def test_unreachable_agent_says_where_and_what_to_check(node: Node) -> None:
    missing = node.socket.parent / "nope.sock"
    code, _, err = await node.mgctl_as(
        node.in_container(ref("a")), "get", "processes", socket=missing
    )
    assert code == 1
    assert f"cannot reach the metagpu agent at {missing}: the socket does not exist" in err
    assert ENV_AGENT_SOCKET in err
    assert "requests a metagpu resource" in err


async def test_before_the_first_reading(node: Node) -> None:
    node.snapshot = None
    code, _, err = await node.mgctl_as(node.in_container(ref("a")), "get", "processes")
    assert code == 1
    assert "has not finished its first reading yet" in err


async def test_watch_streams_documents_and_rides_out_a_missing_reading(node: Node) -> None:
    """``--watch -o json`` prints one document per refresh (JSON Lines); a refresh the
    agent cannot answer yet goes to stderr and the watch carries on; Ctrl-C exits 0."""
    reading_ = node.snapshot
    node.snapshot = None
    proc = await start_mgctl(
        node.mgctl,
        *("get", "processes", "-o", "json", "--watch", "--interval", "0.05"),
        env={ENV_AGENT_SOCKET: str(node.socket)},
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        place_in_container(node.proc_root, proc.pid, ref("a"))
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        problem = await asyncio.wait_for(proc.stderr.readline(), 30)
        assert b"has not finished its first reading yet" in problem
        node.snapshot = reading_
        docs = [json.loads(await asyncio.wait_for(proc.stdout.readline(), 30)) for _ in range(2)]
        for doc in docs:
            assert [p["pid"] for p in doc["items"]] == [node.pid("a")]
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        pytest.param("GET", "/v2/processes", None, 404, "no endpoint GET /v2/processes", id="v2"),
        pytest.param(
            "POST", "/v1/kill", {"pid": "x"}, 400, '"pid" must be a positive integer', id="pid-str"
        ),
        pytest.param(
            "POST", "/v1/kill", {"pid": 5, "signal": "HUP"}, 400, "signal must be one of", id="sig"
        ),
        pytest.param("POST", "/v1/kill", [1], 400, "must be a JSON object", id="not-object"),
        pytest.param("DELETE", "/v1/kill", None, 405, "DELETE /v1/kill", id="method"),
    ],
)
async def test_bad_requests_get_status_documents(
    node: Node, *, method: str, path: str, body: object, status: int, message: str
) -> None:
    # This test process itself is the caller: place it in container a.
    place_in_container(node.proc_root, os.getpid(), ref("a"))
    connector = aiohttp.UnixConnector(path=str(node.socket))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.request(method, f"http://agent{path}", json=body) as resp,
    ):
        doc = await resp.json()
    assert resp.status == status
    assert doc["kind"] == "Status"
    assert message in doc["message"]


# ------------------------------------------------ two agents on one node
# During an upgrade (and a rolling update with maxSurge) a node runs two agents
# for a while: the newer replaces the socket at start-up, the older stops later.


def _bare_context(proc_root: Path, version: str) -> ApiContext:
    return ApiContext(
        snapshot=lambda: None,
        lookup=lambda _: None,
        pods_problem=lambda: None,
        proc_root=proc_root,
        agent_cgroup=None,
        node_name="node-a",
        version=version,
        backend="simulated",
    )


async def _agent_version(socket_path: Path) -> str:
    """The agentVersion of whoever answers on ``socket_path`` (no identity needed)."""
    connector = aiohttp.UnixConnector(path=str(socket_path))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get("http://agent/v1/version") as resp,
    ):
        doc = await resp.json()
    return str(doc["agentVersion"])


async def test_a_removed_socket_is_served_again(short_tmp_path: Path, tmp_path: Path) -> None:
    # An older agent (a release that removed the file without looking whose it
    # was) stops after this one replaced its socket, and deletes this one's file.
    path = short_tmp_path / "run" / AGENT_SOCKET_NAME
    async with ApiServer(_bare_context(tmp_path, "new"), path, check_interval_s=0.05):
        path.unlink()
        await eventually(path.is_socket, what="a new socket")
        assert path.stat().st_mode & 0o777 == SOCKET_MODE
        assert await _agent_version(path) == "new"
    assert not path.exists()


async def test_an_agent_leaves_the_socket_of_the_agent_that_replaced_it(
    short_tmp_path: Path, tmp_path: Path
) -> None:
    path = short_tmp_path / "run" / AGENT_SOCKET_NAME
    older = ApiServer(_bare_context(tmp_path, "old"), path, check_interval_s=0.05)
    await older.start()
    try:
        assert await _agent_version(path) == "old"
        # Agents start seconds apart, never within one clock tick (see _file_identity).
        await asyncio.sleep(0.05)
        async with ApiServer(_bare_context(tmp_path, "new"), path, check_interval_s=0.05):
            assert await _agent_version(path) == "new"
            await asyncio.sleep(0.3)  # several checks: the older agent does not take it back
            assert await _agent_version(path) == "new"
            await older.stop()
            assert path.is_socket(), "the older agent removed the newer one's socket"
            assert await _agent_version(path) == "new"
        assert not path.exists()  # the newer one removes its own
    finally:
        await older.stop()


# ------------------------------------------------ bodies as clients send them
async def _raw_exchange(
    socket_path: Path, head: bytes, parts: list[bytes]
) -> tuple[int, dict[str, object]]:
    """Send ``head`` and then each of ``parts`` as separate writes; the answer's status and JSON.

    Between parts the test checks that no answer has come yet: the agent must
    wait for the whole body, not judge what has arrived so far.
    """
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    try:
        writer.write(head)
        await writer.drain()
        for part in parts:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.read(1), timeout=0.2)  # nothing yet
            writer.write(part)
            await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    body = rest.partition(b"\r\n\r\n")[2]
    return int(status_line.split()[1]), json.loads(body)


async def test_a_body_written_in_two_pieces_is_read_whole(node: Node) -> None:
    place_in_container(node.proc_root, os.getpid(), ref("a"))
    body = b'{"pid": "x"}'
    head = (
        b"POST /v1/kill HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    status, doc = await _raw_exchange(node.socket, head + body[:5], [body[5:]])
    assert status == 400
    assert '"pid" must be a positive integer' in str(doc["message"])


async def test_a_chunked_body_is_read_whole(node: Node) -> None:
    place_in_container(node.proc_root, os.getpid(), ref("a"))
    head = (
        b"POST /v1/kill HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    status, doc = await _raw_exchange(
        node.socket, head + b'5\r\n{"pid\r\n', [b'7\r\n": "x"}\r\n', b"0\r\n\r\n"]
    )
    assert status == 400
    assert '"pid" must be a positive integer' in str(doc["message"])


async def test_a_declared_body_over_the_limit_is_refused_at_once(node: Node) -> None:
    place_in_container(node.proc_root, os.getpid(), ref("a"))
    reader, writer = await asyncio.open_unix_connection(str(node.socket))
    try:
        writer.write(
            b"POST /v1/kill HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: 10000000\r\n\r\n"
        )
        await writer.drain()
        # No body is ever sent: the answer must come from the header alone.
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 413 ")
