"""The device plugin DaemonSet: where it runs, what it mounts, and which privileges it has.

It holds the device plugin (and, with MPS, the MPS control daemon) and nothing
else: the agent has its own DaemonSet (test_agent_daemonset.py), because the
host PID namespace it needs is pod-wide.
"""

from __future__ import annotations

import pytest
import yaml

from plugin.api.config import PluginConfig
from tests.install.chart import (
    Mode,
    Obj,
    component,
    container,
    find,
    mode_params,
    one,
    render,
    scenario_params,
    template_error,
)


def daemonset(values: Obj | None = None) -> Obj:
    return component(render(values), "DaemonSet", "plugin")


def pod(values: Obj | None = None) -> Obj:
    spec: Obj = daemonset(values)["spec"]["template"]["spec"]
    return spec


def test_runs_on_labelled_gpu_nodes_despite_their_taints() -> None:
    spec = pod()
    assert spec["nodeSelector"] == {"accelerator": "nvidia"}
    tolerations = spec["tolerations"]
    assert {
        "key": "cnvrg.io/metagpu",
        "operator": "Equal",
        "value": "present",
        "effect": "NoSchedule",
    } in tolerations
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in tolerations
    assert len(tolerations) == len({str(sorted(t.items())) for t in tolerations}), "duplicates"


def test_scheduling_values() -> None:
    ds = daemonset()
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    spec = ds["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["enableServiceLinks"] is False
    assert "hostNetwork" not in spec
    assert "hostIPC" not in spec
    # Helm merges maps with the defaults; null removes a default key.
    custom = pod(
        {"plugin": {"nodeSelector": {"accelerator": None, "gpu": "a100"}, "priorityClassName": ""}}
    )
    assert custom["nodeSelector"] == {"gpu": "a100"}
    assert "priorityClassName" not in custom


@pytest.mark.parametrize("values", scenario_params())
def test_the_plugin_pod_has_no_host_pid_namespace_and_no_agent(values: Obj) -> None:
    # hostPID is pod-wide: the device plugin and the MPS control daemon would see
    # (and as root could signal) every process on the node. Only the agent needs it,
    # and it runs in its own DaemonSet.
    spec = pod(values)
    assert spec.get("hostPID") is not True
    assert "shareProcessNamespace" not in spec
    names = [c["name"] for c in spec["containers"]]
    assert "agent" not in names
    assert not [c for c in spec["containers"] if c.get("args", [None])[0] == "agent"]
    assert set(names) <= {"device-plugin", "mps-control-daemon"}
    volumes = {v["name"] for v in spec["volumes"]}
    assert "agent-socket-dir" not in volumes, "the agent's mount"
    # The kubelet's PodResources socket, read-only: which GPUs other plugins hand out.
    (mount,) = [
        m for m in container(spec, "device-plugin")["volumeMounts"] if m["name"] == "pod-resources"
    ]
    assert mount["readOnly"] is True


@pytest.mark.parametrize("values", scenario_params())
def test_the_plugin_pod_gets_no_automounted_service_account_token(values: Obj) -> None:
    # Only the device-plugin container's pod watch calls the API server, with a
    # token projected into that container alone (tests/install/test_rbac.py); the
    # pod and its ServiceAccount automount nothing, and no kubeconfig is handed in.
    objects = render(values)
    spec = component(objects, "DaemonSet", "plugin")["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    account = one(objects, "ServiceAccount", spec["serviceAccountName"])
    assert account["automountServiceAccountToken"] is False
    for c in spec["containers"]:
        names = {e["name"] for e in c.get("env", [])}
        assert not {"KUBECONFIG", "NODE_NAME"} & names, c["name"]


def test_containers_see_every_gpu_through_nvml_only() -> None:
    env = {e["name"]: e.get("value") for e in container(pod(), "device-plugin")["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def test_host_paths() -> None:
    volumes = {v["name"]: v.get("hostPath") for v in pod()["volumes"]}
    assert volumes == {
        "config": None,  # a ConfigMap
        "device-plugins": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"},
        "api-token": None,  # projected: the pod watch's ServiceAccount token
        "pod-resources": {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"},
    }


@pytest.mark.parametrize("enforcement", ["off", "report", "kill"])
def test_privileges_are_the_minimum_for_each_container(enforcement: str) -> None:
    spec = pod({"agent": {"memoryEnforcement": enforcement}, "mps": {"enabled": True}})
    for c in spec["containers"]:
        security = c["securityContext"]
        assert security.get("privileged") is not True, c["name"]
        assert security["allowPrivilegeEscalation"] is False, c["name"]
        assert security["capabilities"] == {"drop": ["ALL"]}, c["name"]
        assert security["runAsUser"] == 0, f"{c['name']} writes root-owned kubelet directories"
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


@pytest.mark.parametrize("mode", mode_params())
def test_mps_adds_the_pipe_directory_and_control_daemon(mode: Mode) -> None:
    spec = pod(mode.values())
    names = [c["name"] for c in spec["containers"]]
    volumes = {v["name"]: v for v in spec["volumes"]}
    if mode.mps:
        assert names == ["device-plugin", "mps-control-daemon"]
        assert volumes["mps-pipes"]["hostPath"] == {
            "path": "/var/run/metagpu-mps",
            "type": "DirectoryOrCreate",
        }
        daemon = container(spec, "mps-control-daemon")
        assert daemon["command"] == ["nvidia-cuda-mps-control"]
        assert daemon["args"] == ["-f"]
        env = {e["name"]: e["value"] for e in daemon["env"]}
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/var/run/metagpu-mps"
        assert "compute" in env["NVIDIA_DRIVER_CAPABILITIES"]
        assert {"name": "mps-pipes", "mountPath": "/var/run/metagpu-mps"} in daemon["volumeMounts"]
    else:
        assert names == ["device-plugin"]
        assert "mps-pipes" not in volumes
    if mode.ocp:
        assert spec["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}
    else:
        assert "seLinuxOptions" not in spec["securityContext"]


def test_mps_without_the_chart_daemon() -> None:
    spec = pod({"mps": {"enabled": True, "controlDaemon": {"enabled": False}}})
    assert [c["name"] for c in spec["containers"]] == ["device-plugin"]
    assert any(v["name"] == "mps-pipes" for v in spec["volumes"])


def test_runtime_class_is_created_only_on_request() -> None:
    assert not find(render(), "RuntimeClass")
    runtime_class = one(
        render({"runtimeClass": {"create": True, "handler": "nvidia-cdi"}}), "RuntimeClass"
    )
    assert runtime_class["metadata"]["name"] == "nvidia"
    assert runtime_class["handler"] == "nvidia-cdi"
    assert runtime_class["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


@pytest.mark.parametrize("read_only", [False, True])
def test_read_only_root_filesystem_is_a_choice(read_only: bool) -> None:
    spec = pod({"plugin": {"readOnlyRootFilesystem": read_only}, "mps": {"enabled": True}})
    for c in spec["containers"]:
        assert c["securityContext"]["readOnlyRootFilesystem"] is read_only, c["name"]


def test_resources_are_set_for_every_container() -> None:
    for c in pod({"mps": {"enabled": True}})["containers"]:
        assert c["resources"]["requests"], c["name"]
        assert c["resources"]["limits"]["memory"], c["name"]


def test_pod_annotations_and_labels_are_the_plugins_own() -> None:
    objects = render(
        {
            "plugin": {"podAnnotations": {"a": "plugin"}, "podLabels": {"l": "plugin"}},
            "agent": {"podAnnotations": {"b": "agent"}, "podLabels": {"m": "agent"}},
        }
    )
    plugin = component(objects, "DaemonSet", "plugin")["spec"]["template"]["metadata"]
    agent = component(objects, "DaemonSet", "agent")["spec"]["template"]["metadata"]
    assert plugin["annotations"]["a"] == "plugin"
    assert plugin["labels"]["l"] == "plugin"
    assert "b" not in plugin["annotations"]
    assert "m" not in plugin["labels"]
    assert agent["annotations"]["b"] == "agent"
    assert agent["labels"]["m"] == "agent"
    assert "a" not in agent["annotations"]
    assert "l" not in agent["labels"]


# ------------------------------------------------- supervised MPS (issue 28)
def plugin_config(objects: list[Obj], key: str = "plugin.yaml") -> Obj:
    configmap = next(
        o
        for o in find(objects, "ConfigMap")
        if key in o.get("data", {}) and o["metadata"]["name"].endswith("plugin-config")
    )
    config: Obj = yaml.safe_load(configmap["data"][key])
    return config


def webhook_config(objects: list[Obj]) -> Obj:
    configmap = next(o for o in find(objects, "ConfigMap") if "webhook.yaml" in o.get("data", {}))
    config: Obj = yaml.safe_load(configmap["data"]["webhook.yaml"])
    return config


def test_the_supervised_daemon_replaces_the_sidecar() -> None:
    values = {"mps": {"enabled": True, "supervise": True}}
    objects = render(values)
    spec = component(objects, "DaemonSet", "plugin")["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["device-plugin"]  # no unsupervised sidecar
    plugin = container(spec, "device-plugin")
    env = {e["name"]: e.get("value") for e in plugin["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"  # nvidia-cuda-mps-control
    assert plugin["securityContext"]["privileged"] is True  # the compute mode
    assert "allowPrivilegeEscalation" not in plugin["securityContext"]
    mounts = {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}
    assert mounts["mps-pipes"] == "/var/run/metagpu-mps"
    assert mounts["mps-shm"] == "/dev/shm"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["mps-shm"]["hostPath"] == {
        "path": "/var/run/metagpu-mps-shm",
        "type": "DirectoryOrCreate",
    }
    mps = PluginConfig.model_validate(plugin_config(objects)).mps
    assert (mps.enabled, mps.supervise) == (True, True)
    assert str(mps.shm_directory) == "/var/run/metagpu-mps-shm"
    assert str(mps.pipe_directory) == "/var/run/metagpu-mps"
    # the webhook keeps every metagpu pod off the daemon's directories
    assert webhook_config(objects)["mps_host_directories"] == [
        "/tmp/nvidia-mps",
        "/var/run/metagpu-mps",
        "/var/run/metagpu-mps-shm",
    ]


def test_without_privilege_the_plugin_container_drops_every_capability() -> None:
    spec = pod({"mps": {"enabled": True, "supervise": True, "privileged": False}})
    context = container(spec, "device-plugin")["securityContext"]
    assert "privileged" not in context
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}


def test_the_webhook_denies_the_charts_own_pipe_directory() -> None:
    objects = render({"mps": {"pipeDirectory": "/srv/mps"}})
    assert webhook_config(objects)["mps_host_directories"] == ["/tmp/nvidia-mps", "/srv/mps"]


def test_mps_on_one_node_pool_is_a_second_daemonset() -> None:
    values = {
        "mps": {"enabled": True, "supervise": True, "nodeSelector": {"metagpu.io/mps": "true"}}
    }
    objects = render(values)
    plain = component(objects, "DaemonSet", "plugin")
    pool = component(objects, "DaemonSet", "plugin-mps")
    assert pool["metadata"]["name"] == plain["metadata"]["name"] + "-mps"
    # distinct selectors: neither DaemonSet adopts the other's pods
    assert plain["spec"]["selector"] != pool["spec"]["selector"]
    plain_spec, pool_spec = plain["spec"]["template"]["spec"], pool["spec"]["template"]["spec"]
    assert pool_spec["nodeSelector"] == {"accelerator": "nvidia", "metagpu.io/mps": "true"}
    assert plain_spec["nodeSelector"] == {"accelerator": "nvidia"}
    avoid = {"key": "metagpu.io/mps", "operator": "NotIn", "values": ["true"]}
    terms = plain_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert all(avoid in t["matchExpressions"] for t in terms["nodeSelectorTerms"])
    assert "metagpu.io/mps" not in str(pool_spec.get("affinity"))

    # each reads its own config under the same path
    def config_key(spec: Obj) -> str:
        (volume,) = [v for v in spec["volumes"] if v["name"] == "config"]
        key: str = volume["configMap"]["items"][0]["key"]
        assert volume["configMap"]["items"][0]["path"] == "plugin.yaml"
        return key

    assert (config_key(plain_spec), config_key(pool_spec)) == ("plugin.yaml", "plugin-mps.yaml")
    assert PluginConfig.model_validate(plugin_config(objects)).mps.enabled is False
    pool_mps = PluginConfig.model_validate(plugin_config(objects, "plugin-mps.yaml")).mps
    assert (pool_mps.enabled, pool_mps.supervise) == (True, True)
    assert "mps-pipes" not in {v["name"] for v in plain_spec["volumes"]}
    # the agent runs on both pools: it reads whichever plugin's board is on its node
    agent = component(objects, "DaemonSet", "agent")["spec"]["template"]["spec"]
    assert agent["nodeSelector"] == {"accelerator": "nvidia"}
    assert "metagpu.io/mps" not in str(agent.get("affinity"))


@pytest.mark.parametrize(
    ("values", "error"),
    [
        pytest.param({"mps": {"supervise": True}}, "enabled", id="supervise-needs-enabled"),
        pytest.param(
            {"mps": {"enabled": True, "nodeSelector": {"a": "1", "b": "2"}}},
            "nodeSelector",
            id="one-label-per-pool",
        ),
    ],
)
def test_the_schema_refuses_mps_values_that_cannot_work(values: Obj, error: str) -> None:
    assert error in template_error(values)
