"""AdmissionReview v1 as it travels over the wire: shapes, envelope checks, responses.

The shapes are ``TypedDict``s of the JSON the API server sends (kopf
``structs/reviews.py``): they cost nothing at run time and let mypy check
every key we read. :func:`parse_review` checks the envelope once, so
everything after it can index without guarding; a malformed envelope raises
a :class:`ReviewError`, which the HTTP adapter turns into a 400, the first of
the two error channels. The second channel, a policy denial, is an ordinary
response built by :func:`build_response` with ``allowed: false``.

JSON goes through orjson both ways (:mod:`plugin.api.jsonwire`, shared with the
scheduler extender): it parses the ~3.5 KB review a real API server sends
about twice as fast as the standard library and encodes the answer several
times faster (``docs/benchmarks.md`` has what each step of a review costs).
What it accepts and writes is pinned to the standard library's
(``tests/webhook/test_review.py``, ``test_review_hypothesis.py``):

* a body orjson refuses is answered 400, with the standard library's message
  where it refuses too (it says where the mistake is), else orjson's. So what
  is not RFC 8259 JSON is refused although ``json.loads`` takes it: ``NaN``
  and ``Infinity``, lone UTF-16 surrogates (``"\\ud800"``: not text, and the
  answer could not be encoded), and numbers too large for a double;
* an integer beyond 64 bits (below ``-2**63`` or above ``2**64 - 1``) is read
  as the nearest float, as Kubernetes' own JSON decoding of unstructured
  objects does. The API server never sends one (its integers are int64, its
  quantities strings), so only a hand-made review can hold one; a GPU share
  written that way is still far beyond every limit and denied (a whole
  ``nvidia.com/gpu`` count below 10^31 is still left to NVIDIA's plugin, and
  one above refused as out of range). Reading such bodies exactly would mean
  scanning every body for long digit runs: about 10 us per review in the
  server, two thirds of what the parse itself costs there;
* answers are byte for byte what ``json.dumps(..., ensure_ascii=False)``
  writes, compact.
"""

from __future__ import annotations

import binascii
from collections.abc import Sequence
from typing import Any, Final, Literal, NotRequired, TypedDict, cast

from plugin.api import jsonwire
from webhook.clienttext import MAX_MESSAGE_BYTES, trim_text
from webhook.rules import Decision, Denial, PatchOperation

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
OPERATIONS: Final = ("CREATE", "UPDATE", "DELETE", "CONNECT")


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class GroupVersionResource(TypedDict):
    group: str
    version: str
    resource: str


class UserInfo(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


class AdmissionRequest(TypedDict):
    """``request`` of an AdmissionReview; only the keys the webhook relies on are required."""

    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    operation: Operation
    subResource: NotRequired[str | None]
    requestKind: NotRequired[GroupVersionKind]
    requestResource: NotRequired[GroupVersionResource]
    name: NotRequired[str | None]
    namespace: NotRequired[str | None]
    userInfo: NotRequired[UserInfo]
    object: NotRequired[dict[str, Any] | None]
    oldObject: NotRequired[dict[str, Any] | None]
    dryRun: NotRequired[bool | None]
    options: NotRequired[dict[str, Any] | None]


class ResponseStatus(TypedDict):
    """The ``metav1.Status`` subset the API server shows to the user on denial."""

    code: int
    message: str
    reason: NotRequired[str]


class AdmissionResponse(TypedDict):
    uid: str
    allowed: bool
    patchType: NotRequired[Literal["JSONPatch"]]
    patch: NotRequired[str]
    """base64 of the JSON Patch document."""
    status: NotRequired[ResponseStatus]
    warnings: NotRequired[list[str]]


class AdmissionReview(TypedDict):
    apiVersion: str
    kind: str
    response: AdmissionResponse


class ReviewError(Exception):
    """A request body that is not a usable AdmissionReview; answered with HTTP 400."""


class MalformedReviewError(ReviewError):
    """Not JSON, not an object, or a required field missing or of the wrong type."""


class UnsupportedReviewError(ReviewError):
    """Valid JSON, but not ``admission.k8s.io/v1`` ``AdmissionReview``."""


MAX_WARNINGS: Final = 20
MAX_WARNING_CHARS: Final = 256
"""The API server may truncate warnings beyond these sizes; trimming here keeps
what is shown readable rather than cut in the middle."""


def decode_review(body: bytes) -> AdmissionRequest:
    """Parse and check a request body; raises :class:`ReviewError`."""
    return parse_review(decode_json(body))


def decode_json(body: bytes) -> object:
    """The JSON document in ``body``; :class:`ReviewError` for a body that is not UTF-8
    RFC 8259 JSON (:mod:`plugin.api.jsonwire` says how that differs from ``json.loads``)."""
    try:
        return jsonwire.loads(body, what="a review")
    except jsonwire.JsonBodyError as exc:
        raise MalformedReviewError(str(exc)) from exc


def parse_review(data: object) -> AdmissionRequest:
    """Check the envelope of an already-parsed AdmissionReview and return its request.

    The checks a review from a real API server passes are written as plain
    type tests, one per field, and their messages are built only on failure:
    this runs on every request.
    """
    if not isinstance(data, dict):
        raise MalformedReviewError(
            f"request body must be a JSON object (an AdmissionReview), got {type(data).__name__}"
        )
    api_version, kind = data.get("apiVersion"), data.get("kind")
    if api_version != API_VERSION or kind != KIND:
        raise UnsupportedReviewError(
            f"unsupported review apiVersion={api_version!r} kind={kind!r}; this webhook "
            f"serves apiVersion {API_VERSION!r} kind {KIND!r} (set admissionReviewVersions: [v1])"
        )
    request = data.get("request")
    if not isinstance(request, dict):
        raise MalformedReviewError("AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReviewError(f"request.uid must be a non-empty string, got {uid!r}")
    _require_strings(request, "kind", ("group", "version", "kind"))
    _require_strings(request, "resource", ("group", "version", "resource"))
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise MalformedReviewError(
            f"request.operation must be one of {', '.join(OPERATIONS)}, got {operation!r}"
        )
    for key in ("subResource", "name", "namespace"):
        value = request.get(key)
        if value is not None and not isinstance(value, str):
            raise MalformedReviewError(f"request.{key} must be a string, got {value!r}")
    for key in ("object", "oldObject", "options"):
        value = request.get(key)
        if value is not None and not isinstance(value, dict):
            raise MalformedReviewError(
                f"request.{key} must be an object or null, got {type(value).__name__}"
            )
    if operation in ("CREATE", "UPDATE") and request.get("object") is None:
        raise MalformedReviewError(f"request.object is required for {operation}")
    dry_run = request.get("dryRun")
    if dry_run is not None and not isinstance(dry_run, bool):
        raise MalformedReviewError(f"request.dryRun must be a boolean, got {dry_run!r}")
    return cast(AdmissionRequest, request)


def _require_strings(request: dict[str, Any], key: str, fields: tuple[str, str, str]) -> None:
    value = request.get(key)
    if (
        not isinstance(value, dict)
        or not isinstance(value.get(fields[0]), str)
        or not isinstance(value.get(fields[1]), str)
        or not isinstance(value.get(fields[2]), str)
    ):
        raise MalformedReviewError(
            f"request.{key} must be an object with string fields {', '.join(fields)}, got {value!r}"
        )


def encode_patch(patch: Sequence[PatchOperation]) -> bytes:
    """The base64 JSON Patch document of an AdmissionResponse (ASCII bytes)."""
    return binascii.b2a_base64(_dumps(patch), newline=False)


def _dumps(value: object) -> bytes:
    """Compact UTF-8 JSON, as ``json.dumps(ensure_ascii=False)`` writes it, byte for byte, for
    what answers hold: strings, integers, booleans, null (no floats: orjson writes ``1e16``)."""
    return jsonwire.dumps(value)


def build_response(uid: str, decision: Decision) -> AdmissionReview:
    """The AdmissionReview answering request ``uid`` with ``decision``."""
    response: AdmissionResponse = {"uid": uid, "allowed": not isinstance(decision, Denial)}
    if isinstance(decision, Denial):
        response["status"] = {
            "code": decision.code,
            "reason": decision.reason,
            "message": trim_text(decision.message, MAX_MESSAGE_BYTES),
        }
    elif decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = encode_patch(decision.patch).decode("ascii")
    if decision.warnings:
        response["warnings"] = trim_warnings(decision.warnings)
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def trim_warnings(warnings: Sequence[str]) -> list[str]:
    """At most :data:`MAX_WARNINGS`, each at most :data:`MAX_WARNING_CHARS` characters."""
    out = [
        w if len(w) <= MAX_WARNING_CHARS else w[: MAX_WARNING_CHARS - 3] + "..." for w in warnings
    ]
    if len(out) > MAX_WARNINGS:
        out = [*out[: MAX_WARNINGS - 1], f"... and {len(out) - MAX_WARNINGS + 1} more warnings"]
    return out


def encode_review(review: AdmissionReview) -> bytes:
    """Compact JSON bytes of a response review."""
    return _dumps(review)


_RESPONSE_HEAD: Final = (
    f'{{"apiVersion":"{API_VERSION}","kind":"{KIND}","response":{{"uid":'.encode()
)


def encode_response(uid: str, decision: Decision) -> bytes:
    """``encode_review(build_response(uid, decision))``, assembled directly (the hot path).

    The base64 patch needs no JSON escaping, so it is spliced in rather than
    built into a dict and scanned again by the encoder; byte for byte the same
    document (``tests/webhook/test_review.py`` compares the two).
    """
    parts = [_RESPONSE_HEAD, _dumps(uid)]
    if isinstance(decision, Denial):
        parts.append(b',"allowed":false,"status":')
        parts.append(
            _dumps(
                {
                    "code": decision.code,
                    "reason": decision.reason,
                    "message": trim_text(decision.message, MAX_MESSAGE_BYTES),
                }
            )
        )
    else:
        parts.append(b',"allowed":true')
        if decision.patch:
            parts.append(b',"patchType":"JSONPatch","patch":"')
            parts.append(encode_patch(decision.patch))
            parts.append(b'"')
    if decision.warnings:
        parts.append(b',"warnings":')
        parts.append(_dumps(trim_warnings(decision.warnings)))
    parts.append(b"}}")
    return b"".join(parts)
