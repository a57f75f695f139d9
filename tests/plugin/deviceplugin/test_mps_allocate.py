"""The supervised MPS daemon in the running plugin, through the real gRPC ``Allocate``.

The plugin runs on simulated GPUs with ``mps.supervise`` and the documented stand-in
as its control program, registered with the simulated kubelet. What a container ends
up with is the kubelet's merge (KUBELET-FACTS §3): Allocate's env first, then the
container's own env, which the webhook wrote; the last value of a name wins.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import plugin.gpu.mps_standin
from plugin.api.resources import ENV_MPS_PINNED_DEVICE_MEM_LIMIT, ENV_MPS_THREAD_PERCENTAGE
from tests.plugin.builders import gpus, gpus_file_spec
from tests.plugin.conftest import kubelet_and_plugin, wait_until
from tests.webhook.builders import applied, env_of, gpu, pod, settings
from webhook.rules import mutate_pod

RESOURCE = "cnvrg.io/metagpu"
STANDIN = [sys.executable, str(Path(plugin.gpu.mps_standin.__file__))]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths (the daemon's pipes) must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="mpsa", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def mps_config(directory: Path) -> dict[str, Any]:
    return {
        "mps": {
            "enabled": True,
            "supervise": True,
            "pipe_directory": str(directory / "pipe"),
            "log_directory": str(directory / "log"),
            "shm_directory": str(directory / "shm"),
            "control_command": STANDIN,
            "health_interval_s": 0.05,
            "restart_backoff_s": 0.05,
            "restart_backoff_max_s": 0.2,
        }
    }


def merged_env(allocate: Any, container: Mapping[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: Allocate's, then its own."""
    env = dict(allocate.envs)
    env.update({k: v for k, v in env_of(container).items() if isinstance(v, str)})
    return env


async def test_daemon_modes_limits_and_recovery(tmp_path: Path, short_dir: Path) -> None:
    spec = gpus_file_spec(gpus(2, memory_mib=81920))
    async with kubelet_and_plugin(tmp_path, spec=spec, config=mps_config(short_dir)) as (
        kubelet,
        plugin,
    ):
        await kubelet.wait_registered(RESOURCE)
        await kubelet.wait_devices(RESOURCE, lambda ds: all(d.health == "Healthy" for d in ds))
        assert kubelet.allocatable(RESOURCE) == 200
        backend = plugin.gpus
        uuids = [g.uuid for g in backend.devices()]
        assert [backend.compute_mode(u) for u in uuids] == ["Exclusive_Process"] * 2

        # memory from the share, as CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, always under MPS
        _ids, response = await kubelet.allocate(RESOURCE, 25)
        envs = dict(response.envs)
        assert envs[ENV_MPS_PINNED_DEVICE_MEM_LIMIT] == "0=20480M"
        assert envs["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
        assert ENV_MPS_THREAD_PERCENTAGE not in envs  # the policy is the pod's (webhook)
        mounts = {m.container_path: (m.host_path, m.read_only) for m in response.mounts}
        assert mounts["/tmp/nvidia-mps"] == (str(short_dir / "pipe"), False)
        assert mounts["/dev/shm"] == (str(short_dir / "shm"), False)

        # the daemon dies: its GPUs are offered to no new container, with the reason
        mps = plugin.supervisor._node.mps if plugin.supervisor._node else None
        assert mps is not None
        pid = mps._pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await kubelet.wait_devices(RESOURCE, lambda ds: all(d.health == "Unhealthy" for d in ds))
        assert kubelet.allocatable(RESOURCE) == 0
        assert plugin.supervisor.board is not None
        record = plugin.supervisor.board.records()[uuids[0]]
        assert record.check == "mps"
        assert "MPS control daemon not answering" in record.reason
        # ... and come back once it is restarted with its defaults
        await kubelet.wait_devices(RESOURCE, lambda ds: all(d.health == "Healthy" for d in ds))
        assert mps.status.restarts == 1
        log = (short_dir / "log" / "control.log").read_text()
        assert log.count("Cmd:set_default_device_pinned_mem_limit 1 81920M") == 2
    # the plugin stopped: no daemon, the compute modes as they were
    await wait_until(lambda: not (short_dir / "pipe" / "control").exists(), what="socket gone")
    assert [backend.compute_mode(u) for u in uuids] == ["Default"] * 2
    assert mps.status.state == "stopped"


@pytest.mark.parametrize(
    ("policy", "cap"),
    [
        pytest.param("fixed", "50", id="fixed: SMs capped at the share"),
        pytest.param("balance", None, id="balance: no SM cap"),
        pytest.param("none", None, id="none: no SM cap"),
    ],
)
async def test_policy_env_as_the_container_sees_it(
    tmp_path: Path, short_dir: Path, policy: str, cap: str | None
) -> None:
    """The webhook's env (the pod's) merged over Allocate's, for 0.5 GPU of 80 GiB."""
    admitted = applied(
        submitted := pod(
            gpu("0.5"), annotations={"metagpu.io/compute-policy": policy}, runtime_class="nvidia"
        ),
        mutate_pod(submitted, settings=settings()),
    )
    container = admitted["spec"]["containers"][0]
    units = int(container["resources"]["limits"][RESOURCE])
    assert units == 50
    spec = gpus_file_spec(gpus(1, memory_mib=81920))
    async with kubelet_and_plugin(tmp_path, spec=spec, config=mps_config(short_dir)) as (
        kubelet,
        _plugin,
    ):
        await kubelet.wait_registered(RESOURCE)
        await kubelet.wait_devices(RESOURCE, lambda ds: all(d.health == "Healthy" for d in ds))
        _ids, response = await kubelet.allocate(RESOURCE, units)
    env = merged_env(response, container)
    assert env[ENV_MPS_PINNED_DEVICE_MEM_LIMIT] == "0=40960M"
    assert env.get(ENV_MPS_THREAD_PERCENTAGE) == cap
    assert env["METAGPU_COMPUTE_POLICY"] == policy
