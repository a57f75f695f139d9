"""plugin.api.jsonwire: the one JSON reader and writer of the webhook and the extender.

The webhook's review tests (tests/webhook/test_review*.py) pin what it accepts
against the standard library; these cover what only this module decides.
"""

from __future__ import annotations

import json

import pytest

from plugin.api import jsonwire


@pytest.mark.parametrize("depth", [1025, 5000, 200_000])
def test_nesting_past_the_limit_is_refused_in_words(depth: int) -> None:
    with pytest.raises(jsonwire.JsonBodyError) as refused:
        jsonwire.loads(b"[" * depth + b"]" * depth, what="a thing")
    assert str(refused.value) == (
        "request body is nested too deeply to be a thing (more than 1024 levels)"
    )


def test_nesting_up_to_the_limit_is_read() -> None:
    depth = 900  # below the standard library's recursion limit too
    assert jsonwire.loads(b"[" * depth + b"]" * depth, what="a thing") is not None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "request body is not JSON: Expecting property name"),
        (b"\xff", "request body is not UTF-8 JSON"),
        (b"[Infinity]", "Infinity is not a JSON number"),
        (b'["\\ud800"]', "request body is not JSON"),
    ],
)
def test_what_is_not_json_says_why(body: bytes, message: str) -> None:
    with pytest.raises(jsonwire.JsonBodyError, match="request body") as refused:
        jsonwire.loads(body, what="a thing")
    assert message in str(refused.value)


@pytest.mark.parametrize(
    "value",
    [
        {"Host": "node-a", "Score": 7},
        [{"Host": "ü-node", "Score": 0}, None, True, "line\nbreak", -(2**63)],
        {"wide": 2**70},  # beyond orjson's integers: the fallback encoder writes it
    ],
)
def test_answers_are_what_the_standard_library_writes_compact(value: object) -> None:
    expected = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    assert jsonwire.dumps(value) == expected
