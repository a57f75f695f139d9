"""The wire format: what ``/mutate`` accepts as JSON, and the bytes it answers with.

orjson reads and writes the JSON of the hot path; these tests pin where that
is the standard library's behaviour (the same documents, the same bytes) and
where it deliberately is not (``NaN``, lone surrogates, numbers beyond a
double or beyond 64 bits), so the 400 channel stays the channel for bodies
that are not JSON.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tests.conftest import load_admission_fixture
from tests.webhook.builders import gpu, pod, settings
from webhook.model import Denial, Mutation, PatchOperation
from webhook.review import (
    MalformedReviewError,
    build_response,
    decode_json,
    decode_review,
    encode_response,
    encode_review,
)
from webhook.rules import Decision, mutate_pod

UID = "6a07c661-1012-473f-a7bf-109ef63f93ed"


@pytest.mark.parametrize(
    ("body", "must_contain"),
    [
        pytest.param(
            b"{not json",
            "request body is not JSON: Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1)",
            id="syntax-stdlib-message",
        ),
        pytest.param(b"", "request body is not JSON: Expecting value", id="empty"),
        pytest.param(b'{"a": 1,}', "request body is not JSON", id="trailing-comma"),
        pytest.param(b'{"a": "\x01"}', "Invalid control character", id="control-char"),
        pytest.param(b"\xef\xbb\xbf{}", "request body is not JSON", id="bom"),
        pytest.param(b"\xff\xfe", "not UTF-8 JSON: 'utf-8' codec can't decode", id="not-utf8"),
        pytest.param(b'{"a": "\xed\xa0\x80"}', "not UTF-8 JSON", id="utf8-encoded-surrogate"),
        pytest.param(
            b"[" * 100_000 + b"]" * 100_000,
            "nested too deeply to be a review (more than 1024 levels)",
            id="deep",
        ),
        pytest.param(b'{"a": NaN}', "NaN is not a JSON number", id="nan"),
        pytest.param(b'{"a": Infinity}', "Infinity is not a JSON number", id="infinity"),
        pytest.param(b'{"a": -Infinity}', "-Infinity is not a JSON number", id="minus-infinity"),
        pytest.param(b'{"a": "\\ud800"}', "request body is not JSON", id="lone-surrogate"),
        pytest.param(b'{"a": 1e400}', "number is infinity", id="beyond-a-double"),
    ],
)
def test_bodies_that_are_not_json_are_refused_with_a_reason(body: bytes, must_contain: str) -> None:
    with pytest.raises(MalformedReviewError) as caught:
        decode_json(body)
    assert must_contain in str(caught.value)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(b'{"a": 1, "b": 2, "a": 3}', {"a": 3, "b": 2}, id="duplicate-key-last-wins"),
        pytest.param(b'{"q": 0.5, "n": -0}', {"q": 0.5, "n": 0}, id="float-and-minus-zero"),
        pytest.param(b'{"q": 5e-1, "r": 1E2}', {"q": 0.5, "r": 100.0}, id="exponents"),
        pytest.param(
            b'{"max": 18446744073709551615, "min": -9223372036854775808}',
            {"max": 2**64 - 1, "min": -(2**63)},
            id="64-bit-integers-exact",
        ),
        pytest.param(b'  {"a": "\\u00e9\xc3\xa9"}\n', {"a": "éé"}, id="escapes-and-utf8"),
    ],
)
def test_json_reads_as_the_standard_library_reads_it(
    body: bytes, expected: dict[str, object]
) -> None:
    data = decode_json(body)
    assert isinstance(data, dict)
    assert data == expected == json.loads(body)
    assert [type(v) for v in data.values()] == [type(v) for v in expected.values()]


def test_integers_beyond_64_bits_are_read_as_floats() -> None:
    """The documented difference (Kubernetes reads unstructured JSON the same way)."""
    assert decode_json(b'{"a": 123456789012345678901234567890}') == {"a": 1.2345678901234568e29}


@pytest.mark.parametrize("resource", ["cnvrg.io/gpu", "cnvrg.io/metagpu"])
@pytest.mark.parametrize("number", [10**29, -(10**29), 2**64, -(2**63) - 1, 10**40])
def test_a_share_given_as_a_huge_integer_is_still_denied(resource: str, number: int) -> None:
    """Read as a float, such a share is still far beyond every limit: denied as before,
    only the digits (or, beyond 10**30, the reason) the message quotes differ."""
    review = load_admission_fixture("pod-half-gpu.json")
    container = review["request"]["object"]["spec"]["containers"][0]
    for side in ("limits", "requests"):
        del container["resources"][side]["nvidia.com/gpu"]
        container["resources"][side][resource] = number
    body = json.dumps(review).encode()
    fast = mutate_pod(decode_review(body).get("object") or {}, settings=settings())
    exact = mutate_pod(json.loads(body)["request"]["object"], settings=settings())
    assert isinstance(fast, Denial)
    assert isinstance(exact, Denial)
    assert (fast.code, fast.reason) == (exact.code, exact.reason) == (400, "Invalid")
    assert 'container "train": ' in fast.message
    assert resource in fast.message


def _decisions() -> list[Any]:
    mutation = mutate_pod(pod(gpu("500m", name="tr\u00e4in")), settings=settings())
    assert isinstance(mutation, Mutation)
    assert mutation.patch
    return [
        pytest.param(mutation, id="mutation-non-ascii"),
        pytest.param(Mutation(), id="unchanged"),
        pytest.param(Mutation(warnings=('tab\there "quoted" \x7f \u2028',)), id="warning-only"),
        pytest.param(
            Denial(message='container "c\x01": no\nway', reason="Forbidden", warnings=("w",)),
            id="denial-control-chars",
        ),
        pytest.param(
            Mutation(warnings=tuple(f"w{i}" + "x" * 300 for i in range(30))), id="trimmed"
        ),
    ]


@pytest.mark.parametrize("decision", _decisions())
def test_answer_is_byte_for_byte_what_json_dumps_writes(decision: Decision) -> None:
    review = build_response(UID, decision)
    stdlib = json.dumps(review, separators=(",", ":"), ensure_ascii=False).encode()
    assert encode_response(UID, decision) == encode_review(review) == stdlib


def test_values_orjson_cannot_encode_fall_back_to_the_standard_library() -> None:
    """An integer beyond 64 bits (a ``tolerationSeconds`` in the config, say) still encodes."""
    op: PatchOperation = {"op": "add", "path": "/spec/x", "value": 2**70}
    answer = json.loads(encode_response(UID, Mutation(patch=(op,))))
    assert json.loads(base64.b64decode(answer["response"]["patch"])) == [op]
    big_toleration = {
        "key": "k",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 2**70,
    }
    s = settings(tolerations=[big_toleration])
    decision = mutate_pod(pod(gpu("500m")), settings=s)
    assert isinstance(decision, Mutation)
    patch = json.loads(
        base64.b64decode(json.loads(encode_response(UID, decision))["response"]["patch"])
    )
    assert {"op": "add", "path": "/spec/tolerations", "value": [big_toleration]} in patch
