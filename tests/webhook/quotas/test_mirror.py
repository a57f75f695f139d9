"""The quota mirror's pure core: a source quota in, its companion (or none) out; plans."""

from __future__ import annotations

from typing import Any

import pytest

from tests.webhook.quotas.builders import SETTINGS, quota
from webhook.quotas.mirror import (
    ANNOTATION_MIRROR_OF,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    MAX_NAME_LEN,
    Blocked,
    Create,
    Delete,
    MirrorSettings,
    Replace,
    companion_name,
    desired_companion,
    plan_namespace,
)


@pytest.mark.parametrize(
    ("hard", "units"),
    [
        pytest.param({"requests.nvidia.com/gpu": "1"}, "100", id="requests"),
        pytest.param({"limits.nvidia.com/gpu": "2"}, "200", id="limits-same-intent"),
        pytest.param(
            {"requests.nvidia.com/gpu": "4", "limits.nvidia.com/gpu": "3"}, "300", id="smaller-wins"
        ),
        pytest.param({"requests.nvidia.com/gpu": "1500m"}, "150", id="fraction"),
        pytest.param({"requests.nvidia.com/gpu": "0"}, "0", id="zero-means-none"),
        pytest.param(
            {"requests.nvidia.com/gpu": "2", "requests.cpu": "8", "pods": "10"},
            "200",
            id="other-keys-not-copied",
        ),
    ],
)
def test_a_gpu_quota_gets_its_budget_in_units(hard: dict[str, str], units: str) -> None:
    source = quota("gpus", hard, uid="u-1")
    companion = desired_companion(source, SETTINGS)
    assert companion is not None
    assert companion["spec"] == {"hard": {"requests.cnvrg.io/metagpu": units}}
    meta = companion["metadata"]
    assert meta["name"] == "gpus-metagpu"
    assert meta["namespace"] == "team-a"
    assert meta["labels"] == {LABEL_MANAGED_BY: MANAGED_BY}
    assert meta["annotations"] == {ANNOTATION_MIRROR_OF: "gpus"}
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "name": "gpus",
            "uid": "u-1",
            "controller": True,
        }
    ]


def test_units_per_gpu_and_resource_name_come_from_the_config() -> None:
    settings = MirrorSettings(resource_name="example.com/slices", units_per_gpu=3)
    companion = desired_companion(quota("q", {"requests.nvidia.com/gpu": "0.5"}), settings)
    assert companion is not None
    # 1.5 units rounds down: never more than the operator allowed.
    assert companion["spec"]["hard"] == {"requests.example.com/slices": "1"}


def test_scopes_and_scope_selector_are_copied() -> None:
    selector = {
        "matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]
    }
    source = quota(
        "q", {"requests.nvidia.com/gpu": "2"}, scopes=["NotBestEffort"], scope_selector=selector
    )
    companion = desired_companion(source, SETTINGS)
    assert companion is not None
    assert companion["spec"]["scopes"] == ["NotBestEffort"]
    assert companion["spec"]["scopeSelector"] == selector
    companion["spec"]["scopeSelector"]["matchExpressions"][0]["values"].append("x")
    assert selector["matchExpressions"][0]["values"] == ["high"]  # a copy, not shared


@pytest.mark.parametrize(
    "hard",
    [
        pytest.param({"requests.cpu": "4"}, id="no-gpu-key"),
        pytest.param({"nvidia.com/gpu": "1"}, id="bare-name-is-never-counted"),
        pytest.param(
            {"requests.nvidia.com/gpu": "1", "requests.cnvrg.io/metagpu": "50"},
            id="operator-set-units",
        ),
        pytest.param(
            {"requests.nvidia.com/gpu": "1", "limits.cnvrg.io/metagpu": "50"}, id="units-limits"
        ),
        pytest.param({"requests.nvidia.com/gpu": "1", "cnvrg.io/metagpu": "50"}, id="units-bare"),
    ],
)
def test_quotas_that_get_no_companion(hard: dict[str, str]) -> None:
    assert desired_companion(quota("q", hard), SETTINGS) is None


def test_a_companion_is_never_a_source() -> None:
    mirrored = quota(
        "q-metagpu",
        {"requests.nvidia.com/gpu": "1"},
        labels={LABEL_MANAGED_BY: MANAGED_BY},
    )
    assert desired_companion(mirrored, SETTINGS) is None


def test_long_names_stay_valid_and_distinct() -> None:
    a, b = "a" * 250, "a" * 249 + "b"
    assert len(companion_name(a)) <= MAX_NAME_LEN
    assert companion_name(a) != companion_name(b)
    assert companion_name(a).endswith("-metagpu")


# ------------------------------------------------------------------ plans
def _companion_of(source: dict[str, Any], **changes: Any) -> dict[str, Any]:
    companion = desired_companion(source, SETTINGS)
    assert companion is not None
    companion["metadata"]["uid"] = "c-uid"
    companion["metadata"]["resourceVersion"] = "7"
    companion.update(changes)
    return companion


def test_plan_creates_a_missing_companion() -> None:
    source = quota("gpus", {"requests.nvidia.com/gpu": "1"})
    [action] = plan_namespace([source], SETTINGS)
    assert isinstance(action, Create)
    assert action.obj == desired_companion(source, SETTINGS)


def test_plan_is_empty_when_the_companion_matches() -> None:
    source = quota("gpus", {"requests.nvidia.com/gpu": "1"})
    companion = _companion_of(source, status={"used": {"requests.cnvrg.io/metagpu": "30"}})
    companion["metadata"]["labels"]["team"] = "ml"  # others' labels are theirs
    assert plan_namespace([source, companion], SETTINGS) == []


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(
            lambda c: c["spec"]["hard"].update({"requests.cnvrg.io/metagpu": "900"}), id="units"
        ),
        pytest.param(lambda c: c["spec"]["hard"].update({"requests.cpu": "1"}), id="extra-key"),
        pytest.param(lambda c: c["spec"].update({"scopes": ["BestEffort"]}), id="scopes"),
        pytest.param(lambda c: c["metadata"].pop("ownerReferences"), id="owner-removed"),
        pytest.param(lambda c: c["metadata"]["labels"].clear(), id="label-removed"),
    ],
)
def test_plan_repairs_a_hand_edited_companion(edit: Any) -> None:
    source = quota("gpus", {"requests.nvidia.com/gpu": "1"})
    companion = _companion_of(source)
    edit(companion)
    [action] = plan_namespace([source, companion], SETTINGS)
    assert isinstance(action, Replace)
    assert action.obj["metadata"]["resourceVersion"] == "7"
    assert action.obj["metadata"]["uid"] == "c-uid"
    assert plan_namespace([source, action.obj], SETTINGS) == []


def test_plan_follows_a_changed_budget() -> None:
    source = quota("gpus", {"requests.nvidia.com/gpu": "1"})
    companion = _companion_of(source)
    source["spec"]["hard"]["requests.nvidia.com/gpu"] = "3"
    [action] = plan_namespace([source, companion], SETTINGS)
    assert isinstance(action, Replace)
    assert action.obj["spec"]["hard"] == {"requests.cnvrg.io/metagpu": "300"}


@pytest.mark.parametrize(
    "change",
    [
        pytest.param("gone", id="source-deleted"),
        pytest.param("no-gpu", id="source-stopped-limiting-gpus"),
        pytest.param("units", id="operator-now-limits-units-itself"),
    ],
)
def test_plan_deletes_a_companion_nobody_wants(change: str) -> None:
    source = quota("gpus", {"requests.nvidia.com/gpu": "1"})
    companion = _companion_of(source)
    quotas = [companion]
    if change == "no-gpu":
        source["spec"]["hard"] = {"requests.cpu": "1"}
        quotas.append(source)
    elif change == "units":
        source["spec"]["hard"]["requests.cnvrg.io/metagpu"] = "10"
        quotas.append(source)
    assert plan_namespace(quotas, SETTINGS) == [Delete("team-a", "gpus-metagpu", "c-uid")]


def test_plan_never_touches_a_quota_that_is_not_ours() -> None:
    source = quota("gpus", {"requests.nvidia.com/gpu": "1"})
    squatter = quota("gpus-metagpu", {"requests.cnvrg.io/metagpu": "5"})
    assert plan_namespace([source, squatter], SETTINGS) == [
        Blocked("team-a", "gpus-metagpu", "gpus")
    ]
    other = quota("cpu", {"requests.cpu": "1"})
    assert plan_namespace([other], SETTINGS) == []
