"""Device-plugin mode after DRA mode: the claims DRA mode wrote become units again.

Pure, like :mod:`webhook.rules`. DRA mode (:mod:`webhook.dra`) rewrites
workload templates too, so when an operator switches ``mode: dra`` back to
``mode: device-plugin`` the stored Deployments, Jobs and others still hold
``spec.resourceClaims[{name: gpu-main, resourceClaimTemplateName:
metagpu-50u-40gi}]`` and ``resources.claims[{name: gpu-main}]``, and nothing the
device plugin serves: their new pods would wait for a DRA driver that is gone.
So before the device-plugin rules run, a Pod CREATE and a workload template
(CREATE and UPDATE) get :func:`_unclaim_ops`:

* A ``spec.resourceClaims`` entry is **ours** when its name starts with
  ``gpu-`` (:data:`webhook.dra.CLAIM_ENTRY_PREFIX`) and its
  ``resourceClaimTemplateName`` reads as a :class:`~webhook.dra.Shape` with
  the configured ``dra.template_prefix`` (:func:`webhook.dra.parse_template_name`,
  the inverse of :meth:`~webhook.dra.Shape.template_name`). Every other claim
  (the user's own, another driver's, a ``resourceClaimName``) is never touched.
* Our entries go, and so does every container's ``resources.claims``
  reference to them. A container that referenced one gets the shape's units as
  rule 1 writes them (``cnvrg.io/metagpu: "50"`` in limits and requests), unless
  it asks for a GPU itself: ``kubectl apply`` of the manifest merges
  ``nvidia.com/gpu: 0.5`` back beside the stored claims, and then the claim is
  simply dropped and rule 1 converts the fraction as usual.
* Then the device-plugin rules run on the result (:func:`webhook.rules.mutate_pod`,
  :func:`webhook.rules.mutate_workload`), and the two patches are concatenated
  (RFC 6902 applies them in order), as :mod:`webhook.dra` does the other way.

So a pod or template DRA mode made ends up as device-plugin mode makes it from
the user's manifest, a second admission changes nothing (no claim of ours is
left), and a re-applied manifest comes back to the stored object.

GPU memory (``metagpu.io/gpu-memory``, ``dra.memory_resource_name``): the
device plugin has no such resource (a pod asking for it stays Pending
forever), and it gives each share the memory of its units. So:

* Beside a GPU share or whole GPUs, the memory ask is dropped with a warning:
  the units decide, as they do for a claim shape with units.
* Alone (a memory-only shape such as ``metagpu-10gi``, or a container asking
  ``metagpu.io/gpu-memory: 10Gi`` directly), it becomes the fewest units whose
  memory holds it: ``ceil(memory × units_per_gpu / dra.gpu_memory_mib)``, with
  a warning that says so. That is what an operator expects after switching
  back: the workload keeps running with at least the memory it asked for
  (the device plugin limits ``u`` units to ``floor(gpu_memory × u /
  units_per_gpu)``, which this ``u`` never puts below the ask), and nobody has to
  edit every workload first. Without ``dra.gpu_memory_mib`` there is no way to
  size it, so it is denied, saying what would be accepted: a clear refusal (a
  ReplicaSet's ``FailedCreate`` event) rather than a pod Pending forever on a
  resource no node has.

Pod UPDATE is left alone: a pod's ``spec.resourceClaims`` and resources are
immutable, so a pod DRA mode created keeps its claims until it is replaced.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any, Final

from plugin.api.quantity import MIB, QuantityError, format_mib, read_quantity
from webhook.dra import CLAIM_ENTRY_PREFIX, Shape, parse_template_name
from webhook.model import (
    NO_NAMESPACE_FACTS,
    UNCHANGED,
    Container,
    Decision,
    Denial,
    DraLeftovers,
    Findings,
    Mutation,
    NamespaceFacts,
    Obj,
    PatchOperation,
    RuleSettings,
    add_op,
    as_list,
    as_map,
    containers,
    escape_pointer,
    opted_out,
)
from webhook.patching import applied
from webhook.rules import WORKLOAD_TEMPLATE_PATHS, mutate_pod, mutate_workload

DEVICE_PLUGIN_MODE: Final = "the webhook runs in device-plugin mode"
"""How every warning here ends: why a claim the user may never have seen changed."""

__all__ = ["mutate_pod_leftovers", "mutate_workload_leftovers", "units_for_memory"]


# ------------------------------------------------------------ entry points
def mutate_pod_leftovers(
    pod: Obj, *, settings: RuleSettings, namespace: NamespaceFacts = NO_NAMESPACE_FACTS
) -> Decision:
    """A Pod CREATE in device-plugin mode: DRA mode's claims become units, then rules 1-8."""
    leftovers = settings.dra_leftovers
    meta = as_map(pod.get("metadata"), "metadata")
    spec = as_map(pod.get("spec"), "spec")
    if (
        leftovers is None
        or not _has_leftovers(spec, leftovers, pod_level=True)
        or opted_out(meta, namespace)
    ):
        return mutate_pod(pod, settings=settings, namespace=namespace)
    findings = Findings()
    ops = _unclaim_ops(spec, "/spec", settings=settings, leftovers=leftovers, findings=findings)
    _check_pod_memory(spec, leftovers=leftovers, findings=findings)
    if not ops and not findings.problems:
        return mutate_pod(pod, settings=settings, namespace=namespace)
    return _then_rules(
        ops,
        findings,
        lambda after: mutate_pod(after, settings=settings, namespace=namespace),
        pod,
        namespace=namespace,
    )


def mutate_workload_leftovers(
    obj: Obj,
    *,
    group: str,
    kind: str,
    settings: RuleSettings,
    namespace: NamespaceFacts = NO_NAMESPACE_FACTS,
) -> Decision:
    """Rule 9 in device-plugin mode: a template DRA mode converted gets units back, so the
    workload's next pods are served by the device plugin (CREATE and UPDATE alike)."""

    def rules(after: Obj) -> Decision:
        return mutate_workload(
            after, group=group, kind=kind, settings=settings, namespace=namespace
        )

    leftovers = settings.dra_leftovers
    path = WORKLOAD_TEMPLATE_PATHS.get((group, kind))
    if path is None:
        return UNCHANGED
    template: Any = obj
    for key in path:
        template = template.get(key) if isinstance(template, Mapping) else None
    if leftovers is None or template is None:
        return rules(obj)
    where = ".".join(path)
    template = as_map(template, where)
    spec = as_map(template.get("spec"), where, ".spec")
    if not _has_leftovers(spec, leftovers) or opted_out(
        as_map(template.get("metadata"), where, ".metadata"), namespace
    ):
        return rules(obj)
    findings = Findings()
    base = "/" + "/".join(path) + "/spec"
    ops = _unclaim_ops(spec, base, settings=settings, leftovers=leftovers, findings=findings)
    if not ops and not findings.problems:
        return rules(obj)
    findings.warnings[:] = [f"{kind} template: {w}" for w in findings.warnings]
    findings.problems[:] = [(f"{kind} template: {m}", r) for m, r in findings.problems]
    return _then_rules(ops, findings, rules, obj, namespace=namespace)


def units_for_memory(memory_mib: int | Fraction, *, units_per_gpu: int, gpu_memory_mib: int) -> int:
    """The fewest units whose GPU memory holds ``memory_mib``: ``ceil(memory ×
    units_per_gpu / gpu_memory_mib)``, at least 1.

    The device plugin limits ``u`` units to ``floor(gpu_memory_mib × u /
    units_per_gpu)`` of the smallest GPU, which for this ``u`` is never below
    ``memory_mib``; one unit less would be.
    """
    return max(1, math.ceil(Fraction(memory_mib) * units_per_gpu / gpu_memory_mib))


# --------------------------------------------------------------- internals
def _then_rules(
    ops: list[PatchOperation],
    findings: Findings,
    rules: Callable[[Obj], Decision],
    obj: Obj,
    *,
    namespace: NamespaceFacts,
) -> Decision:
    """Our operations followed by the device-plugin rules' decision on their result."""
    if findings.problems:
        messages = dict.fromkeys(m for m, _ in findings.problems)
        return Denial(
            message="; ".join(messages),
            reason="Invalid",
            warnings=tuple(dict.fromkeys([*namespace.warnings, *findings.warnings])),
        )
    after = applied(obj, ops)
    second: Decision = rules(after)
    warnings = [*namespace.warnings, *findings.warnings, *second.warnings]
    if isinstance(second, Denial):
        return Denial(
            message=second.message,
            reason=second.reason,
            warnings=tuple(dict.fromkeys(warnings)),
        )
    return Mutation(patch=(*ops, *second.patch), warnings=tuple(dict.fromkeys(warnings)))


def _has_leftovers(spec: Obj, leftovers: DraLeftovers, *, pod_level: bool = False) -> bool:
    """Whether anything here is for this module: claims, or GPU memory asked for.

    The hot path: most pods have neither, and leave after a few dict lookups.
    """
    if spec.get("resourceClaims"):
        return True
    name = leftovers.memory_resource_name
    if pod_level:
        pod_resources = as_map(spec.get("resources"), "spec.resources")
        for side in ("limits", "requests"):
            if name in as_map(pod_resources.get(side), "spec.resources.", side):
                return True
    for c in containers(spec, "/spec"):
        held = c.obj.get("resources")
        if not isinstance(held, Mapping):
            continue
        for side in ("limits", "requests"):
            values = held.get(side)
            if isinstance(values, Mapping) and name in values:
                return True
    return False


def _our_entries(spec: Obj, *, prefix: str) -> dict[str, tuple[int, str, Shape]]:
    """``spec.resourceClaims`` entries DRA mode wrote: name -> (index, template, shape).

    Both marks are needed: the ``gpu-`` name and a template name of our prefix
    that reads as a shape. An entry with a ``resourceClaimName`` names a claim
    someone made, which DRA mode never does.
    """
    ours: dict[str, tuple[int, str, Shape]] = {}
    for i, entry in enumerate(as_list(spec.get("resourceClaims"), "spec.resourceClaims")):
        if not isinstance(entry, Mapping) or entry.get("resourceClaimName") is not None:
            continue
        name = entry.get("name")
        template = entry.get("resourceClaimTemplateName")
        if not (isinstance(name, str) and name.startswith(CLAIM_ENTRY_PREFIX)):
            continue
        if not isinstance(template, str):
            continue
        shape = parse_template_name(template, prefix)
        if shape is not None and name not in ours:
            ours[name] = (i, template, shape)
    return ours


def _unclaim_ops(
    spec: Obj,
    base: str,
    *,
    settings: RuleSettings,
    leftovers: DraLeftovers,
    findings: Findings,
) -> list[PatchOperation]:
    """Our claims become units; GPU memory asks become units or leave (module docstring)."""
    ours = _our_entries(spec, prefix=leftovers.template_prefix)
    memory = leftovers.memory_resource_name
    ops: list[PatchOperation] = []
    used: set[str] = set()
    for c in containers(spec, base):
        resources = as_map(c.obj.get("resources"), c.label, " resources")
        limits = as_map(resources.get("limits"), c.label, " resources.limits")
        requests = as_map(resources.get("requests"), c.label, " resources.requests")
        refs = as_list(resources.get("claims"), c.label, " resources.claims")
        held = [
            (i, r["name"])
            for i, r in enumerate(refs)
            if isinstance(r, Mapping) and r.get("name") in ours
        ]
        asks = [n for n in sorted(settings.gpu_resources) if n in limits or n in requests]
        asks_memory = memory in limits or memory in requests
        if held:
            used.update(name for _, name in held)
            ops.extend(_reference_ops(c, held, refs))
            ops.extend(
                _held_ops(
                    c,
                    held,
                    ours,
                    asks=asks,
                    asks_memory=asks_memory,
                    settings=settings,
                    leftovers=leftovers,
                    findings=findings,
                    limits=limits,
                    requests=requests,
                )
            )
        elif asks_memory:
            ops.extend(
                _memory_ops(
                    c,
                    asks=asks,
                    settings=settings,
                    leftovers=leftovers,
                    findings=findings,
                    limits=limits,
                    requests=requests,
                )
            )
    listed = as_list(spec.get("resourceClaims"), "spec.resourceClaims")
    for name, (_, template, _) in ours.items():
        if name not in used:
            findings.warn(
                f"DRA claim {name} ({template}) from mode dra removed: no container uses it "
                f"({DEVICE_PLUGIN_MODE})"
            )
    if ours and len(ours) == len(listed):
        ops.append({"op": "remove", "path": f"{base}/resourceClaims"})
    elif ours:
        ops.extend(
            {"op": "remove", "path": f"{base}/resourceClaims/{index}"}
            for index in sorted((i for i, _, _ in ours.values()), reverse=True)
        )
    return ops


def _reference_ops(
    c: Container, held: list[tuple[int, str]], refs: Sequence[Any]
) -> list[PatchOperation]:
    """Take our claims out of ``resources.claims`` (the list with them, when only they were
    in it, as a device-plugin pod never has one); the user's own references stay."""
    if len(held) == len(refs):
        return [{"op": "remove", "path": f"{c.path}/resources/claims"}]
    return [
        {"op": "remove", "path": f"{c.path}/resources/claims/{i}"}
        for i, _ in sorted(held, reverse=True)
    ]


def _held_ops(
    c: Container,
    held: list[tuple[int, str]],
    ours: Mapping[str, tuple[int, str, Shape]],
    *,
    asks: list[str],
    asks_memory: bool,
    settings: RuleSettings,
    leftovers: DraLeftovers,
    findings: Findings,
    limits: Obj,
    requests: Obj,
) -> list[PatchOperation]:
    """A container that held our claim: its shape's units, unless it asks for a GPU itself."""
    shown = ", ".join(f"{name} ({ours[name][1]})" for _, name in held)
    if asks or asks_memory:
        what = ", ".join(asks) if asks else leftovers.memory_resource_name
        findings.warn(
            f"{c.label}: DRA claim {shown} from mode dra dropped: the container asks for "
            f"{what} itself ({DEVICE_PLUGIN_MODE})"
        )
        if asks_memory:
            return _memory_ops(
                c,
                asks=asks,
                settings=settings,
                leftovers=leftovers,
                findings=findings,
                limits=limits,
                requests=requests,
            )
        return []
    if len(held) > 1:
        findings.deny(
            f"{c.label} holds several metagpu DRA claims ({shown}); device-plugin mode gives "
            f"a container one GPU share: keep one in its resources.claims, or ask for the "
            f"share with nvidia.com/gpu or {settings.resource_name}"
        )
        return []
    name = held[0][1]
    _, template, shape = ours[name]
    claim = f"DRA claim {name} ({template}) from mode dra"
    if shape.units is not None:
        units = shape.units
        how = ""
    else:
        sized = _memory_units(
            c,
            shape.memory_mib,
            shown=format_mib(shape.memory_mib),
            asked=f"{claim} asks for {format_mib(shape.memory_mib)} of GPU memory and no units",
            settings=settings,
            leftovers=leftovers,
            findings=findings,
        )
        if sized is None:
            return []
        units, how = sized
    findings.warn(
        f"{c.label}: {claim} converted back to {settings.resource_name}: {units} "
        f"({DEVICE_PLUGIN_MODE}{how})"
    )
    return _units_ops(c, units, settings=settings, limits=limits, requests=requests)


def _memory_ops(
    c: Container,
    *,
    asks: list[str],
    settings: RuleSettings,
    leftovers: DraLeftovers,
    findings: Findings,
    limits: Obj,
    requests: Obj,
) -> list[PatchOperation]:
    """A container asking for GPU memory itself: dropped beside a GPU ask, else units."""
    name = leftovers.memory_resource_name
    raw = limits.get(name, requests.get(name))
    if asks:
        findings.warn(
            f"{c.label}: {name} {_shown(raw)} dropped: in device-plugin mode a share's GPU "
            f"memory follows what the container asks for beside it ({', '.join(asks)}) "
            f"({DEVICE_PLUGIN_MODE})"
        )
        return _remove_memory_ops(c, name, limits=limits, requests=requests)
    memory_mib = _read_memory_mib(c, name, limits=limits, requests=requests, findings=findings)
    if memory_mib is None:
        return []
    sized = _memory_units(
        c,
        memory_mib,
        shown=format_mib(int(memory_mib)) if memory_mib.denominator == 1 else str(raw),
        asked=f"{name} {_shown(raw)} asks for GPU memory and no units",
        settings=settings,
        leftovers=leftovers,
        findings=findings,
    )
    if sized is None:
        return []
    units, how = sized
    findings.warn(
        f"{c.label}: {name} {_shown(raw)} converted to {settings.resource_name}: {units} "
        f"({DEVICE_PLUGIN_MODE}{how})"
    )
    remaining = {
        side: {k: v for k, v in values.items() if k != name}
        for side, values in (("limits", limits), ("requests", requests))
    }
    return [
        *_remove_memory_ops(c, name, limits=limits, requests=requests, keep_maps=True),
        *_units_ops(
            c,
            units,
            settings=settings,
            limits=remaining["limits"],
            requests=remaining["requests"],
        ),
    ]


def _memory_units(
    c: Container,
    memory_mib: int | Fraction,
    *,
    shown: str,
    asked: str,
    settings: RuleSettings,
    leftovers: DraLeftovers,
    findings: Findings,
) -> tuple[int, str] | None:
    """Units for a memory-only ask and how they were reckoned, or None (denied)."""
    gpu_mib = leftovers.gpu_memory_mib
    accepted = (
        f"ask for a GPU share instead (nvidia.com/gpu: 0.25, or {settings.resource_name}: "
        f"N of {settings.units_per_gpu} per GPU)"
    )
    if gpu_mib is None:
        findings.deny(
            f"{c.label}: {asked}; device-plugin mode serves units, and without "
            f"dra.gpu_memory_mib (the memory of the smallest GPU, in MiB) it cannot tell how "
            f"many: set dra.gpu_memory_mib, or {accepted}"
        )
        return None
    if memory_mib > gpu_mib:
        findings.deny(
            f"{c.label}: {asked}, more than a GPU has ({format_mib(gpu_mib)}, "
            f"dra.gpu_memory_mib); {accepted}"
        )
        return None
    units = units_for_memory(
        memory_mib, units_per_gpu=settings.units_per_gpu, gpu_memory_mib=gpu_mib
    )
    how = (
        f"; its GPU memory as units, rounded up: ceil({shown} × {settings.units_per_gpu} "
        f"units / {format_mib(gpu_mib)} per GPU, dra.gpu_memory_mib)"
    )
    return units, how


def _read_memory_mib(
    c: Container, name: str, *, limits: Obj, requests: Obj, findings: Findings
) -> Fraction | None:
    """The memory a container asks for, in MiB (exactly), or None (denied)."""
    values: dict[str, tuple[Any, Any]] = {}
    for side, held in (("limits", limits), ("requests", requests)):
        if name not in held:
            continue
        try:
            values[side] = (read_quantity(held[name]).value, held[name])
        except QuantityError as exc:
            findings.deny(f"{c.label}: {side} {name}: {exc}")
            return None
    if len({v for v, _ in values.values()}) > 1:
        findings.deny(
            f"{c.label}: {name} limits ({_shown(values['limits'][1])}) and requests "
            f"({_shown(values['requests'][1])}) disagree; set both to the same value, or set "
            "only limits"
        )
        return None
    value, raw = values.get("limits") or values["requests"]
    if value <= 0:
        findings.deny(f"{c.label}: {name} {_shown(raw)} asks for no memory")
        return None
    return Fraction(value) / MIB


def _remove_memory_ops(
    c: Container, name: str, *, limits: Obj, requests: Obj, keep_maps: bool = False
) -> list[PatchOperation]:
    """Take ``name`` out of limits and requests; a map left empty goes (as the API server
    would drop it), unless units are about to be written into it (``keep_maps``)."""
    ops: list[PatchOperation] = []
    for side, values in (("limits", limits), ("requests", requests)):
        if name not in values:
            continue
        if len(values) == 1 and not keep_maps:
            ops.append({"op": "remove", "path": f"{c.path}/resources/{side}"})
        else:
            ops.append(
                {"op": "remove", "path": f"{c.path}/resources/{side}/{escape_pointer(name)}"}
            )
    return ops


def _units_ops(
    c: Container, units: int, *, settings: RuleSettings, limits: Obj, requests: Obj
) -> list[PatchOperation]:
    """``resource_name: "<units>"`` in limits and requests, as rule 1 writes a conversion."""
    text = str(units)
    key = escape_pointer(settings.resource_name)
    ops: list[PatchOperation] = []
    for side, values in (("limits", limits), ("requests", requests)):
        if values:
            ops.append(add_op(f"{c.path}/resources/{side}/{key}", text))
        else:
            ops.append(add_op(f"{c.path}/resources/{side}", {settings.resource_name: text}))
    return ops


def _check_pod_memory(spec: Obj, *, leftovers: DraLeftovers, findings: Findings) -> None:
    """Pod-level ``spec.resources`` cannot hold GPU memory: no node has such a resource,
    and a pod asking for it would stay Pending forever."""
    resources = as_map(spec.get("resources"), "spec.resources")
    name = leftovers.memory_resource_name
    for side in ("limits", "requests"):
        if name in as_map(resources.get(side), "spec.resources.", side):
            findings.deny(
                f"pod-level spec.resources.{side} cannot hold {name}; ask for a GPU share "
                "in each container's resources instead"
            )


def _shown(raw: Any) -> str:
    return f'"{raw}"' if isinstance(raw, str) else repr(raw)
