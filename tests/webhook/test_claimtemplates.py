"""The ResourceClaimTemplates DRA-mode pods name: planned (pure), then kept by the
controller against the in-test API server, with the captured template's spec."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import aiohttp
import jsonpatch
import pytest

from certs.files import BundlePaths
from plugin.api.permissions import verb_set
from tests.harness.kube_api import FakeKubeApi, running_kube_api
from tests.plugin.dra.fixtures import load
from tests.webhook.builders import gpu, pod, settings
from tests.webhook.conftest import client_context, webhook_config
from tests.webhook.http import ReviewClient
from tests.webhook.quotas.harness import FAST, Leadership, write_kubeconfig
from tests.webhook.waiting import eventually
from webhook.claimtemplate_controller import ClaimTemplateController, run_claim_templates
from webhook.claimtemplate_service import controller_wanted
from webhook.claimtemplates import Create, Delete, plan_namespace, pod_shapes
from webhook.config import KubernetesConfig, WebhookConfig
from webhook.dra import Shape, claim_template, mutate_pod_dra
from webhook.model import DraSettings, Mutation
from webhook.namespaces import new_api_client
from webhook.permissions import claim_template_permissions
from webhook.server import running_webhook

SETTINGS: Final = settings(mode="dra", dra={"gpu_memory_mib": 81920})
assert SETTINGS.dra is not None
DRA: Final[DraSettings] = SETTINGS.dra
RCT: Final = ("resource.k8s.io/v1", "ResourceClaimTemplate")
HALF: Final = Shape(50, 40960)
Obj = dict[str, Any]


def stored(shape: Shape, namespace: str = "team-a", **meta: Any) -> Obj:
    obj = claim_template(shape, namespace=namespace, dra=DRA)
    obj["metadata"].update(uid=f"uid-{shape.template_name('x')}", **meta)
    return obj


# ------------------------------------------------------------------- plan
def test_a_missing_template_is_created_with_the_captured_spec() -> None:
    plan = plan_namespace(
        "dra-cap", wanted={HALF}, templates=[], dra=DRA, unreferenced_since={}, now=0
    )
    (action,) = plan.actions
    assert isinstance(action, Create)
    captured = load("resourceclaimtemplate-50-units-40gi-accepted.json")
    assert action.obj["spec"] == captured["response"]["body"]["spec"]
    assert action.obj["metadata"]["namespace"] == "dra-cap"


def test_templates_in_place_are_left_alone() -> None:
    plan = plan_namespace(
        "team-a", wanted={HALF}, templates=[stored(HALF)], dra=DRA, unreferenced_since={}, now=0
    )
    assert plan.actions == []
    assert plan.recheck_in_s is None


def test_an_unreferenced_template_goes_after_the_grace_period() -> None:
    old = stored(Shape(30, 24576))
    first = plan_namespace(
        "team-a", wanted=set(), templates=[old], dra=DRA, unreferenced_since={}, now=100
    )
    assert first.actions == []
    assert first.unreferenced_since == {"metagpu-30u-24gi": 100}
    assert first.recheck_in_s == 600
    later = plan_namespace(
        "team-a",
        wanted=set(),
        templates=[old],
        dra=DRA,
        unreferenced_since=first.unreferenced_since,
        now=700,
    )
    assert later.actions == [
        Delete(
            "team-a", "metagpu-30u-24gi", old["metadata"]["uid"], "no pod has referenced it since"
        )
    ]


def test_templates_that_are_not_ours_are_never_touched() -> None:
    theirs = stored(HALF)
    theirs["metadata"]["labels"] = {}
    other = stored(HALF)
    other["metadata"]["name"] = "gpu-50u-40gi"
    plan = plan_namespace(
        "team-a", wanted={HALF}, templates=[theirs, other], dra=DRA, unreferenced_since={}, now=1e9
    )
    assert plan.actions == []


def test_an_edited_template_is_deleted_to_be_made_again() -> None:
    edited = stored(HALF)
    edited["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    plan = plan_namespace(
        "team-a", wanted={HALF}, templates=[edited], dra=DRA, unreferenced_since={}, now=0
    )
    assert [type(a) for a in plan.actions] == [Delete]


def test_the_shapes_a_converted_pod_names() -> None:
    p = pod(gpu("500m", name="a"), gpu("10Gi", name="b", resource="metagpu.io/gpu-memory"))
    decision = mutate_pod_dra(p, settings=SETTINGS)
    assert isinstance(decision, Mutation)
    out = jsonpatch.apply_patch(copy.deepcopy(p), [dict(o) for o in decision.patch])
    assert pod_shapes(out, prefix="metagpu") == {HALF, Shape(None, 10240)}


# ------------------------------------------------------------- controller
@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[FakeKubeApi, Path]]:
    async with running_kube_api(FakeKubeApi(garbage_collector=False)) as (api, url):
        yield api, write_kubeconfig(url, tmp_path / "kubeconfig")


@contextlib.asynccontextmanager
async def controller(kubeconfig: Path, *, gc_after_s: float = 600) -> AsyncIterator[None]:
    client = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig), {})
    c = ClaimTemplateController(client, dra=DRA, gc_after_s=gc_after_s, watch_timeout_s=1)
    task = asyncio.create_task(c.run(), name="claim-templates-under-test")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()


def converted_pod(name: str, value: str, namespace: str = "team-a") -> Obj:
    p = pod(gpu(value, name="c"), name=name)
    p["metadata"]["namespace"] = namespace
    decision = mutate_pod_dra(p, settings=SETTINGS)
    assert isinstance(decision, Mutation)
    out: Obj = jsonpatch.apply_patch(p, [dict(o) for o in decision.patch])
    return out


def names(api: FakeKubeApi, namespace: str = "team-a") -> set[str]:
    return {t["metadata"]["name"] for t in api.objects(*RCT, namespace)}


async def test_templates_follow_the_pods_of_each_namespace(
    cluster: tuple[FakeKubeApi, Path],
) -> None:
    api, kubeconfig = cluster
    api.put(converted_pod("before", "500m"))  # there before the controller starts
    async with controller(kubeconfig, gc_after_s=0.3):
        await eventually(lambda: names(api) == {"metagpu-50u-40gi"})
        made = api.get(*RCT, "metagpu-50u-40gi", "team-a")
        assert made is not None
        captured = load("resourceclaimtemplate-50-units-40gi-accepted.json")["response"]["body"]
        assert made["spec"] == captured["spec"]
        assert made["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "metagpu"}

        api.put(converted_pod("later", "250m", namespace="team-b"))
        await eventually(lambda: names(api, "team-b") == {"metagpu-25u-20gi"})

        # Gone with its last pod, after the grace period; the other namespace's stays.
        api.remove("v1", "Pod", "before", "team-a")
        await eventually(lambda: names(api) == set())
        assert names(api, "team-b") == {"metagpu-25u-20gi"}
    deletes = [
        r for r in api.writes() if r.resource == "resourceclaimtemplates" and r.verb == "delete"
    ]
    assert [d.body["preconditions"]["uid"] for d in deletes] == [made["metadata"]["uid"]]


async def test_a_deleted_template_comes_back_while_pods_name_it(
    cluster: tuple[FakeKubeApi, Path],
) -> None:
    api, kubeconfig = cluster
    api.put(converted_pod("p", "500m"))
    async with controller(kubeconfig):
        await eventually(lambda: names(api) == {"metagpu-50u-40gi"})
        api.remove(*RCT, "metagpu-50u-40gi", "team-a")
        await eventually(lambda: names(api) == {"metagpu-50u-40gi"})
    creates = [
        r for r in api.writes() if r.resource == "resourceclaimtemplates" and r.verb == "create"
    ]
    assert len(creates) == 2


async def test_under_a_lease_with_exactly_the_declared_permissions(
    cluster: tuple[FakeKubeApi, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """The way the webhook process runs it: one leader writes, with the verbs declared, and
    its log names it (the quota mirror's elector runs in the same process)."""
    caplog.set_level(logging.INFO, logger="webhook.quotas.leader")
    api, kubeconfig = cluster
    api.put(converted_pod("p", "500m"))
    client = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig), {})
    leadership = Leadership()
    task = asyncio.create_task(
        run_claim_templates(
            client,
            dra=DRA,
            lease_name="metagpu-claim-templates",
            lease_namespace="metagpu",
            identity="a",
            timing=FAST,
            gc_after_s=0.3,
            watch_timeout_s=1,
            on_change=leadership.record("a"),
        )
    )
    try:
        await eventually(lambda: names(api) == {"metagpu-50u-40gi"})
        assert leadership.leaders() == {"a"}
        led = [r.getMessage() for r in caplog.records if r.name == "webhook.quotas.leader"]
        assert "leading the claim-template controller" in led
        assert not [m for m in led if "quota mirror" in m]
        api.remove("v1", "Pod", "p", "team-a")
        await eventually(lambda: names(api) == set())
        await eventually(lambda: any(r.verb == "watch" for r in api.requests))
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()
    assert api.verbs_used() == verb_set(claim_template_permissions("metagpu-claim-templates"))


IN_CLUSTER: Final = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}


@pytest.mark.parametrize(
    ("mode", "controller", "env", "wanted"),
    [
        pytest.param("device-plugin", "auto", IN_CLUSTER, False, id="device-plugin-mode"),
        pytest.param("dra", "auto", IN_CLUSTER, True, id="auto-in-cluster"),
        pytest.param("dra", "auto", {}, False, id="auto-outside"),
        pytest.param("dra", False, IN_CLUSTER, False, id="off"),
        pytest.param("dra", True, {}, True, id="on"),
    ],
)
def test_when_the_controller_runs(
    mode: str, controller: str | bool, env: dict[str, str], wanted: bool
) -> None:
    parsed = WebhookConfig.model_validate(
        {"mode": mode, "dra": {"gpu_memory_mib": 81920, "controller": controller}}
    )
    assert controller_wanted(parsed, env) is wanted


async def test_the_webhook_process_runs_it_in_dra_mode(
    cluster: tuple[FakeKubeApi, Path], ca_bundle: BundlePaths
) -> None:
    """``metagpu webhook`` in DRA mode: the pod it converts gets its template."""
    api, kubeconfig = cluster
    config = webhook_config(
        ca_bundle,
        mode="dra",
        dra={"gpu_memory_mib": 81920, "controller": True},
        kubernetes={"enabled": True, "kubeconfig": str(kubeconfig)},
        quota_mirror={"enabled": False, "lease_namespace": "metagpu"},
    )
    p = pod(gpu("500m", name="c"), name="p")
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team-a",
            "operation": "CREATE",
            "userInfo": {"username": "tester"},
            "object": p,
        },
    }
    async with running_webhook(config) as hook, aiohttp.ClientSession() as session:
        client = ReviewClient(session, hook.url, client_context(ca_bundle.ca_file))
        answer = await client.post(review)
        assert answer.response["allowed"] is True
        api.put(jsonpatch.apply_patch(p, answer.patch))
        await eventually(lambda: names(api) == {"metagpu-50u-40gi"})
