"""JSON bodies on the wire, read and written the same way by every HTTP listener.

The webhook (AdmissionReview) and the scheduler extender (ExtenderArgs) both
take JSON from whoever reaches their port, and both answer on the hot path of
pod creation or scheduling. One decoder for both, so a hostile body gets the
same clear 400 everywhere:

* orjson parses (twice as fast as the standard library on a 3.5 KB review,
  and a third faster on a 13 KB ExtenderArgs of 1,000 node names) and
  encodes (10-20× faster on the extender's 35-80 KB answers:
  ``docs/benchmarks.md``);
* a body it refuses raises :class:`JsonBodyError` with the clearest words
  available: the standard library's message where it refuses too (it says
  where the mistake is), else orjson's. So what is not RFC 8259 JSON is
  refused although ``json.loads`` takes it (``NaN``, ``Infinity``, lone
  UTF-16 surrogates, numbers beyond a double);
* nesting deeper than :data:`DEPTH_LIMIT` is refused as such. The standard
  library raises ``RecursionError`` there, which a handler catching
  ``ValueError`` would let through as an HTTP 500 with a traceback in the log:
  ``[[[[...`` from any pod that reaches the port;
* an integer beyond 64 bits is read as the nearest float, as Kubernetes' own
  decoding of unstructured JSON does (no API server or scheduler sends one).

:func:`dumps` writes compact UTF-8 JSON, byte for byte what
``json.dumps(..., ensure_ascii=False, separators=(",", ":"))`` writes for
strings, integers, booleans, null, lists and objects with string keys (no
floats: orjson writes ``1e16`` where the standard library writes
``1e+16``).
"""

from __future__ import annotations

import json
from typing import Final

import orjson

DEPTH_LIMIT: Final = 1024
"""orjson's nesting limit; deeper documents are refused (the standard library's was about 1000)."""

_FALLBACK_ENCODER: Final = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, check_circular=False
)
"""For the one value orjson refuses to encode and JSON allows: an integer wider than
64 bits (a ``tolerationSeconds`` from a config file, say). Never on a hot path."""


class JsonBodyError(ValueError):
    """A request body that is not UTF-8 RFC 8259 JSON; ``str()`` says what is wrong."""


def loads(body: bytes, *, what: str) -> object:
    """The JSON document in ``body``, or :class:`JsonBodyError`.

    ``what`` names the document expected (``"a review"``), for the one message
    that cannot point at a place in the body: nesting too deep.
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise _refusal(body, exc, what) from exc


def dumps(value: object) -> bytes:
    """Compact UTF-8 JSON (see the module docstring for what it equals)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return _FALLBACK_ENCODER.encode(value).encode()


def _refusal(body: bytes, exc: orjson.JSONDecodeError, what: str) -> JsonBodyError:
    """Why ``body`` is refused, in the clearest words available (the error path only)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as bad:
        return JsonBodyError(f"request body is not UTF-8 JSON: {bad}")
    try:
        json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as std:
        return JsonBodyError(f"request body is not JSON: {std}")
    except RecursionError:
        return JsonBodyError(
            f"request body is nested too deeply to be {what} (more than {DEPTH_LIMIT} levels)"
        )
    except _NotJsonConstantError as constant:
        return JsonBodyError(f"request body is not JSON: {constant}")
    # What only orjson refuses: lone surrogates, numbers beyond a double, and
    # nesting past its limit that the standard library still reads.
    if "depth" in str(exc) or "recursion" in str(exc):
        return JsonBodyError(
            f"request body is nested too deeply to be {what} (more than {DEPTH_LIMIT} levels)"
        )
    return JsonBodyError(f"request body is not JSON: {exc}")


class _NotJsonConstantError(ValueError):
    pass


def _refuse_constant(name: str) -> object:
    raise _NotJsonConstantError(f"{name} is not a JSON number (JSON has no NaN or Infinity)")
