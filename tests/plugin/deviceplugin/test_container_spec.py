"""What Allocate tells the runtime, per device-list strategy, ID strategy and MPS (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from plugin.api.config import PluginConfig
from plugin.api.mps_clients import MountSpec
from plugin.api.resources import (
    ENV_AGENT_SOCKET,
    ENV_DEVICE_IDS,
    ENV_GPU_FRACTION,
    ENV_MEMORY_LIMIT_MB,
    ENV_MPS_PINNED_DEVICE_MEM_LIMIT,
    ENV_MPS_PIPE_DIRECTORY,
    ENV_NVIDIA_VISIBLE_DEVICES,
    ENV_UNITS,
)
from plugin.deviceplugin.container_spec import (
    build_container_spec,
    compress_ids,
    expand_ids,
    format_fraction,
)
from plugin.placement.devices import MetaDevice
from tests.plugin.builders import gpu, table, uuid_for

AGENT_MOUNT = MountSpec("/var/run/metagpu", "/var/run/metagpu", read_only=True)


def devices(config: PluginConfig, holding: dict[int, int]) -> list[MetaDevice]:
    """``holding``: GPU index → units held (the lowest ones); GPU 1 has 40 GiB, the rest 80."""
    infos = [gpu(0), gpu(1, memory_mib=40960), gpu(2)]
    t = table(infos, units_per_gpu=config.units_per_gpu, id_strategy=config.device_id_strategy)
    chosen = [d for d in t.devices if d.unit < holding.get(d.gpu.info.index, 0)]
    return list(reversed(chosen))  # the kubelet's order must not matter


CASES: list[Any] = [
    pytest.param(
        {},
        {2: 50},
        {
            ENV_NVIDIA_VISIBLE_DEVICES: uuid_for(2),
            ENV_UNITS: "50",
            ENV_GPU_FRACTION: "0.5",
            ENV_MEMORY_LIMIT_MB: "40960",
            ENV_DEVICE_IDS: f"{uuid_for(2)}::0-49",
            ENV_AGENT_SOCKET: "/var/run/metagpu/agent.sock",
        },
        [AGENT_MOUNT],
        id="envvar-uuid-half",
    ),
    pytest.param(
        {"device_id_strategy": "index"},
        {0: 100, 1: 25},
        {
            ENV_NVIDIA_VISIBLE_DEVICES: "0,1",
            ENV_UNITS: "125",
            ENV_GPU_FRACTION: "1.25",
            ENV_MEMORY_LIMIT_MB: "81920,10240",
            ENV_DEVICE_IDS: "0::0-99,1::0-24",
            ENV_AGENT_SOCKET: "/var/run/metagpu/agent.sock",
        },
        [AGENT_MOUNT],
        id="envvar-index-multi-gpu",
    ),
    pytest.param(
        {"device_list_strategy": "volume-mounts", "agent": {"socket_dir": "/run/mg"}},
        {0: 10, 2: 10},
        {
            ENV_NVIDIA_VISIBLE_DEVICES: "/var/run/nvidia-container-devices",
            ENV_UNITS: "20",
            ENV_GPU_FRACTION: "0.2",
            ENV_MEMORY_LIMIT_MB: "8192,8192",
            ENV_DEVICE_IDS: f"{uuid_for(0)}::0-9,{uuid_for(2)}::0-9",
            ENV_AGENT_SOCKET: "/var/run/metagpu/agent.sock",
        },
        [
            MountSpec("/var/run/metagpu", "/run/mg", read_only=True),
            MountSpec(f"/var/run/nvidia-container-devices/{uuid_for(0)}", "/dev/null", True),
            MountSpec(f"/var/run/nvidia-container-devices/{uuid_for(2)}", "/dev/null", True),
        ],
        id="volume-mounts",
    ),
    pytest.param(
        {"mps": {"enabled": True, "pipe_directory": "/run/nvidia/mps"}},
        {1: 50, 2: 100},
        {
            ENV_NVIDIA_VISIBLE_DEVICES: f"{uuid_for(1)},{uuid_for(2)}",
            ENV_UNITS: "150",
            ENV_GPU_FRACTION: "1.5",
            ENV_MEMORY_LIMIT_MB: "20480,81920",
            ENV_DEVICE_IDS: f"{uuid_for(1)}::0-49,{uuid_for(2)}::0-99",
            ENV_AGENT_SOCKET: "/var/run/metagpu/agent.sock",
            ENV_MPS_PIPE_DIRECTORY: "/tmp/nvidia-mps",
            ENV_MPS_PINNED_DEVICE_MEM_LIMIT: "0=20480M,1=81920M",
        },
        [AGENT_MOUNT, MountSpec("/tmp/nvidia-mps", "/run/nvidia/mps", read_only=False)],
        id="mps-ordinals-follow-visible-devices",
    ),
    pytest.param(
        {"units_per_gpu": 3},
        {0: 1},
        {
            ENV_NVIDIA_VISIBLE_DEVICES: uuid_for(0),
            ENV_UNITS: "1",
            ENV_GPU_FRACTION: "0.3333",
            ENV_MEMORY_LIMIT_MB: "27306",
            ENV_DEVICE_IDS: f"{uuid_for(0)}::0",
            ENV_AGENT_SOCKET: "/var/run/metagpu/agent.sock",
        },
        [AGENT_MOUNT],
        id="thirds-round-down",
    ),
]


@pytest.mark.parametrize(("overrides", "holding", "envs", "mounts"), CASES)
def test_container_spec(
    overrides: dict[str, Any],
    holding: dict[int, int],
    envs: dict[str, str],
    mounts: list[MountSpec],
) -> None:
    config = PluginConfig.model_validate(overrides)
    spec = build_container_spec(devices(config, holding), config=config)
    assert spec.envs == envs
    assert list(spec.mounts) == mounts


def test_same_devices_same_answer_in_any_order() -> None:
    config = PluginConfig()
    held = devices(config, {0: 30, 2: 70})
    assert build_container_spec(held, config=config) == build_container_spec(
        list(reversed(held)), config=config
    )


@pytest.mark.parametrize(
    ("units", "per_gpu", "expected"),
    [(50, 100, "0.5"), (100, 100, "1"), (150, 100, "1.5"), (1, 1000, "0.001"), (2, 3, "0.6667")],
)
def test_format_fraction(units: int, per_gpu: int, expected: str) -> None:
    assert format_fraction(units, per_gpu) == expected


def test_compressed_ids_round_trip_and_stay_small() -> None:
    t = table([gpu(i) for i in range(16)], units_per_gpu=1000)
    every = list(t.devices)
    text = compress_ids(every)
    assert len(text) < 1000  # 16 runs, not 16,000 IDs (the kernel caps one env string at 128 KiB)
    assert expand_ids(text) == [d.id for d in every]
    scattered = every[::3]
    assert expand_ids(compress_ids(scattered)) == [d.id for d in scattered]
