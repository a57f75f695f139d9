"""``python -m metagpu.cli device-plugin`` as a process: signals, reload, XIDs via the GPUs file."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from metagpu.kubelet_sim import KubeletSim
from tests.conftest import REPO_ROOT
from tests.plugin.builders import gpus, gpus_file_spec, uuid_for, write_yaml

pytestmark = pytest.mark.slow

RESOURCE = "cnvrg.io/metagpu"
SOCKET = "metagpu-metagpu.sock"
START_TIMEOUT_S = 30.0
"""Process start imports grpc and pydantic: seconds on a loaded 2-core machine."""


class PluginProcess:
    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.asynccontextmanager
async def plugin_process(
    root: Path, config: dict[str, Any], *args: str
) -> AsyncIterator[PluginProcess]:
    config_file = write_yaml(root / "config.yaml", config)
    log = root / "plugin.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "metagpu.cli",
            "device-plugin",
            "--config",
            str(config_file),
            *args,
            cwd=REPO_ROOT,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
    running = PluginProcess(proc, log)
    try:
        yield running
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def health(devices: list[Any], uuid: str) -> set[str]:
    return {d.health for d in devices if d.ID.startswith(uuid + "::")}


async def test_sighup_reload_xid_from_file_and_sigterm_cleanup(short_tmp_path: Path) -> None:
    directory = short_tmp_path / "dp"
    directory.mkdir()
    gpus_file = write_yaml(short_tmp_path / "gpus.yaml", gpus_file_spec(gpus(2), xids=[]))
    config = {
        "units_per_gpu": 100,
        "device_plugins_dir": str(directory),
        "gpus_file": str(gpus_file),
        "health": {"event_timeout_s": 0.2},
    }
    async with KubeletSim(directory) as kubelet, plugin_process(short_tmp_path, config) as plugin:
        try:
            conn = await kubelet.wait_registered(RESOURCE, timeout_s=START_TIMEOUT_S)
            assert len(conn.devices) == 200

            # An XID appended to the GPUs file reaches the kubelet as a health change.
            spec = yaml.safe_load(gpus_file.read_text())
            spec["gpus"][1]["xids"] = [13, 79]
            write_yaml(gpus_file, spec)
            devices = await kubelet.wait_devices(
                RESOURCE, lambda d: health(d, uuid_for(1)) == {"Unhealthy"}, timeout_s=10
            )
            assert health(devices, uuid_for(0)) == {"Healthy"}

            # SIGHUP: the changed units_per_gpu shows in the next list.
            write_yaml(short_tmp_path / "config.yaml", {**config, "units_per_gpu": 10})
            plugin.proc.send_signal(signal.SIGHUP)
            conn = await kubelet.wait_registered(RESOURCE, count=2, timeout_s=15)
            assert len(conn.devices) == 20
            assert health(conn.devices, uuid_for(1)) == {"Unhealthy"}  # health survives reload

            # SIGTERM: socket removed, exit 0.
            plugin.proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(plugin.proc.wait(), 15) == 0
            assert not (directory / SOCKET).exists()
            assert kubelet.socket_path.is_socket()
        except BaseException:
            print(plugin.output())
            raise
        output = plugin.output()
        assert "starting device plugin" in output
        assert "SIGHUP: reloading configuration" in output
        assert "device plugin stopped" in output


async def test_bad_config_exits_2_with_the_reason(short_tmp_path: Path) -> None:
    async with plugin_process(short_tmp_path, {"units_per_gpu": 0}) as plugin:
        assert await asyncio.wait_for(plugin.proc.wait(), START_TIMEOUT_S) == 2
        output = plugin.output()
    assert "configuration error" in output
    assert "units_per_gpu" in output
    assert "config.yaml" in output


async def test_print_config_shows_flags_over_file(short_tmp_path: Path) -> None:
    async with plugin_process(
        short_tmp_path,
        {"units_per_gpu": 10, "allocation_policy": "spread"},
        "--units-per-gpu",
        "20",
        "--device-id-strategy",
        "index",
        "--print-config",
    ) as plugin:
        assert await asyncio.wait_for(plugin.proc.wait(), START_TIMEOUT_S) == 0
        shown = yaml.safe_load(plugin.output())
    assert shown["units_per_gpu"] == 20
    assert shown["allocation_policy"] == "spread"
    assert shown["device_id_strategy"] == "index"
