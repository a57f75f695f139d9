"""The chart runs the quota mirror in the webhook pods, configured for the release."""

from __future__ import annotations

import pytest

from tests.install.chart import (
    NAMESPACE,
    Obj,
    find,
    load_rendered_config,
    one,
    render,
    template_error,
)
from webhook.config import WebhookConfig


def webhook_config(values: Obj | None = None) -> WebhookConfig:
    objects = render(values or {})
    [configmap] = [c for c in find(objects, "ConfigMap") if "webhook.yaml" in c.get("data", {})]
    name = configmap["metadata"]["name"]
    return load_rendered_config(objects, name, "webhook.yaml", WebhookConfig)


def test_on_by_default_with_a_lease_named_for_the_release() -> None:
    mirror = webhook_config().quota_mirror
    assert mirror.enabled is True
    assert (mirror.lease_name, mirror.lease_namespace) == ("metagpu-quota-mirror", NAMESPACE)
    assert webhook_config({"fullnameOverride": "gpus"}).quota_mirror.lease_name == (
        "gpus-quota-mirror"
    )


def test_opt_out_turns_it_off_and_drops_the_lease_role() -> None:
    values = {"quotaMirror": {"enabled": False}}
    assert webhook_config(values).quota_mirror.enabled is False
    objects = render(values)
    # (the scheduler's own leader-election Role is not the mirror's)
    assert not [
        r
        for r in find(objects, "Role")
        if r["metadata"]["name"] == "metagpu-webhook-leader-election"
    ]
    role = one(render(), "Role", "metagpu-webhook-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE


def test_timings_come_through_extra_config_but_the_switch_does_not() -> None:
    values = {"webhook": {"extraConfig": {"quota_mirror": {"lease_duration_s": 30}}}}
    assert webhook_config(values).quota_mirror.lease_duration_s == 30
    message = template_error({"webhook": {"extraConfig": {"quota_mirror": {"enabled": False}}}})
    assert "webhook.extraConfig.quota_mirror.enabled" in message


@pytest.mark.parametrize("enabled", [True, False])
def test_the_webhook_pods_run_it_no_other_workload_does(enabled: bool) -> None:
    objects = render({"quotaMirror": {"enabled": enabled}})
    for kind in ("Deployment", "DaemonSet", "Job", "CronJob"):
        for workload in find(objects, kind):
            spec = workload["spec"]
            pod = (
                spec.get("template", {}).get("spec")
                or spec["jobTemplate"]["spec"]["template"]["spec"]
            )
            for container in pod["containers"]:
                assert container.get("args", [""])[0] != "quota-mirror"
