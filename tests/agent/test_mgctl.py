"""mgctl on its own: standard library only, its constants, and its table rendering."""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from plugin.agent import mgctl
from plugin.agent.views import API_VERSION
from plugin.api.resources import AGENT_SOCKET_NAME, CONTAINER_AGENT_DIR, ENV_AGENT_SOCKET

MGCTL = Path(mgctl.__file__)


def test_imports_only_the_standard_library() -> None:
    tree = ast.parse(MGCTL.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    assert modules <= sys.stdlib_module_names | {"__future__"}, modules
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(MGCTL), "--help"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert "get" in done.stdout
    assert "kill" in done.stdout
    assert "version" in done.stdout


def test_constants_agree_with_the_resource_contract() -> None:
    # mgctl cannot import plugin.api (it runs alone), so it repeats these.
    assert f"{CONTAINER_AGENT_DIR}/{AGENT_SOCKET_NAME}" == mgctl.DEFAULT_SOCKET
    assert ENV_AGENT_SOCKET == mgctl.ENV_SOCKET
    assert API_VERSION == mgctl.API_VERSION


def test_socket_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(mgctl.ENV_SOCKET, raising=False)
    assert mgctl.socket_path(None) == mgctl.DEFAULT_SOCKET
    monkeypatch.setenv(mgctl.ENV_SOCKET, "/env.sock")
    assert mgctl.socket_path(None) == "/env.sock"
    assert mgctl.socket_path("/flag.sock") == "/flag.sock"


def envelope(scope: str, items: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    caller: dict[str, Any] = {"scope": scope, "pid": 1, "uid": 0}
    if scope == "container":
        caller |= {"namespace": "ml", "pod": "train-0", "container": "trainer"}
    else:
        caller["via"] = "host root"
    return {
        "apiVersion": "v1",
        "node": "gpu-node-1",
        "takenAt": "2026-05-01T10:00:00Z",
        "stale": kw.get("stale", []),
        "caller": caller,
        "items": items,
    }


PROCESSES: list[dict[str, Any]] = [
    {
        "pid": 41231,
        "gpuIndex": 0,
        "usedMemoryMiB": 2048,
        "utilizationPercent": 35,
        "command": "python train.py",
        "containerId": "ab" * 32,
        "namespace": "ml",
        "pod": "train-0",
        "container": "trainer",
        "units": 50,
        "sharePercent": 50.0,
        "memoryLimitMiB": 40960,
    },
    {
        "pid": 7,
        "gpuIndex": 1,
        "usedMemoryMiB": 120,
        "utilizationPercent": None,
        "command": "/usr/lib/xorg/Xorg",
        "containerId": None,
    },
]


def columns(line: str, header: str, names: list[str]) -> list[str]:
    starts = [header.index(n) for n in names]
    return [line[s:e].strip() for s, e in zip(starts, [*starts[1:], None], strict=True)]


def test_process_table() -> None:
    text = mgctl.render_processes(envelope("node", PROCESSES))
    lines = text.splitlines()
    assert (
        lines[0] == "node gpu-node-1  ·  whole node (host root)  ·  reading of 2026-05-01T10:00:00Z"
    )
    header, first, second = lines[2], lines[3], lines[4]
    names = [
        "GPU",
        "PID",
        "NAMESPACE",
        "POD",
        "CONTAINER",
        "MEMORY",
        "LIMIT",
        "SHARE",
        "SM",
        "COMMAND",
    ]
    assert header.split() == names
    assert first.split()[:5] == ["0", "41231", "ml", "train-0", "trainer"]
    assert "2,048 MiB" in first
    assert "40,960 MiB" in first
    assert "50 units (50%)" in first
    assert "35%" in first
    assert first.endswith("python train.py")
    assert "(host)" in second
    assert "-" in second
    # right-aligned numeric columns end in the same place on every line
    for column in ("PID", "MEMORY"):
        end = header.index(column) + len(column)
        assert first[end - 1] != " "
        assert second[end - 1] != " "


def test_empty_and_stale() -> None:
    text = mgctl.render_processes(envelope("container", [], stale=["podresources"]))
    assert "STALE: podresources unavailable, showing last known data" in text
    assert text.endswith("No GPU processes.")
    assert "holds no GPU share" in mgctl.render_devices(envelope("container", []))


def test_claim_devices_without_a_share_are_named_with_their_reason() -> None:
    def unresolved(n: int) -> dict[str, str]:
        return {
            "namespace": "ml",
            "pod": f"p{n}",
            "container": "main",
            "claim": f"ml/p{n}-gpu",
            "device": f"gpu.metagpu.io/gpu=s{n}",
            "reason": "no CDI spec in /var/run/cdi defines it",
        }

    doc = envelope("node", []) | {"unresolvedShares": [unresolved(n) for n in range(12)]}
    text = mgctl.render_devices(doc)
    assert (
        "NO SHARE for ml/p0/main (claim ml/p0-gpu, device gpu.metagpu.io/gpu=s0): "
        "no CDI spec in /var/run/cdi defines it"
    ) in text
    assert "ml/p9/main" in text
    assert "ml/p10/main" not in text
    assert "... and 2 more claim devices without a share" in text
    assert "NO SHARE" not in mgctl.render_devices(envelope("node", []))


def test_container_device_table() -> None:
    doc = envelope(
        "container",
        [
            {
                "index": 0,
                "uuid": "GPU-1",
                "name": "NVIDIA A100-SXM4-80GB",
                "memoryTotalMiB": 81920,
                "share": {
                    "units": 50,
                    "sharePercent": 50.0,
                    "memoryLimitMiB": 40960,
                    "memoryUsedMiB": 41000,
                    "utilizationPercent": 80,
                    "overLimit": True,
                },
            }
        ],
    )
    text = mgctl.render_devices(doc)
    assert "container ml/train-0/trainer" in text
    row = text.splitlines()[3]
    assert "50 units (50%)" in row
    assert "41,000 / 40,960 MiB" in row
    assert row.endswith("OVER LIMIT")


def test_node_device_table_lists_shares() -> None:
    doc = envelope(
        "node",
        [
            {
                "index": 0,
                "uuid": "GPU-1",
                "name": "A100",
                "memoryTotalMiB": 81920,
                "memoryUsedMiB": 12288,
                "utilizationPercent": 37,
                "healthy": True,
                "unitsTotal": 100,
                "unitsAllocated": 75,
                "processes": 3,
                "shares": [
                    {
                        "namespace": "ml",
                        "pod": "a",
                        "container": "main",
                        "units": 25,
                        "sharePercent": 25.0,
                        "memoryLimitMiB": 20480,
                        "memoryUsedMiB": 100,
                        "utilizationPercent": None,
                        "overLimit": False,
                    },
                    {
                        "namespace": "ml",
                        "pod": "x",
                        "container": "main",
                        "units": 0,
                        "sharePercent": 0.0,
                        "memoryLimitMiB": None,
                        "memoryUsedMiB": 5,
                        "utilizationPercent": None,
                        "overLimit": False,
                    },
                ],
            },
            {
                "index": 1,
                "uuid": "GPU-2",
                "name": "A100",
                "memoryTotalMiB": 81920,
                "memoryUsedMiB": None,
                "healthy": False,
                "problem": "XID 79",
                "unitsTotal": 100,
                "unitsAllocated": 0,
                "processes": 0,
                "shares": [],
            },
        ],
    )
    text = mgctl.render_devices(doc)
    assert "12,288 / 81,920 MiB" in text
    assert "75/100" in text
    assert "Unhealthy: XID 79" in text
    assert "- / 81,920 MiB" in text
    share_lines = [line for line in text.splitlines() if " ml " in f" {line} "]
    assert any("25 units (25%)" in line and line.endswith("ok") for line in share_lines)
    assert any(line.endswith("no share") for line in share_lines)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["get"], "the following arguments are required: what", id="no-what"),
        pytest.param(["get", "pods"], "invalid choice: 'pods'", id="bad-what"),
        pytest.param(["kill", "abc"], "invalid int value: 'abc'", id="bad-pid"),
        pytest.param(
            ["get", "processes", "--interval", "0"], "must be greater than 0", id="interval"
        ),
        pytest.param([], "the following arguments are required: COMMAND", id="no-command"),
    ],
)
def test_usage_errors_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        mgctl.main(argv)
    assert exit_.value.code == mgctl.EXIT_USAGE
    assert message in capsys.readouterr().err


# ------------------------------------------------------- a full accept backlog
def _full_backlog(path: str) -> tuple[socket.socket, list[socket.socket]]:
    """A listening unix socket that accepts nothing, with its backlog filled."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    queued: list[socket.socket] = []
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError:
            s.close()
            return server, queued
        queued.append(s)


def test_connect_waits_while_the_backlog_is_full(short_tmp_path: Path) -> None:
    """EAGAIN from a full backlog is "busy", not "unreachable": mgctl tries again."""
    path = str(short_tmp_path / "agent.sock")
    server, queued = _full_backlog(path)
    conn = mgctl._UnixConnection(path, timeout=10)
    done = threading.Event()
    errors: list[BaseException] = []

    def connect() -> None:
        try:
            conn.connect()
        except BaseException as exc:  # reported below
            errors.append(exc)
        done.set()

    thread = threading.Thread(target=connect)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while conn.attempts < 2 and time.monotonic() < deadline:
            time.sleep(0.001)  # polling a condition, bounded: the attempts counter
        assert conn.attempts >= 2, "mgctl gave up (or never retried) while the agent was busy"
        server.accept()[0].close()  # the agent catches up: room in the backlog
        assert done.wait(10)
        assert not errors
        assert conn.sock is not None
    finally:
        thread.join(10)
        if conn.sock is not None:
            conn.sock.close()
        for s in [server, *queued]:
            s.close()


def test_a_backlog_that_stays_full_is_reported_as_busy(short_tmp_path: Path) -> None:
    path = str(short_tmp_path / "agent.sock")
    server, queued = _full_backlog(path)
    try:
        client = mgctl.AgentClient(path, timeout_s=0.3)
        with pytest.raises(mgctl.MgctlError, match="backlog is full"):
            client.get("/version")
    finally:
        for s in [server, *queued]:
            s.close()
