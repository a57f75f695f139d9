"""The webhook in DRA mode (issue 29, item 2): shares become ResourceClaims.

What the webhook writes is compared with what a real v1.36.2 cluster ran
(``tests/fixtures/dra``): the pod ``p50-a`` (``spec.resourceClaims`` +
``resources.claims``), the template ``gpu-50u-40gi`` and the claims the
controller-manager made from it. Names differ on purpose (``gpu-<container>``,
``metagpu-50u-40gi``); everything else is compared field by field. The reviews
are the captured AdmissionReviews of ``tests/fixtures/admission``, sent through
the real webhook server over TLS.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from typing import Any, Final

import aiohttp
import jsonpatch
import kubernetes_validate
import pytest
from pydantic import ValidationError

from certs.files import BundlePaths
from tests.conftest import load_admission_fixture
from tests.plugin.dra.fixtures import load
from tests.webhook.builders import container, gpu, pod, settings
from tests.webhook.conftest import client_context, webhook_config
from tests.webhook.http import ReviewClient
from webhook.admission import admit
from webhook.config import WebhookConfig
from webhook.dra import (
    Shape,
    claim_entry_name,
    claim_template,
    memory_for_units,
    parse_template_name,
    shapes_in,
)
from webhook.model import Decision, Denial, Mutation
from webhook.rules import RuleSettings
from webhook.server import running_webhook

Obj = dict[str, Any]
A100_MIB: Final = 81920
DRA: Final[Obj] = {"mode": "dra", "dra": {"gpu_memory_mib": A100_MIB}}
SETTINGS: Final = settings(**DRA)
MEMORY: Final = "metagpu.io/gpu-memory"
NVIDIA: Final = "nvidia.com/gpu"
METAGPU: Final = "cnvrg.io/metagpu"


# ------------------------------------------------------------------ helpers
def decide(review: Obj, s: RuleSettings = SETTINGS) -> Decision:
    return admit(review["request"], settings=s)


def applied(obj: Obj, patch: Any) -> Obj:
    out: Obj = jsonpatch.apply_patch(copy.deepcopy(obj), [dict(op) for op in patch])
    return out


def converted(review: Obj, s: RuleSettings = SETTINGS) -> tuple[Obj, Mutation]:
    decision = decide(review, s)
    assert isinstance(decision, Mutation), getattr(decision, "message", decision)
    return applied(review["request"]["object"], decision.patch), decision


def review_of(obj: Obj, *, operation: str = "CREATE", old: Obj | None = None) -> Obj:
    """An AdmissionReview for ``obj`` as the API server sends it."""
    group, _, version = obj["apiVersion"].rpartition("/")
    kind = obj["kind"]
    resource = {"group": group, "version": version, "resource": kind.lower() + "s"}
    request: Obj = {
        "uid": "u-1",
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": resource,
        "requestKind": {"group": group, "version": version, "kind": kind},
        "requestResource": resource,
        "name": obj["metadata"].get("name", ""),
        "namespace": obj["metadata"].get("namespace", "dra-cap"),
        "operation": operation,
        "userInfo": {"username": "tester"},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
        "options": None,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def captured_pod_body() -> Obj:
    """What ``p50-a`` was created with: the shape our output must have."""
    body: Obj = load("pod-p50-a-running.json")["created"]["request"]["body"]
    return body


def captured_template() -> Obj:
    stored: Obj = load("resourceclaimtemplate-50-units-40gi-accepted.json")["response"]["body"]
    return stored


def as_user_wrote(body: Obj, limits: Obj) -> Obj:
    """The captured pod as a user writes it for metagpu: a limit, no claims (defaulted:
    the API server copies limits into requests before webhooks run)."""
    out = copy.deepcopy(body)
    out["spec"].pop("resourceClaims")
    for c in out["spec"]["containers"]:
        c["resources"] = {"limits": dict(limits), "requests": dict(limits)}
    return out


def template_spec(obj: Obj) -> Obj:
    spec: Obj = obj["spec"]["template"]["spec"]
    return spec


def entry_names(spec: Obj) -> dict[str, str]:
    return {e["name"]: e["resourceClaimTemplateName"] for e in spec.get("resourceClaims", [])}


# --------------------------------------------------- captured shapes, pure
def test_the_template_for_50_units_is_the_captured_one() -> None:
    """Our template differs from ``gpu-50u-40gi`` by its name and our label only."""
    assert SETTINGS.dra is not None
    ours = claim_template(Shape(50, 40960), namespace="dra-cap", dra=SETTINGS.dra)
    stored = captured_template()
    assert ours["apiVersion"] == stored["apiVersion"] == "resource.k8s.io/v1"
    assert ours["kind"] == stored["kind"] == "ResourceClaimTemplate"
    assert ours["spec"] == stored["spec"]  # as stored: sorted capacity keys, empty metadata
    assert ours["metadata"]["name"] == "metagpu-50u-40gi"
    assert ours["metadata"]["namespace"] == stored["metadata"]["namespace"]
    assert ours["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "metagpu"}
    # ... and the controller-manager's claims from it carry exactly its spec.spec.
    for name in ("a", "b", "c"):
        claim = load(f"claim-p50-{name}-50-units-40gi-allocated.json")
        assert claim["spec"] == ours["spec"]["spec"]


def test_a_memory_only_template_is_the_captured_memory_only_claim() -> None:
    assert SETTINGS.dra is not None
    ours = claim_template(Shape(None, 10240), namespace="dra-cap", dra=SETTINGS.dra)
    assert ours["metadata"]["name"] == "metagpu-10gi"
    assert ours["spec"]["spec"] == load("claim-10gi-memory-only-allocated.json")["spec"]


def test_the_device_class_is_the_captured_one() -> None:
    stored = load("deviceclass-gpu-accepted.json")["response"]["body"]
    assert SETTINGS.dra is not None
    assert SETTINGS.dra.device_class_name == stored["metadata"]["name"]


@pytest.mark.parametrize(
    ("shape", "name"),
    [
        pytest.param(Shape(50, 40960), "metagpu-50u-40gi", id="units"),
        pytest.param(Shape(None, 10240), "metagpu-10gi", id="memory-only"),
        pytest.param(Shape(1, 1536), "metagpu-1u-1536mi", id="mib"),
        pytest.param(Shape(1000, 1048576), "metagpu-1000u-1024gi", id="largest"),
    ],
)
def test_template_names_round_trip(shape: Shape, name: str) -> None:
    assert shape.template_name("metagpu") == name
    assert parse_template_name(name, "metagpu") == shape


@pytest.mark.parametrize(
    "name",
    ["gpu-50u-40gi", "metagpu-50u", "metagpu-0u-1gi", "metagpu-50u-1024mi", "metagpu-x", "metagpu"],
)
def test_names_we_do_not_make_are_not_ours(name: str) -> None:
    assert parse_template_name(name, "metagpu") is None


@pytest.mark.parametrize(
    ("units", "memory_mib"),
    [
        pytest.param(50, 40960, id="half-of-80Gi"),
        pytest.param(33, 26624, id="26.4Gi-floored-to-26Gi"),
        pytest.param(1, 1024, id="at-least-min"),
        pytest.param(100, 81920, id="whole-gpu"),
    ],
)
def test_units_only_memory_is_the_device_plugins_limit_on_the_step(
    units: int, memory_mib: int
) -> None:
    assert SETTINGS.dra is not None
    assert memory_for_units(units, units_per_gpu=100, dra=SETTINGS.dra) == memory_mib


def test_an_h100s_odd_memory_never_asks_for_more_than_it_has() -> None:
    """81559 MiB (NVML on a lent H100): a whole GPU asks for 79Gi, which fits."""
    s = settings(mode="dra", dra={"gpu_memory_mib": 81559})
    assert s.dra is not None
    assert memory_for_units(100, units_per_gpu=100, dra=s.dra) == 79 * 1024
    assert 3 * memory_for_units(33, units_per_gpu=100, dra=s.dra) <= 81559


def test_long_container_names_get_a_dns_label_entry() -> None:
    long = "a" * 63
    name = claim_entry_name(long)
    assert len(name) <= 63
    assert name != claim_entry_name("a" * 62 + "b")
    assert claim_entry_name("c") == "gpu-c"


def test_mode_dra_needs_the_gpu_memory() -> None:
    with pytest.raises(ValidationError, match=r"dra\.gpu_memory_mib"):
        WebhookConfig.model_validate({"mode": "dra"})
    assert WebhookConfig.model_validate({}).mode == "device-plugin"
    with pytest.raises(ValidationError, match="memory needs a name of its own"):
        WebhookConfig.model_validate(
            {**DRA, "dra": {"gpu_memory_mib": 1, "memory_resource_name": NVIDIA}}
        )


# -------------------------------------------------- pods, against p50-a
@pytest.mark.parametrize(
    "limits",
    [
        pytest.param({NVIDIA: "500m"}, id="nvidia.com/gpu-0.5"),
        pytest.param({METAGPU: "50"}, id="cnvrg.io/metagpu-50"),
        pytest.param({NVIDIA: "500m", MEMORY: "40Gi"}, id="share-and-memory"),
    ],
)
def test_a_pod_gets_the_captured_claim_shape(limits: Obj) -> None:
    body = captured_pod_body()
    out, decision = converted(review_of(as_user_wrote(body, limits)))
    # Field by field against the captured pod, where only the names differ.
    (ours,) = out["spec"]["resourceClaims"]
    (theirs,) = body["spec"]["resourceClaims"]
    assert set(ours) == set(theirs) == {"name", "resourceClaimTemplateName"}
    assert ours == {"name": "gpu-c", "resourceClaimTemplateName": "metagpu-50u-40gi"}
    assert theirs["resourceClaimTemplateName"] == captured_template()["metadata"]["name"]
    (c,) = out["spec"]["containers"]
    (captured_c,) = body["spec"]["containers"]
    assert captured_c["resources"] == {"claims": [{"name": theirs["name"]}]}
    assert c["resources"] == {"claims": [{"name": ours["name"]}]}
    assert {k: v for k, v in c.items() if k != "resources"} == {
        k: v for k, v in captured_c.items() if k != "resources"
    }
    # The pod rules still ran (GPU-node tolerations, runtime class); no compute
    # policy: the share's CDI spec carries it.
    assert out["spec"]["runtimeClassName"] == "nvidia"
    assert out["spec"]["tolerations"]
    assert "metagpu.io/compute-policy" not in out["metadata"].get("annotations", {})
    assert "env" not in c
    assert decision.warnings == (
        'container "c": a GPU share of 50 units and 40Gi of GPU memory served through DRA: '
        "claim gpu-c from ResourceClaimTemplate metagpu-50u-40gi",
    )
    # A second admission of what was stored changes nothing.
    assert decide(review_of(out)) == Mutation()


def test_claim_pods_stay_with_the_clusters_scheduler() -> None:
    """The second scheduler exists to keep a share on one GPU; in DRA mode kube-scheduler's
    DRA plugin does that itself, so a claim pod is not sent to it (scheduler_name unused),
    and a pod naming another scheduler hears no warning about split shares."""
    with_scheduler = settings(**DRA, scheduler_name="metagpu-scheduler")
    body = captured_pod_body()
    out, decision = converted(review_of(as_user_wrote(body, {NVIDIA: "0.5"})), with_scheduler)
    assert "schedulerName" not in out["spec"]
    assert out["spec"]["resourceClaims"]
    named = as_user_wrote(body, {NVIDIA: "0.5"})
    named["spec"]["schedulerName"] = "volcano"
    _, decision = converted(review_of(named), with_scheduler)
    assert not [w for w in decision.warnings if "schedulerName" in w]
    device_plugin = settings(scheduler_name="metagpu-scheduler")
    out, _ = converted(review_of(as_user_wrote(body, {NVIDIA: "0.5"})), device_plugin)
    assert out["spec"]["schedulerName"] == "metagpu-scheduler"


def test_memory_alone_is_the_captured_memory_only_claim() -> None:
    body = captured_pod_body()
    out, _ = converted(review_of(as_user_wrote(body, {MEMORY: "10Gi"})))
    assert entry_names(out["spec"]) == {"gpu-c": "metagpu-10gi"}
    assert out["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpu-c"}]}
    assert out["spec"]["tolerations"]  # a GPU pod all the same
    assert decide(review_of(out)) == Mutation()


def test_other_resources_stay() -> None:
    review = load_admission_fixture("pod-half-gpu.json")
    out, _ = converted(review)
    (c,) = out["spec"]["containers"]
    assert c["resources"] == {
        "limits": {"cpu": "1", "memory": "1Gi"},
        "requests": {"cpu": "1", "memory": "1Gi"},
        "claims": [{"name": "gpu-train"}],
    }
    assert entry_names(out["spec"]) == {"gpu-train": "metagpu-50u-40gi"}
    record = json.loads(out["metadata"]["annotations"]["metagpu.io/original-request"])
    assert record == {"train": {NVIDIA: "500m"}}


def test_init_containers_and_sidecars_as_the_kubelet_holds_claims() -> None:
    """A regular init container runs alone before the others: it shares an app
    container's claim of the same shape. A sidecar runs beside them: its own."""
    p = pod(
        gpu("500m", name="train"),
        gpu("250m", name="eval"),
        init=[
            gpu("500m", name="warmup"),
            gpu("300m", name="fetch"),
            {**gpu("250m", name="shipper"), "restartPolicy": "Always"},
        ],
    )
    out, _ = converted(review_of(p))
    spec = out["spec"]
    assert entry_names(spec) == {
        "gpu-train": "metagpu-50u-40gi",
        "gpu-fetch": "metagpu-30u-24gi",
        "gpu-shipper": "metagpu-25u-20gi",
        "gpu-eval": "metagpu-25u-20gi",
    }
    claims = {
        c["name"]: c["resources"]["claims"] for c in [*spec["initContainers"], *spec["containers"]]
    }
    assert claims == {
        "warmup": [{"name": "gpu-train"}],
        "fetch": [{"name": "gpu-fetch"}],
        "shipper": [{"name": "gpu-shipper"}],
        "train": [{"name": "gpu-train"}],
        "eval": [{"name": "gpu-eval"}],
    }
    assert decide(review_of(out)) == Mutation()


def test_the_captured_init_and_sidecar_pod_is_denied_for_its_1_5_gpus() -> None:
    decision = decide(load_admission_fixture("pod-init-sidecar-two-containers-fractions.json"))
    assert isinstance(decision, Denial)
    assert decision.message == (
        'container "train" asks for 150 units (1.5 GPUs); in DRA mode a share is part of one '
        "GPU: ask for at most 1 GPU (cnvrg.io/metagpu: 100), or for whole GPUs with "
        "nvidia.com/gpu (served by NVIDIA's device plugin)"
    )
    assert not any("converted to" in w for w in decision.warnings)


def test_pods_of_a_converted_template_are_gpu_pods() -> None:
    """They arrive with the claim and no units: tolerations and hardening still apply."""
    p = pod(container("c", resources={"claims": [{"name": "gpu-c"}]}))
    p["spec"]["resourceClaims"] = [
        {"name": "gpu-c", "resourceClaimTemplateName": "metagpu-50u-40gi"}
    ]
    out, decision = converted(review_of(p))
    assert out["spec"]["tolerations"]
    assert out["spec"]["runtimeClassName"] == "nvidia"
    assert out["spec"]["resourceClaims"] == p["spec"]["resourceClaims"]
    assert decision.warnings == ()
    p["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    denied = decide(review_of(p))
    assert isinstance(denied, Denial)
    assert "a GPU share (a DRA claim)" in denied.message


def test_device_plugin_mode_is_unchanged() -> None:
    """The default mode never writes claims."""
    out, _ = converted(load_admission_fixture("pod-half-gpu.json"), settings())
    assert "resourceClaims" not in out["spec"]
    assert out["spec"]["containers"][0]["resources"]["limits"][METAGPU] == "50"


# ---------------------------------------------------------------- denials
@pytest.mark.parametrize(
    ("c", "message"),
    [
        pytest.param(
            gpu("1500m", name="c"),
            'container "c" asks for 150 units (1.5 GPUs); in DRA mode a share is part of one GPU',
            id="more-than-one-gpu",
        ),
        pytest.param(
            gpu("100Gi", name="c", resource=MEMORY),
            'container "c": metagpu.io/gpu-memory "100Gi" is more than a GPU has (80Gi, '
            "dra.gpu_memory_mib); ask for a whole number of MiB up to the GPU's 80Gi",
            id="memory-above-the-gpu",
        ),
        pytest.param(
            gpu("1500k", name="c", resource=MEMORY),
            'container "c": metagpu.io/gpu-memory "1500k" is not a whole number of MiB',
            id="memory-not-whole-mib",
        ),
        pytest.param(
            gpu("0", name="c", resource=MEMORY),
            'container "c": metagpu.io/gpu-memory "0" asks for no memory',
            id="no-memory",
        ),
        pytest.param(
            container("c", limits={NVIDIA: "1", MEMORY: "10Gi"}),
            'container "c" asks for metagpu.io/gpu-memory beside whole GPUs (nvidia.com/gpu)',
            id="memory-beside-whole-gpus",
        ),
        pytest.param(
            gpu("30", name="c", resource="cnvrg.io/metagpu-a100"),
            'container "c": cnvrg.io/metagpu-a100 is a per-model pool, which DRA mode does '
            "not have yet",
            id="per-model-pool",
        ),
        pytest.param(
            container("c", limits={MEMORY: "10Gi"}, requests={MEMORY: "20Gi"}),
            'container "c": metagpu.io/gpu-memory limits ("10Gi") and requests ("20Gi") disagree',
            id="limits-and-requests-disagree",
        ),
    ],
)
def test_what_dra_mode_cannot_express_is_denied(c: Obj, message: str) -> None:
    s = settings(**DRA, extra_resource_names=["cnvrg.io/metagpu-a100"])
    decision = decide(review_of(pod(c)), s)
    assert isinstance(decision, Denial), decision
    assert message in decision.message
    assert decision.code == 400


def test_a_claim_of_the_users_with_our_entry_name_is_denied() -> None:
    p = pod(gpu("500m", name="c"))
    p["spec"]["resourceClaims"] = [{"name": "gpu-c", "resourceClaimName": "mine"}]
    decision = decide(review_of(p))
    assert isinstance(decision, Denial)
    assert "spec.resourceClaims already has an entry 'gpu-c' that metagpu did not write" in (
        decision.message
    )


def test_pod_level_gpu_memory_is_denied() -> None:
    p = pod(gpu("500m", name="c"))
    p["spec"]["resources"] = {"limits": {MEMORY: "10Gi"}}
    decision = decide(review_of(p))
    assert isinstance(decision, Denial)
    assert "pod-level spec.resources.limits cannot hold metagpu.io/gpu-memory" in decision.message


# -------------------------------------------------------------- workloads
def test_a_deployment_template_gets_the_claims() -> None:
    review = load_admission_fixture("deployment-half-gpu.json")
    out, decision = converted(review)
    spec = template_spec(out)
    body = captured_pod_body()
    assert entry_names(spec) == {"gpu-jupyter": "metagpu-50u-40gi"}
    assert set(spec["resourceClaims"][0]) == set(body["spec"]["resourceClaims"][0])
    assert spec["containers"][0]["resources"] == {"claims": [{"name": "gpu-jupyter"}]}
    assert decision.warnings[0].startswith('Deployment template: container "jupyter": ')
    # The template's pods arrive as the template has them: nothing more to convert.
    assert decide(review_of(out)) == Mutation()
    assert shapes_in(spec, prefix="metagpu") == {Shape(50, 40960)}


def merged_again(stored: Obj, limits: Obj, container_index: int = 0) -> Obj:
    """What ``kubectl apply`` (three-way merge), SSA and helm send when the manifest is
    applied again: the stored object (with the claims) plus the manifest's request."""
    out = copy.deepcopy(stored)
    spec = template_spec(out) if out["kind"] != "Pod" else out["spec"]
    c = spec["containers"][container_index]
    c["resources"].setdefault("limits", {}).update(limits)
    if out["kind"] == "Pod":
        c["resources"].setdefault("requests", {}).update(limits)
    return out


@pytest.mark.parametrize("limits", [{NVIDIA: "500m"}, {NVIDIA: "500m", MEMORY: "40Gi"}])
def test_reapplying_a_deployment_gives_the_stored_object(limits: Obj) -> None:
    create = load_admission_fixture("deployment-half-gpu.json")
    create["request"]["object"]["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": dict(limits)
    }
    stored, _ = converted(create)
    again = review_of(merged_again(stored, limits), operation="UPDATE", old=stored)
    out, decision = converted(again)
    assert out == stored
    assert decide(review_of(out, operation="UPDATE", old=stored)) == Mutation()
    assert not any("→" in w for w in decision.warnings)


def test_a_reapplied_deployment_follows_a_changed_share() -> None:
    stored, _ = converted(load_admission_fixture("deployment-half-gpu.json"))
    again = review_of(merged_again(stored, {NVIDIA: "700m"}), operation="UPDATE", old=stored)
    out, decision = converted(again)
    spec = template_spec(out)
    assert entry_names(spec) == {"gpu-jupyter": "metagpu-70u-56gi"}
    assert spec["containers"][0]["resources"] == {"claims": [{"name": "gpu-jupyter"}]}
    assert (
        'Deployment template: container "jupyter": GPU share changed: ResourceClaimTemplate '
        "metagpu-50u-40gi → metagpu-70u-56gi"
    ) in decision.warnings


def test_a_reapplied_pod_comes_back_and_a_changed_one_is_refused() -> None:
    stored, _ = converted(load_admission_fixture("pod-half-gpu.json"))
    same = review_of(merged_again(stored, {NVIDIA: "500m"}), operation="UPDATE", old=stored)
    out, _ = converted(same)
    assert out == stored
    changed = review_of(merged_again(stored, {NVIDIA: "700m"}), operation="UPDATE", old=stored)
    decision = decide(changed)
    assert isinstance(decision, Denial)
    assert decision.message == (
        'container "train": the manifest asks for a GPU share of 70 units and 56Gi of GPU '
        "memory, but this pod was created with ResourceClaimTemplate metagpu-50u-40gi and a "
        "running pod's GPU share cannot change; delete the pod and create it again (or change "
        "the share in its Deployment, Job or other workload, whose pods are then replaced)"
    )


def test_a_pod_update_of_a_device_plugin_pod_keeps_its_units() -> None:
    """A pod created before the switch to DRA mode holds units; its claims cannot be added."""
    stored, _ = converted(load_admission_fixture("pod-half-gpu.json"), settings())
    labelled = copy.deepcopy(stored)
    labelled["metadata"].setdefault("labels", {})["x"] = "y"
    assert decide(review_of(labelled, operation="UPDATE", old=stored)) == Mutation()


def test_opted_out_pods_are_left_alone() -> None:
    p = pod(gpu("50", name="c", resource=METAGPU), labels={"metagpu.io/inject": "false"})
    assert decide(review_of(p)) == Mutation()


# ------------------------------------------------------ through the server
@pytest.fixture
async def dra_client(ca_bundle: BundlePaths) -> AsyncIterator[ReviewClient]:
    async with (
        running_webhook(webhook_config(ca_bundle, **DRA)) as hook,
        aiohttp.ClientSession() as session,
    ):
        yield ReviewClient(session, hook.url, client_context(ca_bundle.ca_file))


async def test_the_server_answers_pods_and_deployments_with_claims(
    dra_client: ReviewClient,
) -> None:
    body = captured_pod_body()
    for review, spec_of in (
        (review_of(as_user_wrote(body, {NVIDIA: "500m"})), lambda o: o["spec"]),
        (load_admission_fixture("deployment-half-gpu.json"), template_spec),
    ):
        answer = await dra_client.post(review)
        assert answer.status == 200
        response = answer.response
        assert response["allowed"] is True
        assert response["uid"] == review["request"]["uid"]
        out = applied(review["request"]["object"], answer.patch)
        spec = spec_of(out)
        (entry,) = spec["resourceClaims"]
        assert entry["resourceClaimTemplateName"] == "metagpu-50u-40gi"
        assert spec["containers"][0]["resources"]["claims"] == [{"name": entry["name"]}]
        assert not any(
            NVIDIA in r or METAGPU in r
            for r in (
                spec["containers"][0]["resources"].get("limits", {}),
                spec["containers"][0]["resources"].get("requests", {}),
            )
        )
        again = await dra_client.post(review_of(out))
        assert again.response["allowed"] is True
        assert "patch" not in again.response


async def test_the_server_denies_with_the_message(dra_client: ReviewClient) -> None:
    p = pod(gpu("100Gi", name="c", resource=MEMORY))
    answer = await dra_client.post(review_of(p))
    response = answer.response
    assert answer.status == 200
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert "is more than a GPU has (80Gi" in response["status"]["message"]


@pytest.mark.parametrize(
    ("limits", "template", "capacity"),
    [
        pytest.param({NVIDIA: "500m"}, "metagpu-50u-40gi", {"memory": "40Gi", "units": "50"}),
        pytest.param({MEMORY: "10Gi"}, "metagpu-10gi", {"memory": "10Gi"}),
        pytest.param(
            {NVIDIA: "500m", MEMORY: "10Gi"}, "metagpu-50u-10gi", {"memory": "10Gi", "units": "50"}
        ),
        pytest.param({NVIDIA: "1"}, None, None),
    ],
)
def test_the_documented_table(limits: Obj, template: str | None, capacity: Obj | None) -> None:
    """docs/webhook.md, "DRA mode": what a container writes and the claim it gets."""
    out, _ = converted(review_of(as_user_wrote(captured_pod_body(), limits)))
    if template is None:
        assert "resourceClaims" not in out["spec"]
        return
    assert entry_names(out["spec"]) == {"gpu-c": template}
    shape = parse_template_name(template, "metagpu")
    assert shape is not None
    assert shape.capacity_requests() == capacity


def deployment(*containers: Obj, init: tuple[Obj, ...] = ()) -> Obj:
    spec: Obj = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "team-a"},
        "spec": {
            "selector": {"matchLabels": {"app": "x"}},
            "template": {"metadata": {"labels": {"app": "x"}}, "spec": spec},
        },
    }


def test_an_init_container_whose_twin_changed_gets_its_own_claim() -> None:
    """Its share no longer matches an app container's: it moves to its own claim, and
    holds no reference to its twin's any more."""
    stored, _ = converted(
        review_of(
            deployment(
                container("train", limits={NVIDIA: "500m"}),
                init=(container("warmup", limits={NVIDIA: "500m"}),),
            )
        )
    )
    spec = template_spec(stored)
    assert entry_names(spec) == {"gpu-train": "metagpu-50u-40gi"}
    assert spec["initContainers"][0]["resources"] == {"claims": [{"name": "gpu-train"}]}
    merged = copy.deepcopy(stored)
    m = template_spec(merged)
    m["containers"][0]["resources"]["limits"] = {NVIDIA: "700m"}
    m["initContainers"][0]["resources"]["limits"] = {NVIDIA: "500m"}
    out, _ = converted(review_of(merged, operation="UPDATE", old=stored))
    spec = template_spec(out)
    assert entry_names(spec) == {"gpu-train": "metagpu-70u-56gi", "gpu-warmup": "metagpu-50u-40gi"}
    assert spec["initContainers"][0]["resources"] == {"claims": [{"name": "gpu-warmup"}]}
    assert spec["containers"][0]["resources"] == {"claims": [{"name": "gpu-train"}]}


def test_a_renamed_container_leaves_no_claim_behind() -> None:
    """kubectl's merge drops the old container but keeps the claim entry the webhook
    added: it goes, or it would hold a GPU share for nothing."""
    stored, _ = converted(review_of(deployment(container("a", limits={NVIDIA: "500m"}))))
    merged = copy.deepcopy(stored)
    template_spec(merged)["containers"] = [container("b", limits={NVIDIA: "500m"})]
    out, decision = converted(review_of(merged, operation="UPDATE", old=stored))
    spec = template_spec(out)
    assert entry_names(spec) == {"gpu-b": "metagpu-50u-40gi"}
    assert "claim gpu-a removed: no container uses it any more" in decision.warnings[-1]


def test_the_users_own_claims_are_kept() -> None:
    d = deployment(
        container("a", resources={"limits": {NVIDIA: "500m"}, "claims": [{"name": "nic"}]})
    )
    template_spec(d)["resourceClaims"] = [{"name": "nic", "resourceClaimTemplateName": "rdma"}]
    out, _ = converted(review_of(d))
    spec = template_spec(out)
    assert entry_names(spec) == {"nic": "rdma", "gpu-a": "metagpu-50u-40gi"}
    assert spec["containers"][0]["resources"]["claims"] == [{"name": "nic"}, {"name": "gpu-a"}]


def test_kubectl_debug_in_a_dra_gpu_pod_may_not_see_every_gpu() -> None:
    stored, _ = converted(load_admission_fixture("pod-half-gpu.json"))
    debugged = copy.deepcopy(stored)
    debugged["spec"]["ephemeralContainers"] = [
        {
            "name": "debug",
            "image": "busybox",
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        }
    ]
    review = review_of(debugged, operation="UPDATE", old=stored)
    review["request"]["subResource"] = "ephemeralcontainers"
    decision = decide(review)
    assert isinstance(decision, Denial)
    assert 'ephemeral container "debug"' in decision.message


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(
            lambda: load_admission_fixture("pod-half-gpu.json")["request"]["object"], id="pod"
        ),
        pytest.param(
            lambda: load_admission_fixture("deployment-half-gpu.json")["request"]["object"],
            id="deployment",
        ),
        pytest.param(
            lambda: pod(
                gpu("500m", name="train"),
                init=[
                    gpu("500m", name="warmup"),
                    {**gpu("10Gi", name="s", resource=MEMORY), "restartPolicy": "Always"},
                ],
            ),
            id="init-and-sidecar",
        ),
    ],
)
def test_what_it_writes_passes_the_1_36_schema(obj: Any) -> None:
    """The objects and the templates they name, strictly against Kubernetes 1.36's OpenAPI."""
    out, _ = converted(review_of(obj()))
    kubernetes_validate.validate(out, "1.36", strict=True)
    spec = out["spec"] if out["kind"] == "Pod" else template_spec(out)
    assert SETTINGS.dra is not None
    for shape in shapes_in(spec, prefix="metagpu"):
        template = claim_template(shape, namespace="team-a", dra=SETTINGS.dra)
        kubernetes_validate.validate(template, "1.36", strict=True)
