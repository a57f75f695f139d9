"""The agent on the DRA pool: it reads the CDI specs the DRA plugin writes, read-only.

A claim's share (GPU, units, memory limit) is in the spec the DRA plugin wrote for it
(docs/dra.md, "The agent on DRA nodes"), so the agent's pod must see the same host
directory the plugin writes into, and its config (the real loader, over the rendered
file and the container's env) must point at the mount and name the plugin's driver.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from plugin.api.config import ENV_PREFIX, PluginConfig
from plugin.api.settings import load_config
from plugin.dra.config import DraConfig
from tests.install.chart import (
    DRA_NODES_ONLY,
    DRA_POOL,
    Obj,
    component,
    container,
    load_rendered_config,
    one,
    render,
)
from tests.install.test_rbac import pod_spec


def _agent_config(objects: list[Obj]) -> PluginConfig:
    """The agent's effective config: the rendered file, then its container's plain env."""
    agent = container(pod_spec(component(objects, "DaemonSet", "agent")), "agent")
    env = {e["name"]: e["value"] for e in agent["env"] if "value" in e}
    text = one(objects, "ConfigMap", "metagpu-plugin-config")["data"]["plugin.yaml"]
    with tempfile.TemporaryDirectory(prefix="metagpu-config-") as directory:
        path = Path(directory) / "plugin.yaml"
        path.write_text(text, encoding="utf-8")
        return load_config(PluginConfig, file=path, env=env, env_prefix=ENV_PREFIX)


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(DRA_POOL, id="dra-mode"),
        pytest.param(DRA_NODES_ONLY, id="dra-nodes-only"),
        pytest.param({**DRA_NODES_ONLY, "dra": {**DRA_NODES_ONLY["dra"], "cdiDir": "/etc/cdi"}}),
    ],
)
def test_the_agent_reads_the_directory_the_dra_plugin_writes(values: dict[str, Any]) -> None:
    objects = render(values)
    agent_pod = pod_spec(component(objects, "DaemonSet", "agent"))
    plugin_pod = pod_spec(component(objects, "DaemonSet", "dra-plugin"))
    dra = load_rendered_config(objects, "metagpu-dra-plugin-config", "dra-plugin.yaml", DraConfig)

    def host_path(pod: Obj, volume: str) -> str:
        (found,) = [v for v in pod["volumes"] if v["name"] == volume]
        path: str = found["hostPath"]["path"]
        return path

    assert host_path(agent_pod, "cdi") == host_path(plugin_pod, "cdi")
    (mount,) = [m for m in container(agent_pod, "agent")["volumeMounts"] if m["name"] == "cdi"]
    assert mount["readOnly"] is True  # the agent never writes a spec
    config = _agent_config(objects)
    assert str(config.agent.dra_cdi_dir) == mount["mountPath"]
    assert config.agent.dra_driver == dra.driver_name


def test_without_dra_the_agent_mounts_no_cdi_directory() -> None:
    objects = render({})
    agent_pod = pod_spec(component(objects, "DaemonSet", "agent"))
    assert "cdi" not in {v["name"] for v in agent_pod["volumes"]}
    env = {e["name"] for e in container(agent_pod, "agent")["env"]}
    assert not {n for n in env if "DRA" in n}
