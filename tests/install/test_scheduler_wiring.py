"""The second scheduler as the chart renders it: kube-scheduler's configuration calls the
extender beside it, the extender's config loads, and the webhook points pods at it."""

from __future__ import annotations

from typing import Any

import pytest

from plugin.api.scheduling import DEFAULT_SCHEDULER_NAME
from plugin.extender.config import ExtenderConfig
from plugin.extender.permissions import LEASE_NAME
from tests.install.chart import (
    EVERYTHING,
    NAMESPACE,
    Obj,
    component,
    config_file,
    container,
    flag,
    load_rendered_config,
    mounted_file,
    render,
    scenario_params,
)
from webhook.config import WebhookConfig


def scheduler_pod(objects: list[Obj]) -> Obj:
    spec: Obj = component(objects, "Deployment", "scheduler")["spec"]["template"]["spec"]
    return spec


def scheduler_config(objects: list[Obj]) -> Obj:
    pod = scheduler_pod(objects)
    command = container(pod, "kube-scheduler")["command"]
    path = next(a.split("=", 1)[1] for a in command if a.startswith("--config="))
    volume, key = mounted_file(pod, "kube-scheduler", path)
    return config_file(objects, volume["configMap"]["name"], key)


@pytest.mark.parametrize("values", scenario_params())
def test_kube_scheduler_calls_the_extender_on_localhost(values: Obj) -> None:
    objects = render(values)
    config = scheduler_config(objects)
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == [DEFAULT_SCHEDULER_NAME]
    election = config["leaderElection"]
    assert election == {
        "leaderElect": True,
        "resourceLock": "leases",
        "resourceNamespace": NAMESPACE,
        "resourceName": LEASE_NAME,
    }
    [extender] = config["extenders"]
    extender_args = container(scheduler_pod(objects), "extender")["args"]
    listen = flag(extender_args, "--listen")
    assert listen.startswith("127.0.0.1:")
    assert extender["urlPrefix"] == f"http://{listen}"
    verbs = ("filterVerb", "prioritizeVerb", "bindVerb", "preemptVerb")
    assert {k: extender[k] for k in verbs} == {
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "bindVerb": "bind",
        "preemptVerb": "preempt",
    }
    # Every verb the scheduler is told of is a route the extender serves.
    from typing import Any, cast

    from plugin.extender.server import ExtenderState, create_app
    from plugin.extender.service import ExtenderCore

    state = ExtenderState(
        ExtenderConfig(),
        ExtenderCore(resource="cnvrg.io/metagpu"),
        cast(Any, None),
        cast(Any, None),
    )
    served = {
        r.resource.canonical
        for r in create_app(state).router.routes()
        if r.method == "POST" and r.resource is not None
    }
    assert {f"/{extender[k]}" for k in verbs} <= served
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False
    assert extender["enableHTTPS"] is False
    assert extender["managedResources"] == [
        {"name": "cnvrg.io/metagpu", "ignoredByScheduler": False}
    ]
    assert 1 <= extender["weight"] <= 100


@pytest.mark.parametrize("values", scenario_params())
def test_the_extender_config_loads_and_agrees_with_the_device_plugin(values: Obj) -> None:
    objects = render(values)
    pod = scheduler_pod(objects)
    args = container(pod, "extender")["args"]
    assert args[0] == "scheduler-extender"
    volume, key = mounted_file(pod, "extender", flag(args, "--config"))
    config = load_rendered_config(
        objects,
        volume["configMap"]["name"],
        key,
        ExtenderConfig,
        flags={"listen": flag(args, "--listen")},
    )
    plugin = config_file(objects, "metagpu-plugin-config", "plugin.yaml")
    assert config.placement_policy == plugin["allocation_policy"]
    assert config.resource_name == plugin["resources"][0]["name"]


def test_the_kube_scheduler_tag_follows_the_cluster_unless_set() -> None:
    image = container(scheduler_pod(render()), "kube-scheduler")["image"]
    repository, tag = image.rsplit(":", 1)
    assert repository == "registry.k8s.io/kube-scheduler"
    assert tag.startswith("v1.")
    assert tag.count(".") == 2
    pinned = render({"scheduler": {"image": {"tag": "v1.30.4"}}})
    assert container(scheduler_pod(pinned), "kube-scheduler")["image"].endswith(":v1.30.4")


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({}, DEFAULT_SCHEDULER_NAME, id="on by default"),
        pytest.param(EVERYTHING, DEFAULT_SCHEDULER_NAME, id="everything"),
        pytest.param({"scheduler": {"enabled": False}}, None, id="off"),
    ],
)
def test_the_webhook_points_pods_at_the_scheduler_only_when_it_is_deployed(
    values: dict[str, Any], expected: str | None
) -> None:
    objects = render(values)
    config = load_rendered_config(objects, "metagpu-webhook-config", "webhook.yaml", WebhookConfig)
    assert config.scheduler_name == expected
