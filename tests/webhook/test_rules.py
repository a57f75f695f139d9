"""Table tests over every rule of ``webhook.rules``, on plain pod dicts (no transport)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.webhook.builders import (
    allowed,
    applied,
    container,
    denied,
    env_of,
    gpu,
    pod,
    settings,
    workload,
)
from webhook.config import WebhookConfig
from webhook.rules import (
    Mutation,
    NamespaceFacts,
    PodShapeError,
    RuleSettings,
    mutate_ephemeral_containers,
    mutate_pod,
    mutate_workload,
    share_percent,
)

DEFAULT = settings()
METAGPU = "cnvrg.io/metagpu"
ORIGINAL = "metagpu.io/original-request"
POLICY = "metagpu.io/compute-policy"
Obj = dict[str, Any]


def run(p: Obj, s: RuleSettings = DEFAULT, ns: NamespaceFacts | None = None) -> Mutation:
    """Mutate, apply, and check rule 7 (idempotence) on every allowed result."""
    decision = allowed(mutate_pod(p, settings=s, namespace=ns or NamespaceFacts()))
    out = applied(p, decision)
    again = allowed(mutate_pod(out, settings=s, namespace=ns or NamespaceFacts()))
    assert again.patch == (), f"not idempotent: second run patched {again.patch}"
    return decision


def result(p: Obj, s: RuleSettings = DEFAULT, ns: NamespaceFacts | None = None) -> Obj:
    return applied(p, run(p, s, ns))


def resources(p: Obj, index: int = 0, key: str = "containers") -> Obj:
    out: Obj = p["spec"][key][index]["resources"]
    return out


# ----------------------------------------------------------------- rule 1
@pytest.mark.parametrize(
    ("c", "s", "expected"),
    [
        pytest.param(gpu("500m"), DEFAULT, {METAGPU: "50"}, id="nvidia-500m"),
        pytest.param(
            container(limits={"nvidia.com/gpu": 0.5}), DEFAULT, {METAGPU: "50"}, id="yaml-float"
        ),
        pytest.param(
            gpu("1.5", resource="cnvrg.io/gpu"), DEFAULT, {METAGPU: "150"}, id="cnvrg-1.5"
        ),
        pytest.param(
            gpu("1", resource="cnvrg.io/gpu"), DEFAULT, {METAGPU: "100"}, id="cnvrg-whole"
        ),
        pytest.param(gpu("5e-1"), DEFAULT, {METAGPU: "50"}, id="exponent"),
        pytest.param(gpu(".25"), DEFAULT, {METAGPU: "25"}, id="leading-dot"),
        pytest.param(gpu("8", resource="cnvrg.io/gpu"), DEFAULT, {METAGPU: "800"}, id="at-maximum"),
        pytest.param(
            container(requests={"nvidia.com/gpu": "200m"}),
            DEFAULT,
            {METAGPU: "20"},
            id="request-only",
        ),
        pytest.param(gpu("2"), settings(convert_whole_gpus=True), {METAGPU: "200"}, id="whole-on"),
        pytest.param(gpu("333m"), settings(units_per_gpu=1000), {METAGPU: "333"}, id="per-mille"),
        pytest.param(
            gpu("0.5"),
            settings(resource_name="example.com/shares"),
            {"example.com/shares": "50"},
            id="custom-resource-name",
        ),
    ],
)
def test_fractions_become_units_in_limits_and_requests(
    c: Obj, s: RuleSettings, expected: Obj
) -> None:
    out = resources(result(pod(c), s))
    assert out["limits"] == expected
    assert out["requests"] == expected


def test_conversion_keeps_other_resources_and_escapes_pointer() -> None:
    p = pod(
        container(
            limits={"cpu": "1", "nvidia.com/gpu": "500m"},
            requests={"cpu": "1", "nvidia.com/gpu": "500m"},
        )
    )
    decision = run(p)
    paths = [op["path"] for op in decision.patch]
    assert "/spec/containers/0/resources/limits/nvidia.com~1gpu" in paths
    assert "/spec/containers/0/resources/limits/cnvrg.io~1metagpu" in paths
    assert resources(applied(p, decision))["limits"] == {"cpu": "1", METAGPU: "50"}


@pytest.mark.parametrize(
    ("c", "expected_limits", "expected_requests"),
    [
        pytest.param(gpu("30", resource=METAGPU), {METAGPU: "30"}, {METAGPU: "30"}, id="both"),
        pytest.param(container(limits={METAGPU: "20"}), {METAGPU: "20"}, None, id="limit-only"),
        pytest.param(
            container(requests={METAGPU: "20"}), {METAGPU: "20"}, {METAGPU: "20"}, id="request-only"
        ),
        pytest.param(gpu(30, resource=METAGPU), {METAGPU: 30}, {METAGPU: 30}, id="yaml-int"),
        pytest.param(
            gpu("3e1", resource=METAGPU), {METAGPU: "3e1"}, {METAGPU: "3e1"}, id="exponent"
        ),
    ],
)
def test_metagpu_units_pass_through(
    c: Obj, expected_limits: Obj, expected_requests: Obj | None
) -> None:
    out = resources(result(pod(c)))
    assert out["limits"] == expected_limits
    assert out.get("requests") == expected_requests


def test_whole_nvidia_gpus_are_not_ours() -> None:
    p = pod(gpu("1"), container("sidecar"))
    decision = run(p)
    assert decision.patch == ()


def test_extra_metagpu_resource_counts_as_metagpu() -> None:
    s = settings(extra_resource_names=["cnvrg.io/metagpu-a100"])
    p = pod(container(requests={"cnvrg.io/metagpu-a100": "40"}))
    out = result(p, s)
    assert resources(out)["limits"] == {"cnvrg.io/metagpu-a100": "40"}
    assert out["spec"]["runtimeClassName"] == "nvidia"
    assert "tolerations" in out["spec"]


def test_null_resource_maps_are_replaced() -> None:
    p = pod(
        container(
            limits=None,
            requests=None,
            resources={"limits": {"nvidia.com/gpu": "500m"}, "requests": None},
        )
    )
    assert resources(result(p)) == {"limits": {METAGPU: "50"}, "requests": {METAGPU: "50"}}


@pytest.mark.parametrize(
    ("c", "s", "must_contain"),
    [
        pytest.param(
            gpu("333m", name="c"),
            DEFAULT,
            ['container "c"', "0.333", "0.33 or 0.34", f"{METAGPU}: 33 or 34"],
            id="not-whole-units",
        ),
        pytest.param(
            gpu("1m"), DEFAULT, ["0.001", "use 0.01", f"{METAGPU}: 1"], id="below-one-unit"
        ),
        pytest.param(
            gpu("0.5", resource="cnvrg.io/gpu"),
            settings(units_per_gpu=3),
            ["0.5", f"use {METAGPU}: 1 or 2"],
            id="no-decimal-form",
        ),
        pytest.param(
            gpu("0", resource="cnvrg.io/gpu"),
            DEFAULT,
            ["cnvrg.io/gpu 0 asks for no GPU", "between 0.01 and 8"],
            id="zero",
        ),
        pytest.param(gpu("-500m"), DEFAULT, ["-0.5", "is negative"], id="negative"),
        pytest.param(
            gpu("9", resource="cnvrg.io/gpu"),
            DEFAULT,
            ["cnvrg.io/gpu 9", "maximum of 8 GPUs"],
            id="above-maximum",
        ),
        pytest.param(
            gpu("1.5"),
            settings(max_gpus_per_container=1),
            ["1.5", "maximum of 1 GPUs"],
            id="configured-maximum",
        ),
        pytest.param(gpu("abc"), DEFAULT, ["'abc' is not a quantity", "0.5, 500m"], id="garbage"),
        pytest.param(gpu(True), DEFAULT, ["True is not a quantity"], id="boolean"),
        pytest.param(gpu("1e99"), DEFAULT, ["exponent 99 is out of range"], id="huge-exponent"),
        pytest.param(
            container("c", limits={"nvidia.com/gpu": "500m"}, requests={"nvidia.com/gpu": "250m"}),
            DEFAULT,
            ['container "c"', "limits (0.5", "requests (0.25", "disagree"],
            id="limits-requests-disagree",
        ),
        pytest.param(
            container(limits={"nvidia.com/gpu": "1"}, requests={"nvidia.com/gpu": "500m"}),
            DEFAULT,
            ["disagree"],
            id="whole-limit-fraction-request",
        ),
        pytest.param(
            container(limits={"cnvrg.io/gpu": "500m", "nvidia.com/gpu": "1"}),
            DEFAULT,
            ["mixes a GPU share (cnvrg.io/gpu 0.5", "whole GPUs (nvidia.com/gpu"],
            id="fraction-and-whole",
        ),
        pytest.param(
            container(limits={"cnvrg.io/gpu": "500m", METAGPU: "50"}),
            DEFAULT,
            ["more than one way", "cnvrg.io/gpu", METAGPU],
            id="fraction-and-units",
        ),
        pytest.param(
            gpu("500m", resource=METAGPU),
            DEFAULT,
            [f"{METAGPU} 0.5", "whole number of units", f"write {METAGPU}: 50"],
            id="fractional-units",
        ),
        pytest.param(
            gpu("0", resource=METAGPU),
            DEFAULT,
            ["asks for no GPU", "from 1 to 800"],
            id="zero-units",
        ),
        pytest.param(
            gpu("900", resource=METAGPU),
            DEFAULT,
            ["900", "maximum of 800 units"],
            id="too-many-units",
        ),
    ],
)
def test_conversion_denials_name_container_value_and_accepted(
    c: Obj, s: RuleSettings, must_contain: list[str]
) -> None:
    d = denied(mutate_pod(pod(c), settings=s))
    assert d.code == 400
    for text in must_contain:
        assert text in d.message


@pytest.mark.parametrize(
    ("overrides", "suggested", "low", "high"),
    [
        pytest.param({}, "a share between 0.01 and 8 of a GPU", "0.01", "8", id="default"),
        pytest.param(
            {"max_gpus_per_container": 0.29},
            "a share between 0.01 and 0.29 of a GPU",
            "0.01",
            "0.29",
            id="float-maximum",
        ),
        pytest.param(
            {"units_per_gpu": 300, "max_gpus_per_container": 0.7},
            f"{METAGPU}: 1 to 210 (300 units per GPU)",
            "1",
            "210",
            id="one-unit-no-decimal",
        ),
        pytest.param(
            {"units_per_gpu": 8, "max_gpus_per_container": 0.7},
            "a share between 0.125 and 0.625 of a GPU",
            "0.125",
            "0.625",
            id="maximum-not-whole-units",
        ),
        pytest.param(
            {"units_per_gpu": 7, "max_gpus_per_container": 0.7},
            f"{METAGPU}: 1 to 4 (7 units per GPU)",
            "1",
            "4",
            id="sevenths",
        ),
    ],
)
def test_the_suggested_range_is_itself_accepted(
    overrides: dict[str, Any], suggested: str, low: str, high: str
) -> None:
    """A denial never suggests a value that would be denied in turn (a rounded
    1/300, or a maximum that is not a whole number of units)."""
    s = settings(**overrides)
    d = denied(mutate_pod(pod(gpu("0", resource="cnvrg.io/gpu")), settings=s))
    assert f"ask for {suggested}" in d.message
    resource = "cnvrg.io/gpu" if "share" in suggested else METAGPU
    for value in (low, high):
        allowed(mutate_pod(pod(gpu(value, resource=resource)), settings=s))


def test_max_units_is_exact_for_a_float_maximum() -> None:
    """0.29 GPUs x 100 is 28.999... in floats; the config and the rules agree on 29."""
    config = WebhookConfig.model_validate({"max_gpus_per_container": 0.29})
    assert config.max_units == 29
    assert RuleSettings.from_config(config).max_units == 29


def test_denial_names_init_container_and_lists_every_problem() -> None:
    p = pod(gpu("abc", name="a"), init=[gpu("333m", name="warm")])
    d = denied(mutate_pod(p, settings=DEFAULT))
    assert 'init container "warm"' in d.message
    assert 'container "a"' in d.message
    assert "; " in d.message


def test_pod_level_gpu_resources_are_refused() -> None:
    p = pod(gpu("500m"), resources={"limits": {"nvidia.com/gpu": "1"}})
    assert (
        "pod-level spec.resources.limits cannot hold nvidia.com/gpu"
        in denied(mutate_pod(p, settings=DEFAULT)).message
    )


# ----------------------------------------------------------------- rule 2
CNVRG_TAINT = {"key": METAGPU, "operator": "Equal", "value": "present", "effect": "NoSchedule"}
NVIDIA_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("existing", "added"),
    [
        pytest.param(None, [CNVRG_TAINT, NVIDIA_TAINT], id="none"),
        pytest.param([], [CNVRG_TAINT, NVIDIA_TAINT], id="empty-list"),
        pytest.param([{"operator": "Exists"}], [], id="tolerate-everything"),
        pytest.param(
            [{"operator": "Exists", "effect": "NoSchedule"}], [], id="tolerate-all-noschedule"
        ),
        pytest.param(
            [{"operator": "Exists", "effect": "NoExecute"}],
            [CNVRG_TAINT, NVIDIA_TAINT],
            id="other-effect",
        ),
        pytest.param([NVIDIA_TAINT], [CNVRG_TAINT], id="one-present"),
        pytest.param(
            [{"key": METAGPU, "operator": "Exists"}], [NVIDIA_TAINT], id="key-exists-any-effect"
        ),
        pytest.param(
            [{"key": METAGPU, "value": "present"}], [NVIDIA_TAINT], id="equal-is-default-operator"
        ),
        pytest.param(
            [{**CNVRG_TAINT, "value": "other"}], [CNVRG_TAINT, NVIDIA_TAINT], id="other-value"
        ),
        pytest.param(
            [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "x", "effect": "NoSchedule"}],
            [CNVRG_TAINT, NVIDIA_TAINT],
            id="equal-does-not-cover-exists",
        ),
    ],
)
def test_tolerations_added_once(existing: list[Obj] | None, added: list[Obj]) -> None:
    out = result(pod(gpu("500m"), tolerations=existing))
    assert (out["spec"].get("tolerations") or []) == (existing or []) + added


def test_configured_tolerations_with_seconds() -> None:
    wanted = {
        "key": "gpu-maintenance",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 60,
    }
    s = settings(tolerations=[wanted])
    assert result(pod(gpu("500m")), s)["spec"]["tolerations"] == [wanted]
    shorter = {**wanted, "tolerationSeconds": 30}
    out = result(pod(gpu("500m"), tolerations=[shorter]), s)
    assert out["spec"]["tolerations"] == [shorter, wanted]
    longer = {**wanted, "tolerationSeconds": 600}
    assert result(pod(gpu("500m"), tolerations=[longer]), s)["spec"]["tolerations"] == [longer]


def test_no_gpu_pod_gets_empty_patch() -> None:
    assert run(pod(container(limits={"cpu": "1"}))).patch == ()


# ----------------------------------------------------------------- rule 3
@pytest.mark.parametrize(
    ("existing", "s", "expected"),
    [
        pytest.param(None, DEFAULT, "nvidia", id="set"),
        pytest.param("kata-nvidia", DEFAULT, "kata-nvidia", id="user-value-kept"),
        pytest.param(
            None, settings(runtime_class_name="nvidia-cdi"), "nvidia-cdi", id="configured"
        ),
        pytest.param(None, settings(runtime_class_name=None), None, id="disabled"),
    ],
)
def test_runtime_class(existing: str | None, s: RuleSettings, expected: str | None) -> None:
    assert (
        result(pod(gpu("500m"), runtime_class=existing), s)["spec"].get("runtimeClassName")
        == expected
    )


# ----------------------------------------------------------------- rule 4
@pytest.mark.parametrize(
    ("pod_policy", "ns_policy", "s", "expected"),
    [
        pytest.param(None, None, DEFAULT, "balance", id="config-default"),
        pytest.param(
            None, None, settings(default_compute_policy="fixed"), "fixed", id="configured-default"
        ),
        pytest.param(None, "fixed", DEFAULT, "fixed", id="namespace"),
        pytest.param("none", "fixed", DEFAULT, "none", id="pod-over-namespace"),
    ],
)
def test_policy_precedence(
    pod_policy: str | None, ns_policy: str | None, s: RuleSettings, expected: str
) -> None:
    annotations = {POLICY: pod_policy} if pod_policy else None
    out = result(
        pod(gpu("500m"), annotations=annotations), s, NamespaceFacts(compute_policy=ns_policy)
    )
    assert out["metadata"]["annotations"][POLICY] == expected
    assert env_of(out["spec"]["containers"][0])["METAGPU_COMPUTE_POLICY"] == expected


@pytest.mark.parametrize(
    ("c", "expected_cap"),
    [
        pytest.param(gpu("500m"), "50", id="half"),
        pytest.param(gpu("1.5", resource="cnvrg.io/gpu"), "100", id="capped-at-100"),
        pytest.param(gpu("1", resource=METAGPU), "1", id="one-unit"),
    ],
)
def test_fixed_policy_caps_mps_threads(c: Obj, expected_cap: str) -> None:
    out = result(pod(c, container("side")), ns=NamespaceFacts(compute_policy="fixed"))
    env = env_of(out["spec"]["containers"][0])
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == expected_cap
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env_of(out["spec"]["containers"][1])


@pytest.mark.parametrize(
    ("units", "per_gpu", "expected"),
    [(50, 100, 50), (333, 1000, 34), (1, 1000, 1), (150, 100, 100), (1, 3, 34)],
)
def test_share_percent(units: int, per_gpu: int, expected: int) -> None:
    assert share_percent(units, per_gpu) == expected


@pytest.mark.parametrize("policy", ["balance", "none"])
def test_non_fixed_policies_set_only_the_policy_variable(policy: str) -> None:
    out = result(pod(gpu("500m")), ns=NamespaceFacts(compute_policy=policy))
    assert env_of(out["spec"]["containers"][0]) == {"METAGPU_COMPUTE_POLICY": policy}


def test_fixed_policy_keeps_a_stricter_user_cap_and_denies_a_looser_one() -> None:
    fixed = {POLICY: "fixed"}
    strict = gpu("500m", env=[{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "30"}])
    out = result(pod(strict, annotations=fixed))
    assert env_of(out["spec"]["containers"][0])["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    loose = gpu(
        "500m", name="c", env=[{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "80"}]
    )
    d = denied(mutate_pod(pod(loose, annotations=fixed), settings=DEFAULT))
    assert d.code == 403
    for text in ('container "c"', "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=80", "50%", "from 1 to 50"):
        assert text in d.message


def test_invalid_pod_policy_is_denied() -> None:
    d = denied(mutate_pod(pod(gpu("500m"), annotations={POLICY: "turbo"}), settings=DEFAULT))
    assert "must be one of fixed, balance, none: got 'turbo'" in d.message


def test_invalid_namespace_policy_falls_back_with_warning() -> None:
    decision = run(pod(gpu("500m")), ns=NamespaceFacts(compute_policy="turbo"))
    out = applied(pod(gpu("500m")), decision)
    assert out["metadata"]["annotations"][POLICY] == "balance"
    assert any("'turbo'" in w and "using the default 'balance'" in w for w in decision.warnings)


def test_user_policy_variable_is_kept_with_warning() -> None:
    c = gpu("500m", env=[{"name": "METAGPU_COMPUTE_POLICY", "value": "none"}])
    decision = run(pod(c))
    assert (
        env_of(applied(pod(c), decision)["spec"]["containers"][0])["METAGPU_COMPUTE_POLICY"]
        == "none"
    )
    assert any("METAGPU_COMPUTE_POLICY=none" in w for w in decision.warnings)


# ----------------------------------------------------------------- rule 5
@pytest.mark.parametrize(
    ("env", "shown"),
    [
        pytest.param(
            [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
            "NVIDIA_VISIBLE_DEVICES=all",
            id="nvidia",
        ),
        pytest.param(
            [{"name": "CUDA_VISIBLE_DEVICES", "value": "0,1"}],
            "CUDA_VISIBLE_DEVICES=0,1",
            id="cuda",
        ),
        pytest.param(
            [
                {
                    "name": "NVIDIA_VISIBLE_DEVICES",
                    "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}},
                }
            ],
            "NVIDIA_VISIBLE_DEVICES (from valueFrom)",
            id="value-from",
        ),
    ],
)
def test_gpu_container_choosing_its_gpus(env: list[Obj], shown: str) -> None:
    p = pod(gpu("500m", name="c", env=env))
    d = denied(mutate_pod(p, settings=DEFAULT))
    assert d.code == 403
    assert 'container "c"' in d.message
    assert shown in d.message
    decision = run(p, settings(visible_devices_policy="strip"))
    out_env = env_of(applied(p, decision)["spec"]["containers"][0])
    assert set(out_env) == {"METAGPU_COMPUTE_POLICY"}
    assert any(f"removed {shown}" in w for w in decision.warnings)


def test_strip_removes_duplicates_and_keeps_other_variables() -> None:
    env = [
        {"name": "A", "value": "1"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "B", "value": "2"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"},
    ]
    out = result(pod(gpu("500m", env=env)), settings(visible_devices_policy="strip"))
    assert [e["name"] for e in out["spec"]["containers"][0]["env"]] == [
        "A",
        "B",
        "METAGPU_COMPUTE_POLICY",
    ]


def test_privileged_gpu_container() -> None:
    p = pod(gpu("500m", name="c", privileged=True))
    d = denied(mutate_pod(p, settings=DEFAULT))
    assert d.code == 403
    assert 'container "c" is privileged and requests cnvrg.io/metagpu' in d.message
    run(p, settings(deny_privileged=False))
    run(pod(gpu("500m", privileged=False)))


def test_non_gpu_containers_see_no_gpu_under_nvidia_runtime() -> None:
    p = pod(gpu("500m", name="train"), container("sidecar"), init=[container("init-no-gpu")])
    out = result(p)
    assert env_of(out["spec"]["containers"][1]) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert env_of(out["spec"]["initContainers"][0]) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(out["spec"]["containers"][0])


@pytest.mark.parametrize(
    ("p", "s", "voided"),
    [
        pytest.param(
            pod(container(), runtime_class="nvidia"), DEFAULT, True, id="no-gpu-pod-under-nvidia"
        ),
        pytest.param(pod(container()), DEFAULT, False, id="no-gpu-pod-default-runtime"),
        pytest.param(
            pod(gpu("500m"), container(), runtime_class="kata"), DEFAULT, False, id="other-runtime"
        ),
        pytest.param(
            pod(gpu("500m"), container()),
            settings(void_non_gpu_containers=False),
            False,
            id="disabled",
        ),
        pytest.param(
            pod(container(), runtime_class="nvidia-cdi"),
            settings(runtime_class_name="nvidia-cdi"),
            True,
            id="configured-class",
        ),
        pytest.param(
            pod(container(), runtime_class="nvidia"),
            settings(runtime_class_name=None),
            True,
            id="default-class-name",
        ),
    ],
)
def test_void_applies_only_under_the_nvidia_runtime_class(
    p: Obj, s: RuleSettings, voided: bool
) -> None:
    out = result(p, s)
    last = out["spec"]["containers"][-1]
    assert (env_of(last).get("NVIDIA_VISIBLE_DEVICES") == "void") is voided


def test_whole_gpu_containers_are_not_voided() -> None:
    out = result(pod(gpu("1", name="whole"), runtime_class="nvidia"))
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(out["spec"]["containers"][0])


def test_void_only_pod_records_an_empty_original_request() -> None:
    out = result(pod(container(), runtime_class="nvidia"))
    assert out["metadata"]["annotations"] == {ORIGINAL: "{}"}


@pytest.mark.parametrize("value", ["void", "none", ""])
def test_user_values_that_hide_gpus_are_kept(value: str) -> None:
    p = pod(
        gpu("500m"), container("side", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}])
    )
    out = result(p)
    assert env_of(out["spec"]["containers"][1]) == {"NVIDIA_VISIBLE_DEVICES": value}


def test_non_gpu_container_exposing_gpus_in_metagpu_pod() -> None:
    side = container("side", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    p = pod(gpu("500m"), side)
    d = denied(mutate_pod(p, settings=DEFAULT))
    assert 'container "side" sets NVIDIA_VISIBLE_DEVICES=all' in d.message
    out = result(p, settings(visible_devices_policy="strip"))
    assert env_of(out["spec"]["containers"][1]) == {"NVIDIA_VISIBLE_DEVICES": "void"}


@pytest.mark.parametrize(
    ("runtime_class", "s"),
    [
        pytest.param("kata", DEFAULT, id="other-runtime-class"),
        pytest.param(None, settings(runtime_class_name=None), id="nvidia-is-node-default"),
        pytest.param(None, settings(void_non_gpu_containers=False), id="void-disabled"),
    ],
)
def test_non_gpu_container_exposing_gpus_without_void(
    runtime_class: str | None, s: RuleSettings
) -> None:
    side = container("side", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    p = pod(gpu("500m"), side, runtime_class=runtime_class)
    assert (
        'container "side" sets NVIDIA_VISIBLE_DEVICES=all'
        in denied(mutate_pod(p, settings=s)).message
    )


def test_non_gpu_container_exposing_gpus_in_other_pod_is_warned_not_changed() -> None:
    p = pod(
        container("c", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
        runtime_class="nvidia",
    )
    decision = run(p)
    assert decision.patch == ()
    assert any(
        'container "c" asks for no GPU but sets NVIDIA_VISIBLE_DEVICES=all' in w
        for w in decision.warnings
    )


# ----------------------------------------------------------------- rule 6
@pytest.mark.parametrize(
    ("labels", "ns"),
    [
        pytest.param({"metagpu.io/inject": "false"}, NamespaceFacts(), id="pod-label"),
        pytest.param(None, NamespaceFacts(inject="false"), id="namespace-label"),
    ],
)
def test_opt_out(labels: dict[str, str] | None, ns: NamespaceFacts) -> None:
    p = pod(gpu("500m"), container("side"), labels=labels, runtime_class="nvidia")
    assert allowed(mutate_pod(p, settings=DEFAULT, namespace=ns)).patch == ()
    # not ours: even a fraction the webhook would refuse is left to the API server
    assert (
        allowed(mutate_pod(pod(gpu("333m"), labels=labels), settings=DEFAULT, namespace=ns)).patch
        == ()
    )


def test_opt_out_does_not_switch_off_hardening() -> None:
    c = gpu(
        "50", resource=METAGPU, name="c", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    )
    p = pod(c, labels={"metagpu.io/inject": "false"})
    d = denied(mutate_pod(p, settings=settings(visible_devices_policy="strip")))
    assert "opted out of mutation" in d.message


@pytest.mark.parametrize("value", ["true", "False", "no"])
def test_only_the_string_false_opts_out(value: str) -> None:
    assert run(pod(gpu("500m"), labels={"metagpu.io/inject": value})).patch != ()


# ----------------------------------------------------------------- rule 8
def test_original_request_annotation_and_warnings() -> None:
    p = pod(gpu("500m", name="train"), gpu("20", name="serve", resource=METAGPU))
    decision = run(p)
    out = applied(p, decision)
    record = json.loads(out["metadata"]["annotations"][ORIGINAL])
    assert record == {"train": {"nvidia.com/gpu": "500m"}, "serve": {METAGPU: "20"}}
    assert decision.warnings == (
        'container "train": nvidia.com/gpu 0.5 ("500m") converted to cnvrg.io/metagpu 50 '
        "(100 units per GPU)",
    )


def test_existing_annotations_are_kept() -> None:
    out = result(pod(gpu("500m"), annotations={"team": "vision"}))
    assert out["metadata"]["annotations"]["team"] == "vision"


def test_original_request_merges_with_an_existing_record() -> None:
    earlier = json.dumps({"train": {"nvidia.com/gpu": "500m"}})
    p = pod(
        gpu("50", name="train", resource=METAGPU),
        gpu("250m", name="new"),
        annotations={ORIGINAL: earlier},
    )
    record = json.loads(result(p)["metadata"]["annotations"][ORIGINAL])
    assert record == {"train": {"nvidia.com/gpu": "500m"}, "new": {"nvidia.com/gpu": "250m"}}


def test_original_request_that_is_not_json_is_replaced_with_warning() -> None:
    p = pod(gpu("500m", name="t"), annotations={ORIGINAL: "half a gpu please"})
    decision = run(p)
    assert json.loads(applied(p, decision)["metadata"]["annotations"][ORIGINAL]) == {
        "t": {"nvidia.com/gpu": "500m"}
    }
    assert any("was not a JSON object" in w for w in decision.warnings)


def test_namespace_lookup_warnings_are_passed_on_when_the_answer_used_them() -> None:
    ns = NamespaceFacts(warnings=("namespace lookup failed",))
    assert "namespace lookup failed" in run(pod(gpu("500m")), ns=ns).warnings
    assert (
        "namespace lookup failed"
        in denied(mutate_pod(pod(gpu("333m")), settings=DEFAULT, namespace=ns)).warnings
    )
    assert run(pod(container()), ns=ns).warnings == ()  # no GPU: nothing depended on it


# ----------------------------------------------------------------- rule 9
@pytest.mark.parametrize(
    "kind",
    [
        "Deployment",
        "StatefulSet",
        "DaemonSet",
        "ReplicaSet",
        "ReplicationController",
        "Job",
        "CronJob",
    ],
)
def test_workload_templates_are_converted(kind: str) -> None:
    w = workload(kind, {"containers": [container("nb", limits={"nvidia.com/gpu": "500m"})]})
    group = {"Job": "batch", "CronJob": "batch", "ReplicationController": ""}.get(kind, "apps")
    decision = allowed(mutate_workload(w, group=group, kind=kind, settings=DEFAULT))
    out = applied(w, decision)
    spec = out["spec"]["jobTemplate"]["spec"] if kind == "CronJob" else out["spec"]
    template = spec["template"]
    assert template["spec"]["containers"][0]["resources"] == {
        "limits": {METAGPU: "50"},
        "requests": {METAGPU: "50"},
    }
    assert json.loads(template["metadata"]["annotations"][ORIGINAL]) == {
        "nb": {"nvidia.com/gpu": "500m"}
    }
    assert "tolerations" not in template["spec"]  # rules 2-5 wait for the pods
    assert "runtimeClassName" not in template["spec"]
    assert any(w.startswith(f"{kind} template:") for w in decision.warnings)
    assert allowed(mutate_workload(out, group=group, kind=kind, settings=DEFAULT)).patch == ()


def test_workload_template_denial_and_opt_out() -> None:
    w = workload("Deployment", {"containers": [gpu("333m", name="nb")]})
    assert (
        "0.33 or 0.34"
        in denied(mutate_workload(w, group="apps", kind="Deployment", settings=DEFAULT)).message
    )
    opted = workload(
        "Deployment", {"containers": [gpu("333m")]}, template_labels={"metagpu.io/inject": "false"}
    )
    assert (
        allowed(mutate_workload(opted, group="apps", kind="Deployment", settings=DEFAULT)).patch
        == ()
    )


def test_workload_without_template_or_metadata() -> None:
    rc = {
        "apiVersion": "v1",
        "kind": "ReplicationController",
        "metadata": {"name": "r"},
        "spec": {},
    }
    assert (
        allowed(mutate_workload(rc, group="", kind="ReplicationController", settings=DEFAULT)).patch
        == ()
    )
    bare = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "spec": {"template": {"spec": {"containers": [gpu("500m")]}}},
    }
    out = applied(bare, allowed(mutate_workload(bare, group="batch", kind="Job", settings=DEFAULT)))
    assert ORIGINAL in out["spec"]["template"]["metadata"]["annotations"]


# ------------------------------------------------------- ephemeral containers
def _debug(p: Obj, *ephemeral: Obj, s: RuleSettings = DEFAULT) -> Any:
    new = {**p, "spec": {**p["spec"], "ephemeralContainers": list(ephemeral)}}
    return new, mutate_ephemeral_containers(new, old_pod=p, settings=s)


def test_debug_container_in_gpu_pod_cannot_pick_gpus() -> None:
    base = result(pod(gpu("500m")), settings(runtime_class_name=None))
    dbg = container("debugger", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    _, d = _debug(base, dbg)
    assert 'ephemeral container "debugger" sets NVIDIA_VISIBLE_DEVICES=all' in denied(d).message
    new, decision = _debug(base, dbg, s=settings(visible_devices_policy="strip"))
    out = applied(new, decision)
    assert env_of(out["spec"]["ephemeralContainers"][0]) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    _, harmless = _debug(
        base, container("debugger", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}])
    )
    assert allowed(harmless).patch == ()


def test_debug_container_under_nvidia_runtime_is_voided_and_old_ones_ignored() -> None:
    base = result(pod(gpu("500m")))
    new, decision = _debug(base, container("dbg"))
    out = applied(new, decision)
    assert env_of(out["spec"]["ephemeralContainers"][0]) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    again = mutate_ephemeral_containers(out, old_pod=out, settings=DEFAULT)
    assert allowed(again).patch == ()


def test_debug_container_in_non_gpu_pod_is_left_alone() -> None:
    base = pod(container())
    _, decision = _debug(
        base, container("dbg", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    )
    assert allowed(decision).patch == ()


# ------------------------------------------------------------------ shapes
@pytest.mark.parametrize(
    ("p", "must_contain"),
    [
        pytest.param({"spec": []}, "spec must be a map", id="spec-list"),
        pytest.param(
            {"spec": {"containers": {}}}, "spec.containers must be a list", id="containers-map"
        ),
        pytest.param(
            {"spec": {"containers": ["x"]}}, "spec.containers[0] must be a map", id="container-str"
        ),
        pytest.param(
            {"spec": {"containers": [{"name": "c", "resources": []}]}},
            'container "c" resources must be a map',
            id="resources-list",
        ),
        pytest.param(
            {
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "resources": {"limits": {"nvidia.com/gpu": "500m"}},
                            "env": {},
                        }
                    ]
                }
            },
            "env must be a list",
            id="env-map",
        ),
        pytest.param(
            {"metadata": {"labels": "x"}, "spec": {}},
            "metadata.labels must be a map",
            id="labels-str",
        ),
        pytest.param(
            {
                "spec": {
                    "containers": [
                        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "500m"}}}
                    ],
                    "tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": "60"}],
                }
            },
            "tolerationSeconds must be an integer, got '60'",
            id="toleration-seconds-str",
        ),
    ],
)
def test_objects_not_shaped_like_pods_raise(p: Obj, must_contain: str) -> None:
    with pytest.raises(PodShapeError, match=re.escape(must_contain)):
        mutate_pod(p, settings=DEFAULT)


# ------------------------------------------------- hot-path rewrites, pinned
@pytest.mark.parametrize(
    "name",
    [
        pytest.param("train", id="ascii"),
        pytest.param("tr\u00e4in", id="non-ascii-escaped"),
        pytest.param('q"uote\\back', id="json-escapes"),
        pytest.param("del\x7f", id="del-escaped"),
        pytest.param("tab\tnew\nline", id="control-chars"),
    ],
)
def test_original_request_record_is_written_as_json_dumps_sorted_ascii(name: str) -> None:
    """The record is sorted, compact, ASCII JSON, whatever the container names hold."""
    p = pod(gpu("500m", name=name), gpu("250m", name="a-first"))
    annotations = applied(p, run(p))["metadata"]["annotations"]
    expected = {"a-first": {"nvidia.com/gpu": "250m"}, name: {"nvidia.com/gpu": "500m"}}
    assert annotations[ORIGINAL] == json.dumps(expected, separators=(",", ":"), sort_keys=True)


def test_original_request_nested_too_deeply_is_replaced_with_warning() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    p = pod(gpu("500m", name="t"), annotations={ORIGINAL: deep})
    decision = run(p)
    assert json.loads(applied(p, decision)["metadata"]["annotations"][ORIGINAL]) == {
        "t": {"nvidia.com/gpu": "500m"}
    }
    assert any("was not a JSON object" in w for w in decision.warnings)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(10**400, id="beyond-a-float"),
        pytest.param({"a": 1}, id="map"),
        pytest.param(["30"], id="list"),
        pytest.param("nan", id="nan-text"),
    ],
)
def test_fixed_policy_denies_an_mps_cap_that_is_not_a_number(value: object) -> None:
    cap = gpu("500m", name="c", env=[{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": value}])
    d = denied(mutate_pod(pod(cap, annotations={POLICY: "fixed"}), settings=DEFAULT))
    assert d.code == 403
    assert 'container "c" sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=' in d.message
    assert "set a number from 1 to 50" in d.message
