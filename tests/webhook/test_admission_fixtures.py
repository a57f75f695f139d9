"""The captured AdmissionReviews (kube-apiserver v1.36) through the real HTTPS server.

Each fixture is posted over TLS by a client that trusts only the test CA; the
response must echo the uid, and an allowed response's patch, applied to the
request object, must give an object that ``kubernetes-validate`` accepts and
that the API server's extended-resource checks would accept (the check that
failed in the captures without a webhook). Posting the patched object again
must give no patch (rule 7).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest

from tests.conftest import admission_fixture_names, load_admission_fixture
from tests.webhook.builders import env_of
from tests.webhook.http import HttpAnswer, ReviewClient

KUBERNETES_VERSION = "1.36"
"""The version the fixtures were captured from; kubernetes-validate 1.37 ships its schema."""

METAGPU = "cnvrg.io/metagpu"
ORIGINAL = "metagpu.io/original-request"
TOLERATIONS = [
    {"key": METAGPU, "operator": "Equal", "value": "present", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
]
Obj = dict[str, Any]


def validate_like_the_api_server(obj: Obj) -> None:
    """Schema validation plus the extended-resource rules the captures failed on."""
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    pod_spec = obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]
    for kind in ("initContainers", "containers"):
        for c in pod_spec.get(kind) or []:
            resources = c.get("resources") or {}
            limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
            for name in {**limits, **requests}:
                if "/" not in name:
                    continue  # cpu, memory: not extended resources
                assert name in limits, f"{c['name']}: {name}: Limit must be set"
                assert str(limits[name]).isdigit(), f"{c['name']}: {name} must be an integer"
                if name in requests:
                    assert requests[name] == limits[name], f"{c['name']}: {name} must be equal"


def patched(fixture: Obj, answer: HttpAnswer) -> Obj:
    obj = copy.deepcopy(fixture["request"]["object"])
    out: Obj = jsonpatch.apply_patch(obj, answer.patch)
    return out


def container(obj: Obj, name: str) -> Obj:
    spec = obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or []:
            if c["name"] == name:
                found: Obj = c
                return found
    raise KeyError(name)


def units(obj: Obj, name: str) -> tuple[str | None, str | None]:
    resources = container(obj, name).get("resources") or {}
    return (resources.get("limits") or {}).get(METAGPU), (resources.get("requests") or {}).get(
        METAGPU
    )


# ---------------------------------------------------------------- checks
def half_gpu(fixture: Obj, out: Obj, answer: HttpAnswer) -> None:
    train = container(out, "train")
    assert train["resources"] == {
        "limits": {"cpu": "1", "memory": "1Gi", METAGPU: "50"},
        "requests": {"cpu": "1", "memory": "1Gi", METAGPU: "50"},
    }
    assert out["spec"]["tolerations"][-2:] == TOLERATIONS
    assert out["spec"]["runtimeClassName"] == "nvidia"
    assert env_of(train) == {"METAGPU_COMPUTE_POLICY": "balance"}
    assert out["metadata"]["annotations"]["metagpu.io/compute-policy"] == "balance"
    assert json.loads(out["metadata"]["annotations"][ORIGINAL]) == {
        "train": {"nvidia.com/gpu": "500m"}
    }
    assert any("converted to cnvrg.io/metagpu 50" in w for w in answer.response["warnings"])


def seed_example(fixture: Obj, out: Obj, answer: HttpAnswer) -> None:
    assert units(out, "gpu-test-with-gpu") == ("30", "30")
    assert out["spec"]["tolerations"] == [{"operator": "Exists"}]  # tolerates everything already
    assert out["spec"]["runtimeClassName"] == "nvidia"


def from_job(fixture: Obj, out: Obj, answer: HttpAnswer) -> None:
    assert units(out, "infer") == ("50", "50")
    assert "name" not in out["metadata"]
    assert out["metadata"]["generateName"] == "batch-infer-"
    assert out["spec"]["tolerations"][-2:] == TOLERATIONS


def init_and_sidecar(fixture: Obj, out: Obj, answer: HttpAnswer) -> None:
    assert units(out, "warmup") == ("25", "25")
    assert units(out, "train") == ("150", "150")
    assert units(out, "eval") == ("20", "20")
    sidecar = container(out, "log-shipper")
    assert sidecar["resources"] == {}
    assert env_of(sidecar) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert env_of(container(out, "train")) == {"EPOCHS": "3", "METAGPU_COMPUTE_POLICY": "balance"}
    assert container(out, "train")["resources"]["limits"]["memory"] == "2Gi"
    assert out["metadata"]["annotations"]["team"] == "vision"


def no_gpu(fixture: Obj, out: Obj, answer: HttpAnswer) -> None:
    assert answer.patch == []
    assert "patchType" not in answer.response


def deployment(fixture: Obj, out: Obj, answer: HttpAnswer) -> None:
    template = out["spec"]["template"]
    assert units(out, "jupyter") == ("50", "50")
    assert "nvidia.com/gpu" not in template["spec"]["containers"][0]["resources"]["limits"]
    assert "tolerations" not in template["spec"]  # rule 1 only; the pod rules do the rest
    assert "runtimeClassName" not in template["spec"]
    assert json.loads(template["metadata"]["annotations"][ORIGINAL]) == {
        "jupyter": {"nvidia.com/gpu": "500m"}
    }


def reapplied_unchanged(fixture: Obj, out: Obj, answer: HttpAnswer) -> None:
    """A manifest applied again: the object comes back to exactly what is stored.

    So ``kubectl diff`` and a GitOps tool's server-side diff see no change.
    """
    stored = fixture["request"]["oldObject"]
    assert out["spec"] == stored["spec"]
    assert units(out, "main") == ("50", "50")
    assert not any("→" in w for w in answer.response.get("warnings", []))


def reapplied_changed(fixture: Obj, out: Obj, answer: HttpAnswer) -> None:
    """The fraction changed 0.5 → 0.7: the units follow it, and so does the record."""
    template = out["spec"]["template"]
    assert template["spec"]["containers"][0]["resources"] == {
        "limits": {METAGPU: "70"},
        "requests": {METAGPU: "70"},
    }
    assert json.loads(template["metadata"]["annotations"][ORIGINAL]) == {
        "main": {"nvidia.com/gpu": "700m"}
    }
    assert any(
        'nvidia.com/gpu 0.7 ("700m"): cnvrg.io/metagpu 50 → 70' in w
        for w in answer.response["warnings"]
    )


def replaced(fixture: Obj, out: Obj, answer: HttpAnswer) -> None:
    """``kubectl replace`` of the original manifest: converted again, as on create."""
    assert container(out, "main")["resources"] == {
        "limits": {METAGPU: "50"},
        "requests": {METAGPU: "50"},
    }
    assert json.loads(out["spec"]["template"]["metadata"]["annotations"][ORIGINAL]) == {
        "main": {"nvidia.com/gpu": "500m"}
    }


def unchanged(fixture: Obj, out: Obj, answer: HttpAnswer) -> None:
    assert answer.patch == []
    assert "patchType" not in answer.response
    assert "warnings" not in answer.response


ALLOWED: dict[str, Callable[[Obj, Obj, HttpAnswer], None]] = {
    "pod-half-gpu.json": half_gpu,
    "pod-seed-example-metagpu-30.json": seed_example,
    "pod-from-job-metagpu-50.json": from_job,
    "pod-init-sidecar-two-containers-fractions.json": init_and_sidecar,
    "pod-no-gpu.json": no_gpu,
    "pod-dry-run-0.3-gpu.json": lambda f, o, a: None,  # compared below with its non-dry twin
    "pod-update-metagpu.json": unchanged,
    "pod-update-no-gpu.json": unchanged,
    "deployment-half-gpu.json": deployment,
    "statefulset-metagpu-20.json": unchanged,
    "deployment-reapply-client-side-same.json": reapplied_unchanged,
    "deployment-helm-upgrade-same.json": reapplied_unchanged,
    "deployment-reapply-client-side-0.7.json": reapplied_changed,
    "deployment-rollout-restart.json": unchanged,
    "deployment-replace.json": replaced,
}

DENIED: dict[str, tuple[int, list[str]]] = {
    "pod-0.333-gpu.json": (400, ['container "c"', "0.333", "0.33 or 0.34"]),
    "pod-sets-nvidia-visible-devices.json": (
        403,
        ['container "c"', "NVIDIA_VISIBLE_DEVICES=all", "remove NVIDIA_VISIBLE_DEVICES"],
    ),
}


def test_every_fixture_has_an_expectation() -> None:
    assert set(admission_fixture_names()) == set(ALLOWED) | set(DENIED)


@pytest.mark.parametrize("name", sorted(ALLOWED))
async def test_allowed_fixture(client: ReviewClient, name: str) -> None:
    fixture = load_admission_fixture(name)
    answer = await client.post(fixture)
    assert answer.status == 200, answer.text
    assert answer.review["apiVersion"] == "admission.k8s.io/v1"
    assert answer.review["kind"] == "AdmissionReview"
    assert answer.response["uid"] == fixture["request"]["uid"]
    assert answer.response["allowed"] is True
    out = patched(fixture, answer)
    validate_like_the_api_server(out)
    ALLOWED[name](fixture, out, answer)
    again = copy.deepcopy(fixture)
    again["request"]["object"] = out
    second = await client.post(again)
    assert second.status == 200
    assert second.patch == [], f"not idempotent over HTTP: {second.patch}"


@pytest.mark.parametrize("name", sorted(DENIED))
async def test_denied_fixture(client: ReviewClient, name: str) -> None:
    fixture = load_admission_fixture(name)
    code, must_contain = DENIED[name]
    answer = await client.post(fixture)
    assert answer.status == 200, answer.text
    response = answer.response
    assert response["uid"] == fixture["request"]["uid"]
    assert response["allowed"] is False
    assert "patch" not in response
    assert response["status"]["code"] == code
    for text in must_contain:
        assert text in response["status"]["message"]


async def test_dry_run_gets_the_same_patch_as_a_real_request(client: ReviewClient) -> None:
    fixture = load_admission_fixture("pod-dry-run-0.3-gpu.json")
    assert fixture["request"]["dryRun"] is True
    real = copy.deepcopy(fixture)
    real["request"]["dryRun"] = False
    dry_answer, real_answer = await client.post(fixture), await client.post(real)
    assert dry_answer.patch == real_answer.patch
    assert dry_answer.patch != []
    assert units(patched(fixture, dry_answer), "c") == ("30", "30")
