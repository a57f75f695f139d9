"""Switching the webhook from ``mode: dra`` back to ``mode: device-plugin`` (webhook/leftovers.py).

The objects admitted in device-plugin mode are made by the real DRA-mode rules
from a user's manifest, never written by hand: what device-plugin mode makes of
them must be exactly what it makes of the manifest itself, a second admission
must change nothing, and claims that are not ours must stay.
"""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any, Final

import jsonpatch
import pytest
from hypothesis import HealthCheck, event, example, given, note
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from plugin.api.quantity import QuantityError, read_quantity
from plugin.api.resources import ANNOTATION_ORIGINAL_REQUEST
from tests.webhook.builders import allowed, container, denied, gpu, pod, settings, workload
from tests.webhook.test_dra_hypothesis import with_memory
from webhook.admission import admit
from webhook.dra import Shape, mutate_pod_dra, mutate_workload_dra, parse_template_name
from webhook.leftovers import mutate_pod_leftovers, mutate_workload_leftovers, units_for_memory
from webhook.model import Decision, Denial, Mutation, RuleSettings

Obj = dict[str, Any]
A100_MIB: Final = 81920
DRA: Final = settings(mode="dra", dra={"gpu_memory_mib": A100_MIB})
PLUGIN: Final = settings(dra={"gpu_memory_mib": A100_MIB})
"""Device-plugin mode, with the ``dra`` section the DRA-mode config had."""
PLUGIN_BARE: Final = settings()
"""Device-plugin mode as the chart renders it: no ``dra.gpu_memory_mib``."""
MEMORY: Final = "metagpu.io/gpu-memory"
NVIDIA: Final = "nvidia.com/gpu"
METAGPU: Final = "cnvrg.io/metagpu"


# ------------------------------------------------------------------ helpers
def applied(obj: Obj, decision: Decision) -> Obj:
    assert isinstance(decision, Mutation), getattr(decision, "message", decision)
    out: Obj = jsonpatch.apply_patch(copy.deepcopy(obj), [dict(op) for op in decision.patch])
    return out


def by_dra(p: Obj) -> Obj:
    """What DRA mode stores for the pod ``p``."""
    return applied(p, mutate_pod_dra(p, settings=DRA))


def plugin_pod(p: Obj, s: RuleSettings = PLUGIN) -> Decision:
    return mutate_pod_leftovers(p, settings=s)


def plugin_workload(w: Obj, s: RuleSettings = PLUGIN) -> Decision:
    return mutate_workload_leftovers(w, group="apps", kind=w["kind"], settings=s)


def dra_workload(w: Obj) -> Obj:
    return applied(w, mutate_workload_dra(w, group="apps", kind=w["kind"], settings=DRA))


def spec_of(w: Obj) -> Obj:
    spec: Obj = w["spec"]["template"]["spec"]
    return spec


def as_sent(obj: Obj) -> Obj:
    """``obj`` with every number in limits and requests written as the API server sends
    quantities (text): the generated pods hold numbers, which rule 1 passes through.

    And with the units' limit copied into a missing request, as the API server does
    when it creates a pod: a template's ``cnvrg.io/metagpu: 1`` limit passes through
    rule 1 alone, while units from a claim are written to both sides (the claim does
    not say which sides the manifest had); either template makes the same pods.
    """
    out = copy.deepcopy(obj)
    spec = out["spec"]
    for key in ("template", "spec"):
        spec = spec.get(key, {}) if key in spec else spec
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = c.get("resources") if isinstance(c, dict) else None
        for side in ("limits", "requests"):
            values = resources.get(side) if isinstance(resources, dict) else None
            if isinstance(values, dict):
                for name, value in values.items():
                    if not isinstance(value, str):
                        with contextlib.suppress(QuantityError):  # (left as it came)
                            values[name] = read_quantity(value).plain
        if isinstance(resources, dict) and isinstance(resources.get("limits"), dict):
            units = resources["limits"].get(METAGPU)
            requests = resources.get("requests")
            if units is not None and (not isinstance(requests, dict) or METAGPU not in requests):
                resources["requests"] = {**(requests or {}), METAGPU: units}
    return out


def merged(stored: Obj, manifest: Obj) -> Obj:
    """``kubectl apply`` of ``manifest`` again: each container's limits and requests merged
    into the stored object (the three-way merge keeps what the webhook added)."""
    out = copy.deepcopy(stored)
    for key in ("initContainers", "containers"):
        for before, after in zip(
            spec_of(manifest).get(key) or [], spec_of(out).get(key) or [], strict=True
        ):
            for side in ("limits", "requests"):
                asked = (before.get("resources") or {}).get(side)
                if isinstance(asked, dict) and asked:
                    resources = after.setdefault("resources", {})
                    if not isinstance(resources.get(side), dict):
                        resources[side] = {}
                    resources[side].update(asked)
    return out


# ------------------------------------------------------------ template names
@hsettings(max_examples=300)
@given(
    units=st.none() | st.integers(1, 1000),
    memory_mib=st.integers(1, 1 << 20),
    prefix=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?", fullmatch=True),
)
@example(units=None, memory_mib=10240, prefix="metagpu")
@example(units=50, memory_mib=1536, prefix="gpu-0u")
def test_template_name_round_trip(units: int | None, memory_mib: int, prefix: str) -> None:
    shape = Shape(units, memory_mib)
    name = shape.template_name(prefix)
    note(name)
    assert parse_template_name(name, prefix) == shape


@hsettings(max_examples=300)
@given(text=st.from_regex(r"metagpu-[0-9a-z-]{0,12}", fullmatch=True))
@example(text="metagpu-1024mi")
@example(text="metagpu-050u-1gi")
def test_only_names_we_make_parse(text: str) -> None:
    """A name that parses is the very name its shape makes: nothing else is read as ours."""
    shape = parse_template_name(text, "metagpu")
    if shape is not None:
        event("parsed")
        assert shape.template_name("metagpu") == text


# ------------------------------------------------------------------- pods
@pytest.mark.parametrize(
    "manifest",
    [
        pytest.param(pod(gpu("500m")), id="fraction"),
        pytest.param(pod(gpu("50", resource=METAGPU)), id="units"),
        pytest.param(
            pod(container(limits={NVIDIA: "500m", MEMORY: "10Gi"})), id="fraction-and-memory"
        ),
        pytest.param(pod(container(limits={MEMORY: "10Gi"})), id="memory-only"),
        pytest.param(pod(gpu("500m", "app"), init=[gpu("500m", "warmup")]), id="init-shares-claim"),
        pytest.param(
            pod(gpu("500m", "app"), init=[gpu("250m", "side", restartPolicy="Always")]),
            id="sidecar",
        ),
        pytest.param(
            pod(gpu("500m", "a"), container("b", limits={"cpu": "1"}), gpu("250m", "c")),
            id="several",
        ),
    ],
)
def test_a_dra_pod_becomes_what_device_plugin_mode_makes(manifest: Obj) -> None:
    stored = by_dra(manifest)
    assert stored["spec"].get("resourceClaims"), "DRA mode wrote no claim"
    back = plugin_pod(stored)
    out = applied(stored, back)
    assert out == applied(manifest, plugin_pod(manifest))
    assert "resourceClaims" not in out["spec"]
    again = plugin_pod(out)
    assert isinstance(again, Mutation)
    assert again.patch == ()


def test_warning_says_what_was_converted() -> None:
    back = allowed(plugin_pod(by_dra(pod(gpu("500m")))))
    assert (
        'container "main": DRA claim gpu-main (metagpu-50u-40gi) from mode dra converted back '
        "to cnvrg.io/metagpu: 50 (the webhook runs in device-plugin mode)"
    ) in back.warnings


def test_through_admit_in_device_plugin_mode() -> None:
    """The review path (webhook.admission) uses the conversion in device-plugin mode."""
    stored = by_dra(pod(gpu("500m")))
    request: Obj = {
        "uid": "u",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "object": stored,
    }
    out = applied(stored, admit(request, settings=PLUGIN))  # type: ignore[arg-type]
    assert out["spec"]["containers"][0]["resources"] == {
        "limits": {METAGPU: "50"},
        "requests": {METAGPU: "50"},
    }


def test_pod_update_is_left_alone() -> None:
    """A pod's claims are immutable: a pod DRA mode made keeps them until it is replaced."""
    stored = by_dra(pod(gpu("500m")))
    changed = copy.deepcopy(stored)
    changed["metadata"]["labels"] = {"x": "y"}
    request: Obj = {
        "uid": "u",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "UPDATE",
        "object": changed,
        "oldObject": stored,
    }
    decision = admit(request, settings=PLUGIN)  # type: ignore[arg-type]
    assert isinstance(decision, Mutation)
    assert decision.patch == ()


def test_memory_only_becomes_the_units_that_hold_it() -> None:
    back = allowed(plugin_pod(by_dra(pod(container(limits={MEMORY: "10Gi"})))))
    out = applied(by_dra(pod(container(limits={MEMORY: "10Gi"}))), back)
    units = units_for_memory(10240, units_per_gpu=100, gpu_memory_mib=A100_MIB)
    assert units == 13  # 10Gi of 80Gi is 12.5 units: rounded up
    assert out["spec"]["containers"][0]["resources"]["limits"] == {METAGPU: "13"}
    assert any(
        "DRA claim gpu-main (metagpu-10gi) from mode dra converted back to cnvrg.io/metagpu: 13 "
        "(the webhook runs in device-plugin mode; its GPU memory as units, rounded up: "
        "ceil(10Gi × 100 units / 80Gi per GPU, dra.gpu_memory_mib))" in w
        for w in back.warnings
    ), back.warnings


@pytest.mark.parametrize(
    ("memory_mib", "gpu_mib"),
    [(1, 81920), (10240, 81920), (81920, 81920), (40536, 81559), (1, 1), (777, 1000)],
)
def test_units_for_memory_hold_the_memory(memory_mib: int, gpu_mib: int) -> None:
    """The device plugin's limit for the units is at least the ask; one unit less is not."""
    units = units_for_memory(memory_mib, units_per_gpu=100, gpu_memory_mib=gpu_mib)
    assert gpu_mib * units // 100 >= memory_mib
    assert units == 1 or gpu_mib * (units - 1) // 100 < memory_mib


def test_memory_only_without_gpu_memory_is_denied_with_what_works() -> None:
    denial = denied(plugin_pod(by_dra(pod(container(limits={MEMORY: "10Gi"}))), PLUGIN_BARE))
    for part in (
        'container "main": DRA claim gpu-main (metagpu-10gi) from mode dra asks for 10Gi',
        "set dra.gpu_memory_mib",
        "nvidia.com/gpu: 0.25",
    ):
        assert part in denial.message


def test_units_need_no_gpu_memory() -> None:
    out = applied(by_dra(pod(gpu("500m"))), plugin_pod(by_dra(pod(gpu("500m"))), PLUGIN_BARE))
    assert out["spec"]["containers"][0]["resources"]["limits"] == {METAGPU: "50"}


# -------------------------------------------------- memory asked directly
def test_memory_asked_directly_becomes_units() -> None:
    p = pod(container(limits={MEMORY: "10Gi", "cpu": "1"}, requests={MEMORY: "10Gi"}))
    decision = allowed(plugin_pod(p))
    out = applied(p, decision)
    assert out["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "1", METAGPU: "13"},
        "requests": {METAGPU: "13"},
    }
    assert any(
        'container "main": metagpu.io/gpu-memory "10Gi" converted to cnvrg.io/metagpu: 13' in w
        for w in decision.warnings
    )


def test_memory_beside_a_share_is_dropped() -> None:
    p = pod(container(limits={NVIDIA: "500m", MEMORY: "10Gi"}))
    decision = allowed(plugin_pod(p, PLUGIN_BARE))
    out = applied(p, decision)
    assert out["spec"]["containers"][0]["resources"]["limits"] == {METAGPU: "50"}
    assert any('metagpu.io/gpu-memory "10Gi" dropped' in w for w in decision.warnings)


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        pytest.param("0", "asks for no memory", id="zero"),
        pytest.param("100Gi", "more than a GPU has (80Gi, dra.gpu_memory_mib)", id="too-much"),
        pytest.param("lots", "metagpu.io/gpu-memory", id="unreadable"),
    ],
)
def test_memory_asked_directly_that_cannot_be_units(memory: str, expected: str) -> None:
    assert expected in denied(plugin_pod(pod(container(limits={MEMORY: memory})))).message


def test_memory_without_gpu_memory_is_denied() -> None:
    denial = denied(plugin_pod(pod(container(limits={MEMORY: "10Gi"})), PLUGIN_BARE))
    assert 'metagpu.io/gpu-memory "10Gi" asks for GPU memory and no units' in denial.message
    assert "set dra.gpu_memory_mib" in denial.message


def test_pod_level_memory_is_denied() -> None:
    p = pod(gpu("500m"), resources={"limits": {MEMORY: "10Gi"}})
    assert "pod-level spec.resources.limits cannot hold" in denied(plugin_pod(p)).message


# ------------------------------------------------------- not our claims
def _user_claims(p: Obj) -> Obj:
    out = copy.deepcopy(p)
    out["spec"]["resourceClaims"] = [
        {"name": "my-gpu", "resourceClaimTemplateName": "metagpu-50u-40gi"},
        {"name": "gpu-other", "resourceClaimTemplateName": "nvidia-a100"},
        {"name": "gpu-named", "resourceClaimName": "metagpu-50u-40gi"},
        {"name": "gpu-theirs", "resourceClaimTemplateName": "mine-50u-40gi"},
    ]
    out["spec"]["containers"][0].setdefault("resources", {})["claims"] = [
        {"name": n} for n in ("my-gpu", "gpu-other", "gpu-named", "gpu-theirs")
    ]
    return out


def test_claims_that_are_not_ours_are_never_touched() -> None:
    p = _user_claims(pod(container(limits={"cpu": "1"})))
    decision = plugin_pod(p)
    assert isinstance(decision, Mutation)
    assert decision.patch == ()


def test_beside_ours_the_users_claims_stay() -> None:
    stored = _user_claims(by_dra(pod(gpu("500m"))))
    user = _user_claims(pod(container(limits={"cpu": "1"})))
    stored["spec"]["resourceClaims"] = [
        *user["spec"]["resourceClaims"],
        {"name": "gpu-main", "resourceClaimTemplateName": "metagpu-50u-40gi"},
    ]
    stored["spec"]["containers"][0]["resources"]["claims"].append({"name": "gpu-main"})
    out = applied(stored, plugin_pod(stored))
    assert out["spec"]["resourceClaims"] == user["spec"]["resourceClaims"]
    resources = out["spec"]["containers"][0]["resources"]
    assert resources["claims"] == user["spec"]["containers"][0]["resources"]["claims"]
    assert resources["limits"] == {METAGPU: "50"}


def test_a_claim_no_container_uses_is_removed() -> None:
    stored = by_dra(pod(gpu("500m")))
    stored["spec"]["resourceClaims"].append(
        {"name": "gpu-gone", "resourceClaimTemplateName": "metagpu-25u-20gi"}
    )
    decision = allowed(plugin_pod(stored))
    assert "resourceClaims" not in applied(stored, decision)["spec"]
    assert any("DRA claim gpu-gone (metagpu-25u-20gi)" in w for w in decision.warnings)


def test_several_claims_of_ours_in_one_container_are_denied() -> None:
    stored = by_dra(pod(gpu("500m")))
    stored["spec"]["resourceClaims"].append(
        {"name": "gpu-more", "resourceClaimTemplateName": "metagpu-25u-20gi"}
    )
    stored["spec"]["containers"][0]["resources"]["claims"].append({"name": "gpu-more"})
    assert "holds several metagpu DRA claims" in denied(plugin_pod(stored)).message


def test_opted_out_pods_keep_their_claims() -> None:
    stored = by_dra(pod(gpu("500m")))
    stored["metadata"]["labels"] = {"metagpu.io/inject": "false"}
    decision = plugin_pod(stored)
    assert isinstance(decision, Mutation)
    assert decision.patch == ()


# -------------------------------------------------------------- workloads
@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"])
def test_a_dra_workload_becomes_what_device_plugin_mode_makes(kind: str) -> None:
    manifest = workload(kind, {"containers": [gpu("500m"), container("m", limits={MEMORY: "2Gi"})]})
    stored = dra_workload(manifest)
    assert len(spec_of(stored)["resourceClaims"]) == 2
    decision = allowed(plugin_workload(stored))
    out = applied(stored, decision)
    assert out == applied(manifest, plugin_workload(manifest))
    assert any(w.startswith(f"{kind} template: container") for w in decision.warnings)
    again = plugin_workload(out)
    assert isinstance(again, Mutation)
    assert again.patch == ()


def test_a_reapplied_manifest_drops_the_claim_and_converts_the_fraction() -> None:
    """``kubectl apply`` merges ``nvidia.com/gpu: 0.5`` back beside the stored claims."""
    manifest = workload("Deployment", {"containers": [gpu("500m")]})
    stored = dra_workload(manifest)
    decision = allowed(plugin_workload(merged(stored, manifest)))
    out = applied(merged(stored, manifest), decision)
    assert out == applied(manifest, plugin_workload(manifest))
    assert any(
        "DRA claim gpu-main (metagpu-50u-40gi) from mode dra dropped: the container asks for "
        "nvidia.com/gpu itself" in w
        for w in decision.warnings
    )
    # ... and applied once more, onto what device-plugin mode stored: the stored object.
    again = applied(merged(out, manifest), plugin_workload(merged(out, manifest)))
    assert again == out


def test_the_record_still_says_what_the_user_asked() -> None:
    manifest = workload("Deployment", {"containers": [gpu("500m")]})
    out = applied(dra_workload(manifest), plugin_workload(dra_workload(manifest)))
    record = json.loads(
        out["spec"]["template"]["metadata"]["annotations"][ANNOTATION_ORIGINAL_REQUEST]
    )
    assert record == {"main": {NVIDIA: "500m"}}


def test_a_dra_cronjob_template_converts_back() -> None:
    manifest = workload("CronJob", {"containers": [gpu("250m")]})
    stored = applied(
        manifest, mutate_workload_dra(manifest, group="batch", kind="CronJob", settings=DRA)
    )
    decision = mutate_workload_leftovers(stored, group="batch", kind="CronJob", settings=PLUGIN)
    out = applied(stored, decision)
    spec = out["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert "resourceClaims" not in spec
    assert spec["containers"][0]["resources"] == {
        "limits": {METAGPU: "25"},
        "requests": {METAGPU: "25"},
    }


# ---------------------------------------------------------------- property
ASKS: Final[list[Obj]] = [
    {},
    {"cpu": "1"},
    {NVIDIA: "500m"},
    {NVIDIA: "250m", "cpu": "2"},
    {NVIDIA: "1"},
    {METAGPU: "50"},
    {METAGPU: "7"},
    {MEMORY: "10Gi"},
    {MEMORY: "1536Mi", "memory": "1Gi"},
    {NVIDIA: "500m", MEMORY: "10Gi"},
    {METAGPU: "25", MEMORY: "4Gi"},
]
"""What a container of :func:`shares` asks for: mostly shares DRA mode accepts."""


@st.composite
def shares(draw: st.DrawFn) -> Obj:
    """A pod whose containers (app, init, sidecar) mostly ask for GPU shares, some of them
    beside a claim of the user's own."""

    def one(name: str, *, init: bool) -> Obj:
        asks = draw(st.sampled_from(ASKS))
        extra: Obj = {}
        if init and draw(st.booleans()):
            extra["restartPolicy"] = "Always"
        return container(name, limits=asks, requests=asks, **extra) if asks else container(name)

    apps = [one(f"c{i}", init=False) for i in range(draw(st.integers(1, 3)))]
    inits = [one(f"i{i}", init=True) for i in range(draw(st.integers(0, 2)))]
    p = pod(*apps, init=inits)
    if draw(st.booleans()):
        p["spec"]["resourceClaims"] = [{"name": "mine", "resourceClaimTemplateName": "mine"}]
        p["spec"]["containers"][0]["resources"]["claims"] = [{"name": "mine"}]
    return p


def _same_answer(first: Decision, second: Decision) -> None:
    assert isinstance(first, Denial) == isinstance(second, Denial), (first, second)


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=shares() | with_memory())
def test_pods_dra_made_end_up_as_device_plugin_mode_makes_them(p: Obj) -> None:
    dra = mutate_pod_dra(p, settings=DRA)
    if isinstance(dra, Denial):
        return
    stored = applied(p, dra)
    note(f"stored by DRA mode: {stored}")
    from_stored = plugin_pod(stored)
    from_manifest = plugin_pod(p)
    _same_answer(from_stored, from_manifest)
    if isinstance(from_stored, Denial):
        event("denied in device-plugin mode")
        return
    out = applied(stored, from_stored)
    assert as_sent(out) == as_sent(applied(p, from_manifest))
    event(f"claims converted back: {len(stored['spec'].get('resourceClaims') or [])}")
    again = plugin_pod(out)
    assert isinstance(again, Mutation), again
    assert again.patch == ()


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=shares() | with_memory())
def test_workloads_dra_made_end_up_as_device_plugin_mode_makes_them(p: Obj) -> None:
    manifest: Obj = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "w"},
        "spec": {"template": {"metadata": p["metadata"], "spec": p["spec"]}},
    }
    dra = mutate_workload_dra(manifest, group="apps", kind="Deployment", settings=DRA)
    if isinstance(dra, Denial):
        return
    stored = applied(manifest, dra)
    note(f"stored by DRA mode: {stored}")
    from_stored = plugin_workload(stored)
    from_manifest = plugin_workload(manifest)
    _same_answer(from_stored, from_manifest)
    if isinstance(from_stored, Denial):
        return
    out = applied(stored, from_stored)
    assert as_sent(out) == as_sent(applied(manifest, from_manifest))
    event(f"claims converted back: {len(spec_of(stored).get('resourceClaims') or [])}")
    again = plugin_workload(out)
    assert isinstance(again, Mutation), again
    assert again.patch == ()
    # The manifest applied again onto what DRA mode stored: the claim goes, the request
    # is converted as usual, and the result is the same.
    reapplied = plugin_workload(merged(stored, manifest))
    note(f"re-applied: {reapplied}")
    assert isinstance(reapplied, Mutation), reapplied
    assert as_sent(applied(merged(stored, manifest), reapplied)) == as_sent(out)
