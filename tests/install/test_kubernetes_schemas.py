"""Every rendered object is valid Kubernetes; the objects of CRDs carry the fields they need.

kubernetes-validate ships the OpenAPI schemas of Kubernetes itself, strict
(unknown fields are errors). It has no schema for cert-manager, the Prometheus
Operator or OpenShift, so those objects are checked field by field here.
"""

from __future__ import annotations

import copy
import re
from typing import Final

import kubernetes_validate
import pytest

from tests.install.chart import (
    EVERYTHING,
    NAMESPACE,
    Obj,
    component,
    find,
    one,
    render,
    scenario_params,
)

KUBERNETES_VERSIONS: Final = ("1.30", "1.35")
"""The oldest version the chart supports (Chart.yaml kubeVersion: matchConditions
GA) and a current one."""

CRD_KINDS: Final = {
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("security.openshift.io/v1", "SecurityContextConstraints"),
}
DNS_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
GO_DURATION: Final = re.compile(r"([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values", scenario_params())
def test_every_object_validates_against_kubernetes(values: Obj, version: str) -> None:
    for obj in render(values):
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']} at {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            pytest.fail(f"no Kubernetes {version} schema for {obj['kind']}: {exc.message}")


def test_the_validator_catches_a_bad_object() -> None:
    # Proof that the test above can fail: an unknown field and a wrong type.
    deployment = copy.deepcopy(component(render(), "Deployment", "webhook"))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePulPolicy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)
    webhook_config = copy.deepcopy(one(render(), "MutatingWebhookConfiguration"))
    webhook_config["webhooks"][0]["timeoutSeconds"] = "5"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(webhook_config, KUBERNETES_VERSIONS[-1], strict=True)


def test_only_known_crd_kinds_skip_schema_validation() -> None:
    kinds = {(o["apiVersion"], o["kind"]) for o in render(EVERYTHING)} | {
        (o["apiVersion"], o["kind"])
        for o in render({**EVERYTHING, "certs": {"mode": "cert-manager"}})
    }
    assert kinds >= CRD_KINDS  # every CRD kind is rendered by some scenario, so checked below
    for api_version, kind in kinds - CRD_KINDS:
        assert "." not in api_version.split("/")[0] or api_version.split("/")[0].endswith(
            "k8s.io"
        ), f"{kind} {api_version} is neither core Kubernetes nor a checked CRD"


# ------------------------------------------------------------ cert-manager
def _assert_metadata(obj: Obj) -> None:
    assert DNS_SUBDOMAIN.fullmatch(obj["metadata"]["name"]), obj["metadata"]["name"]
    assert obj["metadata"]["namespace"] == NAMESPACE


def test_cert_manager_chain_has_every_required_field() -> None:
    objects = render({"certs": {"mode": "cert-manager"}})
    issuers = {i["metadata"]["name"]: i for i in find(objects, "Issuer")}
    certificates = {c["metadata"]["name"]: c for c in find(objects, "Certificate")}
    assert len(issuers) == 2
    assert len(certificates) == 2
    for obj in [*issuers.values(), *certificates.values()]:
        assert obj["apiVersion"] == "cert-manager.io/v1"
        _assert_metadata(obj)

    self_signed = [i for i in issuers.values() if "selfSigned" in i["spec"]]
    ca_issuers = [i for i in issuers.values() if "ca" in i["spec"]]
    assert len(self_signed) == 1
    assert len(ca_issuers) == 1
    assert self_signed[0]["spec"] == {"selfSigned": {}}

    ca_certs = [c for c in certificates.values() if c["spec"].get("isCA") is True]
    serving = [c for c in certificates.values() if not c["spec"].get("isCA")]
    assert len(ca_certs) == 1
    assert len(serving) == 1
    ca, leaf = ca_certs[0]["spec"], serving[0]["spec"]

    # self-signed Issuer -> CA Certificate
    assert ca["issuerRef"] == {
        "name": self_signed[0]["metadata"]["name"],
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    assert ca["commonName"]
    assert ca["secretName"]
    assert GO_DURATION.fullmatch(ca["duration"])
    assert ca["privateKey"] == {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Never"}
    # CA Certificate's Secret -> CA Issuer -> serving Certificate
    assert ca_issuers[0]["spec"]["ca"]["secretName"] == ca["secretName"]
    assert leaf["issuerRef"] == {
        "name": ca_issuers[0]["metadata"]["name"],
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    assert leaf["privateKey"]["algorithm"] == "ECDSA"
    assert leaf["privateKey"]["size"] == 256
    assert leaf["usages"] == ["server auth", "digital signature"]
    assert (leaf["duration"], leaf["renewBefore"]) == ("2160h", "720h")
    assert leaf["secretName"] != ca["secretName"]


def test_serving_certificate_names_the_webhook_service_and_secret() -> None:
    objects = render({"certs": {"mode": "cert-manager"}, "clusterDomain": "k8s.example"})
    service = one(objects, "Service", "metagpu-webhook")["metadata"]["name"]
    leaf = next(c for c in find(objects, "Certificate") if not c["spec"].get("isCA"))
    assert leaf["spec"]["dnsNames"] == [
        service,
        f"{service}.{NAMESPACE}",
        f"{service}.{NAMESPACE}.svc",
        f"{service}.{NAMESPACE}.svc.k8s.example",
    ]
    volumes = component(objects, "Deployment", "webhook")["spec"]["template"]["spec"]["volumes"]
    tls = next(v for v in volumes if v["name"] == "tls")
    assert tls["secret"]["secretName"] == leaf["spec"]["secretName"]
    webhook_config = one(objects, "MutatingWebhookConfiguration")
    assert webhook_config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{NAMESPACE}/{leaf['metadata']['name']}"
    )


def test_cert_manager_durations_follow_values() -> None:
    objects = render(
        {
            "certs": {
                "mode": "cert-manager",
                "certManager": {"duration": "720h", "renewBefore": "240h", "caDuration": "43800h"},
            }
        }
    )
    specs = {c["spec"].get("isCA", False): c["spec"] for c in find(objects, "Certificate")}
    assert (specs[False]["duration"], specs[False]["renewBefore"]) == ("720h", "240h")
    assert specs[True]["duration"] == "43800h"


def test_cert_manager_with_an_existing_issuer_skips_the_self_signed_chain() -> None:
    issuer = {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    objects = render({"certs": {"mode": "cert-manager", "certManager": {"issuerRef": issuer}}})
    assert not find(objects, "Issuer")
    certificate = one(objects, "Certificate")
    assert certificate["spec"]["issuerRef"] == issuer
    assert not certificate["spec"].get("isCA")


def test_bootstrap_mode_renders_no_cert_manager_objects() -> None:
    objects = render()
    assert not find(objects, "Certificate")
    assert not find(objects, "Issuer")
    annotations = one(objects, "MutatingWebhookConfiguration")["metadata"].get("annotations", {})
    assert "cert-manager.io/inject-ca-from" not in annotations


# ---------------------------------------------------------- ServiceMonitor
def test_service_monitors_select_services_that_exist() -> None:
    objects = render(EVERYTHING)
    monitors = find(objects, "ServiceMonitor")
    # the agent, the webhook and the scheduler extender (its metrics-only listener)
    assert len(monitors) == 3
    services = find(objects, "Service")
    for monitor in monitors:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        _assert_metadata(monitor)
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
        spec = monitor["spec"]
        assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        selector = spec["selector"]["matchLabels"]
        selected = [
            s for s in services if selector.items() <= s["metadata"].get("labels", {}).items()
        ]
        assert len(selected) == 1, f"{monitor['metadata']['name']} selects {len(selected)} Services"
        ports = {p["name"] for p in selected[0]["spec"]["ports"]}
        assert spec["endpoints"]
        for endpoint in spec["endpoints"]:
            assert endpoint["port"] in ports
            assert endpoint["path"] == "/metrics"
            assert GO_DURATION.fullmatch(endpoint["interval"])


def test_the_extender_is_scraped_on_its_metrics_listener_not_its_verbs() -> None:
    """The extender's verbs (which bind pods) stay on loopback; Prometheus reaches only the
    second listener, whose port the scheduler pod names "metrics"."""
    objects = render(EVERYTHING)
    deployment = one(objects, "Deployment", "metagpu-scheduler")
    extender = next(
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"
    )
    args = extender["args"]
    assert args[args.index("--listen") + 1].startswith("127.0.0.1:")
    metrics = args[args.index("--metrics-listen") + 1]
    assert metrics == "0.0.0.0:8451"
    assert extender["ports"] == [{"name": "metrics", "containerPort": 8451, "protocol": "TCP"}]
    service = one(objects, "Service", "metagpu-scheduler-metrics")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def test_webhook_service_monitor_verifies_the_webhook_certificate() -> None:
    for certs_mode in ("bootstrap", "cert-manager"):
        objects = render({**EVERYTHING, "certs": {"mode": certs_mode}})
        monitor = one(objects, "ServiceMonitor", "metagpu-webhook")
        endpoint = monitor["spec"]["endpoints"][0]
        assert endpoint["scheme"] == "https"
        tls = endpoint["tlsConfig"]
        assert tls["serverName"] == f"metagpu-webhook.{NAMESPACE}.svc"
        deployment = component(objects, "Deployment", "webhook")
        secret = next(
            v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"
        )
        assert tls["ca"]["secret"] == {"name": secret["secret"]["secretName"], "key": "ca.crt"}
        assert "insecureSkipVerify" not in tls


def test_no_service_monitor_by_default() -> None:
    assert not find(render(), "ServiceMonitor")


# ---------------------------------------------------------- OpenShift SCC
SCC_REQUIRED: Final = (
    "allowHostDirVolumePlugin",
    "allowHostIPC",
    "allowHostNetwork",
    "allowHostPID",
    "allowHostPorts",
    "allowPrivilegedContainer",
    "allowedCapabilities",
    "defaultAddCapabilities",
    "requiredDropCapabilities",
    "readOnlyRootFilesystem",
    "priority",
    "runAsUser",
    "seLinuxContext",
    "fsGroup",
    "supplementalGroups",
    "volumes",
)


def _pod_needs(pod: Obj) -> dict[str, object]:
    """What a pod template asks of an SCC, in the SCC's own terms."""
    volume_types = {next(k for k in v if k != "name") for v in pod["volumes"]}
    if pod.get("automountServiceAccountToken", True):
        volume_types.add("projected")  # the ServiceAccount token
    return {
        "allowHostPID": pod.get("hostPID", False),
        "allowHostIPC": pod.get("hostIPC", False),
        "allowHostNetwork": pod.get("hostNetwork", False),
        "allowedCapabilities": sorted(
            {
                cap
                for c in pod["containers"]
                for cap in c["securityContext"].get("capabilities", {}).get("add", [])
            }
        ),
        "volumes": sorted(volume_types),
    }


def _scc_grants(scc: Obj) -> dict[str, object]:
    return {
        "allowHostPID": scc["allowHostPID"],
        "allowHostIPC": scc["allowHostIPC"],
        "allowHostNetwork": scc["allowHostNetwork"],
        "allowedCapabilities": sorted(scc["allowedCapabilities"] or []),
        "volumes": sorted(scc["volumes"]),
    }


@pytest.mark.parametrize("enforcement", ["report", "kill"])
@pytest.mark.parametrize("mps", [False, True])
@pytest.mark.parametrize("component_name", ["plugin", "agent"])
def test_each_gpu_node_pod_has_its_own_scc_granting_exactly_what_it_uses(
    enforcement: str, mps: bool, component_name: str
) -> None:
    # Least privilege: one SCC per ServiceAccount, each allowing exactly what its
    # pods ask for. One SCC for both would let the plugin's ServiceAccount ask for
    # the host PID namespace and CAP_KILL, which only the agent needs.
    objects = render(
        {"ocp": True, "agent": {"memoryEnforcement": enforcement}, "mps": {"enabled": mps}}
    )
    pod = component(objects, "DaemonSet", component_name)["spec"]["template"]["spec"]
    user = f"system:serviceaccount:{NAMESPACE}:{pod['serviceAccountName']}"
    granted = [s for s in find(objects, "SecurityContextConstraints") if user in s["users"]]
    assert len(granted) == 1, f"{component_name}: {len(granted)} SCCs for {user}"
    scc = granted[0]
    assert scc["apiVersion"] == "security.openshift.io/v1"
    assert scc["metadata"]["labels"]["app.kubernetes.io/component"] == component_name
    for field in SCC_REQUIRED:
        assert field in scc, field
    assert scc["users"] == [user], "granted to one ServiceAccount only"
    assert not scc.get("groups")
    assert _scc_grants(scc) == _pod_needs(pod)
    assert scc["allowHostDirVolumePlugin"] is True
    assert scc["allowHostPorts"] is False
    assert scc["allowPrivilegedContainer"] is False
    assert scc["allowPrivilegeEscalation"] is False
    assert scc["requiredDropCapabilities"] == ["ALL"]
    assert not scc["defaultAddCapabilities"]
    assert scc["seccompProfiles"] == ["runtime/default"]
    for strategy in ("runAsUser", "seLinuxContext", "fsGroup", "supplementalGroups"):
        assert scc[strategy]["type"] in (
            "RunAsAny",
            "MustRunAs",
            "MustRunAsRange",
            "MustRunAsNonRoot",
        )
    for c in pod["containers"]:
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], c["name"]
    if component_name == "agent":
        assert (scc["allowHostPID"], scc["allowedCapabilities"]) == (True, ["KILL"])
    else:
        assert (scc["allowHostPID"], scc["allowedCapabilities"]) == (False, [])
        # a projected token for the device-plugin container's pod watch, and only then
        assert "projected" in scc["volumes"], "plugin.honourAssignments is on by default"


def test_no_scc_without_ocp() -> None:
    assert not find(render(), "SecurityContextConstraints")
