"""MPS for DRA shares, end to end: the running DRA plugin with ``mps.supervise``, the
documented stand-in as its control program (:mod:`plugin.gpu.mps_standin`, through the
same subprocess path as ``nvidia-cuda-mps-control``), simulated GPUs that record
compute-mode changes, the kubelet-side harness over real unix sockets and the in-test
API server, as ``test_plugin.py``.

What a share must get, and when it must get nothing: its CDI spec points CUDA at the
daemon (``CUDA_MPS_PIPE_DIRECTORY`` and the mounts, as the device plugin's Allocate);
a GPU whose daemon does not answer leaves the slice and is refused at prepare (its
limits would be variables nobody reads); it comes back once the daemon answers; and
stopping the plugin puts the compute modes back. Waits are on conditions, bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs; kubernetes-validate brings it
import pytest
import yaml

import plugin.gpu.mps_standin
from certs.kube import open_api_client
from plugin.api.config import MpsConfig
from plugin.api.settings import load_config
from plugin.dra.cdi import MOUNT_OPTIONS_RW
from plugin.dra.cli import add_arguments
from plugin.dra.cli import load as load_dra_config
from plugin.dra.config import ENV_PREFIX, DraConfig
from plugin.dra.runtime import DraPlugin
from plugin.gpu.mps_supervisor import STATE_FILE_NAME, MpsSupervisor
from plugin.gpu.simulated import SimulatedGpus
from tests.conftest import REPO_ROOT
from tests.harness.kube_api import FakeKubeApi
from tests.plugin.conftest import wait_until
from tests.plugin.dra.fixtures import CAPTURED_GPUS, DRIVER, NODE, load
from tests.plugin.dra.kubelet import DraKubelet
from tests.plugin.dra.test_plugin import SLICE, gpus_spec, put_claim_of
from tests.plugin.dra.test_shapes import CDI_SPEC_SCHEMA

STANDIN = Path(plugin.gpu.mps_standin.__file__)
CONTAINER_PIPE = "/tmp/nvidia-mps"
PREPARE_50 = "kubelet-node-prepare-consumable-50-units.json"
UUIDS = [g.uuid for g in CAPTURED_GPUS]


@dataclass
class MpsNode:
    """The plugin under test and what it runs on."""

    plugin: DraPlugin
    kubelet: DraKubelet
    fake: FakeKubeApi
    gpus: SimulatedGpus
    root: Path
    task: asyncio.Task[int]
    stop: asyncio.Event

    @property
    def blocked(self) -> Path:
        """While this file exists the control program refuses ``-d`` (a daemon that
        cannot start), so "down" lasts until the test says otherwise."""
        return self.root / "block-start"

    @property
    def mps(self) -> MpsSupervisor:
        assert self.plugin.mps is not None
        return self.plugin.mps

    def slice_devices(self) -> list[str] | None:
        obj = self.fake.get("resource.k8s.io/v1", "ResourceSlice", SLICE)
        return None if obj is None else [d["name"] for d in obj["spec"]["devices"]]

    def specs(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted((self.root / "cdi").glob("*.json"))]

    async def stopped(self) -> int:
        self.stop.set()
        return await asyncio.wait_for(asyncio.shield(self.task), 10)


def gated_standin(root: Path, blocked: Path) -> Path:
    """The stand-in behind a gate: ``-d`` fails while ``blocked`` exists, everything else
    is the stand-in itself (the same exit status and message as a real daemon that
    cannot start: 1 and a line on stderr)."""
    script = root / "mps-control"
    script.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from plugin.gpu.mps_standin import main\n"
        f"if sys.argv[1:] == ['-d'] and os.path.exists({str(blocked)!r}):\n"
        "    print('cannot start the MPS control daemon (blocked by the test)', file=sys.stderr)\n"
        "    sys.exit(1)\n"
        "sys.exit(main())\n"
    )
    return script


@pytest.fixture
async def node(
    short_tmp_path: Path, kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> AsyncIterator[MpsNode]:
    fake, _ = kube_api
    root = short_tmp_path
    gpus_file = root / "gpus.yaml"
    gpus_file.write_text(yaml.safe_dump(gpus_spec()))
    gpus = SimulatedGpus.from_file(gpus_file)
    config = DraConfig.model_validate(
        {
            "node_name": NODE,
            "plugins_dir": str(root / "plugins"),
            "registry_dir": str(root / "registry"),
            "cdi_dir": str(root / "cdi"),
            "gpus_file": str(gpus_file),
            "health": {"event_timeout_s": 0.1, "recovery_s": 3600, "liveness_interval_s": 0},
            "grace_s": 10,
            "mps": {
                "enabled": True,
                "supervise": True,
                "pipe_directory": str(root / "pipe"),
                "log_directory": str(root / "log"),
                "shm_directory": str(root / "shm"),
                "control_command": [sys.executable, str(gated_standin(root, root / "block-start"))],
                "health_interval_s": 0.05,
                "restart_backoff_s": 0.05,
                "restart_backoff_max_s": 0.2,
            },
        }
    )
    plugin = DraPlugin(
        config, open_api=open_api_client, backend_factory=lambda _c: gpus, watch_timeout_s=1
    )
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop), name="dra-plugin-under-test")
    try:
        await asyncio.wait_for(plugin.started.wait(), 10)
        async with DraKubelet(root / "registry") as kubelet:
            yield MpsNode(plugin, kubelet, fake, gpus, root, task, stop)
    finally:
        stop.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), 10)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def env_of(spec: dict[str, Any]) -> dict[str, str]:
    (device,) = spec["devices"]
    return dict(e.split("=", 1) for e in device["containerEdits"]["env"])


async def test_a_share_gets_the_pipe_directory_and_its_mounts(node: MpsNode) -> None:
    assert node.mps.status.state == "up", node.mps.status.reason
    assert [node.gpus.compute_mode(u) for u in UUIDS] == ["Exclusive_Process"] * 2
    await wait_until(lambda: node.slice_devices() == ["gpu-0", "gpu-1"], what="the slice")
    call = load(PREPARE_50)
    put_claim_of(node.fake, call)
    await node.kubelet.register()
    answer = await node.kubelet.replay(call)
    ((_uid, entry),) = answer["claims"].items()
    assert "error" not in entry, entry
    (spec,) = node.specs()
    jsonschema.Draft7Validator(CDI_SPEC_SCHEMA).validate(spec)
    env = env_of(spec)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == CONTAINER_PIPE
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40960M"  # the share's, as before
    (device,) = spec["devices"]
    assert device["containerEdits"]["mounts"] == [
        {
            "hostPath": "/var/run/metagpu",  # the agent's socket, for mgctl
            "containerPath": "/var/run/metagpu",
            "options": ["rbind", "ro", "nosuid", "nodev"],
        },
        {
            "hostPath": str(node.root / "pipe"),
            "containerPath": CONTAINER_PIPE,
            "options": list(MOUNT_OPTIONS_RW),
        },
        {
            "hostPath": str(node.root / "shm"),
            "containerPath": "/dev/shm",
            "options": ["rbind", "rw", "nosuid", "nodev"],
        },
    ]
    # the host directory the spec names is the one the daemon serves
    assert (node.root / "pipe" / "control").exists()
    assert device["name"] in answer["claims"][_uid]["devices"][0]["cdi_device_ids"][0]


async def test_a_daemon_down_withdraws_its_gpus_refuses_prepare_and_they_return(
    node: MpsNode,
) -> None:
    await wait_until(lambda: node.slice_devices() == ["gpu-0", "gpu-1"], what="the slice")
    await node.kubelet.register()
    stream = node.kubelet.watch_health()
    try:
        assert await stream.next() == {"gpu-0": "HEALTHY", "gpu-1": "HEALTHY"}
        first = node.mps.starts
        pid = node.mps._control.daemon_pid()
        assert pid is not None
        node.blocked.touch()  # it will not come back until the test allows it
        os.kill(pid, signal.SIGKILL)

        await wait_until(lambda: node.slice_devices() == [], what="both GPUs withdrawn")
        assert await stream.next() == {"gpu-0": "UNHEALTHY", "gpu-1": "UNHEALTHY"}
        record = node.plugin.board.records()[UUIDS[0]]
        assert record.check == "mps"
        assert record.reason.startswith("MPS control daemon not answering")

        call = load(PREPARE_50)
        ref = put_claim_of(node.fake, call)
        answer = await node.kubelet.prepare([ref])
        error = answer["claims"][ref["uid"]]["error"]
        assert " is withdrawn: MPS control daemon not answering" in error
        assert "new containers would get no memory or compute limits" in error
        assert node.specs() == []  # nothing handed out without its limits

        node.blocked.unlink()
        await wait_until(lambda: node.mps.starts > first, what="the daemon restarted")
        await wait_until(lambda: node.slice_devices() == ["gpu-0", "gpu-1"], what="both GPUs back")
        assert await stream.next() == {"gpu-0": "HEALTHY", "gpu-1": "HEALTHY"}
        answer = await node.kubelet.prepare([ref])
        assert "error" not in answer["claims"][ref["uid"]], answer
        (spec,) = node.specs()
        assert env_of(spec)["CUDA_MPS_PIPE_DIRECTORY"] == CONTAINER_PIPE
    finally:
        stream.cancel()


async def test_stop_quits_the_daemon_and_restores_the_compute_modes(node: MpsNode) -> None:
    mps = node.mps
    assert [node.gpus.compute_mode(u) for u in UUIDS] == ["Exclusive_Process"] * 2
    state_file = node.root / "log" / STATE_FILE_NAME
    assert json.loads(state_file.read_text()) == dict.fromkeys(UUIDS, "Default")
    assert await node.stopped() == 0
    assert mps.status.state == "stopped"
    assert [node.gpus.compute_mode(u) for u in UUIDS] == ["Default"] * 2
    assert not state_file.exists()
    assert mps._control.daemon_pid() is None
    log = (node.root / "log" / "control.log").read_text()
    sent = [line.split("Cmd:", 1)[1] for line in log.splitlines() if "Cmd:" in line]
    assert sent[-1] == "quit"


@pytest.mark.parametrize("supervise", [False, True])
def test_the_mps_section_and_switches_are_the_device_plugins(supervise: bool) -> None:
    """Same keys, same model, same env-var pattern and flags (``METAGPU_DRA_MPS__*``)."""
    assert DraConfig.model_fields["mps"].annotation is MpsConfig
    env = {"METAGPU_DRA_MPS__ENABLED": "true", "METAGPU_DRA_MPS__SHM_DIRECTORY": "/run/mps-shm"}
    config = load_config(DraConfig, file=None, env=env, env_prefix=ENV_PREFIX, flags={})
    assert config.mps.enabled
    assert str(config.mps.shm_directory) == "/run/mps-shm"

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--node-name", NODE, "--mps"] + (["--mps-supervise"] if supervise else [])
    flagged = load_dra_config(parser.parse_args(argv))
    assert flagged.mps.enabled
    assert flagged.mps.supervise is supervise
    assert flagged.driver_name == DRIVER
