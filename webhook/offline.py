"""``metagpu mutate``: the webhook's rules applied to files, to preview what it would do.

Reads YAML or JSON (several documents, a ``kind: List``, or an
``AdmissionReview`` as the API server would send it) and applies exactly the
rules the server applies: Pods get rules 1-8, workloads rule 9, an
AdmissionReview goes through :func:`webhook.admission.admit`. The namespace
is simulated with flags, since no cluster is asked.

Output (stdout) is the resulting objects, so ``metagpu mutate -f pod.yaml |
kubectl apply -f -`` works; with ``-o yaml`` each object is preceded by its
patch as comments, with ``-o json`` each result is
``{"object", "allowed", "patch", "warnings"}``. Warnings go to stderr the way
kubectl prints them, and a denial prints its message and makes the exit code 1.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Literal

import jsonpatch
import yaml

from webhook.admission import admit, classify
from webhook.model import Denial, NamespaceFacts, PodShapeError, RuleSettings
from webhook.review import AdmissionRequest, ReviewError, parse_review

OutputFormat = Literal["yaml", "json"]


class InputError(Exception):
    """A file that cannot be read as Kubernetes objects; the message names it."""


@dataclass
class Result:
    """What the webhook would do with one object."""

    source: str
    """``FILE#N kind/name``: where the object came from."""
    obj: dict[str, Any]
    allowed: bool
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    message: str = ""
    """The denial (or the reason the object was not considered)."""

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source,
            "allowed": self.allowed,
            "patch": self.patch,
            "warnings": self.warnings,
            "object": self.obj,
        }
        if self.message:
            out["message"] = self.message
        return out


def read_documents(stream: IO[str], *, name: str) -> Iterator[tuple[str, Any]]:
    """Every YAML/JSON document in ``stream`` with a label for messages; lists are expanded."""
    try:
        docs = list(yaml.safe_load_all(stream))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(
            f"{name}: not YAML or JSON{where}: {getattr(exc, 'problem', exc)}"
        ) from exc
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        label = f"{name}#{i + 1}" if len(docs) > 1 else name
        if isinstance(doc, dict) and doc.get("kind") == "List":
            for j, item in enumerate(doc.get("items") or []):
                yield f"{label} item {j + 1}", item
        else:
            yield label, doc


def mutate_document(
    doc: Any, *, source: str, settings: RuleSettings, namespace: NamespaceFacts
) -> Result:
    """The rules applied to one document, as the webhook would apply them on CREATE."""
    if not isinstance(doc, dict):
        return Result(source, {}, allowed=False, message=f"{source}: not a Kubernetes object")
    kind = doc.get("kind")
    if kind == "AdmissionReview":
        try:
            request = parse_review(doc)
        except ReviewError as exc:
            return Result(source, doc, allowed=False, message=f"{source}: {exc}")
        obj = copy.deepcopy(request.get("object") or {})
        label = f"{source} {request['kind']['kind']}/{_name(obj)}"
        try:
            decision = admit(request, settings=settings, namespace=namespace)
        except PodShapeError as exc:
            return Result(label, obj, allowed=False, message=f"{label}: {exc}")
    else:
        obj = copy.deepcopy(doc)
        label = f"{source} {kind}/{_name(obj)}"
        request = _create_request(obj)
        target = classify(request)
        if target == "other":
            return Result(
                label,
                obj,
                allowed=True,
                message=f"{label}: not a v1 Pod or an apps/v1, batch/v1 or v1 workload; "
                "the webhook leaves it alone",
            )
        try:
            decision = admit(request, settings=settings, namespace=namespace, target=target)
        except PodShapeError as exc:
            return Result(label, obj, allowed=False, message=f"{label}: {exc}")
    if isinstance(decision, Denial):
        return Result(
            label,
            obj,
            allowed=False,
            warnings=list(decision.warnings),
            message=f"{label} denied ({decision.code} {decision.reason}): {decision.message}",
        )
    ops = [dict(op) for op in decision.patch]
    result_obj = jsonpatch.apply_patch(obj, ops) if ops else obj
    return Result(label, result_obj, allowed=True, patch=ops, warnings=list(decision.warnings))


def _create_request(doc: dict[str, Any]) -> AdmissionRequest:
    """The CREATE review the API server would send for ``doc``, so the server's own
    :func:`~webhook.admission.classify` decides what applies (kind *and* version)."""
    group, _, version = str(doc.get("apiVersion") or "").rpartition("/")
    kind = str(doc.get("kind") or "")
    return {
        "uid": "offline",
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": ""},
        "operation": "CREATE",
        "object": doc,
    }


def render(results: Sequence[Result], *, output: OutputFormat) -> str:
    """stdout text: the resulting objects (YAML stream with patch comments, or JSON)."""
    if output == "json":
        return json.dumps([r.as_json() for r in results], indent=2) + "\n"
    parts = []
    for r in results:
        if not r.allowed:
            continue
        lines = [f"# {r.source}: {len(r.patch)} patch operation(s)"]
        lines += [f"#   {json.dumps(op, separators=(', ', ': '))}" for op in r.patch]
        lines.append(yaml.safe_dump(r.obj, sort_keys=False, default_flow_style=False).rstrip())
        parts.append("\n".join(lines))
    return "---\n".join(p + "\n" for p in parts)


def _name(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    assert isinstance(meta, dict)
    name = meta.get("name") or (f"{meta['generateName']}*" if meta.get("generateName") else "")
    return str(name or "<unnamed>")
