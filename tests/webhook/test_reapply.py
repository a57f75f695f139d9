"""Re-applying a converted workload (issue 19): the same request, not a second way of asking.

Driven by the captured AdmissionReviews (``deployment-reapply-client-side-*``,
``deployment-helm-upgrade-same``) and by variants generated from them the way
the API server would send them: server-side apply, requests only, init
containers and native sidecars, several containers, every workload kind, and
Pods. Then a property: apply a random manifest, apply it again merged as
kubectl's three-way merge would, and the stored object is the one a fresh
create gives; an unchanged manifest is never denied.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any, Final

import hypothesis.strategies as st
import jsonpatch
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings

from tests.conftest import load_admission_fixture
from tests.webhook.builders import settings
from webhook.admission import admit, classify, namespace_to_look_up
from webhook.model import Decision, Denial, Mutation
from webhook.review import AdmissionRequest
from webhook.rules import RuleSettings

DEFAULT: Final = settings()
METAGPU: Final = "cnvrg.io/metagpu"
NVIDIA: Final = "nvidia.com/gpu"
ORIGINAL: Final = "metagpu.io/original-request"
Obj = dict[str, Any]

TEMPLATE_PATHS: Final[dict[str, tuple[str, str, tuple[str, ...]]]] = {
    # kind: (apiVersion, group, path to the pod template)
    "Deployment": ("apps/v1", "apps", ("spec", "template")),
    "StatefulSet": ("apps/v1", "apps", ("spec", "template")),
    "DaemonSet": ("apps/v1", "apps", ("spec", "template")),
    "ReplicaSet": ("apps/v1", "apps", ("spec", "template")),
    "ReplicationController": ("v1", "", ("spec", "template")),
    "Job": ("batch/v1", "batch", ("spec", "template")),
    "CronJob": ("batch/v1", "batch", ("spec", "jobTemplate", "spec", "template")),
}


# ------------------------------------------------------------------ helpers
def decide(review: Obj, s: RuleSettings = DEFAULT) -> Decision:
    request: AdmissionRequest = review["request"]
    return admit(request, settings=s)


def patched(review: Obj, decision: Decision) -> Obj:
    assert isinstance(decision, Mutation), decision
    out: Obj = jsonpatch.apply_patch(
        copy.deepcopy(review["request"]["object"]), [dict(op) for op in decision.patch]
    )
    return out


def template_of(obj: Obj, kind: str = "Deployment") -> Obj:
    node: Any = obj
    for key in TEMPLATE_PATHS[kind][2]:
        node = node[key]
    out: Obj = node
    return out


def spec_of(obj: Obj, kind: str) -> Obj:
    out: Obj = obj["spec"] if kind == "Pod" else template_of(obj, kind)["spec"]
    return out


def meta_of(obj: Obj, kind: str) -> Obj:
    out: Obj = obj["metadata"] if kind == "Pod" else template_of(obj, kind)["metadata"]
    return out


def rekind(review: Obj, kind: str) -> Obj:
    """The captured Deployment re-apply, sent as another workload kind (same template)."""
    out = copy.deepcopy(review)
    api_version, group, path = TEMPLATE_PATHS[kind]
    request = out["request"]
    version = api_version.split("/")[-1]
    for key in ("kind", "requestKind"):
        request[key] = {"group": group, "version": version, "kind": kind}
    plural = kind.lower() + "s"
    for key in ("resource", "requestResource"):
        request[key] = {"group": group, "version": version, "resource": plural}
    for side in ("object", "oldObject"):
        obj = request[side]
        template = obj["spec"]["template"]
        obj["apiVersion"], obj["kind"] = api_version, kind
        spec: Obj = {}
        node = spec
        for key in path[1:-1]:
            node[key] = {}
            node = node[key]
        node[path[-1]] = template
        obj["spec"] = spec
    return out


def as_pod(review: Obj, *, defaulted: bool = True) -> Obj:
    """The captured re-apply as a Pod UPDATE: the template becomes the pod.

    Pods are defaulted before admission, so a limit is copied into the request.
    """
    out = copy.deepcopy(review)
    request = out["request"]
    for key in ("kind", "requestKind"):
        request[key] = {"group": "", "version": "v1", "kind": "Pod"}
    for key in ("resource", "requestResource"):
        request[key] = {"group": "", "version": "v1", "resource": "pods"}
    for side in ("object", "oldObject"):
        template = request[side]["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"]}
        pod["metadata"].update(name="reapplied", namespace=request["namespace"])
        pod["spec"] = template["spec"]
        if defaulted:
            for c in pod["spec"]["containers"]:
                r = c.setdefault("resources", {})
                r.setdefault("requests", {}).update(
                    {k: v for k, v in r.get("limits", {}).items() if k not in r["requests"]}
                )
        request[side] = pod
    return out


def containers_of(obj: Obj, kind: str) -> list[Obj]:
    spec = spec_of(obj, kind)
    return [*spec.get("initContainers", []), *spec["containers"]]


def same_fixture() -> Obj:
    return load_admission_fixture("deployment-reapply-client-side-same.json")


def assert_stored_again(review: Obj, kind: str = "Deployment") -> Mutation:
    """Allowed, and the patched object's spec is exactly the stored one (a quiet diff)."""
    decision = decide(review)
    assert isinstance(decision, Mutation), getattr(decision, "message", decision)
    out = patched(review, decision)
    assert out["spec"] == review["request"]["oldObject"]["spec"]
    assert meta_of(out, kind).get("annotations", {}).get(ORIGINAL) == meta_of(
        review["request"]["oldObject"], kind
    ).get("annotations", {}).get(ORIGINAL)
    again = copy.deepcopy(review)
    again["request"]["object"] = out
    assert decide(again) == Mutation(), "not idempotent after the re-apply"
    assert not any("→" in w for w in decision.warnings)
    return decision


# ------------------------------------------------------ generated variants
def test_server_side_apply_twice_is_the_same_request() -> None:
    """``kubectl apply --server-side``: a PATCH, whose options are PatchOptions."""
    review = same_fixture()
    review["request"]["options"] = {
        "kind": "PatchOptions",
        "apiVersion": "meta.k8s.io/v1",
        "fieldManager": "kubectl",
        "force": False,
    }
    assert_stored_again(review)


def test_dry_run_of_an_unchanged_manifest_shows_no_change() -> None:
    """``kubectl diff`` is a server-side dry run: the answer is the stored object."""
    review = same_fixture()
    review["request"]["dryRun"] = True
    assert_stored_again(review)


def test_requests_only_manifest() -> None:
    """The manifest set only requests: the fraction comes back in requests."""
    review = same_fixture()
    for side in ("object",):
        c = template_of(review["request"][side])["spec"]["containers"][0]
        c["resources"] = {"limits": {METAGPU: "50"}, "requests": {METAGPU: "50", NVIDIA: "500m"}}
    assert_stored_again(review)


@pytest.mark.parametrize("kind", sorted(TEMPLATE_PATHS))
def test_every_workload_kind(kind: str) -> None:
    review = rekind(same_fixture(), kind)
    assert classify(review["request"]) == "workload"
    assert_stored_again(review, kind)


@pytest.mark.parametrize("kind", sorted(TEMPLATE_PATHS))
def test_every_workload_kind_follows_a_changed_fraction(kind: str) -> None:
    review = rekind(load_admission_fixture("deployment-reapply-client-side-0.7.json"), kind)
    decision = decide(review)
    out = patched(review, decision)
    assert containers_of(out, kind)[0]["resources"] == {
        "limits": {METAGPU: "70"},
        "requests": {METAGPU: "70"},
    }
    assert json.loads(meta_of(out, kind)["annotations"][ORIGINAL]) == {"main": {NVIDIA: "700m"}}
    assert any(f"{kind} template:" in w and "50 → 70" in w for w in decision.warnings)


def several(review: Obj, *, fractions: Mapping[str, tuple[str, str, str]]) -> Obj:
    """Init containers, native sidecars and app containers, each re-applied.

    ``fractions``: container -> (resource, value asked now, value recorded).
    Names starting ``init`` are init containers, ``sidecar`` native sidecars.
    """
    out = copy.deepcopy(review)
    units = {"500m": "50", "250m": "25", "1500m": "150", "200m": "20", "700m": "70"}
    record = {name: {resource: recorded} for name, (resource, _, recorded) in fractions.items()}
    text = json.dumps(record, separators=(",", ":"), sort_keys=True)
    for side in ("object", "oldObject"):
        init: list[Obj] = []
        main: list[Obj] = []
        for name, (resource, now, recorded) in fractions.items():
            held = units[recorded]
            limits = {METAGPU: held, resource: now} if side == "object" else {METAGPU: held}
            c: Obj = {
                "name": name,
                "image": "busybox",
                "resources": {"limits": limits, "requests": {METAGPU: held}},
            }
            if name.startswith("sidecar"):
                c["restartPolicy"] = "Always"
            (init if name.startswith(("init", "sidecar")) else main).append(c)
        template = template_of(out["request"][side])
        template["metadata"]["annotations"][ORIGINAL] = text
        template["spec"]["initContainers"] = init
        template["spec"]["containers"] = main
    return out


def test_init_containers_sidecars_and_several_containers_unchanged() -> None:
    review = several(
        same_fixture(),
        fractions={
            "init-warmup": ("cnvrg.io/gpu", "250m", "250m"),
            "sidecar-log": (NVIDIA, "200m", "200m"),
            "train": (NVIDIA, "1500m", "1500m"),
            "eval": ("cnvrg.io/gpu", "200m", "200m"),
        },
    )
    assert_stored_again(review)


def test_several_containers_one_changed() -> None:
    review = several(
        same_fixture(),
        fractions={
            "init-warmup": ("cnvrg.io/gpu", "250m", "250m"),
            "train": (NVIDIA, "700m", "500m"),
            "eval": (NVIDIA, "200m", "200m"),
        },
    )
    decision = decide(review)
    out = patched(review, decision)
    by_name = {c["name"]: c["resources"] for c in containers_of(out, "Deployment")}
    assert by_name["train"] == {"limits": {METAGPU: "70"}, "requests": {METAGPU: "70"}}
    assert by_name["eval"] == {"limits": {METAGPU: "20"}, "requests": {METAGPU: "20"}}
    assert by_name["init-warmup"] == {"limits": {METAGPU: "25"}, "requests": {METAGPU: "25"}}
    record = json.loads(template_of(out)["metadata"]["annotations"][ORIGINAL])
    assert record == {
        "init-warmup": {"cnvrg.io/gpu": "250m"},
        "train": {NVIDIA: "700m"},
        "eval": {NVIDIA: "200m"},
    }
    changed = [w for w in decision.warnings if "→" in w]
    assert len(changed) == 1
    assert 'container "train"' in changed[0]


def test_the_fraction_moved_to_another_resource_name() -> None:
    """``nvidia.com/gpu: 0.5`` rewritten as ``cnvrg.io/gpu: 0.5``: kubectl drops the old
    name (it was in last-applied), and the units still match the record."""
    review = same_fixture()
    c = template_of(review["request"]["object"])["spec"]["containers"][0]
    c["resources"]["limits"] = {METAGPU: "50", "cnvrg.io/gpu": "500m"}
    decision = decide(review)
    out = patched(review, decision)
    assert template_of(out)["spec"] == template_of(review["request"]["oldObject"])["spec"]
    assert template_of(out)["spec"]["containers"][0]["resources"] == {
        "limits": {METAGPU: "50"},
        "requests": {METAGPU: "50"},
    }
    assert json.loads(template_of(out)["metadata"]["annotations"][ORIGINAL]) == {
        "main": {"cnvrg.io/gpu": "500m"}
    }


# ------------------------------------------------------------------- pods
def test_pod_reapplied_unchanged_is_the_stored_pod() -> None:
    review = as_pod(same_fixture())
    assert classify(review["request"]) == "pod-update"
    assert namespace_to_look_up(review["request"]) is None
    assert_stored_again(review, "Pod")


def test_pod_reapplied_with_another_share_is_refused_with_what_to_do() -> None:
    review = as_pod(load_admission_fixture("deployment-reapply-client-side-0.7.json"))
    decision = decide(review)
    assert isinstance(decision, Denial)
    assert 'container "main": the manifest asks for nvidia.com/gpu 700m' in decision.message
    assert "created with cnvrg.io/metagpu 50" in decision.message
    assert "delete the pod and create it again" in decision.message


@pytest.mark.parametrize("name", ["pod-update-metagpu.json", "pod-update-no-gpu.json"])
def test_other_pod_updates_are_left_alone(name: str) -> None:
    assert decide(load_admission_fixture(name)) == Mutation()


# -------------------------------------------------------- really both
def test_hand_written_both_is_denied_with_the_fix() -> None:
    """No record: someone wrote both. The denial says exactly what to delete."""
    review = same_fixture()
    del template_of(review["request"]["object"])["metadata"]["annotations"][ORIGINAL]
    decision = decide(review)
    assert isinstance(decision, Denial)
    assert decision.message == (
        'container "main" asks for a GPU share in more than one way (cnvrg.io/metagpu 50, '
        'nvidia.com/gpu 0.5 ("500m")); use only one: keep nvidia.com/gpu 0.5 ("500m") and '
        "delete cnvrg.io/metagpu from limits and requests, or keep cnvrg.io/metagpu 50 and "
        "delete nvidia.com/gpu"
    )


def test_units_that_are_not_what_metagpu_wrote_are_denied() -> None:
    """Units hand-edited to 60 (the record says 0.5 → 50): not a re-apply."""
    review = same_fixture()
    resources = template_of(review["request"]["object"])["spec"]["containers"][0]["resources"]
    resources["limits"][METAGPU] = resources["requests"][METAGPU] = "60"
    decision = decide(review)
    assert isinstance(decision, Denial)
    assert "is not what metagpu wrote for this container" in decision.message
    assert 'the recorded request (nvidia.com/gpu 0.5 ("500m")) converts to 50 units' in (
        decision.message
    )
    assert "keep cnvrg.io/metagpu 60 and delete nvidia.com/gpu" in decision.message


@pytest.mark.parametrize(
    "record",
    [
        "not json",
        '["main"]',
        '{"main": "500m"}',
        '{"main": {"cnvrg.io/metagpu": "50"}}',
        '{"main": {"nvidia.com/gpu": "500m", "cnvrg.io/gpu": "500m"}}',
        '{"main": {"nvidia.com/gpu": "garbage"}}',
        '{"main": {"nvidia.com/gpu": "-500m"}}',
        '{"main": {"nvidia.com/gpu": "333m"}}',
        '{"other": {"nvidia.com/gpu": "500m"}}',
    ],
)
def test_a_record_that_proves_nothing_keeps_the_denial(record: str) -> None:
    """The record is only a hint: garbage, or a record of something else, is no re-apply."""
    review = same_fixture()
    template_of(review["request"]["object"])["metadata"]["annotations"][ORIGINAL] = record
    decision = decide(review)
    assert isinstance(decision, Denial), decision
    assert "more than one way" in decision.message


def test_the_reapplied_fraction_is_checked_as_if_new() -> None:
    """A recorded conversion does not let a bad fraction through."""
    review = load_admission_fixture("deployment-reapply-client-side-0.7.json")
    limits = template_of(review["request"]["object"])["spec"]["containers"][0]["resources"][
        "limits"
    ]
    limits[NVIDIA] = "333m"
    decision = decide(review)
    assert isinstance(decision, Denial)
    assert "0.333" in decision.message
    assert "not a whole number of units" in decision.message
    limits[NVIDIA] = "9500m"
    decision = decide(review)
    assert isinstance(decision, Denial)
    assert "more than the configured maximum" in decision.message


def test_moving_to_whole_gpus_drops_the_units() -> None:
    """0.5 changed to 1 whole GPU: NVIDIA's plugin serves it, so the units go."""
    review = same_fixture()
    limits = template_of(review["request"]["object"])["spec"]["containers"][0]["resources"][
        "limits"
    ]
    limits[NVIDIA] = "1"
    decision = decide(review)
    out = patched(review, decision)
    assert template_of(out)["spec"]["containers"][0]["resources"] == {"limits": {NVIDIA: "1"}}
    assert ORIGINAL not in template_of(out)["metadata"].get("annotations", {})
    assert any("cnvrg.io/metagpu 50 removed" in w for w in decision.warnings)
    again = copy.deepcopy(review)
    again["request"]["object"] = out
    assert decide(again) == Mutation()


def test_the_record_follows_a_fraction_converted_without_a_reapply() -> None:
    """0.5 → units 70 by hand → 0.7 in the manifest: kubectl drops the units it
    had applied, so only the fraction arrives; the record must say 0.7, or the
    next re-apply of 0.7 would not match it."""
    review = same_fixture()
    template = template_of(review["request"]["object"])
    template["spec"]["containers"][0]["resources"] = {"limits": {NVIDIA: "700m"}}
    out = patched(review, decide(review))
    assert json.loads(template_of(out)["metadata"]["annotations"][ORIGINAL]) == {
        "main": {NVIDIA: "700m"}
    }
    reapply = copy.deepcopy(review)
    reapply["request"]["oldObject"] = out
    merged = copy.deepcopy(out)
    template_of(merged)["spec"]["containers"][0]["resources"]["limits"][NVIDIA] = "700m"
    reapply["request"]["object"] = merged
    assert patched(reapply, decide(reapply))["spec"] == out["spec"]


def test_three_shares_are_never_a_reapply() -> None:
    review = same_fixture()
    limits = template_of(review["request"]["object"])["spec"]["containers"][0]["resources"][
        "limits"
    ]
    limits["cnvrg.io/gpu"] = "500m"
    decision = decide(review)
    assert isinstance(decision, Denial)
    assert "use only one, and delete the others" in decision.message


# ------------------------------------------------------------- property
def three_way_merge(live: Any, last: Any, new: Any) -> Any:
    """kubectl's client-side apply, reduced to what these manifests use.

    Fields of the new manifest go over the live object; fields the previous
    manifest had and the new one lacks are removed; fields no manifest mentions
    (the units and the record the webhook wrote) stay. Containers merge by name
    (their strategic-merge key).
    """
    if isinstance(new, dict) and isinstance(live, dict):
        last = last if isinstance(last, dict) else {}
        out = dict(live)
        for key in last:
            if key not in new:
                out.pop(key, None)
        for key, value in new.items():
            out[key] = three_way_merge(live.get(key), last.get(key), value)
        return out
    if (
        isinstance(new, list)
        and isinstance(live, list)
        and all(isinstance(x, dict) and "name" in x for x in [*new, *live])
    ):
        live_by = {x["name"]: x for x in live}
        last_by = {x["name"]: x for x in last} if isinstance(last, list) else {}
        return [three_way_merge(live_by.get(x["name"]), last_by.get(x["name"]), x) for x in new]
    return copy.deepcopy(new)


FRACTIONS: Final = st.sampled_from(["250m", "500m", "700m", "1", "1500m", "100m", "50m"])
NAMES: Final = st.sampled_from([NVIDIA, "cnvrg.io/gpu"])


@st.composite
def manifests(draw: st.DrawFn) -> Obj:
    """A Deployment manifest as a user writes it: one to three GPU containers."""
    count = draw(st.integers(1, 3))
    containers = []
    for i in range(count):
        resource, value = draw(NAMES), draw(FRACTIONS)
        where = draw(st.sampled_from(["limits", "requests", "both"]))
        sides = ["limits", "requests"] if where == "both" else [where]
        containers.append(
            {
                "name": f"c{i}",
                "image": "busybox",
                "resources": {s: {resource: value} for s in sides},
            }
        )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "app", "namespace": "team-a"},
        "spec": {
            "template": {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": containers}}
        },
    }


def review_of(obj: Obj, old: Obj | None) -> Obj:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "1",
            "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "namespace": "team-a",
            "operation": "UPDATE" if old is not None else "CREATE",
            "userInfo": {"username": "u"},
            "object": obj,
            "oldObject": old,
        },
    }


def store(obj: Obj, old: Obj | None) -> Obj:
    """What the API server stores after the webhook (the test fails on a denial)."""
    review = review_of(copy.deepcopy(obj), old)
    decision = decide(review)
    assert isinstance(decision, Mutation), decision.message
    return patched(review, decision)


@given(first=manifests(), second=manifests(), change=st.booleans())
@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_apply_then_apply_again_converges_to_a_fresh_create(
    first: Obj, second: Obj, change: bool
) -> None:
    stored = store(first, None)
    manifest = second if change else first
    if change:
        # Same containers (a user edits values, not the container list here).
        names = [c["name"] for c in first["spec"]["template"]["spec"]["containers"]]
        manifest = copy.deepcopy(second)
        cs = manifest["spec"]["template"]["spec"]["containers"]
        while len(cs) < len(names):
            cs.append(copy.deepcopy(cs[-1]))
        manifest["spec"]["template"]["spec"]["containers"] = [
            dict(c, name=n) for c, n in zip(cs, names, strict=False)
        ]
    merged = three_way_merge(stored, first, manifest)
    again = store(merged, stored)
    fresh = store(manifest, None)
    assert again["spec"] == fresh["spec"]
    if not change:
        assert again == stored
    # And once more: a third apply of the same manifest changes nothing.
    assert store(three_way_merge(again, manifest, manifest), again) == again
