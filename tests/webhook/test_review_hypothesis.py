"""Properties of the wire format: orjson reads and writes what the standard library does.

Within RFC 8259 JSON whose integers fit in 64 bits (everything a real API
server sends), :func:`webhook.review.decode_json` gives exactly the document
``json.loads`` gives, types included, and the answer is byte for byte what
``json.dumps`` writes.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import given, note
from hypothesis import strategies as st

from webhook.model import Denial, Mutation, PatchOperation
from webhook.review import build_response, decode_json, encode_response

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
)
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
answer_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text()),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
"""What answers hold: no floats (orjson writes ``1e16`` where ``json`` writes ``1e+16``), but
integers of any size (beyond 64 bits the encoder falls back to the standard library)."""


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (``1``, ``1.0`` and ``True`` differ)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@given(doc=documents, ascii_only=st.booleans(), indent=st.sampled_from([None, 2]))
def test_decode_json_reads_what_json_loads_reads(
    doc: object, ascii_only: bool, indent: int | None
) -> None:
    body = json.dumps(doc, ensure_ascii=ascii_only, indent=indent).encode()
    note(repr(body[:300]))
    assert same(decode_json(body), json.loads(body))


ops = st.lists(
    st.builds(
        lambda path, value: {"op": "add", "path": path, "value": value},
        st.text(),
        answer_values,
    ),
    max_size=4,
)


@given(
    uid=st.text(min_size=1),
    patch=ops,
    warnings=st.lists(st.text(max_size=300), max_size=25),
    message=st.one_of(st.none(), st.text()),
)
def test_answers_are_what_json_dumps_writes(
    uid: str, patch: list[PatchOperation], warnings: list[str], message: str | None
) -> None:
    decision = (
        Denial(message=message, reason="Forbidden", warnings=tuple(warnings))
        if message is not None
        else Mutation(patch=tuple(patch), warnings=tuple(warnings))
    )
    answer = encode_response(uid, decision)
    assert answer == stdlib(build_response(uid, decision))
    sent = json.loads(answer)["response"].get("patch")
    if sent is not None:
        assert base64.b64decode(sent) == stdlib(patch)


def stdlib(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
