"""DRA mode over generated pods and workloads: no exception, the patch applies, a second
admission is a no-op, no extended resource of ours is left, every claim reference
resolves, and a re-applied manifest comes back to the stored object."""

from __future__ import annotations

import copy
from typing import Any, Final

import jsonpatch
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from tests.webhook.builders import settings as rule_settings
from tests.webhook.strategies import pod
from webhook.dra import mutate_pod_dra, mutate_workload_dra
from webhook.model import Denial, Mutation, RuleSettings

MEMORY: Final = "metagpu.io/gpu-memory"
DRA_SETTINGS: Final = [
    rule_settings(mode="dra", dra={"gpu_memory_mib": 81920}),
    rule_settings(
        mode="dra",
        dra={"gpu_memory_mib": 81559, "memory_step_mib": 512},
        extra_resource_names=["cnvrg.io/metagpu-a100"],
        convert_whole_gpus=True,
    ),
]
Obj = dict[str, Any]


@st.composite
def with_memory(draw: st.DrawFn) -> Obj:
    """A generated pod, some of whose containers also ask for GPU memory."""
    p: Obj = draw(pod())
    for c in [*p["spec"].get("initContainers", []), *p["spec"]["containers"]]:
        if draw(st.integers(0, 3)) == 0:
            value = draw(st.sampled_from(["10Gi", "1536Mi", "512Mi", "100Gi", "1500k", "0"]))
            resources = c.setdefault("resources", {})
            for side in ("limits", "requests"):
                if not isinstance(resources.get(side), dict):
                    resources[side] = {}
                resources[side][MEMORY] = value
        if draw(st.integers(0, 4)) == 0:
            c["restartPolicy"] = "Always"
    return p


def all_containers(spec: Obj) -> list[Obj]:
    return [*(spec.get("initContainers") or []), *spec["containers"]]


def check_claims(spec: Obj, s: RuleSettings) -> None:
    entries = {e["name"] for e in spec.get("resourceClaims") or []}
    for c in all_containers(spec):
        resources = c.get("resources") or {}
        for side in ("limits", "requests"):
            held = resources.get(side) or {}
            assert s.resource_name not in held, f"{c['name']}: units left in {side}"
            assert MEMORY not in held, f"{c['name']}: GPU memory left in {side}"
        for ref in resources.get("claims") or []:
            assert ref["name"] in entries, f"{c['name']}: claim {ref['name']} has no entry"


def opted_out(p: Obj) -> bool:
    return (p["metadata"].get("labels") or {}).get("metagpu.io/inject") == "false"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=with_memory(), s=st.sampled_from(DRA_SETTINGS))
def test_pods(p: Obj, s: RuleSettings) -> None:
    original = copy.deepcopy(p)
    decision = mutate_pod_dra(p, settings=s)
    assert p == original, "the rules must not modify their input"
    if isinstance(decision, Denial):
        assert decision.message
        return
    note(f"patch: {decision.patch}")
    out = jsonpatch.apply_patch(copy.deepcopy(p), [dict(o) for o in decision.patch])
    again = mutate_pod_dra(out, settings=s)
    assert isinstance(again, Mutation), f"allowed once, denied on its own output: {again}"
    assert again.patch == ()
    if not opted_out(p):
        check_claims(out["spec"], s)
        event(f"claims in the pod: {len(out['spec'].get('resourceClaims') or [])}")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=with_memory(), s=st.sampled_from(DRA_SETTINGS))
def test_workloads_and_their_reapply(p: Obj, s: RuleSettings) -> None:
    template = {"metadata": p["metadata"], "spec": p["spec"]}
    w: Obj = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "w"},
        "spec": {"template": template},
    }
    decision = mutate_workload_dra(w, group="apps", kind="Deployment", settings=s)
    if isinstance(decision, Denial):
        return
    stored = jsonpatch.apply_patch(copy.deepcopy(w), [dict(o) for o in decision.patch])
    note(f"stored: {stored}")
    again = mutate_workload_dra(stored, group="apps", kind="Deployment", settings=s)
    assert isinstance(again, Mutation)
    assert again.patch == ()
    if opted_out(p):
        return
    stored_spec = stored["spec"]["template"]["spec"]
    check_claims(stored_spec, s)
    event(f"claims in the template: {len(stored_spec.get('resourceClaims') or [])}")
    # The manifest applied again: every container's request merged back into the
    # stored object (kubectl's three-way merge keeps what the webhook added).
    merged = copy.deepcopy(stored)
    merged_spec = merged["spec"]["template"]["spec"]
    for before, after in zip(all_containers(p["spec"]), all_containers(merged_spec), strict=True):
        for side in ("limits", "requests"):
            asked = (before.get("resources") or {}).get(side)
            if isinstance(asked, dict) and asked:
                after.setdefault("resources", {})
                if not isinstance(after["resources"].get(side), dict):
                    after["resources"][side] = {}
                after["resources"][side].update(asked)
    reapplied = mutate_workload_dra(merged, group="apps", kind="Deployment", settings=s)
    note(f"re-applied: {reapplied}")
    assert isinstance(reapplied, Mutation), reapplied
    out = jsonpatch.apply_patch(merged, [dict(o) for o in reapplied.patch])
    assert out["spec"]["template"]["spec"] == stored_spec
