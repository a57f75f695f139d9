"""Installs that must not wait on their own taint, and the chart without GPUs (issue 32).

Items 2 and 5: on a cluster whose every node is a GPU node (one node, DGX-style,
edge), the taint docs/install.md asks for kept the pre-install hook Job
Pending and ``helm install`` waiting for its timeout. Every pod the chart makes
takes a nodeSelector and tolerations (hooks included), and
``allNodesAreGpuNodes`` lets them all onto a tainted node. ``plugin.simulatedGpus``
serves made-up GPUs to the plugin and the agent, for kind
(``examples/kind-values.yaml``, the README's steps).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import kubernetes_validate
import pytest
import yaml

from plugin.agent.labels import OWNED_LABELS
from plugin.api.chart_values import CHART_VALUES, HOST_PATH_VALUES
from plugin.api.config import PluginConfig
from plugin.api.resources import MGCTL_FILE_NAME
from plugin.api.scheduling import ANNOTATION_GPU_LEDGER, ANNOTATION_LEDGER_REFRESH
from plugin.gpu.health_file import HEALTH_FILE_NAME
from plugin.gpu.simulated import SimulatedGpusFile
from tests.install.chart import (
    CHART_DIR,
    DRA_POOL,
    NAMESPACE,
    RELEASE,
    REPO_ROOT,
    Obj,
    component,
    flag,
    helm,
    load_rendered_config,
    mounted_file,
    one,
    render,
    walk,
)

GPU_TAINT: Final = {"key": "cnvrg.io/metagpu", "value": "present", "effect": "NoSchedule"}
"""The taint docs/install.md asks for on every GPU node (the first of `tolerations`)."""
KIND_VALUES: Final = REPO_ROOT / "examples" / "kind-values.yaml"


def pod_specs(objects: list[Obj]) -> dict[str, Obj]:
    """Every pod template the chart renders, by ``Kind/name``."""
    specs: dict[str, Obj] = {}
    for obj in objects:
        spec = obj.get("spec", {})
        if obj["kind"] in ("Deployment", "DaemonSet", "Job"):
            specs[f"{obj['kind']}/{obj['metadata']['name']}"] = spec["template"]["spec"]
        elif obj["kind"] == "CronJob":
            template = spec["jobTemplate"]["spec"]["template"]["spec"]
            specs[f"CronJob/{obj['metadata']['name']}"] = template
    return specs


def tolerates(spec: Obj, taint: Obj) -> bool:
    """The kube-scheduler's rule (TolerationsTolerateTaint)."""
    for t in spec.get("tolerations") or []:
        if t.get("effect") not in (None, "", taint["effect"]):
            continue
        if t.get("operator") == "Exists" and t.get("key") in (None, "", taint["key"]):
            return True
        if t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", ""):
            return True
    return False


# Which values set a pod's placement: pod key → (selector value, tolerations value, affinity value)
PLACEMENT: Final = {
    "Deployment/metagpu-webhook": (
        "webhook.nodeSelector",
        "webhook.tolerations",
        "webhook.affinity",
    ),
    "Deployment/metagpu-scheduler": (
        "scheduler.nodeSelector",
        "scheduler.tolerations",
        "scheduler.affinity",
    ),
    "DaemonSet/metagpu-plugin": (
        "plugin.nodeSelector",
        "plugin.extraTolerations",
        "plugin.affinity",
    ),
    "DaemonSet/metagpu-agent": ("agent.nodeSelector", "agent.extraTolerations", "agent.affinity"),
    "Job/metagpu-certs-secret": ("certs.nodeSelector", "certs.tolerations", "certs.affinity"),
    "Job/metagpu-certs-cabundle": ("certs.nodeSelector", "certs.tolerations", "certs.affinity"),
    "CronJob/metagpu-certs-renew": ("certs.nodeSelector", "certs.tolerations", "certs.affinity"),
    "Job/metagpu-cleanup": ("cleanup.nodeSelector", "cleanup.tolerations", "cleanup.affinity"),
}
MARK_TOLERATION: Final = {
    "key": "example.com/dedicated",
    "operator": "Exists",
    "effect": "NoSchedule",
}
MARK_AFFINITY: Final = {
    "nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 1,
                "preference": {
                    "matchExpressions": [
                        {"key": "example.com/pool", "operator": "In", "values": ["infra"]}
                    ]
                },
            }
        ]
    }
}


def nested(dotted: str, value: Any) -> Obj:
    out: Obj = value
    for part in reversed(dotted.split(".")):
        out = {part: out}
    return out


def merge(*trees: Obj) -> Obj:
    out: Obj = {}
    for tree in trees:
        for key, value in tree.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merge(out[key], value)
            else:
                out[key] = value
    return out


def test_every_pod_is_listed_here() -> None:
    """A new Deployment, DaemonSet, Job or CronJob must come with placement values."""
    assert set(pod_specs(render({}))) == set(PLACEMENT)


@pytest.mark.parametrize("pod", sorted(PLACEMENT))
def test_each_pod_takes_its_node_selector_tolerations_and_affinity(pod: str) -> None:
    selector, tolerations, affinity = PLACEMENT[pod]
    values = merge(
        nested(selector, {"example.com/pool": "infra"}),
        nested(tolerations, [MARK_TOLERATION]),
        nested(affinity, MARK_AFFINITY),
    )
    spec = pod_specs(render(values))[pod]
    assert spec["nodeSelector"]["example.com/pool"] == "infra"
    assert MARK_TOLERATION in spec["tolerations"]
    preferred = spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert MARK_AFFINITY["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0] in (
        preferred
    )


def test_by_default_only_the_gpu_node_pods_tolerate_the_gpu_taint() -> None:
    """Cluster pods stay off GPU nodes unless asked: those belong to GPU workloads."""
    on_gpu_nodes = {p for p, s in pod_specs(render({})).items() if tolerates(s, GPU_TAINT)}
    assert on_gpu_nodes == {"DaemonSet/metagpu-plugin", "DaemonSet/metagpu-agent"}


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"allNodesAreGpuNodes": True}, id="allNodesAreGpuNodes"),
        pytest.param(yaml.safe_load(KIND_VALUES.read_text()), id="examples/kind-values.yaml"),
        pytest.param(
            {"allNodesAreGpuNodes": True, "certs": {"mode": "cert-manager"}}, id="cert-manager"
        ),
    ],
)
def test_on_a_tainted_single_node_every_pod_and_hook_can_run(values: Obj) -> None:
    specs = pod_specs(render(values))
    hooks = [p for p in specs if p.startswith(("Job/", "CronJob/"))]
    # The certificate Jobs and CronJob (bootstrap mode), and the uninstall cleanup.
    if values.get("certs", {}).get("mode") != "cert-manager":
        assert len(hooks) == 4, sorted(specs)
    else:
        assert hooks == ["Job/metagpu-cleanup"]
    for pod, spec in specs.items():
        assert tolerates(spec, GPU_TAINT), f"{pod} would stay Pending on the tainted node"
        # ... and also the taint cloud GPU node pools carry.
        assert tolerates(spec, {"key": "nvidia.com/gpu", "effect": "NoSchedule"}), pod


def test_the_pre_install_hook_waits_on_the_taint_without_it() -> None:
    """What issue 32 saw: the pre-install Job had no toleration at all."""
    spec = pod_specs(render({}))["Job/metagpu-certs-secret"]
    assert not tolerates(spec, GPU_TAINT)
    rendered = helm(
        "template",
        RELEASE,
        str(CHART_DIR),
        "-n",
        NAMESPACE,
        values={
            "certs": {
                "tolerations": [
                    {"key": "cnvrg.io/metagpu", "operator": "Exists", "effect": "NoSchedule"}
                ]
            }
        },
    )
    assert rendered.returncode == 0, rendered.stderr  # the schema accepts certs.tolerations


# ------------------------------------------------------------ simulated GPUs (kind)
def test_kind_values_serve_simulated_gpus_to_the_plugin_and_the_agent() -> None:
    objects = render(yaml.safe_load(KIND_VALUES.read_text()))
    config = load_rendered_config(objects, "metagpu-plugin-config", "plugin.yaml", PluginConfig)
    assert config.gpus_file is not None
    for name in ("plugin", "agent"):
        spec = component(objects, "DaemonSet", name)["spec"]["template"]["spec"]
        main = spec["containers"][0]
        assert flag(main["args"], "--config").startswith(str(config.gpus_file.parent))
        volume, key = mounted_file(spec, main["name"], str(config.gpus_file))
        data = one(objects, "ConfigMap", volume["configMap"]["name"])["data"]
        gpus = SimulatedGpusFile.model_validate(yaml.safe_load(data[key]))
        assert [g.memory_mib for g in gpus.gpus] == [81920, 81920]
        assert "runtimeClassName" not in spec, f"kind has no nvidia runtime ({name})"


def test_simulated_gpus_are_off_by_default_and_say_so_when_on() -> None:
    objects = render({})
    config = load_rendered_config(objects, "metagpu-plugin-config", "plugin.yaml", PluginConfig)
    assert config.gpus_file is None
    assert all(
        "simulated" not in k for k in one(objects, "ConfigMap", "metagpu-plugin-config")["data"]
    )
    notes = helm(
        "install",
        RELEASE,
        str(CHART_DIR),
        "-n",
        NAMESPACE,
        "--dry-run=client",
        values={"plugin": {"simulatedGpus": {"enabled": True}}},
    )
    assert notes.returncode == 0, notes.stderr
    assert "WARNING: plugin.simulatedGpus is on. NOT FOR PRODUCTION" in notes.stdout


@pytest.mark.parametrize("version", ["1.30", "1.35"])
def test_the_kind_install_validates_against_kubernetes(version: str) -> None:
    for obj in render(yaml.safe_load(KIND_VALUES.read_text())):
        if obj["apiVersion"].startswith(("cert-manager.io", "monitoring.coreos.com")):
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {exc.message}")


# ------------------------------------------- messages name the chart value (item 4)
CHART_VALUE_PROBES: Final[dict[str, tuple[Any, Callable[[PluginConfig], Any], Any]]] = {
    "fail_on_init_error": (False, lambda c: c.fail_on_init_error, False),
    "resources[].gpus": ([0, 1], lambda c: c.resources[0].gpus, [0, 1]),
    "placement.honour_assignments": (False, lambda c: c.placement.honour_assignments, False),
    "gpus_file": ({"enabled": True}, lambda c: c.gpus_file is not None, True),
    "health.enabled": (False, lambda c: c.health.enabled, False),
    "agent.memory_enforcement": ("kill", lambda c: c.agent.memory_enforcement, "kill"),
    "agent.socket_dir": ("/run/mg", lambda c: str(c.agent.socket_dir), "/run/mg"),
}


@pytest.mark.parametrize("key", sorted(CHART_VALUES))
def test_each_chart_value_named_in_messages_sets_its_config_key(key: str) -> None:
    """plugin.api.chart_values names a chart value beside a config key in errors; it
    must be the value that renders that key."""
    value, read, expected = CHART_VALUE_PROBES[key]
    objects = render(nested(CHART_VALUES[key], value))
    config = load_rendered_config(objects, "metagpu-plugin-config", "plugin.yaml", PluginConfig)
    assert read(config) == expected


def test_the_host_path_values_named_in_messages_mount_that_config_key() -> None:
    assert set(HOST_PATH_VALUES) == {"device_plugins_dir"}
    objects = render(nested(HOST_PATH_VALUES["device_plugins_dir"], "/data/kubelet/dp"))
    config = load_rendered_config(objects, "metagpu-plugin-config", "plugin.yaml", PluginConfig)
    spec = component(objects, "DaemonSet", "plugin")["spec"]["template"]["spec"]
    mount = next(
        m
        for m in spec["containers"][0]["volumeMounts"]
        if m["mountPath"] == str(config.device_plugins_dir)
    )
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["path"] == "/data/kubelet/dp"


def test_values_documented_for_single_node_clusters_exist() -> None:
    """docs/install.md names these; the schema must know them."""
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    paths = {".".join(p) for p, _ in walk(values)}
    assert {
        "allNodesAreGpuNodes",
        "certs.tolerations",
        "certs.nodeSelector",
        "certs.affinity",
        "plugin.simulatedGpus.enabled",
    } <= paths


# ------------------------------------------------------------- uninstall (item 3)
def test_the_uninstall_table_names_every_leftover() -> None:
    """What a release leaves behind, taken from the code and the chart, is in the
    Uninstall table with a way to remove it."""
    guide = (REPO_ROOT / "docs" / "install.md").read_text()
    section = guide.split("\n## Uninstall\n", 1)[1].split("\n## ", 1)[0]
    leases = {
        name
        for obj in render(DRA_POOL)
        if obj["kind"] == "Role"
        and obj["metadata"]["labels"]["app.kubernetes.io/component"] != "cleanup"
        for rule in obj.get("rules", [])
        if "leases" in rule.get("resources", [])
        for name in rule.get("resourceNames", [])
    }
    assert leases == {"metagpu-quota-mirror", "metagpu-scheduler", "metagpu-claim-templates"}
    short_labels = [label.split("/", 1)[1] for label in OWNED_LABELS]
    by_hand = [line for line in section.splitlines() if "delete lease" in line]
    wanted = [
        *(f"`{lease}`" for lease in sorted(leases)),
        f"`{ANNOTATION_GPU_LEDGER}`",
        f"`{ANNOTATION_LEDGER_REFRESH}`",
        f"{ANNOTATION_GPU_LEDGER}-",
        f"{ANNOTATION_LEDGER_REFRESH}-",
        *short_labels,
        *(f"{label}-" for label in OWNED_LABELS),
        f"/var/run/metagpu/{MGCTL_FILE_NAME}",
        HEALTH_FILE_NAME,
    ]
    missing = [w for w in wanted if w not in section]
    missing += [
        f"delete lease … {lease}" for lease in leases if not any(lease in c for c in by_hand)
    ]
    assert not missing, missing
    removed, stays = section.split("| What stays |", 1)
    assert all(line.count("|") == 4 for line in removed.splitlines() if line.startswith("| ")), (
        "every row the hook removes says where and how"
    )
    assert all(line.count("|") == 5 for line in stays.splitlines() if line.startswith("| ")), (
        "every row that stays says where, why and how"
    )


def test_the_readme_kind_pod_gets_half_a_gpu_from_the_kind_install(tmp_path: Path) -> None:
    """README "Try it on kind": its pod, through the webhook config the kind values
    render, asks the metagpu-scheduler for 50 units and no nvidia RuntimeClass."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Try it on kind", 1)[1].split("\n## ", 1)[0]
    assert "-f examples/kind-values.yaml" in section
    pod = section.split("<<'YAML'\n", 1)[1].split("\nYAML\n", 1)[0]
    (tmp_path / "pod.yaml").write_text(pod)
    objects = render(yaml.safe_load(KIND_VALUES.read_text()))
    webhook_config = one(objects, "ConfigMap", "metagpu-webhook-config")["data"]["webhook.yaml"]
    (tmp_path / "webhook.yaml").write_text(webhook_config)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "metagpu.cli",
            "mutate",
            "--config",
            str(tmp_path / "webhook.yaml"),
            "-f",
            str(tmp_path / "pod.yaml"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = [d for d in yaml.safe_load_all(done.stdout) if d]
    (mutated,) = out
    assert mutated["spec"]["schedulerName"] == "metagpu-scheduler"
    assert mutated["spec"]["containers"][0]["resources"]["limits"] == {"cnvrg.io/metagpu": "50"}
    assert "runtimeClassName" not in mutated["spec"]
