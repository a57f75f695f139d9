"""The upstream scheduler-extender wire format (``k8s.io/kube-scheduler/extender/v1``).

The Go types carry no JSON tags, so the field names on the wire are the Go
field names: ``Pod``, ``Nodes``, ``NodeNames`` (ExtenderArgs);
``Nodes``, ``NodeNames``, ``FailedNodes``, ``FailedAndUnresolvableNodes``,
``Error`` (ExtenderFilterResult); ``[{"Host", "Score"}]`` (HostPriorityList,
scores 0..MaxExtenderPriority = 10); ``PodName``, ``PodNamespace``, ``PodUID``,
``Node`` (ExtenderBindingArgs); ``Error`` (ExtenderBindingResult);
``Pod``, ``NodeNameToVictims`` (``{Pods: [Pod], NumPDBViolations}``, when not
``nodeCacheCapable``) or ``NodeNameToMetaVictims`` (``{Pods: [{UID}],
NumPDBViolations}``) (ExtenderPreemptionArgs), and ``NodeNameToMetaVictims``
(ExtenderPreemptionResult: the answer is always meta victims, which kube-scheduler
turns back into pods from its own cache, ``convertToVictims``). The captured
requests in ``tests/fixtures/scheduler-extender/`` are what kube-scheduler
v1.28.7 really sent.

Requests are validated here (a body that is not one of these gives the
adapter a :class:`ProtocolError` to answer 400 with); answers are built as
plain dicts in exactly the upstream shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound="_Wire")


class ProtocolError(ValueError):
    """The request body is not the extender message the verb expects; ``str()`` says why."""


class _Wire(BaseModel):
    # Unknown fields are ignored: a newer scheduler may send more, and Go's
    # decoder would ignore them too.
    model_config = ConfigDict(extra="ignore", frozen=True)


class ExtenderArgs(_Wire):
    Pod: dict[str, Any]
    Nodes: dict[str, Any] | None = None
    """A NodeList, sent only when the extender is not ``nodeCacheCapable``."""
    NodeNames: list[str] | None = None
    """Sent only when the extender is ``nodeCacheCapable`` (ours is)."""

    def node_names(self) -> list[str]:
        """The candidate nodes, from whichever of the two fields the scheduler filled."""
        if self.NodeNames is not None:
            return list(self.NodeNames)
        items = (self.Nodes or {}).get("items") or []
        return [
            str(item["metadata"]["name"])
            for item in items
            if isinstance(item, Mapping)
            and isinstance(item.get("metadata"), Mapping)
            and "name" in item["metadata"]
        ]


class MetaPod(_Wire):
    UID: str


class MetaVictims(_Wire):
    Pods: list[MetaPod] | None = None
    NumPDBViolations: int = 0


class Victims(_Wire):
    Pods: list[dict[str, Any]] | None = None
    NumPDBViolations: int = 0


class ExtenderPreemptionArgs(_Wire):
    Pod: dict[str, Any]
    NodeNameToVictims: dict[str, Victims | None] | None = None
    """Full pods, sent only when the extender is not ``nodeCacheCapable``."""
    NodeNameToMetaVictims: dict[str, MetaVictims | None] | None = None
    """UIDs only, sent when the extender is ``nodeCacheCapable`` (ours is)."""

    def offered(self) -> dict[str, tuple[list[str], int]]:
        """Node → (the victims' UIDs kube-scheduler found, its PDB violation count)."""
        out: dict[str, tuple[list[str], int]] = {}
        for node, meta in (self.NodeNameToMetaVictims or {}).items():
            pods = (meta.Pods or []) if meta is not None else []
            out[node] = ([p.UID for p in pods], meta.NumPDBViolations if meta else 0)
        for node, full in (self.NodeNameToVictims or {}).items():
            if node in out:
                continue
            uids = [
                str((p.get("metadata") or {}).get("uid") or "")
                for p in ((full.Pods or []) if full is not None else [])
            ]
            out[node] = ([u for u in uids if u], full.NumPDBViolations if full else 0)
        return out


class ExtenderBindingArgs(_Wire):
    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class HostPriority(TypedDict):
    Host: str
    Score: int


class ExtenderFilterResult(TypedDict):
    Nodes: dict[str, Any] | None
    NodeNames: list[str] | None
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


class ExtenderBindingResult(TypedDict):
    Error: str


class MetaPodResult(TypedDict):
    UID: str


class MetaVictimsResult(TypedDict):
    Pods: list[MetaPodResult]
    NumPDBViolations: int


class ExtenderPreemptionResult(TypedDict):
    NodeNameToMetaVictims: dict[str, MetaVictimsResult]


def parse_args(body: object) -> ExtenderArgs:
    """ExtenderArgs from decoded JSON, or :class:`ProtocolError` naming what is wrong."""
    return _parse(ExtenderArgs, body, "ExtenderArgs {Pod, Nodes, NodeNames}")


def parse_preemption(body: object) -> ExtenderPreemptionArgs:
    return _parse(
        ExtenderPreemptionArgs,
        body,
        "ExtenderPreemptionArgs {Pod, NodeNameToVictims, NodeNameToMetaVictims}",
    )


def parse_binding(body: object) -> ExtenderBindingArgs:
    return _parse(
        ExtenderBindingArgs, body, "ExtenderBindingArgs {PodName, PodNamespace, PodUID, Node}"
    )


def filter_result(
    args: ExtenderArgs,
    passed: tuple[str, ...],
    failed: Mapping[str, str],
    *,
    unresolvable: Mapping[str, str] | None = None,
    error: str = "",
) -> ExtenderFilterResult:
    """The answer in the shape the scheduler was asked in (names, or a NodeList)."""
    nodes: dict[str, Any] | None = None
    names: list[str] | None = list(passed)
    if args.NodeNames is None and args.Nodes is not None:
        keep = set(passed)
        nodes = dict(args.Nodes)
        nodes["items"] = [
            item
            for item in args.Nodes.get("items") or []
            if isinstance(item, Mapping) and (item.get("metadata") or {}).get("name") in keep
        ]
        names = None
    return {
        "Nodes": nodes,
        "NodeNames": names,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable or {}),
        "Error": error,
    }


def _parse(model: type[M], body: object, shape: str) -> M:
    if not isinstance(body, dict):
        raise ProtocolError(f"expected a JSON object ({shape}), got {type(body).__name__}")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
            for e in exc.errors(include_url=False)[:5]
        )
        raise ProtocolError(f"not an {shape}: {problems}") from exc
