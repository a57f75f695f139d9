"""Bootstrap mode: the hook jobs run in the right order, with the right flags, and can re-run.

`metagpu certs bootstrap` runs as a pre-install/pre-upgrade hook without
``--webhook-config`` (the Secret must exist before the webhook Deployment
mounts it) and as a post-install/post-upgrade hook with it (the configuration
exists by then); a CronJob re-runs the second form so the serving certificate
is renewed without an upgrade.
"""

from __future__ import annotations

from typing import Final

import pytest

from tests.install.chart import NAMESPACE, Obj, component, find, flag, flags, one, render

HOOK: Final = "helm.sh/hook"
WEIGHT: Final = "helm.sh/hook-weight"
DELETE_POLICY: Final = "helm.sh/hook-delete-policy"


def _certs(objects: list[Obj]) -> list[Obj]:
    """The certificate objects (the uninstall cleanup hook has tests of its own)."""
    return [
        o
        for o in objects
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "certs"
    ]


def _hooks(objects: list[Obj]) -> list[Obj]:
    return [o for o in _certs(objects) if HOOK in o["metadata"].get("annotations", {})]


def _events(obj: Obj) -> set[str]:
    return set(obj["metadata"]["annotations"][HOOK].split(","))


def _jobs(objects: list[Obj]) -> dict[str, Obj]:
    jobs = {}
    for job in find(_certs(objects), "Job"):
        events = _events(job)
        jobs["pre" if events == {"pre-install", "pre-upgrade"} else "post"] = job
    return jobs


def test_pre_hook_ensures_the_secret_and_post_hook_patches_the_ca() -> None:
    objects = render()
    jobs = _jobs(objects)
    assert _events(jobs["pre"]) == {"pre-install", "pre-upgrade"}
    assert _events(jobs["post"]) == {"post-install", "post-upgrade"}
    pre_args = jobs["pre"]["spec"]["template"]["spec"]["containers"][0]["args"]
    post_args = jobs["post"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--webhook-config" not in pre_args
    configuration = one(objects, "MutatingWebhookConfiguration")
    assert flag(post_args, "--webhook-config") == configuration["metadata"]["name"]
    assert sorted(flags(post_args, "--webhook")) == sorted(
        h["name"] for h in configuration["webhooks"]
    )
    service = one(objects, "Service", "metagpu-webhook")
    for args in (pre_args, post_args):
        assert flag(args, "--namespace") == NAMESPACE
        assert flag(args, "--service") == service["metadata"]["name"]
        assert flag(args, "--cluster-domain") == "cluster.local"
        assert flag(args, "--secret") == "metagpu-webhook-tls"
        assert (flag(args, "--validity-days"), flag(args, "--ca-validity-days")) == ("365", "3650")


def test_hook_rbac_exists_before_the_jobs_and_every_hook_can_re_run() -> None:
    hooks = _hooks(render())
    jobs = [h for h in hooks if h["kind"] == "Job"]
    rbac = [h for h in hooks if h["kind"] != "Job"]
    assert {h["kind"] for h in rbac} == {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
    }
    job_events = set().union(*(_events(j) for j in jobs))
    for obj in rbac:
        assert _events(obj) >= job_events, f"{obj['kind']} missing for some hook phase"
        assert int(obj["metadata"]["annotations"][WEIGHT]) < min(
            int(j["metadata"]["annotations"][WEIGHT]) for j in jobs
        ), f"{obj['kind']} must be created before the jobs (lower hook weight)"
    for obj in hooks:
        policy = set(obj["metadata"]["annotations"][DELETE_POLICY].split(","))
        assert policy == {"before-hook-creation", "hook-succeeded"}, obj["metadata"]["name"]


def test_jobs_are_bounded_and_hardened() -> None:
    objects = render()
    for job in find(_certs(objects), "Job"):
        spec = job["spec"]
        assert spec["backoffLimit"] == 4
        assert spec["activeDeadlineSeconds"] == 300, (
            "a stuck job must fail the install, not hang it"
        )
        pod = spec["template"]["spec"]
        assert pod["restartPolicy"] == "Never"
        assert pod["securityContext"]["runAsNonRoot"] is True
        security = pod["containers"][0]["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["allowPrivilegeEscalation"] is False


def test_renewal_cronjob_runs_the_post_form() -> None:
    objects = render()
    cronjob = one(objects, "CronJob")
    assert HOOK not in cronjob["metadata"].get("annotations", {}), "must outlive the hook phase"
    spec = cronjob["spec"]
    assert spec["schedule"] == "17 3 * * *"
    assert spec["concurrencyPolicy"] == "Forbid"
    args = spec["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    post = _jobs(objects)["post"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == post
    account = spec["jobTemplate"]["spec"]["template"]["spec"]["serviceAccountName"]
    sa = one(objects, "ServiceAccount", account)
    assert HOOK not in sa["metadata"].get("annotations", {}), (
        "its RBAC must not be deleted after hooks"
    )


def test_renewal_can_be_turned_off() -> None:
    objects = render({"certs": {"bootstrap": {"renew": {"enabled": False}}}})
    assert not find(objects, "CronJob")
    assert len(find(_certs(objects), "Job")) == 2


@pytest.mark.parametrize("ocp", [False, True])
def test_job_pods_fit_the_restricted_pod_security_level(ocp: bool) -> None:
    for job in find(render({"ocp": ocp}), "Job"):
        pod = job["spec"]["template"]["spec"]
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert ("runAsUser" in pod["securityContext"]) is not ocp


def test_bootstrap_mode_mounts_a_secret_the_pre_hook_creates() -> None:
    objects = render({"certs": {"secretName": "gpu-webhook-cert"}})
    volumes = component(objects, "Deployment", "webhook")["spec"]["template"]["spec"]["volumes"]
    assert (
        next(v for v in volumes if v["name"] == "tls")["secret"]["secretName"] == "gpu-webhook-cert"
    )
    pre = _jobs(objects)["pre"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert flag(pre, "--secret") == "gpu-webhook-cert"


def test_cert_manager_mode_has_no_hooks() -> None:
    objects = render({"certs": {"mode": "cert-manager"}})
    assert not _hooks(objects)
    assert not find(_certs(objects), "Job")
    assert not find(objects, "CronJob")


def test_default_names_are_the_bootstrap_command_defaults() -> None:
    # `metagpu certs bootstrap` run by hand (docs/certs.md) with no name flags
    # must keep exactly the objects a default install uses.
    from certs.permissions import DEFAULT_SECRET_NAME, DEFAULT_WEBHOOK_CONFIG_NAME

    objects = render()
    assert one(objects, "MutatingWebhookConfiguration")["metadata"]["name"] == (
        DEFAULT_WEBHOOK_CONFIG_NAME
    )
    volumes = component(objects, "Deployment", "webhook")["spec"]["template"]["spec"]["volumes"]
    tls = next(v for v in volumes if v["name"] == "tls")
    assert tls["secret"]["secretName"] == DEFAULT_SECRET_NAME
