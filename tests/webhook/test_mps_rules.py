"""Rule 5 (MPS): no way around the node's MPS limits from the pod spec.

Table-driven on pod dicts, then through the AdmissionReview v1 path with the
captured ``pod-half-gpu.json`` request (../shared/fixtures/admission/) given the
variables and volumes a pod author could add.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from tests.conftest import load_admission_fixture
from tests.webhook.builders import allowed, applied, denied, env_of, gpu, pod, settings
from webhook.admission import admit
from webhook.mps import exposes
from webhook.review import build_response, parse_review
from webhook.rules import mutate_pod

FIXED = {"metagpu.io/compute-policy": "fixed"}
BALANCE = {"metagpu.io/compute-policy": "balance"}


@pytest.mark.parametrize(
    ("var", "value", "expected"),
    [
        pytest.param(
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            "0=80G",
            ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=80G", "memory limit from the container's share"],
            id="own memory limit",
        ),
        pytest.param(
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            "0=1G",
            ["set_per_process_memory_fraction"],
            id="even a small one: admission cannot know the GPU's size",
        ),
        pytest.param(
            "CUDA_MPS_PIPE_DIRECTORY",
            "/tmp/elsewhere",
            ["CUDA_MPS_PIPE_DIRECTORY=/tmp/elsewhere", "without the MPS limits"],
            id="another daemon, or none",
        ),
        pytest.param(
            "CUDA_MPS_LOG_DIRECTORY",
            "/tmp/log",
            ["CUDA_MPS_LOG_DIRECTORY=/tmp/log", "belongs to the node's MPS daemon"],
            id="the daemon's log directory",
        ),
    ],
)
def test_escaping_variables_are_denied(var: str, value: str, expected: list[str]) -> None:
    p = pod(gpu("0.5", env=[{"name": var, "value": value}]), annotations=BALANCE)
    message = denied(mutate_pod(p, settings=settings())).message
    for part in [*expected, f"remove {var} from its env"]:
        assert part in message


def test_a_variable_from_value_from_is_named_as_such() -> None:
    ref = {"configMapKeyRef": {"name": "c", "key": "k"}}
    p = pod(gpu("0.5", env=[{"name": "CUDA_MPS_PIPE_DIRECTORY", "valueFrom": ref}]))
    assert (
        "CUDA_MPS_PIPE_DIRECTORY (from valueFrom)"
        in denied(mutate_pod(p, settings=settings())).message
    )


def test_strip_policy_removes_them_with_a_warning() -> None:
    env = [
        {"name": "A", "value": "1"},
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=80G"},
        {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/x"},
    ]
    p = pod(gpu("0.5", env=env), annotations=BALANCE)
    decision = allowed(mutate_pod(p, settings=settings(visible_devices_policy="strip")))
    out = env_of(applied(p, decision)["spec"]["containers"][0])
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in out
    assert "CUDA_MPS_PIPE_DIRECTORY" not in out
    assert out["A"] == "1"
    assert any("removed CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=80G" in w for w in decision.warnings)


def test_per_context_partitioning_is_denied_under_fixed_only() -> None:
    env = [{"name": "CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING", "value": "1"}]
    message = denied(mutate_pod(pod(gpu("0.5", env=env), annotations=FIXED), settings=settings()))
    assert "its compute policy is fixed" in message.message
    allowed(mutate_pod(pod(gpu("0.5", env=env), annotations=BALANCE), settings=settings()))


@pytest.mark.parametrize(
    ("annotations", "cap"),
    [
        pytest.param(FIXED, "25", id="fixed: a stricter cap than the 50% share"),
        pytest.param(BALANCE, "25", id="balance: any cap is stricter than none"),
        pytest.param(BALANCE, "100", id="balance: a cap of 100 is none"),
    ],
)
def test_stricter_compute_caps_are_kept(annotations: dict[str, str], cap: str) -> None:
    env = [{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": cap}]
    p = pod(gpu("0.5", env=env), annotations=annotations)
    out = env_of(applied(p, allowed(mutate_pod(p, settings=settings())))["spec"]["containers"][0])
    assert out["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == cap


def test_priority_can_only_be_lowered_so_it_is_kept() -> None:
    env = [{"name": "CUDA_MPS_CLIENT_PRIORITY", "value": "1"}]
    allowed(mutate_pod(pod(gpu("0.5", env=env)), settings=settings()))


def test_a_container_without_a_gpu_may_set_them() -> None:
    sidecar = {
        "name": "side",
        "image": "busybox:1",
        "env": [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/x"}],
    }
    allowed(mutate_pod(pod(gpu("0.5"), sidecar), settings=settings()))


def test_opting_out_does_not_switch_the_check_off() -> None:
    env = [{"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=80G"}]
    p = pod(gpu("50", resource="cnvrg.io/metagpu", env=env), labels={"metagpu.io/inject": "false"})
    message = denied(mutate_pod(p, settings=settings(visible_devices_policy="strip"))).message
    assert "cannot be removed for you" in message


@pytest.mark.parametrize(
    ("host_path", "denied_for"),
    [
        pytest.param("/var/run/metagpu-mps", "/var/run/metagpu-mps", id="the pipe directory"),
        pytest.param("/run/metagpu-mps", "/var/run/metagpu-mps", id="the same through /run"),
        pytest.param("/var/run", "/var/run/metagpu-mps", id="a directory above it"),
        pytest.param("/", "/tmp/nvidia-mps", id="the root"),
        pytest.param("/tmp/nvidia-mps/control", "/tmp/nvidia-mps", id="its control socket"),
    ],
)
def test_host_path_mounts_of_the_pipe_directory_are_denied(host_path: str, denied_for: str) -> None:
    volumes = [{"name": "v", "hostPath": {"path": host_path}}]
    message = denied(mutate_pod(pod(gpu("0.5"), volumes=volumes), settings=settings())).message
    assert f"mounts hostPath {host_path}" in message
    assert f"{denied_for} holds the node's MPS daemon pipes" in message


def test_other_host_paths_and_gpu_less_pods_are_left_alone() -> None:
    volumes = [{"name": "data", "hostPath": {"path": "/data/sets"}}]
    allowed(mutate_pod(pod(gpu("0.5"), volumes=volumes), settings=settings()))
    pipe = [{"name": "v", "hostPath": {"path": "/var/run/metagpu-mps"}}]
    allowed(mutate_pod(pod(volumes=pipe), settings=settings()))  # not a metagpu pod
    allowed(mutate_pod(pod(gpu("0.5"), volumes=pipe), settings=settings(mps_host_directories=[])))


@pytest.mark.parametrize(
    ("mounted", "protected", "expected"),
    [
        ("/tmp", "/tmp/nvidia-mps", True),
        ("/tmp/nvidia-mps-other", "/tmp/nvidia-mps", False),
        ("relative/path", "/tmp/nvidia-mps", False),
        ("/var/run/metagpu-mps/", "/run/metagpu-mps", True),
    ],
)
def test_exposes(mounted: str, protected: str, expected: bool) -> None:
    assert exposes(mounted, protected) is expected


def review_with(mutate: Any) -> dict[str, Any]:
    """The captured half-GPU pod request, with what the pod author added."""
    review = copy.deepcopy(load_admission_fixture("pod-half-gpu.json"))
    mutate(review["request"]["object"])
    return review


def answer(review: dict[str, Any]) -> dict[str, Any]:
    request = parse_review(review)
    return dict(build_response(request["uid"], admit(request, settings=settings()))["response"])


def test_admission_review_denies_an_escaping_variable() -> None:
    def add_env(obj: dict[str, Any]) -> None:
        obj["spec"]["containers"][0]["env"] = [
            {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=79G"}
        ]

    response = answer(review_with(add_env))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=79G" in response["status"]["message"]


def test_admission_review_denies_a_pipe_mount_and_keeps_a_stricter_cap() -> None:
    def add_volume(obj: dict[str, Any]) -> None:
        obj["spec"].setdefault("volumes", []).append(
            {"name": "mps", "hostPath": {"path": "/tmp/nvidia-mps"}}
        )

    response = answer(review_with(add_volume))
    assert response["allowed"] is False
    assert "mounts hostPath /tmp/nvidia-mps" in response["status"]["message"]

    def stricter(obj: dict[str, Any]) -> None:
        obj["metadata"].setdefault("annotations", {})["metagpu.io/compute-policy"] = "fixed"
        obj["spec"]["containers"][0]["env"] = [
            {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "20"}
        ]

    review = review_with(stricter)
    response = answer(review)
    assert response["allowed"] is True
    import base64
    import json

    patch = json.loads(base64.b64decode(response["patch"]))
    out = jsonpatch.apply_patch(copy.deepcopy(review["request"]["object"]), patch)
    assert env_of(out["spec"]["containers"][0])["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
