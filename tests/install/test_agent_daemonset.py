"""The node agent DaemonSet: the only pod on a GPU node with the host PID namespace.

It must run wherever the device plugin runs (the agent accounts for and
enforces the plugin's allocations, and serves the mgctl socket the plugin hands
out), with the agent container's privileges and nothing beside it.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.install.chart import (
    EVERYTHING,
    NAMESPACE,
    Obj,
    component,
    container,
    find,
    render,
    scenario_params,
)


def daemonsets(values: Obj | None = None) -> tuple[Obj, Obj]:
    """(plugin, agent) DaemonSets."""
    objects = render(values)
    return component(objects, "DaemonSet", "plugin"), component(objects, "DaemonSet", "agent")


def pod_of(daemonset: Obj) -> Obj:
    spec: Obj = daemonset["spec"]["template"]["spec"]
    return spec


def agent_pod(values: Obj | None = None) -> Obj:
    return pod_of(daemonsets(values)[1])


SCHEDULING = ("nodeSelector", "affinity", "tolerations", "runtimeClassName", "priorityClassName")


def scheduling(pod: Obj) -> dict[str, Any]:
    return {field: pod.get(field) for field in SCHEDULING}


@pytest.mark.parametrize("values", scenario_params())
def test_the_agent_pod_is_alone_in_the_host_pid_namespace(values: Obj) -> None:
    plugin, agent = daemonsets(values)
    spec = pod_of(agent)
    assert spec["hostPID"] is True
    assert [c["name"] for c in spec["containers"]] == ["agent"]
    assert "initContainers" not in spec
    assert "shareProcessNamespace" not in spec
    assert container(spec, "agent")["args"][0] == "agent"
    assert pod_of(plugin).get("hostPID") is not True
    for other in find(render(values), "Deployment"):
        assert pod_of(other).get("hostPID") is not True, other["metadata"]["name"]


@pytest.mark.parametrize("values", scenario_params())
def test_the_agent_runs_on_the_same_gpu_nodes_as_the_plugin(values: Obj) -> None:
    plugin, agent = daemonsets(values)
    expected = scheduling(pod_of(plugin))
    pool = (values.get("mps") or {}).get("nodeSelector")
    if pool:
        # MPS on one node pool: the plugin keeps off it (its -mps twin serves it);
        # the agent runs on both, so it has the plugin's scheduling without that.
        (key,) = pool
        terms = expected["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        for term in terms["nodeSelectorTerms"]:
            term["matchExpressions"] = [
                e for e in term["matchExpressions"] if e["key"] != key or e["operator"] != "NotIn"
            ]
    assert scheduling(pod_of(agent)) == expected
    assert agent["spec"]["updateStrategy"] == plugin["spec"]["updateStrategy"]
    assert agent["metadata"]["namespace"] == NAMESPACE


@pytest.mark.parametrize(
    "plugin_values",
    [
        pytest.param({"nodeSelector": {"accelerator": None, "gpu": "a100"}}, id="node-selector"),
        pytest.param(
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "pool", "operator": "In", "values": ["gpu"]}
                                    ]
                                }
                            ]
                        }
                    }
                }
            },
            id="affinity",
        ),
        pytest.param({"extraTolerations": [{"key": "gpu-only", "operator": "Exists"}]}, id="tol"),
        pytest.param({"priorityClassName": ""}, id="no-priority-class"),
        pytest.param({"priorityClassName": "gpu-critical"}, id="priority-class"),
        pytest.param({"updateStrategy": {"type": "OnDelete", "rollingUpdate": None}}, id="update"),
    ],
)
def test_the_agent_follows_the_plugins_scheduling_values(plugin_values: Obj) -> None:
    # Values written for the one-DaemonSet chart keep placing the agent with the plugin.
    plugin, agent = daemonsets({"plugin": plugin_values})
    assert scheduling(pod_of(agent)) == scheduling(pod_of(plugin))
    assert agent["spec"]["updateStrategy"] == plugin["spec"]["updateStrategy"]


OWNER_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {
                            "key": "nvidia.com/gpu.deploy.device-plugin",
                            "operator": "NotIn",
                            "values": ["true"],
                        }
                    ]
                }
            ]
        }
    }
}


def test_agent_values_override_the_plugins() -> None:
    affinity = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 1,
                    "preference": {
                        "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]
                    },
                }
            ]
        }
    }
    plugin, agent = daemonsets(
        {
            "agent": {
                "nodeSelector": {"gpu": "yes"},
                "affinity": affinity,
                "extraTolerations": [{"key": "agent-only", "operator": "Exists"}],
                "priorityClassName": "agent-critical",
                "updateStrategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxUnavailable": "25%"},
                },
            }
        }
    )
    spec, plugin_spec = pod_of(agent), pod_of(plugin)
    assert spec["nodeSelector"] == {"gpu": "yes"}
    assert spec["affinity"] == affinity
    assert spec["priorityClassName"] == "agent-critical"
    assert agent["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": "25%"}
    # Tolerations add to the plugin's: the agent still goes wherever the plugin goes.
    assert spec["tolerations"] == [
        *plugin_spec["tolerations"],
        {"key": "agent-only", "operator": "Exists"},
    ]
    # ... and none of it changes the plugin.
    assert plugin_spec["nodeSelector"] == {"accelerator": "nvidia"}
    assert plugin_spec["affinity"] == OWNER_AFFINITY  # plugin.layout owner, the default
    assert plugin_spec["priorityClassName"] == "system-node-critical"


def test_an_empty_agent_priority_class_means_none() -> None:
    plugin, agent = daemonsets({"agent": {"priorityClassName": ""}})
    assert "priorityClassName" not in pod_of(agent)
    assert pod_of(plugin)["priorityClassName"] == "system-node-critical"


@pytest.mark.parametrize("enforcement", ["off", "report", "kill"])
def test_the_agent_keeps_its_privileges_and_no_more(enforcement: str) -> None:
    spec = agent_pod({"agent": {"memoryEnforcement": enforcement}})
    security = container(spec, "agent")["securityContext"]
    assert security.get("privileged") is not True
    assert security["allowPrivilegeEscalation"] is False
    assert security["runAsUser"] == 0
    # mgctl kill works in every mode, and signalling another UID needs CAP_KILL.
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["KILL"]}
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["enableServiceLinks"] is False
    assert "hostNetwork" not in spec
    assert "hostIPC" not in spec
    # It calls the API server (pods, its Node, Events): it needs its token.
    assert spec.get("automountServiceAccountToken", True) is True


@pytest.mark.parametrize("ocp", [False, True])
def test_selinux_type_on_openshift(ocp: bool) -> None:
    spec = agent_pod({"ocp": ocp})
    if ocp:
        assert spec["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}
    else:
        assert "seLinuxOptions" not in spec["securityContext"]


def test_the_agent_sees_every_gpu_through_nvml_only() -> None:
    env = {e["name"]: e.get("value") for e in container(agent_pod(), "agent")["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert agent_pod()["runtimeClassName"] == "nvidia"


def test_host_paths() -> None:
    volumes = {v["name"]: v.get("hostPath") for v in agent_pod()["volumes"]}
    assert volumes == {
        "config": None,  # a ConfigMap
        "pod-resources": {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"},
        "agent-socket-dir": {"path": "/var/run/metagpu", "type": "DirectoryOrCreate"},
        # the device plugin's GPU health board (issue 15): read-only
        "device-plugins": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"},
    }
    mounts = {m["name"]: m for m in container(agent_pod(), "agent")["volumeMounts"]}
    assert mounts["pod-resources"]["readOnly"] is True
    assert mounts["device-plugins"]["readOnly"] is True
    assert mounts["config"]["readOnly"] is True
    assert not mounts["agent-socket-dir"].get("readOnly")


def test_probes_resources_and_metrics_port() -> None:
    agent = container(agent_pod(), "agent")
    assert agent["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert agent["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert agent["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert agent["resources"]["requests"]
    assert agent["resources"]["limits"]["memory"]


@pytest.mark.parametrize("read_only", [False, True])
def test_read_only_root_filesystem_follows_the_plugin_value(read_only: bool) -> None:
    spec = agent_pod({"plugin": {"readOnlyRootFilesystem": read_only}})
    assert container(spec, "agent")["securityContext"]["readOnlyRootFilesystem"] is read_only


@pytest.mark.parametrize("values", scenario_params())
def test_both_pod_templates_roll_on_a_config_change(values: Obj) -> None:
    def checksums(extra: Obj) -> tuple[str, str]:
        plugin, agent = daemonsets({**values, **extra})
        return (
            plugin["spec"]["template"]["metadata"]["annotations"]["checksum/config"],
            agent["spec"]["template"]["metadata"]["annotations"]["checksum/config"],
        )

    base = checksums({})
    assert base[0] == base[1], "both DaemonSets read the one config file"
    changed = checksums({"unitsPerGpu": 50})
    assert changed[0] != base[0]
    assert changed[1] != base[1]


# ----------------------------------------------------------- metrics
def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


@pytest.mark.parametrize("values", [EVERYTHING, {**EVERYTHING, "agent": {"podLabels": {"x": "y"}}}])
def test_the_metrics_service_selects_the_agent_pods_only(values: Obj) -> None:
    objects = render(values)
    service = next(
        s for s in find(objects, "Service") if s["metadata"]["name"].endswith("-agent-metrics")
    )
    assert service["metadata"]["labels"]["app.kubernetes.io/component"] == "agent"
    selector = service["spec"]["selector"]
    agent = component(objects, "DaemonSet", "agent")
    plugin = component(objects, "DaemonSet", "plugin")
    assert _matches(selector, agent["spec"]["template"]["metadata"]["labels"])
    assert not _matches(selector, plugin["spec"]["template"]["metadata"]["labels"])
    for workload in find(objects, "Deployment"):
        assert not _matches(selector, workload["spec"]["template"]["metadata"]["labels"])
    # The port it targets is the agent container's.
    ports = {p["name"] for p in container(pod_of(agent), "agent")["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] in ports
    monitor = next(
        m for m in find(objects, "ServiceMonitor") if m["metadata"]["name"].endswith("-agent")
    )
    assert _matches(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert monitor["metadata"]["labels"]["app.kubernetes.io/component"] == "agent"


def test_the_daemonset_selectors_do_not_overlap() -> None:
    plugin, agent = daemonsets(EVERYTHING)
    plugin_selector = plugin["spec"]["selector"]["matchLabels"]
    agent_selector = agent["spec"]["selector"]["matchLabels"]
    assert _matches(plugin_selector, plugin["spec"]["template"]["metadata"]["labels"])
    assert _matches(agent_selector, agent["spec"]["template"]["metadata"]["labels"])
    assert not _matches(plugin_selector, agent["spec"]["template"]["metadata"]["labels"])
    assert not _matches(agent_selector, plugin["spec"]["template"]["metadata"]["labels"])
