"""OpenShift: the DRA kubelet plugin's SecurityContextConstraints admits its pod and
nothing broader, for every values combination that changes the pod (MPS off, MPS
unsupervised, supervised with and without privilege, MPS on another node pool).

``refusals`` models what OpenShift's SCC admission checks of a pod, field by field;
``excess`` lists what the SCC grants that the pod never asks for. The existing
comparison of the device plugin's and agent's SCCs (``_pod_needs``/``_scc_grants`` in
test_kubernetes_schemas.py) covers host namespaces, capabilities and volume types; the
DRA plugin can be privileged (mps.supervise with mps.privileged) and pins its UID, so
it needs these too. seLinuxContext, fsGroup and supplementalGroups are RunAsAny by
design, as the siblings' (dra-plugin-scc.yaml says why), and checked as such.
"""

from __future__ import annotations

import copy
from typing import Any, Final

import kubernetes_validate
import pytest

from tests.install.chart import (
    DRA_NODES_ONLY,
    DRA_POOL,
    NAMESPACE,
    Obj,
    component,
    find,
    render,
)
from tests.install.test_kubernetes_schemas import SCC_REQUIRED, _pod_needs, _scc_grants

HOST_NAMESPACES: Final = (
    ("hostPID", "allowHostPID"),
    ("hostIPC", "allowHostIPC"),
    ("hostNetwork", "allowHostNetwork"),
)
"""Pod field, SCC field."""

SECCOMP: Final = {"RuntimeDefault": "runtime/default", "Unconfined": "unconfined"}
"""A pod's seccompProfile.type, in the SCC's seccompProfiles terms."""


def _volume_types(pod: Obj) -> set[str]:
    types = {next(k for k in v if k != "name") for v in pod.get("volumes", [])}
    if pod.get("automountServiceAccountToken", True):
        types.add("projected")  # the ServiceAccount token the kubelet mounts
    return types


def _containers(pod: Obj) -> list[Obj]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _privileged(c: Obj) -> bool:
    return bool(c.get("securityContext", {}).get("privileged", False))


def _escalates(c: Obj) -> bool:
    # Privileged implies escalation; an unset allowPrivilegeEscalation is what the
    # SCC defaults it to, so only an explicit true asks for it.
    sc = c.get("securityContext", {})
    return _privileged(c) or sc.get("allowPrivilegeEscalation") is True


def _added(c: Obj) -> set[str]:
    return set(c.get("securityContext", {}).get("capabilities", {}).get("add", []))


def _dropped(c: Obj) -> set[str]:
    return set(c.get("securityContext", {}).get("capabilities", {}).get("drop", []))


def _uid(pod: Obj, c: Obj) -> Any:
    return c.get("securityContext", {}).get(
        "runAsUser", pod.get("securityContext", {}).get("runAsUser")
    )


def _seccomp(pod: Obj, c: Obj) -> str | None:
    profile = c.get("securityContext", {}).get(
        "seccompProfile", pod.get("securityContext", {}).get("seccompProfile")
    )
    return None if profile is None else SECCOMP.get(profile["type"], profile["type"])


def refusals(scc: Obj, pod: Obj) -> list[str]:
    """Why OpenShift's SCC admission would refuse ``pod`` under ``scc`` (empty: admitted)."""
    found: list[str] = []
    for pod_field, scc_field in HOST_NAMESPACES:
        if pod.get(pod_field) and not scc[scc_field]:
            found.append(f"{pod_field} but not {scc_field}")
    allowed_volumes = set(scc["volumes"])
    if "*" not in allowed_volumes:
        found += [f"volume type {t}" for t in sorted(_volume_types(pod) - allowed_volumes)]
    if any("hostPath" in v for v in pod.get("volumes", [])) and not scc["allowHostDirVolumePlugin"]:
        found.append("hostPath volume but not allowHostDirVolumePlugin")
    sysctls = {s["name"] for s in pod.get("securityContext", {}).get("sysctls", [])}
    if sysctls and "*" in (scc.get("forbiddenSysctls") or []):
        found.append(f"sysctls {sorted(sysctls)}")
    caps_ok = set(scc["allowedCapabilities"] or []) | set(scc["defaultAddCapabilities"] or [])
    for c in _containers(pod):
        name = c["name"]
        if _privileged(c) and not scc["allowPrivilegedContainer"]:
            found.append(f"{name}: privileged")
        if _escalates(c) and not scc["allowPrivilegeEscalation"]:
            found.append(f"{name}: privilege escalation")
        if "*" not in caps_ok and _added(c) - caps_ok:
            found.append(f"{name}: adds {sorted(_added(c) - caps_ok)}")
        if _added(c) & set(scc["requiredDropCapabilities"] or []):
            found.append(f"{name}: adds a capability the SCC drops")
        for port in c.get("ports", []):
            if port.get("hostPort") and not scc["allowHostPorts"]:
                found.append(f"{name}: hostPort {port['hostPort']}")
        uid = _uid(pod, c)
        run_as = scc["runAsUser"]
        if run_as["type"] == "MustRunAs" and uid != run_as["uid"]:
            found.append(f"{name}: runAsUser {uid}, the SCC pins {run_as['uid']}")
        if run_as["type"] == "MustRunAsNonRoot" and uid == 0:
            found.append(f"{name}: root, the SCC wants non-root")
        if scc["readOnlyRootFilesystem"] and not c.get("securityContext", {}).get(
            "readOnlyRootFilesystem"
        ):
            found.append(f"{name}: writable root filesystem")
        profiles = scc.get("seccompProfiles") or []
        seccomp = _seccomp(pod, c)
        if profiles and "*" not in profiles and seccomp not in profiles:
            found.append(f"{name}: seccomp {seccomp}, the SCC allows {profiles}")
    return found


def excess(scc: Obj, pod: Obj) -> list[str]:
    """What ``scc`` grants that ``pod`` never asks for (empty: nothing broader)."""
    containers = _containers(pod)
    found = [
        scc_field
        for pod_field, scc_field in HOST_NAMESPACES
        if scc[scc_field] and not pod.get(pod_field)
    ]
    if scc["allowHostPorts"] and not any(
        p.get("hostPort") for c in containers for p in c.get("ports", [])
    ):
        found.append("allowHostPorts")
    if scc["allowPrivilegedContainer"] and not any(_privileged(c) for c in containers):
        found.append("allowPrivilegedContainer")
    if scc["allowPrivilegeEscalation"] and not any(_escalates(c) for c in containers):
        found.append("allowPrivilegeEscalation")
    added = set().union(*(_added(c) for c in containers))
    if set(scc["allowedCapabilities"] or []) - added:
        found.append(f"allowedCapabilities {sorted(set(scc['allowedCapabilities']) - added)}")
    if scc["defaultAddCapabilities"]:
        found.append("defaultAddCapabilities")
    unprivileged = [c for c in containers if not _privileged(c)]
    every_drops_all = unprivileged and all("ALL" in _dropped(c) for c in unprivileged)
    if every_drops_all and scc["requiredDropCapabilities"] != ["ALL"]:
        found.append("requiredDropCapabilities is not ALL, yet every container drops ALL")
    if set(scc["volumes"]) - _volume_types(pod):
        found.append(f"volumes {sorted(set(scc['volumes']) - _volume_types(pod))}")
    if scc["allowHostDirVolumePlugin"] and "hostPath" not in _volume_types(pod):
        found.append("allowHostDirVolumePlugin")
    uids = {_uid(pod, c) for c in containers}
    pinned = {"type": "MustRunAs", "uid": next(iter(uids))}
    if None not in uids and len(uids) == 1 and scc["runAsUser"] != pinned:
        found.append(f"runAsUser {scc['runAsUser']}, every container runs as {uids}")
    seccomp = {_seccomp(pod, c) for c in containers}
    if set(scc.get("seccompProfiles") or ["*"]) - seccomp:
        found.append(f"seccompProfiles {scc.get('seccompProfiles')}, the pod uses {seccomp}")
    if not pod.get("securityContext", {}).get("sysctls") and scc.get("forbiddenSysctls") != ["*"]:
        found.append("sysctls not all forbidden, yet the pod sets none")
    if scc.get("allowedUnsafeSysctls"):
        found.append("allowedUnsafeSysctls")
    return found


# ------------------------------------------------------------------ scenarios
DRA_OCP: Final[Obj] = {**DRA_NODES_ONLY, "ocp": True}


def _with(**values: Any) -> Obj:
    merged = copy.deepcopy(DRA_OCP)
    merged.update(values)
    return merged


SCENARIOS: Final = [
    pytest.param(DRA_OCP, False, id="mps-off"),
    pytest.param(_with(mps={"enabled": True}), False, id="mps-unsupervised"),
    pytest.param(_with(mps={"enabled": True, "supervise": True}), True, id="mps-supervised"),
    pytest.param(
        _with(mps={"enabled": True, "supervise": True, "privileged": False}),
        False,
        id="mps-supervised-unprivileged",
    ),
    pytest.param({**DRA_POOL, "ocp": True}, False, id="dra-webhook-mps-on-another-pool"),
    pytest.param(
        _with(
            mps={"enabled": True, "supervise": True},
            plugin={"readOnlyRootFilesystem": True, "simulatedGpus": {"enabled": True}},
        ),
        True,
        id="mps-supervised-read-only-simulated",
    ),
]


def _dra_pod_and_scc(objects: list[Obj]) -> tuple[Obj, Obj, str]:
    pod = component(objects, "DaemonSet", "dra-plugin")["spec"]["template"]["spec"]
    user = f"system:serviceaccount:{NAMESPACE}:{pod['serviceAccountName']}"
    granted = [s for s in find(objects, "SecurityContextConstraints") if user in s["users"]]
    assert len(granted) == 1, f"{len(granted)} SCCs for {user}"
    return pod, granted[0], user


@pytest.mark.parametrize(("values", "privileged"), SCENARIOS)
def test_the_dra_plugin_scc_admits_its_pod_and_nothing_broader(
    values: Obj, privileged: bool
) -> None:
    objects = render(values)
    pod, scc, user = _dra_pod_and_scc(objects)
    assert scc["metadata"]["labels"]["app.kubernetes.io/component"] == "dra-plugin"
    assert scc["users"] == [user], "granted to the DRA plugin's ServiceAccount only"
    assert not scc.get("groups")
    assert refusals(scc, pod) == []
    assert excess(scc, pod) == []
    assert _scc_grants(scc) == _pod_needs(pod)  # the siblings' checker agrees
    # The scenario really is what its id says (so the matrix covers both branches).
    assert scc["allowPrivilegedContainer"] is privileged
    assert any(_privileged(c) for c in pod["containers"]) is privileged
    for strategy in ("seLinuxContext", "fsGroup", "supplementalGroups"):
        assert scc[strategy] == {"type": "RunAsAny"}, strategy
    assert pod["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}


@pytest.mark.parametrize(("values", "privileged"), SCENARIOS)
def test_the_dra_plugin_scc_is_the_only_one_naming_its_account(
    values: Obj, privileged: bool
) -> None:
    objects = render(values)
    _pod, scc, user = _dra_pod_and_scc(objects)
    sccs = find(objects, "SecurityContextConstraints")
    assert [s["metadata"]["name"] for s in sccs if user in s["users"]] == [scc["metadata"]["name"]]
    assert len({s["metadata"]["name"] for s in sccs}) == len(sccs), "SCC names collide"
    assert len(sccs) == 3, "the device plugin's, the agent's and the DRA plugin's"


@pytest.mark.parametrize(("values", "privileged"), SCENARIOS)
def test_dra_objects_on_openshift_are_valid(values: Obj, privileged: bool) -> None:
    # Kubernetes objects against the 1.36 schemas (strict), as test_dra_mode.py does;
    # the SCC, which kubernetes-validate has no schema for, field by field as
    # test_kubernetes_schemas.py does.
    for obj in render(values):
        if obj["kind"] == "SecurityContextConstraints":
            assert obj["apiVersion"] == "security.openshift.io/v1"
            for field in SCC_REQUIRED:
                assert field in obj, f"{obj['metadata']['name']}: {field}"
            assert "namespace" not in obj["metadata"], "SCCs are cluster-scoped"
            continue
        if obj["apiVersion"].startswith(("cert-manager.io", "monitoring.coreos.com")):
            continue
        kubernetes_validate.validate(obj, "1.36", strict=True)


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(DRA_NODES_ONLY, id="dra-without-ocp"),
        pytest.param({"ocp": True}, id="ocp-without-dra"),
    ],
)
def test_no_dra_plugin_scc_without_both_ocp_and_dra(values: Obj) -> None:
    labels = [
        s["metadata"]["labels"]["app.kubernetes.io/component"]
        for s in find(render(values), "SecurityContextConstraints")
    ]
    assert "dra-plugin" not in labels


# --------------------------------------------------- the checkers can fail
def _broken_pod(pod: Obj, change: str) -> Obj:
    pod = copy.deepcopy(pod)
    main = pod["containers"][0]
    if change == "hostNetwork":
        pod["hostNetwork"] = True
    elif change == "emptyDir":
        pod["volumes"].append({"name": "scratch", "emptyDir": {}})
    elif change == "capability":
        main["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]
    elif change == "privileged":
        main["securityContext"] = {"runAsUser": 0, "privileged": True}
    elif change == "uid":
        main["securityContext"]["runAsUser"] = 1000
    elif change == "seccomp":
        pod["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
    elif change == "sysctl":
        pod["securityContext"]["sysctls"] = [{"name": "net.ipv4.ping_group_range", "value": "0 0"}]
    elif change == "hostPort":
        main["ports"] = [{"containerPort": 8080, "hostPort": 8080}]
    return pod


@pytest.mark.parametrize(
    "change",
    ["hostNetwork", "emptyDir", "capability", "privileged", "uid", "seccomp", "sysctl", "hostPort"],
)
def test_refusals_catches_a_pod_asking_for_more(change: str) -> None:
    pod, scc, _user = _dra_pod_and_scc(render(DRA_OCP))
    assert refusals(scc, pod) == []
    assert refusals(scc, _broken_pod(pod, change)), change


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("allowHostPID", True),
        ("allowHostPorts", True),
        ("allowPrivilegedContainer", True),
        ("allowPrivilegeEscalation", True),
        ("allowedCapabilities", ["NET_ADMIN"]),
        ("defaultAddCapabilities", ["KILL"]),
        ("requiredDropCapabilities", []),
        ("volumes", ["configMap", "hostPath", "projected", "secret"]),
        ("runAsUser", {"type": "RunAsAny"}),
        ("seccompProfiles", ["*"]),
        ("forbiddenSysctls", []),
        ("allowedUnsafeSysctls", ["kernel.msg*"]),
    ],
)
def test_excess_catches_an_scc_granting_more(field: str, value: Any) -> None:
    pod, scc, _user = _dra_pod_and_scc(render(DRA_OCP))
    assert excess(scc, pod) == []
    assert excess({**scc, field: value}, pod), field


def test_a_pod_privileged_without_its_scc_granting_it_is_refused() -> None:
    # The privileged render's pod against the unprivileged render's SCC: the SCC
    # follows the pod's privilege, not a fixed grant.
    _pod, scc, _user = _dra_pod_and_scc(render(DRA_OCP))
    pod, _scc, _user = _dra_pod_and_scc(render(_with(mps={"enabled": True, "supervise": True})))
    assert set(refusals(scc, pod)) >= {"dra-plugin: privileged", "dra-plugin: privilege escalation"}
