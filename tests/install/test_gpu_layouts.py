"""One owner per GPU: each documented layout renders, validates, and schedules where it must.

The values files are the ones docs/install.md tells operators to use
(``examples/layouts/*.yaml``), so the guide and the chart cannot drift apart.
"""

from __future__ import annotations

from typing import Any, Final

import kubernetes_validate
import pytest
import yaml

from tests.install.chart import (
    REPO_ROOT,
    Obj,
    component,
    config_file,
    render,
    template_error,
)

LAYOUTS: Final = REPO_ROOT / "examples" / "layouts"
NVIDIA_SWITCH: Final = {
    "key": "nvidia.com/gpu.deploy.device-plugin",
    "operator": "NotIn",
    "values": ["true"],
}
"""The GPU Operator's per-node switch for its device plugin, as a node-affinity term."""


def layout_values(name: str) -> Obj:
    values: Obj = yaml.safe_load((LAYOUTS / f"{name}.yaml").read_text())
    return values


def gpu_pods(values: Obj) -> list[Obj]:
    objects = render(values)
    return [
        component(objects, "DaemonSet", name)["spec"]["template"]["spec"]
        for name in ("plugin", "agent")
    ]


def required_expressions(spec: Obj) -> list[list[Any]]:
    terms = (
        spec.get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms", [])
    )
    return [t.get("matchExpressions", []) for t in terms]


def plugin_config(values: Obj) -> Obj:
    return config_file(render(values), "metagpu-plugin-config", "plugin.yaml")


def test_every_documented_layout_has_a_values_file() -> None:
    assert sorted(p.stem for p in LAYOUTS.glob("*.yaml")) == ["mig", "owner", "split"]
    guide = (REPO_ROOT / "docs" / "install.md").read_text()
    for path in LAYOUTS.glob("*.yaml"):
        assert f"examples/layouts/{path.name}" in guide


@pytest.mark.parametrize("version", ["1.30", "1.35"])
@pytest.mark.parametrize("layout", ["owner", "split", "mig"])
def test_each_layout_renders_valid_kubernetes(layout: str, version: str) -> None:
    for obj in render(layout_values(layout)):
        if obj["apiVersion"].startswith(("cert-manager.io", "monitoring.coreos.com")):
            continue
        kubernetes_validate.validate(obj, version, strict=True)


def test_owner_keeps_metagpu_off_nodes_where_the_gpu_operator_runs_nvidias_plugin() -> None:
    values = layout_values("owner")
    for spec in gpu_pods(values):
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert required_expressions(spec) == [[NVIDIA_SWITCH]]
    config = plugin_config(values)
    assert config["resources"] == [{"name": "cnvrg.io/metagpu", "gpus": "all"}]


def test_owner_is_the_default_and_ands_the_switch_into_every_affinity_term() -> None:
    (plugin, _) = gpu_pods({})
    assert required_expressions(plugin) == [[NVIDIA_SWITCH]]
    own = {"key": "zone", "operator": "In", "values": ["a"]}
    other = {"key": "pool", "operator": "Exists"}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [own]}, {"matchExpressions": [other]}]
            }
        }
    }
    (plugin, agent) = gpu_pods({"plugin": {"affinity": affinity}})
    for spec in (plugin, agent):
        assert required_expressions(spec) == [[own, NVIDIA_SWITCH], [other, NVIDIA_SWITCH]]


def test_split_serves_only_its_gpus_next_to_nvidias_plugin() -> None:
    values = layout_values("split")
    for spec in gpu_pods(values):
        assert spec["nodeSelector"] == {"metagpu.io/layout": "split"}
        assert required_expressions(spec) == []  # NVIDIA's plugin runs here by design
    assert plugin_config(values)["resources"] == [{"name": "cnvrg.io/metagpu", "gpus": [2, 3]}]


def test_split_refuses_all_gpus() -> None:
    error = template_error({"plugin": {"layout": "split"}})
    assert 'plugin.layout is "split" but plugin.resourceGpus is "all"' in error
    assert "list the GPUs" in error


def test_mig_nodes_are_selected_by_node_feature_discovery() -> None:
    values = layout_values("mig")
    for spec in gpu_pods(values):
        assert spec["nodeSelector"] == {"feature.node.kubernetes.io/pci-10de.present": "true"}
        assert required_expressions(spec) == []
    assert plugin_config(values)["resources"] == [{"name": "cnvrg.io/metagpu", "gpus": "all"}]


@pytest.mark.parametrize(
    ("selection", "selector"),
    [
        ("label", {"accelerator": "nvidia"}),
        ("nfd", {"feature.node.kubernetes.io/pci-10de.present": "true"}),
        ("gfd", {"nvidia.com/gpu.present": "true"}),
    ],
)
def test_node_selection(selection: str, selector: dict[str, str]) -> None:
    for spec in gpu_pods({"plugin": {"nodeSelection": selection}}):
        assert spec["nodeSelector"] == selector


def test_a_bad_layout_or_selection_names_the_value() -> None:
    assert "/plugin/layout" in template_error({"plugin": {"layout": "shared"}})
    assert "/plugin/nodeSelection" in template_error({"plugin": {"nodeSelection": "auto"}})


def test_the_plugin_reads_the_kubelets_pod_resources_read_only() -> None:
    (plugin, _) = gpu_pods({})
    mounts = {m["name"]: m for c in plugin["containers"] for m in c.get("volumeMounts", [])}
    assert mounts["pod-resources"]["readOnly"] is True
    volumes = {v["name"]: v for v in plugin["volumes"]}
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
