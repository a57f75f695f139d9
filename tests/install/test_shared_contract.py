"""What the chart tells the webhook agrees with what it tells the device plugin and agent.

Both config files are taken from the rendered ConfigMaps and loaded through
the components' real models (:class:`webhook.config.WebhookConfig`,
:class:`plugin.api.config.PluginConfig`) with the real loader, so a key the
chart renders that a component does not know fails here (the models forbid
unknown keys). Then the three things that must agree are compared: resource
names, units per GPU and tolerations.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.install.chart import (
    EVERYTHING,
    Obj,
    component,
    container,
    flag,
    load_rendered_config,
    render,
    scenario_params,
    template_error,
)


def configs(values: Obj) -> tuple[Any, Any, list[Obj]]:
    from plugin.api.config import PluginConfig
    from webhook.config import WebhookConfig

    objects = render(values)
    webhook = load_rendered_config(objects, "metagpu-webhook-config", "webhook.yaml", WebhookConfig)
    plugin = load_rendered_config(objects, "metagpu-plugin-config", "plugin.yaml", PluginConfig)
    return webhook, plugin, objects


def plugin_pod(objects: list[Obj]) -> Obj:
    pod: Obj = component(objects, "DaemonSet", "plugin")["spec"]["template"]["spec"]
    return pod


def agent_pod(objects: list[Obj]) -> Obj:
    pod: Obj = component(objects, "DaemonSet", "agent")["spec"]["template"]["spec"]
    return pod


@pytest.mark.parametrize("values", scenario_params())
def test_both_configs_load_through_the_real_models(values: Obj) -> None:
    webhook, plugin, _ = configs(values)
    assert webhook.version == "v1"
    assert plugin.version == "v1"


@pytest.mark.parametrize("values", scenario_params())
def test_resource_names_and_units_agree(values: Obj) -> None:
    webhook, plugin, _ = configs(values)
    advertised = [r.name for r in plugin.resources]
    assert webhook.resource_name == advertised[0]
    assert sorted(webhook.extra_resource_names) == sorted(advertised[1:])
    assert not set(webhook.fraction_resource_names) & set(advertised)
    assert webhook.units_per_gpu == plugin.units_per_gpu


def test_changed_shared_values_reach_both_components() -> None:
    values = {
        "resourceName": "example.com/vgpu",
        "unitsPerGpu": 20,
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "runtimeClass": {"name": "nvidia-legacy"},
    }
    webhook, plugin, objects = configs(values)
    assert webhook.resource_name == plugin.resources[0].name == "example.com/vgpu"
    assert webhook.units_per_gpu == plugin.units_per_gpu == 20
    assert [t.as_kubernetes() for t in webhook.tolerations] == values["tolerations"]
    assert webhook.runtime_class_name == "nvidia-legacy"
    assert plugin_pod(objects)["runtimeClassName"] == "nvidia-legacy"
    assert agent_pod(objects)["runtimeClassName"] == "nvidia-legacy"


@pytest.mark.parametrize("values", scenario_params())
def test_plugin_and_agent_tolerate_every_taint_the_webhook_lets_gpu_pods_onto(
    values: Obj,
) -> None:
    webhook, _, objects = configs(values)
    for name, pod in (("device plugin", plugin_pod(objects)), ("agent", agent_pod(objects))):
        for toleration in webhook.tolerations:
            assert toleration.as_kubernetes() in pod["tolerations"], (
                f"GPU pods tolerate {toleration.as_kubernetes()} but the {name} does not, "
                "so it would not run on the nodes they are sent to"
            )


def test_runtime_class_agrees_and_can_be_left_out() -> None:
    webhook, _, objects = configs({})
    assert webhook.runtime_class_name == plugin_pod(objects)["runtimeClassName"] == "nvidia"
    assert agent_pod(objects)["runtimeClassName"] == "nvidia"
    webhook, _, objects = configs({"runtimeClass": {"name": ""}})
    assert webhook.runtime_class_name is None
    assert "runtimeClassName" not in plugin_pod(objects)
    assert "runtimeClassName" not in agent_pod(objects)


def test_defaults_match_the_component_defaults() -> None:
    # The chart's defaults are the components' own, so a chart install and
    # `metagpu webhook`/`device-plugin` with no config behave the same.
    from plugin.api.config import PluginConfig
    from webhook.config import WebhookConfig

    webhook, plugin, _ = configs({})
    defaults_webhook, defaults_plugin = WebhookConfig(), PluginConfig()
    for field in (
        "resource_name",
        "extra_resource_names",
        "units_per_gpu",
        "fraction_resource_names",
        "convert_whole_gpus",
        "max_gpus_per_container",
        "tolerations",
        "runtime_class_name",
        "default_compute_policy",
        "visible_devices_policy",
        "deny_privileged",
        "void_non_gpu_containers",
    ):
        assert getattr(webhook, field) == getattr(defaults_webhook, field), field
    for field in (
        "units_per_gpu",
        "resources",
        "allocation_policy",
        "device_id_strategy",
        "device_list_strategy",
        "device_plugins_dir",
        "fail_on_init_error",
        "health",
    ):
        assert getattr(plugin, field) == getattr(defaults_plugin, field), field
    for field in (
        "socket_dir",
        "pod_resources_socket",
        "interval_s",
        "memory_enforcement",
        "kill_grace_s",
        "metrics_listen",
        "label_node",
        "install_mgctl",
    ):
        assert getattr(plugin.agent, field) == getattr(defaults_plugin.agent, field), field


# ------------------------------------------------------- paths in the pods
def _mount(pod: Obj, container_name: str, volume: str) -> Obj:
    mounts: list[Obj] = [
        m for m in container(pod, container_name)["volumeMounts"] if m["name"] == volume
    ]
    assert len(mounts) == 1, f"{container_name} does not mount {volume}"
    return mounts[0]


@pytest.mark.parametrize("values", scenario_params())
def test_config_paths_are_what_the_plugin_and_agent_pods_mount(values: Obj) -> None:
    _, plugin, objects = configs(values)
    plugin_spec, agent_spec = plugin_pod(objects), agent_pod(objects)
    plugin_volumes = {v["name"]: v for v in plugin_spec["volumes"]}
    agent_volumes = {v["name"]: v for v in agent_spec["volumes"]}

    # The kubelet's device-plugins dir, read-write for the plugin's socket.
    mount = _mount(plugin_spec, "device-plugin", "device-plugins")
    assert str(plugin.device_plugins_dir) == mount["mountPath"]
    assert not mount.get("readOnly")
    assert plugin_volumes["device-plugins"]["hostPath"]["path"] == (
        "/var/lib/kubelet/device-plugins"
    )
    # The agent socket dir: the plugin hands its *host* path to the kubelet (the
    # agent's socket_dir), so the agent must write it at that same path. The
    # plugin itself never opens it, so its pod does not mount it.
    socket_dir = str(plugin.agent.socket_dir)
    assert agent_volumes["agent-socket-dir"]["hostPath"] == {
        "path": socket_dir,
        "type": "DirectoryOrCreate",
    }
    assert _mount(agent_spec, "agent", "agent-socket-dir")["mountPath"] == socket_dir
    assert not _mount(agent_spec, "agent", "agent-socket-dir").get("readOnly")
    assert "agent-socket-dir" not in plugin_volumes
    # The kubelet's pod-resources socket: the agent reads allocations there, and the
    # plugin which GPUs another device plugin hands out; both read-only, same path.
    for spec, volumes, name in (
        (agent_spec, agent_volumes, "agent"),
        (plugin_spec, plugin_volumes, "device-plugin"),
    ):
        mount = _mount(spec, name, "pod-resources")
        assert str(plugin.agent.pod_resources_socket).startswith(mount["mountPath"] + "/")
        assert mount["readOnly"] is True
        assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    # The plugin's health board, in the kubelet's device-plugins directory: the
    # plugin writes it where the config says, the agent reads it from there.
    board_dir = str(plugin.device_plugins_dir)
    assert _mount(plugin_spec, "device-plugin", "device-plugins")["mountPath"] == board_dir
    assert _mount(agent_spec, "agent", "device-plugins")["mountPath"] == board_dir
    assert _mount(agent_spec, "agent", "device-plugins")["readOnly"] is True
    assert (
        agent_volumes["device-plugins"]["hostPath"]["path"]
        == plugin_volumes["device-plugins"]["hostPath"]["path"]
    )
    # Both read the one config file, from the one ConfigMap.
    for pod, volumes, name in (
        (plugin_spec, plugin_volumes, "device-plugin"),
        (agent_spec, agent_volumes, "agent"),
    ):
        config_path = flag(container(pod, name)["args"], "--config")
        assert config_path.startswith(_mount(pod, name, "config")["mountPath"] + "/")
        assert volumes["config"]["configMap"]["name"] == "metagpu-plugin-config"
        items = volumes["config"]["configMap"]["items"]
        assert {"key": "plugin.yaml", "path": config_path.rsplit("/", 1)[1]} in items
    # MPS: the pipe directory the plugin hands out exists on the host.
    if plugin.mps.enabled:
        assert plugin_volumes["mps-pipes"]["hostPath"]["path"] == str(plugin.mps.pipe_directory)
        assert _mount(plugin_spec, "device-plugin", "mps-pipes")["mountPath"] == str(
            plugin.mps.pipe_directory
        )
    else:
        assert "mps-pipes" not in plugin_volumes
    assert "mps-pipes" not in agent_volumes


def test_host_paths_follow_values_while_config_paths_stay() -> None:
    values = {
        "plugin": {"devicePluginsDir": "/var/lib/k0s/kubelet/device-plugins"},
        "agent": {
            "podResourcesDir": "/var/lib/k0s/kubelet/pod-resources",
            "socketDir": "/run/metagpu",
        },
    }
    _, plugin, objects = configs(values)
    plugin_volumes = {v["name"]: v for v in plugin_pod(objects)["volumes"]}
    agent_volumes = {v["name"]: v for v in agent_pod(objects)["volumes"]}
    assert plugin_volumes["device-plugins"]["hostPath"]["path"] == (
        "/var/lib/k0s/kubelet/device-plugins"
    )
    assert agent_volumes["pod-resources"]["hostPath"]["path"] == (
        "/var/lib/k0s/kubelet/pod-resources"
    )
    assert str(plugin.device_plugins_dir) == "/var/lib/kubelet/device-plugins"
    assert str(plugin.agent.pod_resources_socket) == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert str(plugin.agent.socket_dir) == "/run/metagpu"
    assert agent_volumes["agent-socket-dir"]["hostPath"]["path"] == "/run/metagpu"


def test_agent_metrics_port_is_the_container_port_and_the_service_port() -> None:
    from plugin.api.agent_config import DEFAULT_METRICS_LISTEN
    from plugin.api.settings import split_listen

    _, plugin, objects = configs({**EVERYTHING, "agent": {"metricsPort": 9500}})
    _, port = split_listen(plugin.agent.metrics_listen, example=DEFAULT_METRICS_LISTEN)
    agent = container(agent_pod(objects), "agent")
    assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in agent["ports"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert agent[probe]["httpGet"]["port"] == "metrics"
    service = next(
        o
        for o in objects
        if o["kind"] == "Service" and o["metadata"]["name"].endswith("agent-metrics")
    )
    assert service["spec"]["ports"][0]["port"] == port
    assert service["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize(
    ("host", "agent_listen", "webhook_listen"),
    [
        pytest.param(None, "0.0.0.0:9400", "0.0.0.0:8443", id="default-ipv4"),
        pytest.param("::", "[::]:9400", "[::]:8443", id="ipv6-only-cluster"),
        pytest.param("fd00::7", "[fd00::7]:9400", "[fd00::7]:8443", id="one-ipv6-address"),
    ],
)
def test_listen_hosts_reach_both_components(
    host: str | None, agent_listen: str, webhook_listen: str
) -> None:
    values: Obj = {}
    if host is not None:
        values = {"agent": {"metricsHost": host}, "webhook": {"listenHost": host}}
    webhook, plugin, objects = configs(values)
    assert plugin.agent.metrics_listen == agent_listen
    args = container(
        component(objects, "Deployment", "webhook")["spec"]["template"]["spec"], "webhook"
    )["args"]
    assert flag(args, "--listen") == webhook_listen
    # ...and the webhook's own model accepts what the chart passes on its command line.
    from webhook.config import WebhookConfig

    assert WebhookConfig(listen=webhook_listen).port == 8443
    assert webhook.version == "v1"


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"agent": {"metricsHost": "every-interface"}}, id="agent-name"),
        pytest.param({"webhook": {"listenHost": "[::]"}}, id="webhook-brackets"),
        pytest.param({"agent": {"extraConfig": {"metrics_listen": "[::]:9400"}}}, id="extra"),
    ],
)
def test_bad_listen_hosts_fail_the_install(values: Obj) -> None:
    message = template_error(values)
    assert "metricsHost" in message or "listenHost" in message or "metrics_listen" in message


def test_agent_node_name_comes_from_the_downward_api() -> None:
    from plugin.api.config import ENV_PREFIX

    objects = render()
    env = {e["name"]: e for e in container(agent_pod(objects), "agent")["env"]}
    # Once, under the config's own name (the agent also reads NODE_NAME, but two
    # sources of one setting would only invite them to disagree).
    assert env[f"{ENV_PREFIX}AGENT__NODE_NAME"]["valueFrom"]["fieldRef"] == {
        "fieldPath": "spec.nodeName"
    }
    assert "NODE_NAME" not in env
    # The device plugin's pod watch gets it the same way, under its own config name.
    plugin_env = {e["name"]: e for e in container(plugin_pod(objects), "device-plugin")["env"]}
    assert plugin_env[f"{ENV_PREFIX}PLACEMENT__NODE_NAME"]["valueFrom"]["fieldRef"] == {
        "fieldPath": "spec.nodeName"
    }
    assert not {"NODE_NAME", f"{ENV_PREFIX}AGENT__NODE_NAME"} & set(plugin_env)


def test_extra_resources_are_advertised_and_known_to_the_webhook() -> None:
    webhook, plugin, _ = configs(EVERYTHING)
    assert [(r.name, r.gpus) for r in plugin.resources] == [
        ("cnvrg.io/metagpu", [0, 1]),
        ("cnvrg.io/metagpu-a100", [2, 3]),
    ]
    assert webhook.extra_resource_names == ["cnvrg.io/metagpu-a100"]
