"""Each component's RBAC grants exactly the permissions its code declares: no more, no less.

The declarations live next to the code (``webhook.permissions``,
``certs.permissions``, ``plugin.agent.permissions``) and each component's own
tests check that its API calls equal them. Here the other side: the rules the
chart binds to each ServiceAccount, flattened to ``(group, resource, verb)``,
equal :func:`plugin.api.permissions.verb_set` of the declaration; cluster-wide
rules are in a ClusterRole only where the declaration says so; and where the
declaration names objects, the chart names the same ones.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import pytest

from plugin.api.permissions import Permission, verb_set
from tests.install.chart import (
    DRA_NODES_ONLY,
    DRA_POOL,
    EVERYTHING,
    NAMESPACE,
    Obj,
    component,
    find,
    flag,
    load_rendered_config,
    one,
    render,
    scenario_params,
)


@dataclass(frozen=True)
class Grant:
    """One (group, resource, verb) a ServiceAccount gets, and how."""

    group: str
    resource: str
    verb: str
    cluster_wide: bool
    resource_names: frozenset[str]


BUILT_IN_ROLES: Final = {
    ("ClusterRole", "system:kube-scheduler"),
    ("ClusterRole", "system:volume-scheduler"),
    ("Role", "extension-apiserver-authentication-reader"),
}
"""Roles Kubernetes itself defines, bound only to the second scheduler (as the upstream
"Configure Multiple Schedulers" task binds them); checked by their own test."""


def built_in_bindings(objects: list[Obj], service_account: str) -> set[tuple[str, str, str]]:
    """``(binding namespace or "", role kind, role name)`` of built-in roles bound to the SA."""
    found = set()
    for binding in [*find(objects, "RoleBinding"), *find(objects, "ClusterRoleBinding")]:
        ref = binding["roleRef"]
        if (ref["kind"], ref["name"]) not in BUILT_IN_ROLES:
            continue
        if any(
            s["kind"] == "ServiceAccount"
            and s["name"] == service_account
            and s["namespace"] == NAMESPACE
            for s in binding.get("subjects", [])
        ):
            found.add((binding["metadata"].get("namespace", ""), ref["kind"], ref["name"]))
    return found


def grants(objects: list[Obj], service_account: str) -> list[Grant]:
    """Every rule bound to ``service_account`` (in the release namespace), built-in roles aside."""
    found: list[Grant] = []
    for binding in [*find(objects, "RoleBinding"), *find(objects, "ClusterRoleBinding")]:
        if (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in BUILT_IN_ROLES:
            continue
        subjects = binding.get("subjects", [])
        if not any(
            s["kind"] == "ServiceAccount"
            and s["name"] == service_account
            and s["namespace"] == NAMESPACE
            for s in subjects
        ):
            continue
        ref = binding["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        role = one(objects, ref["kind"], ref["name"])
        cluster_wide = binding["kind"] == "ClusterRoleBinding"
        if binding["kind"] == "RoleBinding":
            assert binding["metadata"]["namespace"] == role["metadata"]["namespace"] == NAMESPACE
        for rule in role["rules"]:
            assert "nonResourceURLs" not in rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert "*" not in (group, resource, verb), (
                            f"wildcard in {role['metadata']['name']}"
                        )
                        found.append(
                            Grant(
                                group,
                                resource,
                                verb,
                                cluster_wide,
                                frozenset(rule.get("resourceNames", [])),
                            )
                        )
    return found


def assert_exactly(granted: Iterable[Grant], declared: Iterable[Permission], *, who: str) -> None:
    granted, declared = list(granted), list(declared)
    given = {(g.group, g.resource, g.verb) for g in granted}
    wanted = verb_set(declared)
    assert given == wanted, (
        f"{who}: chart grants {sorted(given - wanted)} more and {sorted(wanted - given)} less "
        "than the code declares"
    )
    # Two declarations may name different objects for one verb (the Leases of the quota
    # mirror and of the claim-template controller): the grants must name their union.
    named: dict[tuple[str, str, str], set[str]] = {}
    for permission in declared:
        if permission.resource_names:
            for verb in permission.verbs:
                key = (permission.group, permission.resource, verb)
                named.setdefault(key, set()).update(permission.resource_names)
    for permission in declared:
        for verb in permission.verbs:
            key = (permission.group, permission.resource, verb)
            matching = [g for g in granted if (g.group, g.resource, g.verb) == key]
            for grant in matching:
                scope = (
                    "namespaced (Role)" if permission.namespaced else "cluster-wide (ClusterRole)"
                )
                assert grant.cluster_wide is not permission.namespaced, (
                    f"{who}: {verb} {permission.resource} must be {scope}"
                )
            if permission.resource_names:
                names = [g.resource_names for g in matching]
                union = set().union(*names)
                said = f"chart says {[sorted(n) for n in names]}"
                assert all(names), f"{who}: {verb} {permission.resource} unlimited: {said}"
                assert union == named[key], (
                    f"{who}: {verb} {permission.resource} must be limited to "
                    f"{sorted(named[key])}, {said}"
                )


def pod_spec(obj: Obj) -> Obj:
    spec = obj["spec"]
    pod: Obj = (
        spec.get("template", {}).get("spec") or spec["jobTemplate"]["spec"]["template"]["spec"]
    )
    return pod


def _webhook_permissions(objects: list[Obj]) -> tuple[Permission, ...]:
    """What the rendered webhook config asks of the webhook process."""
    from webhook.config import WebhookConfig
    from webhook.permissions import permissions_for

    [configmap] = [c for c in find(objects, "ConfigMap") if "webhook.yaml" in c.get("data", {})]
    name = configmap["metadata"]["name"]
    config = load_rendered_config(objects, name, "webhook.yaml", WebhookConfig)
    assert config.quota_mirror.lease_namespace == NAMESPACE
    return permissions_for(
        quota_mirror=config.quota_mirror.enabled is not False,
        lease_name=config.quota_mirror.lease_name,
        claim_template_lease=config.dra.lease_name if config.mode == "dra" else None,
        explain_waiting=config.dra.explain_waiting,
    )


@pytest.mark.parametrize(
    "values",
    [
        *scenario_params(),
        pytest.param({"quotaMirror": {"enabled": False}}, id="quota-mirror-off"),
        pytest.param({"fullnameOverride": "gpus"}, id="renamed"),
        pytest.param(DRA_POOL, id="dra-mode"),
        pytest.param(
            {**DRA_POOL, "quotaMirror": {"enabled": False}, "fullnameOverride": "gpus"},
            id="dra-mode-quota-mirror-off-renamed",
        ),
        pytest.param(DRA_NODES_ONLY, id="dra-pool-units-webhook"),
        pytest.param(
            {**DRA_POOL, "dra": {**DRA_POOL["dra"], "explainWaiting": False}},
            id="dra-mode-no-waiting-events",
        ),
    ],
)
def test_webhook_rbac_is_exactly_its_permissions(values: Obj) -> None:
    objects = render(values)
    service_account = pod_spec(component(objects, "Deployment", "webhook"))["serviceAccountName"]
    assert_exactly(grants(objects, service_account), _webhook_permissions(objects), who="webhook")


def test_quota_mirror_rbac_comes_and_goes_with_its_value() -> None:
    def mirror_grants(values: Obj) -> set[tuple[str, str, str]]:
        objects = render(values)
        return {
            (g.group, g.resource, g.verb)
            for g in grants(objects, "metagpu-webhook")
            if g.resource == "leases" or g.verb in ("create", "update", "delete")
        }

    assert mirror_grants({}) == {
        ("", "resourcequotas", "create"),
        ("", "resourcequotas", "update"),
        ("", "resourcequotas", "delete"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "update"),
    }
    assert mirror_grants({"quotaMirror": {"enabled": False}}) == set()


@pytest.mark.parametrize("values", scenario_params())
def test_scheduler_rbac_is_its_extenders_permissions_and_its_lease(values: Obj) -> None:
    from plugin.extender.permissions import LEADER_ELECTION, PERMISSIONS, PREEMPTION

    objects = render(values)
    service_account = pod_spec(component(objects, "Deployment", "scheduler"))["serviceAccountName"]
    assert_exactly(
        grants(objects, service_account),
        (*PERMISSIONS, *PREEMPTION, *LEADER_ELECTION),
        who="scheduler",
    )
    assert built_in_bindings(objects, service_account) == {
        ("", "ClusterRole", "system:kube-scheduler"),
        ("", "ClusterRole", "system:volume-scheduler"),
        ("kube-system", "Role", "extension-apiserver-authentication-reader"),
    }
    # No other ServiceAccount of the chart gets a built-in role.
    for other in find(objects, "ServiceAccount"):
        if other["metadata"]["name"] != service_account:
            assert not built_in_bindings(objects, other["metadata"]["name"])


def test_scheduler_off_renders_no_scheduler_and_no_scheduler_name() -> None:
    objects = render({"scheduler": {"enabled": False}})
    assert not [
        o
        for o in objects
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "scheduler"
    ]
    assert not built_in_bindings(objects, "metagpu-scheduler")


@pytest.mark.parametrize("values", scenario_params())
def test_agent_rbac_is_exactly_its_permissions(values: Obj) -> None:
    from plugin.agent.permissions import PERMISSIONS

    objects = render(values)
    service_account = pod_spec(component(objects, "DaemonSet", "agent"))["serviceAccountName"]
    assert_exactly(grants(objects, service_account), PERMISSIONS, who="agent")


@pytest.mark.parametrize("values", scenario_params())
def test_device_plugin_rbac_is_exactly_its_permissions_and_only_its_container_has_a_token(
    values: Obj,
) -> None:
    from plugin.deviceplugin.permissions import PERMISSIONS

    objects = render(values)
    pod = pod_spec(component(objects, "DaemonSet", "plugin"))
    service_account = pod["serviceAccountName"]
    assert_exactly(grants(objects, service_account), PERMISSIONS, who="device plugin")
    # No automounted token: the device-plugin container alone gets a projected one;
    # the MPS control daemon beside it never calls the API server.
    assert pod["automountServiceAccountToken"] is False
    assert one(objects, "ServiceAccount", service_account)["automountServiceAccountToken"] is False
    token_volumes = {
        v["name"]
        for v in pod.get("volumes", [])
        if any("serviceAccountToken" in src for src in v.get("projected", {}).get("sources", []))
    }
    for container in pod["containers"]:
        mounts = {m["name"] for m in container.get("volumeMounts", [])}
        has_token = bool(mounts & token_volumes)
        assert has_token is (container["name"] == "device-plugin"), container["name"]
        if has_token:
            env = {e["name"]: e for e in container["env"]}
            node = env["METAGPU_PLUGIN_PLACEMENT__NODE_NAME"]
            assert node["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_without_honour_assignments_the_device_plugin_gets_no_rbac_and_no_token() -> None:
    objects = render({"plugin": {"honourAssignments": False}})
    pod = pod_spec(component(objects, "DaemonSet", "plugin"))
    service_account = pod["serviceAccountName"]
    assert grants(objects, service_account) == []
    assert pod["automountServiceAccountToken"] is False
    assert not any("projected" in v for v in pod.get("volumes", []))
    # Not even through a group every ServiceAccount of the namespace is in.
    for binding in [*find(objects, "RoleBinding"), *find(objects, "ClusterRoleBinding")]:
        for subject in binding.get("subjects", []):
            assert subject["kind"] == "ServiceAccount", binding["metadata"]["name"]


def test_the_device_plugin_loads_no_kubernetes_client_until_its_pod_watch_starts() -> None:
    # The device-plugin command, with everything it imports to run, loads no
    # Kubernetes client: the pod watch imports it when it starts (so
    # ``metagpu device-plugin --help`` and a plugin without the API stay light).
    code = (
        "import sys, asyncio\n"
        "import plugin.deviceplugin.cli, plugin.deviceplugin.supervisor\n"
        "import plugin.deviceplugin.server, plugin.deviceplugin.servicer\n"
        "import plugin.gpu.nvml, plugin.deviceplugin.container_spec, plugin.gpu.health_monitor\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('kubernetes_asyncio', 'kubernetes') or m.startswith(('plugin.agent', 'certs.kube')))\n"
        "print(loaded)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]", result.stdout


def _bootstrap_runs(objects: list[Obj]) -> list[Obj]:
    return [
        o
        for o in [*find(objects, "Job"), *find(objects, "CronJob")]
        if pod_spec(o)["containers"][0]["args"][:2] == ["certs", "bootstrap"]
    ]


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="defaults"),
        pytest.param({"certs": {"secretName": "gpu-webhook-cert"}}, id="custom-secret"),
        pytest.param({**EVERYTHING, "fullnameOverride": "gpus"}, id="everything-renamed"),
    ],
)
def test_bootstrap_rbac_is_exactly_its_permissions_for_the_names_it_is_given(values: Obj) -> None:
    from certs.permissions import permissions_for

    objects = render(values)
    runs = _bootstrap_runs(objects)
    assert len(runs) == 3  # pre hook, post hook, renewal CronJob
    for run in runs:
        spec = pod_spec(run)
        args = spec["containers"][0]["args"]
        webhook_config = flag(args, "--webhook-config") if "--webhook-config" in args else None
        declared = permissions_for(secret=flag(args, "--secret"), webhook_config=webhook_config)
        granted = grants(objects, spec["serviceAccountName"])
        # One ServiceAccount serves both hooks, so it holds the union: the Secret rules
        # and the webhook configuration rule of the post-install run.
        full = permissions_for(
            secret=flag(args, "--secret"),
            webhook_config=one(objects, "MutatingWebhookConfiguration")["metadata"]["name"],
        )
        assert_exactly(
            granted, full, who=f"certs bootstrap ({run['kind']} {run['metadata']['name']})"
        )
        assert verb_set(declared) <= {(g.group, g.resource, g.verb) for g in granted}


def test_bootstrap_may_patch_only_the_release_webhook_configuration() -> None:
    objects = render()
    configuration = one(objects, "MutatingWebhookConfiguration")["metadata"]["name"]
    secret = component(objects, "Deployment", "webhook")["spec"]["template"]["spec"]["volumes"]
    tls_secret = next(v for v in secret if v["name"] == "tls")["secret"]["secretName"]
    for run in _bootstrap_runs(objects):
        args = pod_spec(run)["containers"][0]["args"]
        assert flag(args, "--secret") == tls_secret
        if "--webhook-config" in args:
            assert flag(args, "--webhook-config") == configuration


def test_cert_manager_mode_has_no_bootstrap_rbac() -> None:
    objects = render({"certs": {"mode": "cert-manager"}})
    assert not _bootstrap_runs(objects)
    assert not [
        o
        for o in objects
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "certs"
        and o["kind"] in ("Role", "ClusterRole", "ServiceAccount")
    ]


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="defaults"),
        pytest.param(DRA_POOL, id="dra-mode"),
        pytest.param({**EVERYTHING, **DRA_POOL, "fullnameOverride": "gpus"}, id="dra-renamed"),
    ],
)
def test_cleanup_rbac_is_exactly_its_permissions_for_the_flags_it_is_given(values: Obj) -> None:
    from metagpu.cleanup.permissions import permissions_for
    from tests.install.chart import flags

    objects = render(values)
    [job] = [
        o for o in find(objects, "Job") if pod_spec(o)["containers"][0]["args"][0] == "cleanup"
    ]
    spec = pod_spec(job)
    args = spec["containers"][0]["args"]
    declared = permissions_for(
        leases=flags(args, "--lease"),
        dra="--dra" in args,
        quota_companions="--quota-companions" in args,
    )
    assert_exactly(grants(objects, spec["serviceAccountName"]), declared, who="cleanup")


def test_every_service_account_is_used_and_none_is_shared() -> None:
    objects = render(EVERYTHING)
    used = [
        pod_spec(o)["serviceAccountName"]
        for o in objects
        if o["kind"] in ("Deployment", "DaemonSet", "Job", "CronJob")
    ]
    accounts = {sa["metadata"]["name"] for sa in find(objects, "ServiceAccount")}
    assert accounts == set(used)
    webhook = pod_spec(component(objects, "Deployment", "webhook"))["serviceAccountName"]
    plugin = pod_spec(component(objects, "DaemonSet", "plugin"))["serviceAccountName"]
    agent = pod_spec(component(objects, "DaemonSet", "agent"))["serviceAccountName"]
    scheduler = pod_spec(component(objects, "Deployment", "scheduler"))["serviceAccountName"]
    assert (
        len(
            {
                webhook,
                plugin,
                agent,
                scheduler,
                *[pod_spec(o)["serviceAccountName"] for o in _bootstrap_runs(objects)],
            }
        )
        == 6
    )


def test_the_check_catches_an_extra_verb() -> None:
    # Proof that the comparison above can fail.
    objects = render()
    role = one(objects, "ClusterRole", "metagpu-webhook")
    role["rules"][0]["verbs"].append("delete")
    with pytest.raises(AssertionError, match="more"):
        assert_exactly(
            grants(objects, "metagpu-webhook"), _webhook_permissions(objects), who="webhook"
        )
