"""The copy-on-write patch (webhook.patching) against the reference, jsonpatch.apply_patch."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import jsonpointer
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import load_admission_fixture
from webhook.admission import admit
from webhook.config import WebhookConfig
from webhook.model import Mutation, RuleSettings
from webhook.patching import applied

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text("ab/~", max_size=3))
KEYS = st.text("ab/~-0", min_size=1, max_size=3)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=3)),
    max_leaves=12,
)


def escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def containers(doc: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every map and list in ``doc`` with its pointer."""
    found: list[tuple[str, Any]] = []
    if isinstance(doc, dict):
        found.append((path, doc))
        for key, value in doc.items():
            found += containers(value, f"{path}/{escape(key)}")
    elif isinstance(doc, list):
        found.append((path, doc))
        for i, value in enumerate(doc):
            found += containers(value, f"{path}/{i}")
    return found


@st.composite
def patched(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A document and a patch of valid add/remove/replace operations, each written against
    the document as the operations before it left it (as the rules write them)."""
    doc = draw(st.dictionaries(KEYS, JSON, min_size=1, max_size=4))
    current = copy.deepcopy(doc)
    ops: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 6))):
        path, target = draw(st.sampled_from(containers(current)))
        kind = draw(st.sampled_from(["add", "remove", "replace"]))
        if isinstance(target, dict):
            if kind == "add" or not target:
                token = draw(KEYS)
                kind = "add"
            else:
                token = draw(st.sampled_from(sorted(target)))
        elif kind == "add" or not target:
            kind = "add"
            token = draw(st.sampled_from([*map(str, range(len(target) + 1)), "-"]))
        else:
            token = str(draw(st.integers(0, len(target) - 1)))
        op: dict[str, Any] = {"op": kind, "path": f"{path}/{escape(token)}"}
        if kind != "remove":
            op["value"] = draw(JSON)
        if path == "" and kind == "remove" and len(current) == 1:
            continue  # keep a document to write to
        ops.append(op)
        current = jsonpatch.apply_patch(current, [op])
    return doc, ops


@settings(max_examples=300, deadline=None)
@given(patched())
def test_the_same_document_as_jsonpatch_and_the_request_untouched(
    case: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    doc, ops = case
    before = copy.deepcopy(doc)
    expected = jsonpatch.apply_patch(copy.deepcopy(doc), copy.deepcopy(ops))
    assert applied(doc, copy.deepcopy(ops)) == expected
    assert doc == before


@pytest.mark.parametrize(
    "op",
    [
        {"op": "remove", "path": "/a/missing"},
        {"op": "replace", "path": "/missing", "value": 1},
        {"op": "add", "path": "/a/b/c", "value": 1},
        {"op": "add", "path": "/l/5", "value": 1},
        {"op": "remove", "path": "/l/-"},
        {"op": "add", "path": "a", "value": 1},
    ],
)
def test_what_jsonpatch_refuses_is_refused(op: dict[str, Any]) -> None:
    doc = {"a": {}, "l": [1]}
    with pytest.raises((jsonpatch.JsonPatchException, jsonpointer.JsonPointerException)):
        jsonpatch.apply_patch(copy.deepcopy(doc), [op])
    with pytest.raises(jsonpatch.JsonPatchConflict):
        applied(doc, [op])


def test_operations_the_rules_never_write_are_refused_not_guessed() -> None:
    with pytest.raises(jsonpatch.JsonPatchConflict, match="unsupported operation 'move'"):
        applied({"a": 1, "l": []}, [{"op": "move", "path": "/b", "from": "/a"}])


def test_a_dra_review_is_the_same_through_either() -> None:
    """DRA mode's second step reads the pod as the first step left it."""
    review = load_admission_fixture("pod-half-gpu.json")["request"]
    settings_ = RuleSettings.from_config(
        WebhookConfig.model_validate({"mode": "dra", "dra": {"gpu_memory_mib": 81920}})
    )
    decision = admit(review, settings=settings_)
    assert isinstance(decision, Mutation)
    ops = [dict(op) for op in decision.patch]
    assert applied(review["object"], ops) == jsonpatch.apply_patch(
        copy.deepcopy(review["object"]), ops
    )
