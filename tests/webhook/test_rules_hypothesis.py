"""Properties of the rules over generated pods: no exception, the patch applies, idempotent."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

from plugin.api.quantity import QuantityError, parse_quantity
from tests.webhook.strategies import SETTINGS, namespace_facts, pod, rule_settings
from webhook.model import Denial, Mutation, NamespaceFacts, RuleSettings
from webhook.rules import mutate_pod, mutate_workload

HALF_GPU_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p"},
    "spec": {
        "containers": [
            {"name": "c0", "resources": {"limits": {"nvidia.com/gpu": "500m"}}, "env": None}
        ],
        "tolerations": None,
    },
}


def check_units(out: dict[str, Any], s: RuleSettings) -> None:
    """After an allowed mutation, every metagpu resource is a whole number, limit == request."""
    for key in ("initContainers", "containers"):
        for c in out["spec"].get(key) or []:
            resources = c.get("resources") or {}
            limits = resources.get("limits") or {}
            requests = resources.get("requests") or {}
            for name in s.metagpu_resources:
                if name in limits or name in requests:
                    assert name in limits, f"{c['name']}: {name} has no limit"
                    value = parse_quantity(limits[name])
                    assert value == int(value)
                    assert value > 0
                    if name in requests:
                        assert parse_quantity(requests[name]) == value


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=pod(), s=rule_settings, ns=namespace_facts)
@example(p=HALF_GPU_POD, s=SETTINGS[0], ns=NamespaceFacts())
def test_pod_rules_never_raise_patch_applies_and_idempotent(
    p: dict[str, Any], s: RuleSettings, ns: NamespaceFacts
) -> None:
    original = copy.deepcopy(p)
    decision = mutate_pod(p, settings=s, namespace=ns)
    assert p == original, "the rules must not modify their input"
    if isinstance(decision, Denial):
        assert decision.message
        assert decision.code in (400, 403)
        return
    note(f"patch: {decision.patch}")
    out = jsonpatch.apply_patch(copy.deepcopy(p), list(decision.patch))
    again = mutate_pod(out, settings=s, namespace=ns)
    note(f"second run: {again}")
    assert isinstance(again, Mutation), f"allowed once, denied on its own output: {again}"
    assert again.patch == ()
    opted_out = (
        ns.inject == "false"
        or (p["metadata"].get("labels") or {}).get("metagpu.io/inject") == "false"
    )
    if not opted_out:
        check_units(out, s)


@settings(max_examples=200, deadline=None)
@given(p=pod(), s=rule_settings, kind=st.sampled_from(["Deployment", "Job", "CronJob"]))
def test_workload_rules_never_raise_and_idempotent(
    p: dict[str, Any], s: RuleSettings, kind: str
) -> None:
    template = {"metadata": p["metadata"], "spec": p["spec"]}
    group = "batch" if kind in ("Job", "CronJob") else "apps"
    spec: dict[str, Any] = (
        {"jobTemplate": {"spec": {"template": template}}}
        if kind == "CronJob"
        else {"template": template}
    )
    w = {"apiVersion": f"{group}/v1", "kind": kind, "metadata": {"name": "w"}, "spec": spec}
    decision = mutate_workload(w, group=group, kind=kind, settings=s)
    if isinstance(decision, Denial):
        return
    out = jsonpatch.apply_patch(copy.deepcopy(w), list(decision.patch))
    again = mutate_workload(out, group=group, kind=kind, settings=s)
    assert isinstance(again, Mutation)
    assert again.patch == ()


@given(st.one_of(st.text(max_size=70), st.floats(), st.integers(), st.none(), st.booleans()))
def test_quantity_parser_raises_only_quantity_errors(raw: object) -> None:
    try:
        value = parse_quantity(raw)
    except QuantityError as exc:
        message = str(exc)
    else:
        message = ""
        assert value.is_finite()
    assert message or isinstance(raw, (str, int, float))
