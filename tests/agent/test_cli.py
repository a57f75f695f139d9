"""``metagpu agent``: flags, env, config precedence, light imports, and a real process
that starts, serves and stops on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from metagpu.cli import main
from plugin.api.resources import AGENT_SOCKET_NAME, MGCTL_FILE_NAME
from tests.agent.builders import A100, gpu_uuid

ROOT = Path(__file__).resolve().parents[2]


def print_config(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["agent", "--print-config", *argv]) == 0
    config: dict[str, object] = json.loads(capsys.readouterr().out)
    return config


def agent_section(config: dict[str, object]) -> dict[str, object]:
    section = config["agent"]
    assert isinstance(section, dict)
    return section


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in list(os.environ):
        if var.startswith("METAGPU_") or var == "NODE_NAME":
            monkeypatch.delenv(var)


def test_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    agent = agent_section(print_config(capsys))
    assert agent == {
        "socket_dir": "/var/run/metagpu",
        "node_name": None,
        "pod_resources_socket": "/var/lib/kubelet/pod-resources/kubelet.sock",
        "pod_resources_timeout_s": 5.0,
        "interval_s": 5.0,
        "memory_enforcement": "report",
        "kill_grace_s": 30.0,
        "report_cooldown_s": 600.0,
        "metrics_listen": "0.0.0.0:9400",
        "proc_root": "/proc",
        "label_node": True,
        "publish_ledger": True,
        "ledger_refresh_s": 300.0,
        "ledger_max_bytes": 65536,
        "rightsizing_window_s": 86400.0,
        "install_mgctl": True,
        "dra_driver": "gpu.metagpu.io",
        "dra_cdi_dir": "/var/run/cdi",
    }


def test_precedence_flag_env_file_node_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\nunits_per_gpu: 10\nagent:\n  interval_s: 9\n  kill_grace_s: 60\n"
        "  memory_enforcement: 'off'\n"
    )
    monkeypatch.setenv("METAGPU_PLUGIN_AGENT__INTERVAL_S", "7")
    monkeypatch.setenv("METAGPU_PLUGIN_AGENT__MEMORY_ENFORCEMENT", "kill")
    monkeypatch.setenv("NODE_NAME", "from-downward-api")
    got = print_config(capsys, "--config", str(config), "--memory-enforcement", "report")
    agent = agent_section(got)
    assert got["units_per_gpu"] == 10  # shared with the device plugin
    assert agent["kill_grace_s"] == 60  # file
    assert agent["interval_s"] == 7  # env beats file
    assert agent["memory_enforcement"] == "report"  # flag beats env
    assert agent["node_name"] == "from-downward-api"
    monkeypatch.setenv("METAGPU_PLUGIN_AGENT__NODE_NAME", "from-env")
    assert agent_section(print_config(capsys))["node_name"] == "from-env"
    assert agent_section(print_config(capsys, "--node-name", "flag"))["node_name"] == "flag"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        pytest.param(["--metrics-listen", "9400"], {}, "must be HOST:PORT", id="listen-no-host"),
        pytest.param(["--metrics-listen", ":9400"], {}, "host is empty", id="listen-empty-host"),
        pytest.param(["--metrics-listen", "[zz]:1"], {}, "not an IPv6 address", id="listen-v6"),
        pytest.param(["--metrics-listen", "::1:9400"], {}, "in brackets", id="listen-bare-v6"),
        pytest.param(["--metrics-listen", "h:65536"], {}, "0..65535", id="listen-port"),
        pytest.param(["--interval", "0"], {}, "agent.interval_s", id="interval-zero"),
        pytest.param(
            [],
            {"METAGPU_PLUGIN_AGENT__MEMORY_ENFORCEMENT": "always"},
            "from env METAGPU_PLUGIN_AGENT__MEMORY_ENFORCEMENT",
            id="enforcement-env",
        ),
        pytest.param(["--kill-grace", "-1"], {}, "agent.kill_grace_s", id="grace-negative"),
    ],
)
def test_bad_settings_exit_2_with_a_clear_message(
    argv: list[str],
    env: dict[str, str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["agent", "--print-config", *argv]) == 2
    err = capsys.readouterr().err
    assert "metagpu agent: configuration error" in err
    assert message in err


def test_cli_module_is_light() -> None:
    code = (
        "import sys, plugin.agent.cli\n"
        "heavy = {'aiohttp', 'grpc', 'kubernetes_asyncio', 'pynvml', 'prometheus_client'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.strip() == "[]"


def test_metagpu_agent_process_serves_and_stops_on_sigterm(short_tmp_path: Path) -> None:
    gpus = short_tmp_path / "gpus.yaml"
    gpus.write_text(f"gpus:\n  - {{uuid: {gpu_uuid(0)}, name: {A100}, memory_mib: 81920}}\n")
    socket_dir = short_tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("METAGPU_", "KUBE"))}
    env.pop("NODE_NAME", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "metagpu.cli",
            "agent",
            "--gpus-file",
            str(gpus),
            "--socket-dir",
            str(socket_dir),
            "--metrics-listen",
            "127.0.0.1:0",
            "--pod-resources-socket",
            str(short_tmp_path / "absent.sock"),
            "--interval",
            "0.2",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        # Ready means: serving, and the first cycle has run (it reports the
        # missing kubelet); a SIGTERM before that would race the first cycle.
        while not (
            (socket_dir / AGENT_SOCKET_NAME).exists()
            and any("kubelet PodResources socket" in line for line in list(lines))
        ):
            assert proc.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "agent never served:\n" + "".join(lines)
            time.sleep(0.05)  # polling a condition, bounded by the deadline
        assert (socket_dir / MGCTL_FILE_NAME).exists()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        reader.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(lines)
    assert proc.returncode == 0, out
    assert not (socket_dir / AGENT_SOCKET_NAME).exists()
    assert "node agent starting" in out
    assert "node agent stopped" in out
    assert "no node name" in out  # says it runs without the API, and why
    assert "kubelet PodResources socket" in out  # the missing kubelet, logged once
    assert out.count("podresources unavailable") == 1
