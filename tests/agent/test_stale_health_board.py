"""Phantom GPUs from a stale health board (issue 32, item 1): the acceptance test.

A real install showed it: on a node without a GPU driver the device plugin
never starts, the agent serves an empty node, and yet it labelled the node
with two healthy A100s and published them in its ledger, read from a
``metagpu-gpu-health.json`` an earlier install had left behind. Here the
plugin never runs; the board in the device-plugins directory is one a writer
that is not running left (another boot, a dead process, a lapsed refresh, an
older release). The agent, as ``metagpu agent`` runs it (real API client
against the fake API server, PodResources over gRPC, the installed mgctl),
must publish no GPUs and say why, in its labels, its ledger and mgctl. The
last case is the control: the same file from a writer that runs is trusted.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from certs.kube import open_api_client
from plugin.agent import pods as pods_module
from plugin.agent.agent import AgentRuntime
from plugin.agent.gpus import NoDriver
from plugin.agent.identity import Caller
from plugin.agent.mgctl import render_devices, render_processes
from plugin.agent.views import device_list, process_list
from plugin.api.config import PluginConfig
from plugin.api.provenance import Stamp, Writer, current_writer
from plugin.api.resources import (
    AGENT_SOCKET_NAME,
    ENV_AGENT_SOCKET,
    MGCTL_FILE_NAME,
    NODE_LABEL_GPU_COUNT,
    NODE_LABEL_GPU_PRODUCT,
    NODE_LABEL_LARGEST_FREE_UNITS,
)
from plugin.api.scheduling import ANNOTATION_GPU_LEDGER
from plugin.gpu.health import GpuHealth
from plugin.gpu.health_file import HEALTH_FILE_NAME, board_document, write_board
from tests.agent.builders import fake_boot, mirror_this_process, place_on_host, stat_line
from tests.agent.helpers import eventually, run_mgctl
from tests.harness.kube_api import FakeKubeApi
from tests.harness.podresources import running_pod_resources
from tests.plugin.builders import gpu

HOST = Caller(pid=1, uid=0, scope="node", container=None, via="host root")
NO_DRIVER = "NVML Shared Library Not Found"
OTHER_BOOT = "9f0e1d2c-3b4a-4596-8877-665544332211"
DEAD_PID = 4_000_001
"""A PID the fake procfs has no process for."""


def stale_board(directory: Path, stamp: Stamp | None) -> None:
    """The board an earlier install left: two healthy A100s with nothing allocated."""
    infos = {g.uuid: g for g in (gpu(0), gpu(1))}
    records = {u: GpuHealth(uuid=u, state="Healthy", reason="", check="", since=0.0) for u in infos}
    written_at = stamp.written_at if stamp is not None else 1_700_000_000.0
    write_board(
        directory / HEALTH_FILE_NAME,
        board_document(infos, records, {}, written_at=written_at, stamp=stamp),
    )


def left_by(*, boot: str = "this", writer: str = "dead", age_s: float = 1.0) -> Stamp:
    """A stamp from this boot or another, by this process or a dead one, ``age_s`` old."""
    me = current_writer()
    boot_id = me.boot_id if boot == "this" else OTHER_BOOT
    pid, start = (me.pid, me.start_ticks) if writer == "me" else (DEAD_PID, 777)
    writer_ = Writer(boot_id=boot_id, pid=pid, start_ticks=start)
    return Stamp(writer=writer_, written_at=time.time() - age_s, valid_for_s=30.0)


@pytest.fixture
def api(kube_api: tuple[FakeKubeApi, str], kube_config_env: Path, monkeypatch: Any) -> FakeKubeApi:
    monkeypatch.setattr(pods_module, "WATCH_TIMEOUT_S", 1)
    fake, _ = kube_api
    fake.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "labels": {}}})
    return fake


def node(fake: FakeKubeApi) -> dict[str, Any]:
    obj = fake.get("v1", "Node", "node-a")
    assert obj is not None
    return obj


def ledger_gpus(fake: FakeKubeApi) -> list[dict[str, Any]] | None:
    text = (node(fake)["metadata"].get("annotations") or {}).get(ANNOTATION_GPU_LEDGER)
    return None if text is None else list(json.loads(text)["gpus"])


@pytest.mark.parametrize(
    ("stamp", "why"),
    [
        pytest.param(
            lambda: left_by(boot="other"), "written before this node last booted", id="another boot"
        ),
        pytest.param(left_by, f"process {DEAD_PID} (started 777", id="dead writer"),
        pytest.param(
            lambda: left_by(writer="me", age_s=600), "last refreshed 600 s ago", id="lapsed"
        ),
        pytest.param(lambda: None, "does not say which process wrote it", id="older release"),
    ],
)
async def test_a_stale_board_without_a_plugin_shows_no_gpus_and_says_why(
    short_tmp_path: Path, tmp_path: Path, api: FakeKubeApi, stamp: Any, why: str
) -> None:
    proc = tmp_path / "proc"
    mirror_this_process(proc)
    (proc / "777").mkdir()  # a live PID 777 that is not the writer (another start time)
    (proc / "777" / "stat").write_text(stat_line(777, start_ticks=1))
    directory = short_tmp_path / "dp"
    directory.mkdir()
    stale_board(directory, stamp())
    run = short_tmp_path / "run"
    config = PluginConfig.model_validate(
        {
            "device_plugins_dir": str(directory),
            "agent": {
                "node_name": "node-a",
                "socket_dir": str(run),
                "pod_resources_socket": str(short_tmp_path / "pr.sock"),
                "metrics_listen": "127.0.0.1:0",
                "proc_root": str(proc),
                "interval_s": 0.1,
            },
        }
    )
    async with (
        running_pod_resources(short_tmp_path / "pr.sock"),
        AgentRuntime(config, open_api=open_api_client, backend=NoDriver(NO_DRIVER)) as rt,
    ):
        snapshot = (await rt.agent.next_cycle()).snapshot
        await eventually(lambda: ledger_gpus(api) is not None, what="the ledger is published")
        await eventually(
            lambda: NODE_LABEL_GPU_COUNT in (node(api)["metadata"].get("labels") or {}),
            what="the node is labelled",
        )
        # Labels: no GPUs, and no product from the stale file.
        labels = node(api)["metadata"]["labels"]
        assert labels[NODE_LABEL_GPU_COUNT] == "0"
        assert labels[NODE_LABEL_LARGEST_FREE_UNITS] == "0"
        assert NODE_LABEL_GPU_PRODUCT not in labels
        # Ledger: none of the stale file's GPUs for the scheduler extender.
        assert ledger_gpus(api) == []
        # mgctl: no GPUs, and why (no driver; the board is not current, and why not).
        assert snapshot.gpus == ()
        reason = snapshot.no_gpus_reason
        assert reason is not None
        assert NO_DRIVER in reason
        assert HEALTH_FILE_NAME in reason
        assert why in reason
        for text in (
            render_devices(device_list(snapshot, HOST, node="node-a")),
            render_processes(process_list(snapshot, HOST, node="node-a", command=lambda _: "")),
        ):
            assert f"NO GPUS on this node: {reason}" in text
        if os.geteuid() == 0:  # the installed mgctl, as host root (node scope)
            code, out, err = await run_mgctl(
                run / MGCTL_FILE_NAME,
                "get",
                "devices",
                place=lambda pid: place_on_host(proc, pid),
                env={ENV_AGENT_SOCKET: str(run / AGENT_SOCKET_NAME)},
            )
            assert code == 0, err
            assert why in out
            assert "No GPUs on this node." in out


async def test_the_same_board_from_a_running_writer_is_trusted(
    short_tmp_path: Path, tmp_path: Path
) -> None:
    """The control: only provenance differs from the cases above."""
    proc = tmp_path / "proc"
    mirror_this_process(proc)
    directory = short_tmp_path / "dp"
    directory.mkdir()
    stale_board(directory, left_by(writer="me"))
    config = PluginConfig.model_validate(
        {
            "device_plugins_dir": str(directory),
            "agent": {
                "socket_dir": str(short_tmp_path / "run"),
                "pod_resources_socket": str(short_tmp_path / "pr.sock"),
                "metrics_listen": "127.0.0.1:0",
                "proc_root": str(proc),
                "interval_s": 0.1,
            },
        }
    )
    async with (
        running_pod_resources(short_tmp_path / "pr.sock"),
        AgentRuntime(config, open_api=open_api_client, backend=NoDriver(NO_DRIVER)) as rt,
    ):
        snapshot = (await rt.agent.next_cycle()).snapshot
        assert [g.uuid for g in snapshot.gpus] == [gpu(0).uuid, gpu(1).uuid]
        assert snapshot.no_gpus_reason is None
        fake_boot(proc, OTHER_BOOT)  # the node "reboots"
        snapshot = (await rt.agent.next_cycle()).snapshot
        assert snapshot.gpus == ()
        assert "before this node last booted" in (snapshot.no_gpus_reason or "")
