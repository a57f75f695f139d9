"""The chart's uninstall cleanup: a post-delete hook Job running ``metagpu cleanup``.

Its RBAC is checked against the command's declaration in tests/install/test_rbac.py;
here the hook itself: when Helm runs it and in what order, that it can never hold
an uninstall up for long, that it is scheduled like the other hook Jobs, that it
names every Lease the release's components elect leaders on, and that the
static manifests (no hooks in kubectl) do not carry it.
"""

from __future__ import annotations

from typing import Final

import kubernetes_validate
import pytest

from tests.install.chart import (
    DRA_POOL,
    EVERYTHING,
    Obj,
    find,
    flag,
    flags,
    one,
    render,
    template_error,
)

HOOK_KINDS: Final = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
GPU_TAINT: Final = {
    "key": "cnvrg.io/metagpu",
    "operator": "Equal",
    "value": "present",
    "effect": "NoSchedule",
}


def cleanup_objects(objects: list[Obj]) -> list[Obj]:
    return [
        o
        for o in objects
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "cleanup"
    ]


def cleanup_job(objects: list[Obj]) -> Obj:
    [job] = [o for o in cleanup_objects(objects) if o["kind"] == "Job"]
    return job


def pod(job: Obj) -> Obj:
    spec: Obj = job["spec"]["template"]["spec"]
    return spec


def args(job: Obj) -> list[str]:
    found: list[str] = pod(job)["containers"][0]["args"]
    return found


def test_a_post_delete_job_runs_metagpu_cleanup_after_its_rbac() -> None:
    objects = cleanup_objects(render())
    job = cleanup_job(objects)
    assert args(job)[0] == "cleanup"
    assert sorted(o["kind"] for o in objects) == sorted([*HOOK_KINDS, "Job"])
    for obj in objects:
        annotations = obj["metadata"]["annotations"]
        # After the release's objects (the agent's RBAC among them) are gone, so nothing
        # still running writes a label or re-creates a Lease behind the cleanup.
        assert annotations["helm.sh/hook"] == "post-delete", obj["kind"]
        policy = annotations["helm.sh/hook-delete-policy"]
        if obj["kind"] == "Job":
            # Its log (what it could not remove, and how) outlives the hook a while.
            assert policy == "before-hook-creation"
            assert job["spec"]["ttlSecondsAfterFinished"] == 600
        else:
            assert policy == "before-hook-creation,hook-succeeded", obj["kind"]
    weights = {o["kind"]: int(o["metadata"]["annotations"]["helm.sh/hook-weight"]) for o in objects}
    assert all(weights[kind] < weights["Job"] for kind in HOOK_KINDS), weights
    # Its ServiceAccount is the hook's own, and only the Job uses it.
    assert pod(job)["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]


def test_the_job_is_bounded_and_ends_with_a_report_before_it_is_killed() -> None:
    job = cleanup_job(render({"cleanup": {"timeoutSeconds": 30, "activeDeadlineSeconds": 45}}))
    assert job["spec"]["backoffLimit"] <= 1
    assert job["spec"]["activeDeadlineSeconds"] == 45
    assert float(flag(args(job), "--timeout-s")) == 30
    assert "--strict" not in args(job)  # a failed cleanup must not fail the uninstall
    assert pod(job)["restartPolicy"] == "Never"
    error = template_error({"cleanup": {"timeoutSeconds": 120, "activeDeadlineSeconds": 120}})
    assert "cleanup.activeDeadlineSeconds must be more than cleanup.timeoutSeconds" in error


def test_it_is_scheduled_and_locked_down_like_the_bootstrap_hooks() -> None:
    values: Obj = {
        "allNodesAreGpuNodes": True,
        "cleanup": {"nodeSelector": {"pool": "system"}, "tolerations": [{"operator": "Exists"}]},
        "certs": {"nodeSelector": {"pool": "system"}, "tolerations": [{"operator": "Exists"}]},
        "imagePullSecrets": [{"name": "regcred"}],
    }
    objects = render(values)
    [bootstrap] = [j for j in find(objects, "Job") if j["metadata"]["name"].endswith("-secret")]
    ours, theirs = pod(cleanup_job(objects)), pod(bootstrap)
    for key in ("nodeSelector", "tolerations", "securityContext", "imagePullSecrets"):
        assert ours[key] == theirs[key], key
    assert GPU_TAINT in ours["tolerations"]
    mine, other = ours["containers"][0], theirs["containers"][0]
    assert mine["securityContext"] == other["securityContext"]
    assert mine["securityContext"]["readOnlyRootFilesystem"] is True
    assert mine["image"] == other["image"]
    assert flags(mine["args"], "--log-level") == flags(other["args"], "--log-level")


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="defaults"),
        pytest.param({**EVERYTHING, **DRA_POOL, "fullnameOverride": "gpus"}, id="dra-renamed"),
    ],
)
def test_it_deletes_every_lease_the_release_elects_leaders_on(values: Obj) -> None:
    objects = render(values)
    elsewhere = {
        name
        for role in find(objects, "Role")
        if role not in cleanup_objects(objects)
        for rule in role["rules"]
        if "leases" in rule["resources"]
        for name in rule.get("resourceNames", [])
    }
    job = cleanup_job(objects)
    leases = set(flags(args(job), "--lease"))
    # All of them whatever runs now: an upgrade may have turned a component off after it
    # made its Lease. With every component on, no more than those.
    assert elsewhere <= leases
    if values:
        assert leases == elsewhere
    assert flag(args(job), "--namespace") == job["metadata"]["namespace"]


def test_dra_mode_adds_the_claim_templates_and_nothing_else_does() -> None:
    assert "--dra" not in args(cleanup_job(render()))
    assert "--dra" in args(cleanup_job(render(DRA_POOL)))


def test_cleanup_disabled_renders_nothing_of_it() -> None:
    assert not cleanup_objects(render({"cleanup": {"enabled": False}}))


@pytest.mark.parametrize("version", ["1.30", "1.35"])
def test_the_hook_objects_validate_against_kubernetes(version: str) -> None:
    for obj in cleanup_objects(render({**EVERYTHING, **DRA_POOL})):
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']} at {path}: {exc.message}")
