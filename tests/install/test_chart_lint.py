"""The chart lints and renders in every mode, and refuses bad values with a message that says why.

``make chart-lint`` runs ``pytest tests/install -k lint``: the lint tests here
carry "lint" in their names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.install.chart import (
    CHART_DIR,
    EVERYTHING,
    NAMESPACE,
    RELEASE,
    Mode,
    Obj,
    helm,
    mode_params,
    render,
    scenario_params,
    template_error,
    walk,
)


@pytest.mark.parametrize("mode", mode_params())
def test_helm_lint_strict_passes_in_every_mode(mode: Mode) -> None:
    result = helm(
        "lint", "--strict", str(CHART_DIR), "--namespace", NAMESPACE, values=mode.values()
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_helm_lint_strict_passes_with_every_feature_on() -> None:
    result = helm("lint", "--strict", str(CHART_DIR), "--namespace", NAMESPACE, values=EVERYTHING)
    assert result.returncode == 0, result.stdout + result.stderr


def test_helm_lint_fails_on_a_broken_value() -> None:
    # The lint tests can fail: a value the schema refuses fails lint too.
    result = helm("lint", "--strict", str(CHART_DIR), values={"certs": {"mode": "vault"}})
    assert result.returncode != 0
    assert "certs" in result.stdout + result.stderr


CLUSTER_SCOPED = (
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "RuntimeClass",
    "SecurityContextConstraints",
)


def is_auth_reader_binding(obj: Obj) -> bool:
    """The one object outside the release namespace: the second scheduler's RoleBinding to
    ``extension-apiserver-authentication-reader``, which exists only in kube-system (the
    upstream "Configure Multiple Schedulers" task binds it there too)."""
    return bool(
        obj["kind"] == "RoleBinding"
        and obj["metadata"].get("namespace") == "kube-system"
        and obj["roleRef"]["name"] == "extension-apiserver-authentication-reader"
    )


@pytest.mark.parametrize("values", scenario_params())
def test_helm_template_renders_the_components(values: Obj) -> None:
    objects = render(values)
    kinds = {o["kind"] for o in objects}
    assert {
        "Deployment",
        "DaemonSet",
        "Service",
        "MutatingWebhookConfiguration",
        "ConfigMap",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
    } <= kinds
    for obj in objects:
        assert obj["metadata"]["name"], obj
        labels = obj["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/instance") == RELEASE, obj["metadata"]["name"]
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"].get("namespace") == NAMESPACE or is_auth_reader_binding(obj), (
                obj["metadata"]["name"]
            )
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(names) == len(set(names)), f"duplicate objects: {names}"


def test_rendering_is_deterministic() -> None:
    args = ("template", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE)
    first, second = helm(*args), helm(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout


# ------------------------------------------------------- values refused
@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param(
            {"certs": {"mode": "vault"}},
            ["/certs/mode", "bootstrap", "cert-manager"],
            id="certs-mode",
        ),
        pytest.param({"webhook": {"replicas": 0}}, ["/webhook/replicas", "minimum"], id="replicas"),
        pytest.param(
            {"webhook": {"failurePolicy": "Maybe"}},
            ["/webhook/failurePolicy", "Fail"],
            id="failure-policy",
        ),
        pytest.param(
            {"webhook": {"timeoutSeconds": 31}},
            ["/webhook/timeoutSeconds", "maximum"],
            id="timeout",
        ),
        pytest.param(
            {"webhook": {"port": 443}}, ["/webhook/port", "minimum"], id="privileged-port"
        ),
        pytest.param({"webhook": {"replcas": 2}}, ["/webhook", "replcas"], id="typo-in-section"),
        pytest.param({"unitsPerGPU": 100}, ["unitsPerGPU"], id="typo-top-level"),
        pytest.param({"unitsPerGpu": 0}, ["/unitsPerGpu", "minimum"], id="units-zero"),
        pytest.param({"unitsPerGpu": 1001}, ["/unitsPerGpu", "maximum"], id="units-too-many"),
        pytest.param(
            {"resourceName": "metagpu"}, ["/resourceName", "pattern"], id="resource-no-domain"
        ),
        pytest.param(
            {"fractionResourceNames": ["nvidia.com/gpu'"]},
            ["/fractionResourceNames/0"],
            id="quote-in-name",
        ),
        pytest.param({"logFormat": "xml"}, ["/logFormat", "text", "json"], id="log-format"),
        pytest.param(
            {"defaultComputePolicy": "greedy"},
            ["/defaultComputePolicy", "balance"],
            id="compute-policy",
        ),
        pytest.param(
            {"agent": {"memoryEnforcement": "maybe"}},
            ["/agent/memoryEnforcement", "kill"],
            id="enforcement",
        ),
        pytest.param(
            {"tolerations": [{"key": "a", "operator": "Maybe"}]},
            ["/tolerations/0/operator"],
            id="toleration",
        ),
        pytest.param(
            {"plugin": {"resourceGpus": "some"}}, ["/plugin/resourceGpus"], id="resource-gpus"
        ),
        pytest.param(
            {"certs": {"certManager": {"duration": "90 days"}}},
            ["/certs/certManager/duration"],
            id="duration",
        ),
        pytest.param({"image": {"digest": "sha256:abc"}}, ["/image/digest"], id="digest"),
        pytest.param(
            {"runtimeClass": {"name": "NVIDIA"}}, ["/runtimeClass/name"], id="runtime-class"
        ),
        pytest.param(
            {"agent": {"priorityClassName": 5}}, ["/agent/priorityClassName"], id="agent-priority"
        ),
        pytest.param(
            {"agent": {"updateStrategy": {"type": "Recreate"}}},
            ["/agent/updateStrategy/type", "OnDelete"],
            id="agent-update-strategy",
        ),
        pytest.param(
            {"agent": {"nodeSelector": {"gpu": True}}}, ["/agent/nodeSelector/gpu"], id="agent-ns"
        ),
        pytest.param({"agent": {"hostPID": False}}, ["/agent", "hostPID"], id="agent-typo"),
        pytest.param(
            {"quotaMirror": {"enabled": "yes"}}, ["/quotaMirror/enabled"], id="quota-mirror"
        ),
        pytest.param(
            {"quotaMirror": {"enable": False}}, ["/quotaMirror", "enable"], id="quota-mirror-typo"
        ),
    ],
)
def test_schema_refuses_bad_values_naming_the_value(values: Obj, expected: list[str]) -> None:
    message = template_error(values)
    assert "values don't meet the specifications of the schema" in message
    for text in expected:
        assert text in message, message


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param(
            {"webhook": {"namespaceLookupTimeoutS": 5, "timeoutSeconds": 5}},
            ["webhook.namespaceLookupTimeoutS (5)", "below webhook.timeoutSeconds (5)"],
            id="lookup-timeout",
        ),
        pytest.param(
            {"plugin": {"extraResources": [{"name": "cnvrg.io/metagpu-a100", "gpus": [1]}]}},
            ["plugin.extraResources", 'plugin.resourceGpus is "all"'],
            id="all-gpus-and-extras",
        ),
        pytest.param(
            {
                "plugin": {
                    "resourceGpus": [0],
                    "extraResources": [{"name": "cnvrg.io/metagpu", "gpus": [1]}],
                }
            },
            ["plugin.extraResources", "unique", "cnvrg.io/metagpu"],
            id="extra-repeats-resource-name",
        ),
        pytest.param(
            {
                "plugin": {
                    "resourceGpus": [0],
                    "extraResources": [{"name": "example.com/metagpu", "gpus": [1]}],
                }
            },
            ['same name part "metagpu"', "socket"],
            id="socket-collision",
        ),
        pytest.param(
            {"fractionResourceNames": ["cnvrg.io/metagpu"]},
            ["fractionResourceNames must not contain cnvrg.io/metagpu"],
            id="metagpu-as-fraction",
        ),
        pytest.param(
            {"runtimeClass": {"create": True, "name": ""}},
            ["runtimeClass.create is true but runtimeClass.name is empty"],
            id="create-unnamed-runtime-class",
        ),
        pytest.param(
            {"webhook": {"extraConfig": {"deny_privileged": False}}},
            ["webhook.extraConfig.deny_privileged", "set that value instead"],
            id="extra-config-shadows-value",
        ),
        pytest.param(
            {"agent": {"extraConfig": {"interval_s": 2}}},
            ["agent.extraConfig.interval_s", "set that value instead"],
            id="agent-extra-config-shadows-value",
        ),
        pytest.param(
            {"plugin": {"extraConfig": {"health": {"enabled": False}}}},
            ["plugin.extraConfig.health.enabled", "set that value instead"],
            id="nested-extra-config-shadows-value",
        ),
        pytest.param(
            {"webhook": {"replicas": 2, "podDisruptionBudget": {"minAvailable": 2}}},
            ["webhook.podDisruptionBudget.minAvailable (2)", "below webhook.replicas (2)"],
            id="pdb-blocks-drains",
        ),
        pytest.param(
            {"certs": {"bootstrap": {"validityDays": 400, "caValidityDays": 365}}},
            ["certs.bootstrap.validityDays (400)", "caValidityDays (365)"],
            id="leaf-outlives-ca",
        ),
    ],
)
def test_inconsistent_values_fail_with_a_clear_message(values: Obj, expected: list[str]) -> None:
    message = template_error(values)
    for text in expected:
        assert text in message, message


def test_extra_config_adds_keys_the_chart_has_no_value_for() -> None:
    objects = render(
        {
            "webhook": {
                "extraConfig": {
                    "max_body_bytes": 1048576,
                    "kubernetes": {"initial_sync_timeout_s": 20},
                }
            },
            "plugin": {"extraConfig": {"allow_split_fraction": True, "health": {"recovery_s": 60}}},
            "agent": {"extraConfig": {"pod_resources_timeout_s": 3}},
        }
    )
    webhook = _config(objects, "metagpu-webhook-config", "webhook.yaml")
    plugin = _config(objects, "metagpu-plugin-config", "plugin.yaml")
    assert webhook["max_body_bytes"] == 1048576
    assert webhook["kubernetes"]["initial_sync_timeout_s"] == 20
    assert webhook["kubernetes"]["enabled"] is True  # the chart's own key survives the merge
    assert plugin["allow_split_fraction"] is True
    assert plugin["health"] == {"enabled": True, "recovery_s": 60}
    assert plugin["agent"]["pod_resources_timeout_s"] == 3


def _config(objects: list[Obj], name: str, key: str) -> Obj:
    configmap = next(
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name
    )
    parsed: Obj = yaml.safe_load(configmap["data"][key])
    return parsed


# --------------------------------------------------- schema completeness
def _schema_paths(
    schema: Obj, definitions: Obj, path: tuple[str, ...] = ()
) -> dict[tuple[str, ...], Obj]:
    """Every property path the schema declares, with its (resolved) schema."""
    ref = schema.get("$ref") or next(
        (s.get("$ref") for s in schema.get("allOf", []) if "$ref" in s), None
    )
    if isinstance(ref, str):
        schema = {
            **definitions[ref.rsplit("/", 1)[1]],
            **{k: v for k, v in schema.items() if k != "allOf"},
        }
    found: dict[tuple[str, ...], Obj] = {}
    for key, child in schema.get("properties", {}).items():
        found[(*path, key)] = child
        found.update(_schema_paths(child, definitions, (*path, key)))
    return found


def test_every_value_is_in_the_schema_and_every_section_is_closed() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    declared = _schema_paths(schema, schema["definitions"])
    free_form = {"extraConfig", "affinity", "updateStrategy", "resources", "issuerRef"}
    for path, value in walk(values):
        if any(part in free_form for part in path[:-1]) or path[-2:-1] in (
            ("nodeSelector",),
            ("podAnnotations",),
            ("podLabels",),
            ("labels",),
            ("annotations",),
            ("commonLabels",),
        ):
            continue
        assert path in declared, f"values.yaml has {'.'.join(path)} but values.schema.json does not"
        if isinstance(value, dict) and path[-1] not in free_form | {
            "nodeSelector",
            "podAnnotations",
            "podLabels",
            "labels",
            "annotations",
            "commonLabels",
        }:
            assert declared[path].get("additionalProperties") is False, (
                f"{'.'.join(path)}: a typo below it would be silently ignored"
            )
    assert schema["additionalProperties"] is False


def test_schema_declares_nothing_values_yaml_lacks() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    present = {path for path, _ in walk(values)}
    declared = _schema_paths(schema, schema["definitions"])
    nested_free = ("resources", "issuerRef", "updateStrategy", "podDisruptionBudget")
    missing = [
        ".".join(p)
        for p in declared
        if p not in present and p != ("global",) and not any(part in nested_free for part in p[:-1])
    ]
    assert not missing, (
        f"values.schema.json declares values with no default in values.yaml: {missing}"
    )


def test_every_value_is_commented_in_values_yaml() -> None:
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    uncommented = []
    for index, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "-")) or ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip())
        previous = lines[index - 1].strip() if index else ""
        is_section = stripped.endswith(":")
        parent_is_free_form = _inside_free_form(lines, index, indent)
        if not previous.startswith("#") and not is_section and not parent_is_free_form:
            uncommented.append(f"line {index + 1}: {stripped}")
    assert not uncommented, "values without a comment above them:\n" + "\n".join(uncommented)


def _inside_free_form(lines: list[str], index: int, indent: int) -> bool:
    """Whether line ``index`` is the content of a list/map default (tolerations, resources...)."""
    for previous in reversed(lines[:index]):
        if not previous.strip() or previous.strip().startswith("#"):
            continue
        previous_indent = len(previous) - len(previous.lstrip())
        if previous_indent < indent:
            return previous.strip().startswith("-") or previous.strip().rstrip(":").split(":")[
                0
            ] in {
                "requests",
                "limits",
                "resources",
                "nodeSelector",
                "rollingUpdate",
                "updateStrategy",
                "tolerations",
                "extraTolerations",
            }
        if previous.strip().startswith("-"):
            return True
    return False


# ---------------------------------------------------------------- NOTES
def _notes(values: Obj | None = None) -> str:
    result = helm(
        "install",
        RELEASE,
        str(CHART_DIR),
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
        values=values or {},
    )
    assert result.returncode == 0, result.stderr
    assert "NOTES:" in result.stdout
    return result.stdout.split("NOTES:", 1)[1]


def test_notes_tell_the_operator_the_next_steps() -> None:
    notes = _notes()
    assert "kubectl label node <node> accelerator=nvidia" in notes
    assert "kubectl taint node <node> cnvrg.io/metagpu=present:NoSchedule" in notes
    assert "kubectl get runtimeclass nvidia" in notes
    assert "nvidia.com/gpu: 0.5" in notes
    assert '"cnvrg.io/metagpu":"50"' in notes
    assert "docs/install.md" in notes


def test_notes_follow_the_values() -> None:
    notes = _notes(
        {
            "plugin": {"nodeSelector": {"gpu": "yes"}},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "runtimeClass": {"create": True},
            "certs": {"mode": "cert-manager"},
            "webhook": {"replicas": 1},
        }
    )
    assert "kubectl label node <node> gpu=yes" in notes
    assert "kubectl taint node <node> dedicated:NoSchedule" in notes
    assert "this release created it" in notes
    assert "get certificate" in notes
    assert "WARNING: webhook.replicas is 1" in notes


def test_notes_say_how_to_join_the_dra_pool() -> None:
    from tests.install.chart import DRA_NODES_ONLY, DRA_POOL

    assert "DRA mode" not in _notes()
    notes = _notes(DRA_POOL)
    assert "DRA mode (PREVIEW" in notes
    assert "kubectl label node <node> metagpu.io/dra=true" in notes
    assert "webhook.mode=dra: every GPU share" in notes
    assert "DeviceClass gpu.metagpu.io" in _notes(DRA_NODES_ONLY)
    assert "the device plugin keeps off them (the agent runs there too)" in notes


def test_notes_warn_of_mps_without_the_extender() -> None:
    """Only the extender keeps two users' MPS clients off one GPU (docs/mps.md)."""
    assert "WARNING: mps.enabled without scheduler.enabled" in _notes(
        {"mps": {"enabled": True}, "scheduler": {"enabled": False}}
    )
    assert "mps.enabled without" not in _notes({"mps": {"enabled": True}})
    assert "mps.enabled without" not in _notes({"scheduler": {"enabled": False}})


def test_chart_files_are_present() -> None:
    for name in (
        "Chart.yaml",
        "values.yaml",
        "values.schema.json",
        "templates/NOTES.txt",
        ".helmignore",
    ):
        assert (CHART_DIR / name).is_file(), name
    chart: dict[str, Any] = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"  # Helm 3 and 4
    assert chart["name"] == "metagpu"
    assert chart["kubeVersion"] == ">=1.30.0-0"  # matchConditions GA
    assert Path(CHART_DIR / "templates").is_dir()
