"""AdmissionReview v1 as it travels over the wire: shapes, envelope checks, responses.

The shapes are ``TypedDict``s of the JSON the API server sends (kopf
``structs/reviews.py``): they cost nothing at run time and let mypy check
every key we read. :func:`parse_review` checks the envelope once, so
everything after it can index without guarding; a malformed envelope raises
a :class:`ReviewError`, which the HTTP adapter turns into a 400, the first of
the two error channels. The second channel, a policy denial, is an ordinary
response built by :func:`build_response` with ``allowed: false``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any, Final, Literal, NotRequired, TypedDict, cast

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


_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False)
"""One compact encoder, built once (``json.dumps`` with options builds one per call). No
circularity check: what it encodes is built here or parsed from JSON, never cyclic."""

MAX_WARNINGS: Final = 20
MAX_WARNING_CHARS: Final = 256
"""The API server may truncate warnings beyond these sizes; trimming here keeps
what is shown readable rather than cut in the middle."""


def decode_review(body: bytes) -> AdmissionRequest:
    """Parse and check a request body; raises :class:`ReviewError`."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedReviewError(f"request body is not UTF-8 JSON: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedReviewError(f"request body is not JSON: {exc}") from exc
    except RecursionError as exc:
        raise MalformedReviewError("request body is nested too deeply to be a review") from exc
    return parse_review(data)


def parse_review(data: object) -> AdmissionRequest:
    """Check the envelope of an already-parsed AdmissionReview and return its request."""
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


def _require_strings(request: dict[str, Any], key: str, fields: Sequence[str]) -> None:
    value = request.get(key)
    if not isinstance(value, dict) or not all(isinstance(value.get(f), str) for f in fields):
        raise MalformedReviewError(
            f"request.{key} must be an object with string fields {', '.join(fields)}, got {value!r}"
        )


def encode_patch(patch: Sequence[PatchOperation]) -> str:
    """The base64 JSON Patch document of an AdmissionResponse."""
    return base64.b64encode(_ENCODER.encode(list(patch)).encode()).decode("ascii")


def build_response(uid: str, decision: Decision) -> AdmissionReview:
    """The AdmissionReview answering request ``uid`` with ``decision``."""
    response: AdmissionResponse = {"uid": uid, "allowed": not isinstance(decision, Denial)}
    if isinstance(decision, Denial):
        response["status"] = {
            "code": decision.code,
            "reason": decision.reason,
            "message": decision.message,
        }
    elif decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = encode_patch(decision.patch)
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
    return _ENCODER.encode(review).encode()


_RESPONSE_HEAD: Final = f'{{"apiVersion":"{API_VERSION}","kind":"{KIND}","response":{{"uid":'


def encode_response(uid: str, decision: Decision) -> bytes:
    """``encode_review(build_response(uid, decision))``, assembled directly (the hot path).

    The base64 patch needs no JSON escaping, so it is spliced in rather than
    re-scanned by the encoder: about twice as fast as building the dict and
    encoding it, byte for byte the same document (tests compare the two).
    """
    parts = [_RESPONSE_HEAD, _ENCODER.encode(uid)]
    if isinstance(decision, Denial):
        parts.append(',"allowed":false,"status":')
        parts.append(
            _ENCODER.encode(
                {"code": decision.code, "reason": decision.reason, "message": decision.message}
            )
        )
    else:
        parts.append(',"allowed":true')
        if decision.patch:
            parts.append(',"patchType":"JSONPatch","patch":"')
            parts.append(encode_patch(decision.patch))
            parts.append('"')
    if decision.warnings:
        parts.append(',"warnings":')
        parts.append(_ENCODER.encode(trim_warnings(decision.warnings)))
    parts.append("}}")
    return "".join(parts).encode()
