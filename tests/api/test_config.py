"""PluginConfig: defaults (the Helm chart's contract), validation, and flags > env > file."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugin.api.config import ENV_PREFIX, PluginConfig
from plugin.api.settings import ConfigError, env_var_names, load_config


def load_yaml(tmp_path: Path, text: str, **kwargs: object) -> PluginConfig:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_config(PluginConfig, file=path, env_prefix=ENV_PREFIX, **kwargs)  # type: ignore[arg-type]


def test_defaults_are_the_chart_contract() -> None:
    assert PluginConfig().model_dump(mode="json", exclude={"agent"}) == {
        "version": "v1",
        "units_per_gpu": 100,
        "resources": [{"name": "cnvrg.io/metagpu", "gpus": "all"}],
        "allocation_policy": "binpack",
        "allow_split_fraction": None,
        "device_id_strategy": "uuid",
        "device_list_strategy": "envvar",
        "device_plugins_dir": "/var/lib/kubelet/device-plugins",
        "gpus_file": None,
        "fail_on_init_error": True,
        "health": {
            "enabled": True,
            "ignored_xids": [13, 31, 43, 45, 68, 109],
            "recovery_s": 300.0,
            "event_timeout_s": 1.0,
            "liveness_interval_s": 10.0,
            "check_volatile_ecc": True,
            "check_row_remap": True,
            "check_retired_pages": True,
        },
        "mps": {
            "enabled": False,
            "supervise": False,
            "pipe_directory": "/tmp/nvidia-mps",
            "container_pipe_directory": "/tmp/nvidia-mps",
            "log_directory": None,
            "shm_directory": None,
            "control_command": ["nvidia-cuda-mps-control"],
            "set_exclusive_process": True,
            "health_interval_s": 5.0,
            "command_timeout_s": 10.0,
            "start_timeout_s": 15.0,
            "restart_backoff_s": 1.0,
            "restart_backoff_max_s": 60.0,
        },
        "placement": {"extender": False, "honour_assignments": True, "node_name": None},
    }


@pytest.mark.parametrize(
    ("allow", "extender", "refuses"),
    [
        pytest.param(None, False, False, id="unset-without-extender"),
        pytest.param(None, True, True, id="unset-with-extender"),
        pytest.param(False, False, True, id="false"),
        pytest.param(True, True, False, id="true"),
    ],
)
def test_split_fractions_are_refused_as_allow_split_fraction_and_the_extender_say(
    allow: bool | None, extender: bool, refuses: bool
) -> None:
    config = PluginConfig(allow_split_fraction=allow, placement={"extender": extender})  # type: ignore[arg-type]
    assert config.refuses_split_fraction is refuses


def test_env_var_names_cover_nested_fields() -> None:
    names = env_var_names(PluginConfig, ENV_PREFIX)
    for var in (
        "METAGPU_PLUGIN_UNITS_PER_GPU",
        "METAGPU_PLUGIN_ALLOCATION_POLICY",
        "METAGPU_PLUGIN_DEVICE_PLUGINS_DIR",
        "METAGPU_PLUGIN_HEALTH__IGNORED_XIDS",
        "METAGPU_PLUGIN_HEALTH__RECOVERY_S",
        "METAGPU_PLUGIN_MPS__ENABLED",
    ):
        assert var in names


def test_two_resources_on_disjoint_gpus(tmp_path: Path) -> None:
    config = load_yaml(
        tmp_path,
        """
version: v1
resources:
  - name: cnvrg.io/metagpu
    gpus: [0, 1]
  - name: cnvrg.io/metagpu-a100
    gpus: [GPU-aaaa, 3]
""",
    )
    assert [r.name for r in config.resources] == ["cnvrg.io/metagpu", "cnvrg.io/metagpu-a100"]
    assert [r.socket_name for r in config.resources] == [
        "metagpu-metagpu.sock",
        "metagpu-metagpu-a100.sock",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("version: v2\n", ["version", "'v1'", "v2"], id="unknown-version"),
        pytest.param("unitsPerGPU: 10\n", ["unknown setting", "units_per_gpu"], id="typo"),
        pytest.param(
            "units_per_gpu: 0\n", ["units_per_gpu", "greater than or equal to 1"], id="zero-units"
        ),
        pytest.param("units_per_gpu: 1001\n", ["units_per_gpu", "1000"], id="too-many-units"),
        pytest.param(
            "allocation_policy: pack\n", ["allocation_policy", "'binpack'", "'spread'"], id="policy"
        ),
        pytest.param(
            "device_id_strategy: serial\n", ["device_id_strategy", "'uuid'"], id="id-strategy"
        ),
        pytest.param(
            "device_list_strategy: cdi\n",
            ["device_list_strategy", "'volume-mounts'"],
            id="list-strategy",
        ),
        pytest.param(
            "resources: [{name: metagpu}]\n", ["resources.0.name", "<domain>/<name>"], id="bad-name"
        ),
        pytest.param(
            "resources: [{name: cnvrg.io/a}, {name: cnvrg.io/a, gpus: [1]}]\n",
            ["unique", "cnvrg.io/a"],
            id="duplicate-name",
        ),
        pytest.param(
            "resources: [{name: cnvrg.io/a, gpus: [0]}, {name: example.com/a, gpus: [1]}]\n",
            ["sockets would collide", "metagpu-a.sock"],
            id="socket-collision",
        ),
        pytest.param(
            "resources: [{name: cnvrg.io/a}, {name: cnvrg.io/b, gpus: [1]}]\n",
            ["cnvrg.io/a takes gpus: all", "at most one resource"],
            id="all-plus-another",
        ),
        pytest.param(
            "resources: [{name: cnvrg.io/a, gpus: [0, 1]}, {name: cnvrg.io/b, gpus: [1]}]\n",
            ["GPU 1", "cnvrg.io/a", "cnvrg.io/b", "at most one resource"],
            id="gpu-in-two",
        ),
        pytest.param("resources: []\n", ["at least one resource"], id="no-resources"),
        pytest.param("resources: [{gpus: []}]\n", ["non-empty list"], id="empty-gpus"),
        pytest.param("resources: [{gpus: [0, 0]}]\n", ["listed twice", "0"], id="gpu-twice"),
        pytest.param(
            "resources: [{gpus: [0, '0']}]\n",
            ["listed twice", "as 0 and as '0'"],
            id="gpu-twice-as-int-and-digits",
        ),
        pytest.param(
            "resources: [{gpus: [GPU-AB12, gpu-ab12]}]\n",
            ["listed twice", "'GPU-AB12'", "'gpu-ab12'"],
            id="uuid-twice-in-any-case",
        ),
        pytest.param(
            "resources: [{name: cnvrg.io/a, gpus: [1]}, {name: cnvrg.io/b, gpus: ['1']}]\n",
            ["'1'", "cnvrg.io/a", "cnvrg.io/b", "at most one resource"],
            id="gpu-in-two-as-int-and-digits",
        ),
        pytest.param("resources: [{gpus: [-1]}]\n", ["index must be >= 0", "-1"], id="negative"),
        pytest.param("health: {ignored_xids: [0]}\n", ["positive", "[0]"], id="xid-zero"),
        pytest.param("health: {recovery_s: 0}\n", ["recovery_s", "greater than 0"], id="recovery"),
        pytest.param(
            "health: {event_timeout_s: 600}\n", ["event_timeout_s", "60"], id="event-timeout"
        ),
        pytest.param(
            "mps: {pipe_directory: relative/pipe}\n",
            ["absolute path", "relative/pipe"],
            id="mps-relative",
        ),
        pytest.param(
            "mps: {supervise: true}\n",
            ["mps.supervise needs mps.enabled"],
            id="mps-supervise-without-enabled",
        ),
    ],
)
def test_invalid_config_is_explained(tmp_path: Path, text: str, expected: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        load_yaml(tmp_path, text)
    message = str(err.value)
    for fragment in expected:
        assert fragment in message
    assert "config.yaml" in message  # where the bad value came from


def test_flags_beat_env_beat_file(tmp_path: Path) -> None:
    text = "units_per_gpu: 10\nallocation_policy: spread\ndevice_id_strategy: index\n"
    env = {"METAGPU_PLUGIN_UNITS_PER_GPU": "20", "METAGPU_PLUGIN_ALLOCATION_POLICY": "binpack"}
    config = load_yaml(
        tmp_path, text, env=env, flags={"units_per_gpu": 30, "allocation_policy": None}
    )
    assert config.units_per_gpu == 30  # flag
    assert config.allocation_policy == "binpack"  # env (flag not given)
    assert config.device_id_strategy == "index"  # file


def test_env_sets_nested_and_list_fields(tmp_path: Path) -> None:
    env = {
        "METAGPU_PLUGIN_HEALTH__IGNORED_XIDS": "13,31,79",
        "METAGPU_PLUGIN_HEALTH__RECOVERY_S": "60",
        "METAGPU_PLUGIN_MPS__ENABLED": "true",
    }
    config = load_yaml(tmp_path, "", env=env)
    assert config.health.ignored_xids == [13, 31, 79]
    assert config.health.recovery_s == 60
    assert config.mps.enabled


def test_env_error_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_yaml(tmp_path, "", env={"METAGPU_PLUGIN_DEVICE_ID_STRATEGY": "serial"})
    assert "env METAGPU_PLUGIN_DEVICE_ID_STRATEGY" in str(err.value)
    assert "'serial'" in str(err.value)


def test_ignored_xids_are_sorted_and_deduplicated(tmp_path: Path) -> None:
    config = load_yaml(tmp_path, "health: {ignored_xids: [43, 13, 43]}\n")
    assert config.health.ignored_xids == [13, 43]
