"""The webhook's matchConditions send it exactly the objects it acts on, and never error.

With ``failurePolicy: Fail`` the matchConditions are what keeps a webhook
outage away from the rest of the cluster, so they are evaluated here the way
the API server does (CEL over ``object``, ``oldObject`` and ``request``):

* against the AdmissionReview requests captured from a real API server
  (``tests/fixtures/admission``): every GPU object matches, the no-GPU pods do not;
* against objects generated from the resource names in the *rendered* webhook
  config (loaded through :class:`webhook.config.WebhookConfig` and digested by
  the webhook's own :class:`webhook.model.RuleSettings`), in every place a pod
  can ask for a GPU, for every kind the webhook is registered for;
* against objects with fields missing at every level, with a has() that fails
  like cel-go's (:mod:`tests.install.cel`): an evaluation error would reject the
  request under Fail.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator
from typing import Any, Final

import pytest

from tests.conftest import admission_fixture_names, load_admission_fixture
from tests.install.cel import MatchConditionError, compile_condition, evaluate
from tests.install.chart import DRA_POOL, EVERYTHING, Obj, load_rendered_config, one, render

WORKLOAD_TEMPLATE_PATHS: Final[dict[str, tuple[str, ...]]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
API_VERSIONS: Final = {
    "Pod": "v1",
    "ReplicationController": "v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
}
NO_GPU_FIXTURES: Final = {"pod-no-gpu.json", "pod-update-no-gpu.json"}
NOT_SENT_FIXTURES: Final = {"pod-update-metagpu.json"}
"""A label UPDATE of a converted pod: a GPU pod, but no re-apply, so it never waits on us."""


@functools.cache
def _programs(values_key: str) -> dict[str, tuple[Any, str]]:
    """Compiled matchConditions per webhook name: (program, expression)."""
    values = {"everything": EVERYTHING, "dra": DRA_POOL}.get(values_key, {})
    configuration = one(render(values), "MutatingWebhookConfiguration")
    programs = {}
    for hook in configuration["webhooks"]:
        assert len(hook["matchConditions"]) == 1, "the conditions are ANDed: one OR-expression"
        expression = hook["matchConditions"][0]["expression"]
        programs[hook["name"]] = (compile_condition(expression), expression)
    return programs


def matches(webhook: str, request: dict[str, Any], *, values_key: str = "defaults") -> bool:
    program, expression = _programs(values_key)[webhook]
    return evaluate(program, request, expression=expression)


def webhook_for(kind: str) -> str:
    return "pods.metagpu.io" if kind == "Pod" else "workloads.metagpu.io"


def admission_request(
    obj: Obj, *, operation: str = "CREATE", old: Obj | None = None, type_of: Obj | None = None
) -> dict[str, Any]:
    """The ``request`` of an AdmissionReview for ``obj``, shaped like the API server's.

    ``type_of`` supplies apiVersion and kind when ``obj`` itself lacks them."""
    typed = type_of or obj
    group, _, version = typed["apiVersion"].rpartition("/")
    return {
        "uid": "00000000-0000-0000-0000-000000000000",
        "kind": {"group": group, "version": version, "kind": typed["kind"]},
        "resource": {"group": group, "version": version, "resource": typed["kind"].lower() + "s"},
        "namespace": "team-a",
        "operation": operation,
        "userInfo": {"username": "alice"},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }


def pod_spec(
    *, resource: str | None = None, where: str = "containers", field: str = "limits"
) -> Obj:
    spec: Obj = {"containers": [{"name": "main", "image": "busybox", "resources": {}}]}
    if resource is not None:
        target = {"name": "gpu", "image": "cuda", "resources": {field: {resource: "500m"}}}
        spec.setdefault(where, []).append(target)
    return spec


def wrap(kind: str, spec: Obj) -> Obj:
    """A ``kind`` object whose pod spec is ``spec``."""
    obj: Obj = {
        "apiVersion": API_VERSIONS.get(kind, "apps/v1"),
        "kind": kind,
        "metadata": {"name": f"{kind.lower()}-x", "namespace": "team-a"},
    }
    if kind == "Pod":
        obj["spec"] = spec
        return obj
    node = obj
    path = WORKLOAD_TEMPLATE_PATHS[kind]
    for key in path:
        node = node.setdefault(key, {})
    node["metadata"] = {"labels": {"app": "x"}}
    node["spec"] = spec
    return obj


# ------------------------------------------------------- captured requests
@pytest.mark.parametrize("name", admission_fixture_names())
def test_captured_requests_match_when_they_mention_a_gpu(name: str) -> None:
    review = load_admission_fixture(name)
    request = review["request"]
    kind = request["kind"]["kind"]
    expected = name not in NO_GPU_FIXTURES | NOT_SENT_FIXTURES
    assert matches(webhook_for(kind), request) is expected, name


def _reapplied_pod(limits: Obj, *, operation: str = "UPDATE", sub: str | None = None) -> Obj:
    """A Pod UPDATE whose container holds ``limits`` (as merged by a re-apply)."""
    stored = wrap("Pod", {"containers": [{"name": "main", "image": "x", "resources": {}}]})
    stored["spec"]["containers"][0]["resources"] = {"limits": {"cnvrg.io/metagpu": "50"}}
    obj = copy.deepcopy(stored)
    obj["spec"]["containers"][0]["resources"] = {"limits": limits, "requests": dict(limits)}
    request = admission_request(obj, operation=operation, old=stored)
    if sub is not None:
        request["subResource"] = sub
    return request


@pytest.mark.parametrize(
    ("limits", "sub", "expected"),
    [
        pytest.param(
            {"cnvrg.io/metagpu": "50", "nvidia.com/gpu": "500m"}, None, True, id="reapply"
        ),
        pytest.param(
            {"cnvrg.io/metagpu": "50", "cnvrg.io/gpu": "500m"}, None, True, id="cnvrg-gpu"
        ),
        pytest.param({"cnvrg.io/metagpu": "50", "nvidia.com/gpu": "1"}, None, True, id="to-whole"),
        pytest.param({"cnvrg.io/metagpu": "50"}, None, False, id="units-only"),
        pytest.param({"nvidia.com/gpu": "1"}, None, False, id="whole-gpu-pod"),
        pytest.param({"cnvrg.io/metagpu": "50"}, "ephemeralcontainers", True, id="kubectl-debug"),
    ],
)
def test_pod_updates_reach_the_webhook_only_when_they_are_ours(
    limits: Obj, sub: str | None, expected: bool
) -> None:
    """Pod UPDATE is registered for re-applied manifests only: a label, annotation or
    finalizer update of a GPU pod must not depend on the webhook being up."""
    assert matches("pods.metagpu.io", _reapplied_pod(limits, sub=sub)) is expected
    assert matches("pods.metagpu.io", _reapplied_pod(limits, operation="CREATE")) is True


def test_a_reapplied_init_container_reaches_the_webhook() -> None:
    request = _reapplied_pod({"cnvrg.io/metagpu": "50"})
    spec = request["object"]["spec"]
    spec["initContainers"] = [
        {
            "name": "warmup",
            "image": "x",
            "resources": {"limits": {"cnvrg.io/metagpu": "25", "cnvrg.io/gpu": "250m"}},
        }
    ]
    assert matches("pods.metagpu.io", request) is True


def test_the_no_gpu_fixtures_are_the_ones_without_gpu_resources() -> None:
    # Guard against the fixture set changing under the test above.
    text = {
        n: str(load_admission_fixture(n)["request"]["object"]) for n in admission_fixture_names()
    }
    gpu_words = re.compile(r"nvidia\.com/gpu|cnvrg\.io/(metagpu|gpu)")
    assert {n for n, t in text.items() if not gpu_words.search(t)} == NO_GPU_FIXTURES


# -------------------------------------------- names from the rendered config
def _rendered_resource_names(values: Obj) -> frozenset[str]:
    """Every resource name the webhook acts on, as the webhook itself computes it."""
    from webhook.config import WebhookConfig
    from webhook.model import RuleSettings

    config = load_rendered_config(
        render(values), "metagpu-webhook-config", "webhook.yaml", WebhookConfig
    )
    return RuleSettings.from_config(config).gpu_resources


def _cases(values_key: str) -> Iterator[Any]:
    values = EVERYTHING if values_key == "everything" else {}
    for resource in sorted(_rendered_resource_names(values)):
        for kind in ("Pod", *WORKLOAD_TEMPLATE_PATHS):
            lists = ("containers", "initContainers") + (
                ("ephemeralContainers",) if kind == "Pod" else ()
            )
            for where in lists:
                for field in ("limits", "requests"):
                    yield pytest.param(
                        values_key,
                        kind,
                        resource,
                        where,
                        field,
                        id=f"{values_key}-{kind}-{resource}-{where}-{field}",
                    )


def _all_cases() -> list[Any]:
    return [*_cases("defaults"), *_cases("everything")]


@pytest.mark.parametrize(("values_key", "kind", "resource", "where", "field"), _all_cases())
def test_every_resource_name_the_webhook_acts_on_matches_everywhere(
    values_key: str, kind: str, resource: str, where: str, field: str
) -> None:
    obj = wrap(kind, pod_spec(resource=resource, where=where, field=field))
    assert matches(webhook_for(kind), admission_request(obj), values_key=values_key)


def test_generated_cases_cover_the_extra_names() -> None:
    names = _rendered_resource_names(EVERYTHING)
    assert {
        "cnvrg.io/metagpu",
        "cnvrg.io/metagpu-a100",
        "example.com/gpu-share",
        "nvidia.com/gpu",
    } <= names


@pytest.mark.parametrize("kind", ["Pod", *WORKLOAD_TEMPLATE_PATHS])
@pytest.mark.parametrize(
    ("resource", "runtime_class", "expected"),
    [
        pytest.param(None, None, False, id="no-gpu"),
        pytest.param("cpu", None, False, id="cpu-only"),
        pytest.param("example.com/fpga", None, False, id="other-extended-resource"),
        pytest.param("amd.com/gpu", None, False, id="another-vendor"),
        pytest.param(None, "nvidia", True, id="nvidia-runtime-class"),
        pytest.param(None, "gvisor", False, id="other-runtime-class"),
    ],
)
def test_objects_without_a_gpu_are_not_sent(
    kind: str, resource: str | None, runtime_class: str | None, expected: bool
) -> None:
    spec = pod_spec(resource=resource)
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    assert matches(webhook_for(kind), admission_request(wrap(kind, spec))) is expected


def test_extra_runtime_classes_are_sent() -> None:
    spec = pod_spec()
    spec["runtimeClassName"] = "nvidia-cdi"
    request = admission_request(wrap("Pod", spec))
    assert matches("pods.metagpu.io", request, values_key="everything")
    assert not matches("pods.metagpu.io", request)


def test_without_a_runtime_class_value_the_nvidia_class_is_still_sent() -> None:
    # The webhook voids non-GPU containers under "nvidia" when it sets no class itself.
    configuration = one(render({"runtimeClass": {"name": ""}}), "MutatingWebhookConfiguration")
    spec = pod_spec()
    spec["runtimeClassName"] = "nvidia"
    for hook in configuration["webhooks"]:
        if hook["name"] == "pods.metagpu.io":
            program = compile_condition(hook["matchConditions"][0]["expression"])
            assert evaluate(program, admission_request(wrap("Pod", spec)))


def _holding_claims(template: str, claim: str = "gpu-main") -> Obj:
    """A pod spec whose only GPU is a claim DRA mode wrote, as a stored workload keeps it."""
    spec = pod_spec()
    spec["containers"][0]["resources"] = {"claims": [{"name": claim}]}
    spec["resourceClaims"] = [{"name": claim, "resourceClaimTemplateName": template}]
    return spec


@pytest.mark.parametrize("kind", ["Pod", *WORKLOAD_TEMPLATE_PATHS])
def test_claims_mode_dra_left_are_sent_in_device_plugin_mode(kind: str) -> None:
    """After webhook.mode goes back to device-plugin, a workload still holding our claim
    (and each pod its ReplicaSet makes) reaches the webhook, which turns it into units
    (webhook/leftovers.py); a user's own claims, and DRA mode itself, are left alone."""
    ours = admission_request(wrap(kind, _holding_claims("metagpu-50u-40gi")))
    assert matches(webhook_for(kind), ours)
    assert not matches(webhook_for(kind), ours, values_key="dra")
    for template, claim in (("team-gpu", "gpu-main"), ("metagpu-50u-40gi", "shared")):
        theirs = admission_request(wrap(kind, _holding_claims(template, claim)))
        assert not matches(webhook_for(kind), theirs)


def test_a_memory_only_ask_is_sent_in_device_plugin_mode() -> None:
    request = admission_request(wrap("Pod", pod_spec(resource="metagpu.io/gpu-memory")))
    assert matches("pods.metagpu.io", request)


def test_device_plugin_mode_gets_the_gpu_memory_when_the_values_give_it() -> None:
    """So a memory-only ask becomes units of that GPU instead of a refusal."""
    from webhook.config import WebhookConfig

    def rendered(values: Obj) -> WebhookConfig:
        objects = render(values)
        [configmap] = [
            c for c in objects if c.get("kind") == "ConfigMap" and "webhook.yaml" in c["data"]
        ]
        name = configmap["metadata"]["name"]
        return load_rendered_config(objects, name, "webhook.yaml", WebhookConfig)

    assert rendered({"dra": {"gpuMemoryMiB": 81559}}).dra.gpu_memory_mib == 81559
    assert rendered({}).dra.gpu_memory_mib is None
    assert rendered({"dra": {"gpuMemoryMiB": 81559}}).mode == "device-plugin"


def test_ephemeral_container_update_of_a_gpu_pod_matches() -> None:
    old = wrap("Pod", pod_spec(resource="cnvrg.io/metagpu"))
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [
        {"name": "debug", "image": "busybox", "env": [{"name": "X", "value": "1"}]}
    ]
    request = admission_request(new, operation="UPDATE", old=old)
    request["subResource"] = "ephemeralcontainers"
    assert matches("pods.metagpu.io", request)


# ----------------------------------------------------- never an error
def _strip(obj: Obj, path: tuple[str, ...]) -> Obj:
    """A copy of ``obj`` with the field at ``path`` removed, from every list element on the way
    (so no sibling container can answer for the one that lacks the field)."""
    copied = copy.deepcopy(obj)
    nodes: list[Any] = [copied]
    for key in path[:-1]:
        children = [n[key] for n in nodes if isinstance(n, dict) and key in n]
        nodes = [item for c in children for item in (c if isinstance(c, list) else [c])]
    for node in nodes:
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return copied


def _field_paths(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(value, dict):
        for key, child in value.items():
            yield (*path, key)
            yield from _field_paths(child, (*path, key))
    elif isinstance(value, list) and value:
        yield from _field_paths(value[0], path)


@pytest.mark.parametrize("kind", ["Pod", *WORKLOAD_TEMPLATE_PATHS])
def test_missing_fields_at_any_level_never_cause_an_evaluation_error(kind: str) -> None:
    full = wrap(kind, pod_spec(resource="nvidia.com/gpu"))
    full_spec = full["spec"] if kind == "Pod" else None
    if full_spec is not None:
        full_spec["runtimeClassName"] = "nvidia"
        full_spec["initContainers"] = [
            {"name": "i", "image": "x", "resources": {"requests": {"cpu": "1"}}}
        ]
        full_spec["ephemeralContainers"] = [{"name": "e", "image": "x"}]
    for path in _field_paths(full):
        stripped = _strip(full, path)
        try:
            matches(webhook_for(kind), admission_request(stripped, type_of=full))
        except MatchConditionError as exc:
            pytest.fail(f"removing {'.'.join(path)} makes the condition error: {exc}")


def test_strict_evaluation_catches_an_unguarded_field() -> None:
    # Proof that the test above can fail: cel-go errors on has(a.b.c) when a.b is missing.
    program = compile_condition("object.spec.containers.exists(c, has(c.resources.limits))")
    request = admission_request(wrap("Pod", {"containers": [{"name": "x"}]}))
    with pytest.raises(MatchConditionError, match="resources"):
        evaluate(program, request)


@pytest.mark.parametrize("values_key", ["defaults", "everything", "dra"])
def test_every_has_guard_covers_its_parent(values_key: str) -> None:
    # Static check alongside the evaluation: each has(a.b.c) follows has(a.b), unless
    # a is the object, the request (always set by the API server) or a comprehension
    # variable, so no field is read unguarded.
    roots = {"object", "request", "c", "r", "e", "k"}
    for _, expression in _programs(values_key).values():
        guarded = set(re.findall(r"has\(([\w.]+)\)", expression))
        for path in guarded:
            parent = path.rsplit(".", 1)[0]
            if "." in parent:
                assert parent in guarded, f"has({path}) without has({parent}) first"
            else:
                assert parent in roots, path
        for chain in re.findall(r"([\w.]+)\.exists\(", expression):
            if chain.count(".") >= 1 and chain.split(".")[0] == "object":
                assert chain in guarded, f"{chain}.exists(...) without has({chain})"
