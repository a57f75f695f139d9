"""The chart's DRA mode (issue 29, item 2): the DRA plugin on one node pool, the device
plugin off it (the agent on both), the DeviceClass as captured, the webhook's mode and the
claim-template controller's RBAC, and the values that would let a node or a pod get
both modes refused.

The webhook admits a pod before the pod has a node, so its mode is one for the cluster
(``webhook.mode``); the plugins are chosen per node pool (``dra.nodeSelector``). No
node runs both plugins, so a GPU has one owner, and a pod holds either units (only
device-plugin nodes advertise them) or a claim (only DRA nodes publish slices).
"""

from __future__ import annotations

import copy
import json
from typing import Any, Final

import kubernetes_validate
import pytest

from plugin.dra.config import DraConfig
from tests.install.cel import compile_condition, evaluate
from tests.install.chart import (
    CHART_DIR,
    DRA_NODES_ONLY,
    DRA_POOL,
    RELEASE,
    REPO_ROOT,
    Obj,
    component,
    config_file,
    container,
    find,
    flag,
    helm,
    load_rendered_config,
    one,
    render,
    template_error,
)
from tests.install.test_rbac import assert_exactly, grants, pod_spec
from webhook.config import WebhookConfig

DRA_LABEL: Final = ("metagpu.io/dra", "true")
FIXTURES: Final = REPO_ROOT / "tests" / "fixtures" / "dra"


def _required_terms(pod: Obj) -> list[Obj]:
    affinity = pod.get("affinity", {}).get("nodeAffinity", {})
    terms: list[Obj] = affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get(
        "nodeSelectorTerms", []
    )
    return terms


def _schedulable(pod: Obj, labels: dict[str, str]) -> bool:
    """Whether a node with ``labels`` passes the pod's nodeSelector and required affinity
    (In / NotIn / Exists, the operators the chart writes)."""
    if any(labels.get(k) != v for k, v in pod.get("nodeSelector", {}).items()):
        return False
    terms = _required_terms(pod)
    if not terms:
        return True

    def holds(expression: Obj) -> bool:
        value = labels.get(expression["key"])
        operator = expression["operator"]
        if operator == "In":
            return value in expression["values"]
        if operator == "NotIn":
            return value not in expression["values"]
        if operator == "Exists":
            return value is not None
        raise AssertionError(f"operator {operator} not modelled")

    return any(all(holds(e) for e in t.get("matchExpressions", [])) for t in terms)


GPU_NODES: Final = {
    "device-plugin node": {"accelerator": "nvidia"},
    "MPS node": {"accelerator": "nvidia", "metagpu.io/mps": "true"},
    "DRA node": {"accelerator": "nvidia", "metagpu.io/dra": "true"},
    "GPU Operator node": {"accelerator": "nvidia", "nvidia.com/gpu.deploy.device-plugin": "true"},
}


@pytest.mark.parametrize("values", [DRA_POOL, DRA_NODES_ONLY], ids=["dra-mode", "dra-nodes-only"])
def test_every_gpu_node_runs_exactly_one_plugin_and_the_agent(values: Obj) -> None:
    objects = render(values)
    daemonsets = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in find(objects, "DaemonSet")
    }
    plugins = {k: pod_spec(d) for k, d in daemonsets.items() if k != "agent"}
    assert "dra-plugin" in plugins
    for node, labels in GPU_NODES.items():
        running = sorted(k for k, pod in plugins.items() if _schedulable(pod, labels))
        if node == "GPU Operator node":
            assert running == [], node  # NVIDIA's plugin owns it (plugin.layout owner)
            continue
        assert len(running) == 1, f"{node}: {running}"
        assert (running == ["dra-plugin"]) is (node == "DRA node"), f"{node}: {running}"
        # The agent accounts units and claims alike: every node of either plugin has one.
        assert _schedulable(pod_spec(daemonsets["agent"]), labels), node


def test_the_agents_own_affinity_is_not_narrowed_to_the_device_plugin_pool() -> None:
    own = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    }
    objects = render({**DRA_POOL, "agent": {"affinity": own}})
    agent = pod_spec(component(objects, "DaemonSet", "agent"))
    assert _schedulable(agent, {"accelerator": "nvidia", "zone": "a"})
    assert _schedulable(agent, {"accelerator": "nvidia", "zone": "a", DRA_LABEL[0]: "true"})
    assert not _schedulable(agent, {"accelerator": "nvidia", "zone": "b", DRA_LABEL[0]: "true"})


def test_the_dra_plugin_pod_serves_the_kubelet_dirs_at_their_host_paths() -> None:
    objects = render(DRA_POOL)
    daemonset = component(objects, "DaemonSet", "dra-plugin")
    pod = pod_spec(daemonset)
    main = container(pod, "dra-plugin")
    assert main["args"][0] == "dra-plugin"
    config_path = flag(main["args"], "--config")
    assert config_path == "/etc/metagpu/config/dra-plugin.yaml"
    config = load_rendered_config(
        objects, "metagpu-dra-plugin-config", "dra-plugin.yaml", DraConfig
    )
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
    for name, configured in (
        ("plugins", config.plugins_dir),
        ("plugins-registry", config.registry_dir),
        ("cdi", config.cdi_dir),
    ):
        # The plugin reports its socket path to the kubelet, which dials it on the host.
        assert mounts[name] == host_paths[name] == str(configured), name
    assert config.driver_name == "gpu.metagpu.io"
    assert config.units_per_gpu == 100
    env = {e["name"]: e for e in main["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"accelerator": "nvidia", "metagpu.io/dra": "true"}
    annotations = daemonset["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/config"]


def test_shares_mount_the_socket_the_agent_on_their_node_serves() -> None:
    """mgctl in a DRA container reaches the agent: the DRA plugin's CDI specs mount the
    agent's socket directory, wherever agent.socketDir puts it."""
    from plugin.api.agent_config import AgentConfig

    for values in (DRA_POOL, {**DRA_POOL, "agent": {"socketDir": "/run/mg"}}):
        objects = render(values)
        config = load_rendered_config(
            objects, "metagpu-dra-plugin-config", "dra-plugin.yaml", DraConfig
        )
        agent = pod_spec(component(objects, "DaemonSet", "agent"))
        host_paths = {v["hostPath"]["path"] for v in agent["volumes"] if "hostPath" in v}
        assert str(config.agent_socket_dir) in host_paths
        assert str(config.agent_socket_dir) == values.get("agent", {}).get(
            "socketDir", str(AgentConfig().socket_dir)
        )


def test_the_webhook_sizes_claims_by_the_plugins_memory_policy() -> None:
    values = copy.deepcopy(DRA_POOL)
    values["dra"].update({"memoryStepMiB": 512, "memoryMinMiB": 2048})
    objects = render(values)
    plugin = load_rendered_config(
        objects, "metagpu-dra-plugin-config", "dra-plugin.yaml", DraConfig
    )
    webhook = load_rendered_config(objects, "metagpu-webhook-config", "webhook.yaml", WebhookConfig)
    assert webhook.mode == "dra"
    assert webhook.dra.device_class_name == plugin.driver_name
    assert webhook.dra.gpu_memory_mib == 81559
    assert webhook.dra.memory_step_mib == plugin.memory.step_mib == 512
    assert webhook.dra.memory_min_mib == plugin.memory.min_mib == 2048
    assert webhook.dra.controller is True
    assert webhook.dra.lease_name == "metagpu-claim-templates"
    assert webhook.units_per_gpu == plugin.units_per_gpu


def test_simulated_gpus_reach_the_dra_plugin() -> None:
    objects = render({**DRA_POOL, "plugin": {"simulatedGpus": {"enabled": True}}})
    config = config_file(objects, "metagpu-dra-plugin-config", "dra-plugin.yaml")
    assert config["gpus_file"] == "/etc/metagpu/config/simulated-gpus.yaml"
    assert "simulated-gpus.yaml" in one(objects, "ConfigMap", "metagpu-dra-plugin-config")["data"]
    assert "runtimeClassName" not in pod_spec(component(objects, "DaemonSet", "dra-plugin"))


def test_the_device_class_is_the_captured_one() -> None:
    captured = json.loads((FIXTURES / "deviceclass-gpu-accepted.json").read_text())
    sent = captured["request"]["body"]
    rendered = one(render(DRA_NODES_ONLY), "DeviceClass")
    assert rendered["metadata"]["name"] == sent["metadata"]["name"]
    assert rendered["spec"] == sent["spec"]


def test_the_dra_plugin_rbac_is_exactly_its_permissions() -> None:
    from plugin.dra.permissions import PERMISSIONS

    objects = render(DRA_POOL)
    account = pod_spec(component(objects, "DaemonSet", "dra-plugin"))["serviceAccountName"]
    assert_exactly(grants(objects, account), PERMISSIONS, who="DRA plugin")
    others = {pod_spec(d)["serviceAccountName"] for d in find(objects, "DaemonSet")} - {account}
    assert account not in others


@pytest.mark.parametrize("values", [DRA_POOL, DRA_NODES_ONLY], ids=["dra-mode", "dra-nodes-only"])
def test_dra_mode_objects_pass_kubernetes_1_36(values: Obj) -> None:
    for obj in render(values):
        if obj["apiVersion"].startswith(("cert-manager.io", "monitoring.coreos.com")):
            continue
        kubernetes_validate.validate(obj, "1.36", strict=True)


def test_the_controller_rbac_comes_only_with_the_dra_webhook() -> None:
    def controller_grants(values: Obj) -> set[tuple[str, str, str]]:
        return {
            (g.group, g.resource, g.verb)
            for g in grants(render(values), "metagpu-webhook")
            if g.resource in ("pods", "resourceclaimtemplates")
            or "metagpu-claim-templates" in g.resource_names
        }

    assert controller_grants({}) == set()
    assert controller_grants(DRA_NODES_ONLY) == set()
    assert controller_grants(DRA_POOL) == {
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("resource.k8s.io", "resourceclaimtemplates", "list"),
        ("resource.k8s.io", "resourceclaimtemplates", "watch"),
        ("resource.k8s.io", "resourceclaimtemplates", "create"),
        ("resource.k8s.io", "resourceclaimtemplates", "delete"),
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "update"),
    }


def test_nothing_of_dra_mode_is_rendered_by_default() -> None:
    objects = render()
    assert not find(objects, "DeviceClass")
    assert not [
        o
        for o in objects
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "dra-plugin"
    ]
    webhook = config_file(objects, "metagpu-webhook-config", "webhook.yaml")
    assert "mode" not in webhook
    assert "dra" not in webhook


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param(
            {"dra": {"enabled": True}}, "dra.enabled needs dra.nodeSelector", id="no-pool-label"
        ),
        pytest.param(
            {"webhook": {"mode": "dra"}, "dra": {"gpuMemoryMiB": 81920}},
            "webhook.mode is dra but dra.enabled is false",
            id="claims-no-node-serves",
        ),
        pytest.param(
            {**DRA_NODES_ONLY, "webhook": {"mode": "dra"}},
            "webhook.mode dra needs dra.gpuMemoryMiB",
            id="no-gpu-memory",
        ),
        pytest.param(
            {
                **DRA_NODES_ONLY,
                "mps": {"enabled": True, "nodeSelector": {"metagpu.io/dra": "true"}},
            },
            "mps.nodeSelector and dra.nodeSelector are the same label",
            id="one-label-two-pools",
        ),
        pytest.param(
            {"dra": {"enabled": True, "nodeSelector": {"a": "1", "b": "2"}}},
            "dra/nodeSelector",
            id="two-labels",
        ),
        pytest.param(
            {**DRA_NODES_ONLY, "dra": {**DRA_NODES_ONLY["dra"], "extraConfig": {"cdi_dir": "/x"}}},
            "dra.extraConfig.cdi_dir: this key is rendered from a chart value",
            id="extra-config-twice",
        ),
    ],
)
def test_contradictory_values_are_refused(values: Obj, expected: str) -> None:
    assert expected in template_error(values)


def test_dra_mode_on_a_cluster_without_resource_k8s_io_v1_is_refused() -> None:
    result = helm(
        "template", RELEASE, str(CHART_DIR), "--kube-version", "1.33.4", values=DRA_NODES_ONLY
    )
    assert result.returncode != 0
    assert "dra.enabled needs Kubernetes 1.34 or newer" in result.stderr
    assert "v1.33.4" in result.stderr
    ok = helm("template", RELEASE, str(CHART_DIR), "--kube-version", "1.34.0", values=DRA_POOL)
    assert ok.returncode == 0, ok.stderr


# ------------------------------------------------------------ matchConditions
def _pods_condition(values: Obj) -> tuple[Any, str]:
    configuration = one(render(values), "MutatingWebhookConfiguration")
    hook = next(h for h in configuration["webhooks"] if h["name"] == "pods.metagpu.io")
    expression: str = hook["matchConditions"][0]["expression"]
    return compile_condition(expression), expression


def _pod_request(resources: Obj, *, operation: str, stored: Obj | None = None) -> dict[str, Any]:
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {"containers": [{"name": "main", "image": "cuda", "resources": resources}]},
    }
    if stored is not None:
        pod["spec"]["resourceClaims"] = [
            {"name": "gpu-main", "resourceClaimTemplateName": "metagpu-50u-40gi"}
        ]
    return {
        "uid": "0",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team-a",
        "operation": operation,
        "userInfo": {"username": "alice"},
        "object": pod,
        "oldObject": stored,
        "dryRun": False,
    }


STORED_DRA_POD: Final[Obj] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "team-a"},
    "spec": {
        "containers": [
            {"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu-main"}]}}
        ],
        "resourceClaims": [{"name": "gpu-main", "resourceClaimTemplateName": "metagpu-50u-40gi"}],
    },
}


@pytest.mark.parametrize(
    ("resources", "operation", "expected"),
    [
        pytest.param(
            {"claims": [{"name": "gpu-main"}], "limits": {"nvidia.com/gpu": "500m"}},
            "UPDATE",
            True,
            id="reapplied-dra-pod",
        ),
        pytest.param(
            {"claims": [{"name": "gpu-main"}], "limits": {"metagpu.io/gpu-memory": "10Gi"}},
            "UPDATE",
            True,
            id="reapplied-memory-only",
        ),
        pytest.param({"claims": [{"name": "gpu-main"}]}, "UPDATE", False, id="label-update"),
        pytest.param(
            {"limits": {"metagpu.io/gpu-memory": "10Gi"}}, "CREATE", True, id="memory-only"
        ),
        pytest.param({"limits": {"nvidia.com/gpu": "500m"}}, "CREATE", True, id="fraction"),
    ],
)
def test_dra_pods_reach_the_webhook_when_it_acts_on_them(
    resources: Obj, operation: str, expected: bool
) -> None:
    program, expression = _pods_condition(DRA_POOL)
    stored = copy.deepcopy(STORED_DRA_POD) if operation == "UPDATE" else None
    request = _pod_request(resources, operation=operation, stored=stored)
    assert evaluate(program, request, expression=expression) is expected


def test_in_units_mode_a_pod_holding_a_claim_is_not_sent_on_update() -> None:
    # Without the DRA webhook, a claim is the user's own: a re-apply is not ours.
    program, expression = _pods_condition(DRA_NODES_ONLY)
    resources = {"claims": [{"name": "gpu-main"}], "limits": {"nvidia.com/gpu": "500m"}}
    request = _pod_request(resources, operation="UPDATE", stored=copy.deepcopy(STORED_DRA_POD))
    assert evaluate(program, request, expression=expression) is False


def test_missing_fields_of_a_reapplied_dra_pod_never_cause_an_evaluation_error() -> None:
    from tests.install.cel import MatchConditionError
    from tests.install.test_match_conditions import _field_paths, _strip

    program, expression = _pods_condition(DRA_POOL)
    resources = {"claims": [{"name": "gpu-main"}], "limits": {"nvidia.com/gpu": "500m"}}
    full = _pod_request(resources, operation="UPDATE", stored=copy.deepcopy(STORED_DRA_POD))
    for path in _field_paths(full["object"]):
        request = {**full, "object": _strip(full["object"], path)}
        try:
            evaluate(program, request, expression=expression)
        except MatchConditionError as exc:
            pytest.fail(f"removing {'.'.join(path)} makes the condition error: {exc}")


# ------------------------------------------------------------------ MPS for DRA shares
DRA_SUPERVISED_MPS: Final[Obj] = {
    "dra": {"enabled": True, "nodeSelector": {"metagpu.io/dra": "true"}},
    "mps": {"enabled": True, "supervise": True},
}
"""MPS on every GPU node, the DRA pool included: the DRA plugin runs the daemon itself."""


def _dra_pod(objects: list[Obj]) -> tuple[Obj, Obj]:
    pod = pod_spec(component(objects, "DaemonSet", "dra-plugin"))
    return pod, container(pod, "dra-plugin")


def test_the_supervised_dra_plugin_gets_what_the_device_plugin_gets_for_mps() -> None:
    objects = render(DRA_SUPERVISED_MPS)
    pod, main = _dra_pod(objects)
    device_pod = pod_spec(component(objects, "DaemonSet", "plugin"))
    device = container(device_pod, "device-plugin")
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"  # nvidia-cuda-mps-control
    assert main["securityContext"] == device["securityContext"]  # privileged: the compute mode
    assert main["securityContext"]["privileged"] is True
    mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
    assert mounts["mps-pipes"] == "/var/run/metagpu-mps"
    assert mounts["mps-shm"] == "/dev/shm"
    volumes = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    device_volumes = {v["name"]: v["hostPath"] for v in device_pod["volumes"] if "hostPath" in v}
    for name in ("mps-pipes", "mps-shm"):
        assert volumes[name] == device_volumes[name], name
    # the config is the device plugin's mps section, read by the same model
    mps = load_rendered_config(
        objects, "metagpu-dra-plugin-config", "dra-plugin.yaml", DraConfig
    ).mps
    device_mps = config_file(objects, "metagpu-plugin-config", "plugin.yaml")["mps"]
    assert mps.model_dump(mode="json", exclude_unset=True) == device_mps
    assert (mps.enabled, mps.supervise) == (True, True)
    assert str(mps.pipe_directory) == volumes["mps-pipes"]["path"]
    assert str(mps.shm_directory) == volumes["mps-shm"]["path"]


def test_unsupervised_mps_gives_the_dra_plugin_the_pipe_directory_only() -> None:
    objects = render({**DRA_SUPERVISED_MPS, "mps": {"enabled": True}})
    pod, main = _dra_pod(objects)
    mps = load_rendered_config(
        objects, "metagpu-dra-plugin-config", "dra-plugin.yaml", DraConfig
    ).mps
    assert (mps.enabled, mps.supervise, mps.shm_directory) == (True, False, None)
    assert [c["name"] for c in pod["containers"]] == ["dra-plugin"]
    assert {m["name"] for m in main["volumeMounts"]} >= {"mps-pipes"}
    assert "mps-shm" not in {m["name"] for m in main["volumeMounts"]}
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def test_without_privilege_the_supervised_dra_plugin_drops_every_capability() -> None:
    values = copy.deepcopy(DRA_SUPERVISED_MPS)
    values["mps"]["privileged"] = False
    _pod, main = _dra_pod(render(values))
    assert "privileged" not in main["securityContext"]
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(DRA_NODES_ONLY, id="mps off"),
        pytest.param(DRA_POOL, id="mps for a device-plugin node pool (mps.nodeSelector)"),
    ],
)
def test_the_dra_plugin_serves_no_mps_unless_every_gpu_node_does(values: Obj) -> None:
    objects = render(values)
    _pod, main = _dra_pod(objects)
    mps = load_rendered_config(
        objects, "metagpu-dra-plugin-config", "dra-plugin.yaml", DraConfig
    ).mps
    assert not mps.enabled
    assert not mps.supervise
    assert not {m["name"] for m in main["volumeMounts"]} & {"mps-pipes", "mps-shm"}
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_supervised_dra_mps_objects_pass_kubernetes_1_36() -> None:
    for obj in render(DRA_SUPERVISED_MPS):
        if obj["apiVersion"].startswith(("cert-manager.io", "monitoring.coreos.com")):
            continue
        kubernetes_validate.validate(obj, "1.36", strict=True)
