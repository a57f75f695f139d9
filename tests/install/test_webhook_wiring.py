"""The webhook configuration reaches what ``metagpu webhook`` serves; the webhook pods are hardened.

The container arguments are parsed by the real ``metagpu`` command parsers
(:func:`metagpu.cli.build_parser`), so a flag the chart passes that a
component does not accept fails here, not in a crash-looping pod.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Final

import pytest

from tests.install.chart import (
    EVERYTHING,
    NAMESPACE,
    Obj,
    component,
    container,
    find,
    flag,
    mode_params,
    mounted_file,
    one,
    render,
    scenario_params,
)

MUTATE_PATH: Final = "/mutate"


def parse_args(args: list[str]) -> argparse.Namespace:
    """Parse a metagpu container's args with the real parser of its command."""
    from metagpu.cli import build_parser, find_command

    command = find_command(args[0])
    return build_parser(command).parse_args(args[1:])


def webhook_pod(objects: list[Obj]) -> Obj:
    spec: Obj = component(objects, "Deployment", "webhook")["spec"]["template"]["spec"]
    return spec


def listen_port(args: list[str]) -> int:
    host, _, port = flag(args, "--listen").rpartition(":")
    assert host, args
    return int(port)


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels and matchExpressions)."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


# --------------------------------------------------------------- endpoint
@pytest.mark.parametrize("values", scenario_params())
def test_webhook_configuration_calls_the_served_path_port_and_service(values: Obj) -> None:
    objects = render(values)
    configuration = one(objects, "MutatingWebhookConfiguration")
    deployment = component(objects, "Deployment", "webhook")
    pod = deployment["spec"]["template"]["spec"]
    webhook = container(pod, "webhook")
    assert len(configuration["webhooks"]) == 2
    for hook in configuration["webhooks"]:
        service_ref = hook["clientConfig"]["service"]
        assert service_ref["path"] == MUTATE_PATH
        assert service_ref["namespace"] == NAMESPACE
        service = one(objects, "Service", service_ref["name"])
        ports = [p for p in service["spec"]["ports"] if p["port"] == service_ref["port"]]
        assert len(ports) == 1, f"Service {service_ref['name']} has no port {service_ref['port']}"
        target = ports[0]["targetPort"]
        container_ports = {p["name"]: p["containerPort"] for p in webhook["ports"]}
        target_port = container_ports[target] if isinstance(target, str) else target
        assert target_port == listen_port(webhook["args"]), (
            "Service targets a port nobody listens on"
        )
        assert selects(
            {"matchLabels": service["spec"]["selector"]},
            deployment["spec"]["template"]["metadata"]["labels"],
        )
        assert "url" not in hook["clientConfig"]


def test_listen_port_follows_values() -> None:
    objects = render({"webhook": {"port": 9443, "service": {"port": 8443}}})
    webhook = container(webhook_pod(objects), "webhook")
    assert flag(webhook["args"], "--listen") == "0.0.0.0:9443"
    assert webhook["ports"] == [{"name": "https", "containerPort": 9443, "protocol": "TCP"}]
    for hook in one(objects, "MutatingWebhookConfiguration")["webhooks"]:
        assert hook["clientConfig"]["service"]["port"] == 8443
    assert one(objects, "Service", "metagpu-webhook")["spec"]["ports"][0]["port"] == 8443


@pytest.mark.parametrize("values", scenario_params())
def test_webhook_policy_fields(values: Obj) -> None:
    for hook in one(render(values), "MutatingWebhookConfiguration")["webhooks"]:
        assert hook["failurePolicy"] == "Fail"
        assert hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["reinvocationPolicy"] == "IfNeeded"
        assert hook["timeoutSeconds"] == 5
        assert hook["matchPolicy"] == "Equivalent"
        assert len(hook["matchConditions"]) <= 64


def test_webhook_rules_cover_pods_and_every_workload_kind() -> None:
    hooks = {h["name"]: h for h in one(render(), "MutatingWebhookConfiguration")["webhooks"]}
    assert set(hooks) == {"pods.metagpu.io", "workloads.metagpu.io"}

    def covered(hook: Obj) -> set[tuple[str, str, str]]:
        return {
            (group, resource, operation)
            for rule in hook["rules"]
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for operation in rule["operations"]
        }

    assert covered(hooks["pods.metagpu.io"]) == {
        ("", "pods", "CREATE"),
        ("", "pods", "UPDATE"),  # re-applied manifests only (matchConditions)
        ("", "pods/ephemeralcontainers", "UPDATE"),
    }
    workloads = {
        ("apps", "deployments"),
        ("apps", "statefulsets"),
        ("apps", "daemonsets"),
        ("apps", "replicasets"),
        ("", "replicationcontrollers"),
        ("batch", "jobs"),
        ("batch", "cronjobs"),
    }
    assert covered(hooks["workloads.metagpu.io"]) == {
        (group, resource, op) for group, resource in workloads for op in ("CREATE", "UPDATE")
    }
    for hook in hooks.values():
        for rule in hook["rules"]:
            assert rule["apiVersions"] == ["v1"]
            assert rule["scope"] == "Namespaced"


@pytest.mark.parametrize(
    ("namespace_labels", "sent"),
    [
        pytest.param({"kubernetes.io/metadata.name": "default"}, True, id="default"),
        pytest.param(
            {"kubernetes.io/metadata.name": "team-a", "metagpu.io/inject": "true"},
            True,
            id="inject-true",
        ),
        pytest.param({"kubernetes.io/metadata.name": NAMESPACE}, False, id="release-namespace"),
        pytest.param({"kubernetes.io/metadata.name": "kube-system"}, False, id="kube-system"),
        pytest.param({"kubernetes.io/metadata.name": "gpu-operator"}, False, id="extra-excluded"),
        pytest.param(
            {"kubernetes.io/metadata.name": "team-b", "metagpu.io/inject": "false"},
            False,
            id="opt-out",
        ),
    ],
)
def test_namespace_selector_excludes_the_release_namespace_and_kube_system(
    namespace_labels: dict[str, str], sent: bool
) -> None:
    objects = render({"webhook": {"namespaceSelector": {"excludeNamespaces": ["gpu-operator"]}}})
    for hook in one(objects, "MutatingWebhookConfiguration")["webhooks"]:
        assert selects(hook["namespaceSelector"], namespace_labels) is sent


@pytest.mark.parametrize(
    ("object_labels", "sent"),
    [
        pytest.param({}, True, id="no-labels"),
        pytest.param({"app": "train"}, True, id="other-labels"),
        pytest.param({"metagpu.io/inject": "true"}, True, id="inject-true"),
        pytest.param({"metagpu.io/inject": "false"}, False, id="opt-out"),
    ],
)
def test_workloads_honour_the_opt_out_label(object_labels: dict[str, str], sent: bool) -> None:
    hook = _webhook(render(), "workloads")
    assert selects(hook["objectSelector"], object_labels) is sent


def test_opted_out_pods_still_reach_the_webhook_for_hardening() -> None:
    # A pod label is written by the pod's author; if it kept the pod away from the
    # webhook, anyone could switch off the NVIDIA_VISIBLE_DEVICES/privileged denials.
    hook = _webhook(render(), "pods")
    assert selects(hook.get("objectSelector", {}), {"metagpu.io/inject": "false"})


def test_extra_object_selector_expressions_apply_to_both_webhooks() -> None:
    extra = {"key": "team", "operator": "In", "values": ["ml"]}
    objects = render({"webhook": {"objectSelector": {"matchExpressions": [extra]}}})
    for kind in ("pods", "workloads"):
        hook = _webhook(objects, kind)
        assert selects(hook["objectSelector"], {"team": "ml"})
        assert not selects(hook["objectSelector"], {"team": "web"})


def _webhook(objects: list[Obj], kind: str) -> Obj:
    hooks = one(objects, "MutatingWebhookConfiguration")["webhooks"]
    matching: list[Obj] = [h for h in hooks if h["name"].startswith(f"{kind}.")]
    assert len(matching) == 1, [h["name"] for h in hooks]
    return matching[0]


def test_the_webhook_plugin_and_agent_pods_are_never_sent_to_the_webhook() -> None:
    objects = render(EVERYTHING)
    namespace_labels = {"kubernetes.io/metadata.name": NAMESPACE}
    for hook in one(objects, "MutatingWebhookConfiguration")["webhooks"]:
        assert not selects(hook["namespaceSelector"], namespace_labels)
    # ... which matters: the plugin and agent pods run under the nvidia runtime class.
    for name in ("plugin", "agent"):
        daemonset = component(objects, "DaemonSet", name)
        assert daemonset["metadata"]["namespace"] == NAMESPACE
        assert daemonset["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"


# ------------------------------------------------------------ real CLIs
def _metagpu_containers(objects: list[Obj]) -> list[tuple[str, Obj]]:
    found = []
    for obj in objects:
        spec = obj.get("spec", {})
        pod = spec.get("template", {}).get("spec") or (
            spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec")
        )
        if not pod:
            continue
        for c in pod["containers"]:
            if "command" not in c:  # the image entrypoint: metagpu
                found.append((f"{obj['kind']}/{obj['metadata']['name']}/{c['name']}", c))
    return found


@pytest.mark.parametrize("values", scenario_params())
def test_every_container_command_parses_with_the_real_cli(values: Obj) -> None:
    containers = _metagpu_containers(render(values))
    commands = {c["args"][0] for _, c in containers}
    assert {"webhook", "device-plugin", "agent"} <= commands
    for where, c in containers:
        try:
            parse_args(c["args"])
        except SystemExit as exc:
            pytest.fail(f"{where}: metagpu rejects {c['args']} (exit {exc.code})")


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_log_format_and_level_reach_every_component(log_format: str) -> None:
    objects = render({"logFormat": log_format, "logLevel": "DEBUG", **EVERYTHING})
    for where, c in _metagpu_containers(objects):
        parsed = parse_args(c["args"])
        assert parsed.log_format == log_format, where
        assert parsed.log_level == "DEBUG", where


# ------------------------------------------------------ files and config
def test_webhook_reads_its_config_and_only_the_serving_pair() -> None:
    objects = render()
    pod = webhook_pod(objects)
    args = container(pod, "webhook")["args"]
    volume, key = mounted_file(pod, "webhook", flag(args, "--config"))
    assert volume["configMap"]["name"] == "metagpu-webhook-config"
    assert key in one(objects, "ConfigMap", "metagpu-webhook-config")["data"]
    for option, secret_key in (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key")):
        volume, key = mounted_file(pod, "webhook", flag(args, option))
        assert key == secret_key
        assert volume["secret"]["secretName"] == "metagpu-webhook-tls"
    tls = next(v for v in pod["volumes"] if v["name"] == "tls")["secret"]
    assert {i["key"] for i in tls["items"]} == {"tls.crt", "tls.key"}, "never mount the CA key"
    mounts = container(pod, "webhook")["volumeMounts"]
    assert all("subPath" not in m for m in mounts), "subPath mounts never see Secret updates"


@pytest.mark.parametrize("values", scenario_params())
def test_metagpu_webhook_serves_what_the_configuration_calls(
    values: Obj, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real CLI parses the container args and loads the rendered config; the real
    app factory's routes hold the path, and its port is the one the Service targets."""
    from webhook.cli import load_webhook_config
    from webhook.metrics import WebhookMetrics
    from webhook.model import RuleSettings
    from webhook.server import WebhookState, create_app

    for name in [n for n in os.environ if n.startswith("METAGPU_")]:
        monkeypatch.delenv(name)
    objects = render(values)
    webhook = container(webhook_pod(objects), "webhook")
    args = parse_args(webhook["args"])
    # The file the pod reads is the rendered ConfigMap entry; read it from here instead.
    volume, key = mounted_file(webhook_pod(objects), "webhook", str(args.config))
    config_file = tmp_path / key
    config_file.write_text(one(objects, "ConfigMap", volume["configMap"]["name"])["data"][key])
    args.config = config_file
    config = load_webhook_config(args)

    assert config.host == "0.0.0.0"
    assert {"name": "https", "containerPort": config.port, "protocol": "TCP"} in webhook["ports"]
    assert str(config.tls.cert_file) == flag(webhook["args"], "--tls-cert")
    assert str(config.tls.key_file) == flag(webhook["args"], "--tls-key")
    assert config.kubernetes.enabled is True
    timeouts = {
        h["timeoutSeconds"] for h in one(objects, "MutatingWebhookConfiguration")["webhooks"]
    }
    assert config.kubernetes.namespace_lookup_timeout_s < min(timeouts)
    # A terminating pod keeps answering while endpoints update, and stops in time.
    assert config.drain_delay_s > 0
    grace = webhook_pod(objects)["terminationGracePeriodSeconds"]
    assert config.drain_delay_s + config.shutdown_timeout_s < grace

    app = create_app(
        WebhookState(
            config=config, settings=RuleSettings.from_config(config), metrics=WebhookMetrics()
        )
    )
    routes = {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource}
    for hook in one(objects, "MutatingWebhookConfiguration")["webhooks"]:
        assert ("POST", hook["clientConfig"]["service"]["path"]) in routes
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert ("GET", webhook[probe]["httpGet"]["path"]) in routes
    assert ("GET", "/metrics") in routes  # the webhook ServiceMonitor's path


def test_config_change_rolls_the_pods() -> None:
    def checksums(values: Obj) -> tuple[str, str, str]:
        objects = render(values)
        workloads = (
            component(objects, "Deployment", "webhook"),
            component(objects, "DaemonSet", "plugin"),
            component(objects, "DaemonSet", "agent"),
        )
        webhook, plugin, agent = (
            w["spec"]["template"]["metadata"]["annotations"]["checksum/config"] for w in workloads
        )
        return webhook, plugin, agent

    base = checksums({})
    webhook_changed = checksums({"webhook": {"denyPrivileged": False}})
    plugin_changed = checksums({"agent": {"intervalS": 10}})
    shared_changed = checksums({"unitsPerGpu": 50})
    assert webhook_changed[0] != base[0]
    assert webhook_changed[1:] == base[1:]
    # plugin.yaml is one file for both DaemonSets: a change rolls both.
    assert plugin_changed[1] != base[1]
    assert plugin_changed[2] != base[2]
    assert plugin_changed[0] == base[0]
    assert all(changed != before for changed, before in zip(shared_changed, base, strict=True))


# ----------------------------------------------------------- hardening
@pytest.mark.parametrize("mode", mode_params())
def test_webhook_pod_is_hardened(mode: Any) -> None:
    objects = render(mode.values())
    pod = webhook_pod(objects)
    assert pod["enableServiceLinks"] is False, "service links collide with METAGPU_WEBHOOK_*"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    if mode.ocp:
        assert "runAsUser" not in pod["securityContext"], (
            "restricted-v2 assigns the UID on OpenShift"
        )
        assert "fsGroup" not in pod["securityContext"]
    else:
        assert pod["securityContext"]["runAsUser"] == 65532
        assert pod["securityContext"]["fsGroup"] == 65532
    webhook = container(pod, "webhook")
    security = webhook["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert webhook["resources"]["requests"]
    assert webhook["resources"]["limits"]["memory"]
    assert not any(e["name"].startswith("METAGPU_WEBHOOK_") for e in webhook.get("env", []))
    assert pod["serviceAccountName"] == "metagpu-webhook"


def test_webhook_probes_use_https_on_the_webhook_port() -> None:
    webhook = container(webhook_pod(render()), "webhook")
    probes = {
        name: webhook[name]["httpGet"]
        for name in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert probes["livenessProbe"]["path"] == "/healthz"
    assert probes["startupProbe"]["path"] == "/healthz"
    assert probes["readinessProbe"]["path"] == "/readyz"
    for probe in probes.values():
        assert probe["scheme"] == "HTTPS"
        assert probe["port"] == "https"


@pytest.mark.parametrize(
    ("replicas", "pdb"),
    [
        pytest.param(2, True, id="two"),
        pytest.param(3, True, id="three"),
        pytest.param(1, False, id="one"),
    ],
)
def test_disruption_budget_keeps_one_replica(replicas: int, pdb: bool) -> None:
    objects = render({"webhook": {"replicas": replicas}})
    assert component(objects, "Deployment", "webhook")["spec"]["replicas"] == replicas
    budgets = find(objects, "PodDisruptionBudget")
    assert bool(budgets) is pdb
    if pdb:
        spec = budgets[0]["spec"]
        assert spec["minAvailable"] == 1
        labels = component(objects, "Deployment", "webhook")["spec"]["template"]["metadata"][
            "labels"
        ]
        assert selects(spec["selector"], labels)


def test_default_is_two_replicas_spread_by_hostname() -> None:
    objects = render()
    deployment = component(objects, "Deployment", "webhook")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = deployment["spec"]["template"]["spec"]
    terms = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    term = terms[0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert selects(term["labelSelector"], deployment["spec"]["template"]["metadata"]["labels"])
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"


def test_hard_anti_affinity_is_required() -> None:
    pod = webhook_pod(render({"webhook": {"antiAffinity": "hard"}}))
    terms = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms[0]["topologyKey"] == "kubernetes.io/hostname"


def test_operator_affinity_is_kept_beside_the_anti_affinity() -> None:
    node_affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}
            ]
        }
    }
    pod = webhook_pod(render({"webhook": {"affinity": {"nodeAffinity": node_affinity}}}))
    assert pod["affinity"]["nodeAffinity"] == node_affinity
    assert "podAntiAffinity" in pod["affinity"]


def test_priority_class_is_optional() -> None:
    assert "priorityClassName" not in webhook_pod(render())
    pod = webhook_pod(render({"webhook": {"priorityClassName": "system-cluster-critical"}}))
    assert pod["priorityClassName"] == "system-cluster-critical"


def test_image_reference() -> None:
    def image(values: Obj) -> str:
        image_ref: str = container(webhook_pod(render(values)), "webhook")["image"]
        return image_ref

    assert image({}) == "ghcr.io/metagpu/metagpu:0.1.0"
    assert image({"image": {"tag": "dev"}}) == "ghcr.io/metagpu/metagpu:dev"
    digest = "sha256:" + "a" * 64
    assert image({"image": {"digest": digest}}) == f"ghcr.io/metagpu/metagpu@{digest}"


def _webhook_config(objects: list[Obj]) -> Any:
    import yaml

    from webhook.config import WebhookConfig

    data = one(objects, "ConfigMap", "metagpu-webhook-config")["data"]["webhook.yaml"]
    return WebhookConfig.model_validate(yaml.safe_load(data))


def test_connection_limits_flow_from_values_into_the_config() -> None:
    from webhook.config import ConnectionsConfig

    defaults = _webhook_config(render()).connections
    assert defaults == ConnectionsConfig()  # the chart's defaults are the webhook's
    values = {"webhook": {"connections": {"maxConnectionsPerClient": 64, "idleTimeoutS": 300}}}
    chosen = _webhook_config(render(values)).connections
    assert (chosen.max_connections_per_client, chosen.idle_timeout_s) == (64, 300)


def test_network_policy_is_off_by_default_and_admits_only_the_webhook_port() -> None:
    assert find(render(), "NetworkPolicy") == []
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    values = {
        "webhook": {
            "port": 9443,
            "networkPolicy": {
                "enabled": True,
                "controlPlaneCidrs": ["10.0.0.0/24"],
                "extraFrom": [peer],
            },
        }
    }
    objects = render(values)
    policy = one(objects, "NetworkPolicy", "metagpu-webhook")["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    template = component(objects, "Deployment", "webhook")["spec"]["template"]
    assert selects(policy["podSelector"], template["metadata"]["labels"])
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": 9443, "protocol": "TCP"}]
    assert rule["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}, peer]
    # No sources given: the port from anywhere, every other port closed.
    (open_rule,) = one(render({"webhook": {"networkPolicy": {"enabled": True}}}), "NetworkPolicy")[
        "spec"
    ]["ingress"]
    assert "from" not in open_rule
