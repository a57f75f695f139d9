"""Rule 1: GPU fractions in a container's resources become whole metagpu units.

``nvidia.com/gpu: 0.5`` reaches the webhook as ``500m`` (the API server
normalises quantities, and has already copied limits into requests). It
leaves as ``cnvrg.io/metagpu: "50"`` in limits *and* requests: extended
resources must be whole numbers with equal limit and request, or the API
server refuses the pod right after the webhook.

Conversion is exact (:mod:`plugin.api.quantity`): a share that is not a whole
number of units, zero, negative, above the maximum or unreadable is denied
with a message naming the container, the value and what would be accepted.

A re-apply (``kubectl apply``, server-side apply, ``helm upgrade``, Argo CD,
Flux) merges the user's manifest, which has the fraction, into the live object,
which has the units this webhook wrote: the API server then sends both in one
container. When the units are exactly what the conversion of the request
recorded in ``metagpu.io/original-request`` gives, that is the manifest applied
again, and the fraction is what the user wants now (:func:`_as_reapply`). The
record is only a hint: the fraction is still checked as if new, and the units
follow it, so no annotation lets a container have more than it asks for.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NamedTuple

from plugin.api.quantity import (
    Quantity,
    QuantityError,
    format_decimal,
    fraction_suggestion,
    nearest_units,
    read_quantity,
    units_as_fraction,
)
from plugin.api.resources import ANNOTATION_ORIGINAL_REQUEST, NVIDIA_GPU_RESOURCE
from webhook.model import (
    Container,
    Findings,
    Obj,
    PatchOperation,
    RuleSettings,
    add_op,
    as_map,
    escape_pointer,
)


@dataclass(slots=True)
class GpuPlan:
    """What rule 1 decided for one container.

    Built once, at the end of :func:`plan_gpu`, from immutable defaults: most
    containers ask for no GPU, and their plan is nothing but the container.
    """

    container: Container
    units: int = 0
    """Units of a metagpu resource after conversion; 0: no metagpu."""
    resource: str = ""
    """The metagpu resource the units are of."""
    has_gpu: bool = False
    """Asks for any GPU (metagpu or whole NVIDIA GPUs): such a container is never voided."""
    resource_ops: Sequence[PatchOperation] = ()
    warnings: Sequence[str] = ()
    original: Mapping[str, str] | None = None
    """What the container asked for, as sent: ``{"nvidia.com/gpu": "500m"}``; None: nothing."""
    reapplied_from: int | None = None
    """A re-applied manifest: the units the object held before."""

    @property
    def restates_request(self) -> bool:
        """What this plan records is what the user asks for now, over an older record.

        True for a converted fraction (fresh or re-applied) and for a re-apply
        that went back to whole GPUs. False for units passed through: the pods
        of a converted template arrive with units, and the record they inherit
        from the template says better what the user wrote.
        """
        if self.reapplied_from is not None:
            return self.original is not None
        return self.original is not None and self.resource not in self.original

    @property
    def leaves_metagpu(self) -> bool:
        """A re-apply that went back to whole GPUs: the container's record goes."""
        return self.reapplied_from is not None and self.original is None


def show_value(raw: Any, value: Decimal | Quantity | None = None) -> str:
    """``0.333 ("333m")``: the value in plain notation, and as sent if that differs."""
    if value is None:
        return f'"{raw}"' if isinstance(raw, str) else repr(raw)
    plain = value.plain if isinstance(value, Quantity) else format_decimal(value)
    if isinstance(raw, str) and raw != plain:
        return f'{plain} ("{raw}")'
    return plain


def plan_gpu(
    c: Container, *, settings: RuleSettings, findings: Findings, meta: Obj | None = None
) -> GpuPlan:
    """Rule 1 for one container: which GPU it asks for and how to rewrite it.

    Problems go to ``findings``; the plan's own warnings are kept on the plan
    so a caller (the workload rule) can word them for its context. ``meta`` is
    the metadata of the pod or template the container belongs to: its
    ``original-request`` record tells a re-applied manifest from a container
    that really asks twice (read only then, so the usual path never parses it).
    """
    resources = as_map(c.obj.get("resources"), c.label, " resources")
    if not resources:
        return GpuPlan(c)
    limits = as_map(resources.get("limits"), c.label, " resources.limits")
    requests = as_map(resources.get("requests"), c.label, " resources.requests")
    gpu = settings.gpu_resources
    names = [n for n in limits if n in gpu]
    for n in requests:
        if n in gpu and n not in limits:
            names.append(n)
    if not names:
        return GpuPlan(c)

    shares: list[tuple[str, Quantity, Any]] = []  # (resource, value, raw): ours
    whole: list[tuple[str, Any]] = []  # whole NVIDIA GPUs: NVIDIA's device plugin serves them
    before = len(findings.problems)
    for name in names:
        read = _read_pair(c, name, limits, requests, findings)
        if read is None:
            continue
        value, raw = read
        if name in settings.metagpu_resources or (
            name in settings.fraction_resources
            and not (
                name == NVIDIA_GPU_RESOURCE and value.whole and not settings.convert_whole_gpus
            )
        ):
            shares.append((name, value, raw))
        else:
            whole.append((name, raw))
    if len(findings.problems) > before or not shares:
        return GpuPlan(c, has_gpu=True)
    previous_units: int | None = None
    if len(shares) + len(whole) > 1:
        reapply = _as_reapply(c, shares, whole, meta=meta, settings=settings)
        if reapply is not None and reapply.whole:
            return _back_to_whole_gpus(c, reapply, resources=resources, settings=settings)
        if reapply is not None:
            shares, previous_units = [reapply.share], reapply.units
        elif len(shares) > 1:
            findings.deny(_two_ways(c, shares, meta=meta, settings=settings))
            return GpuPlan(c, has_gpu=True)
    name, value, raw = shares[0]
    if whole:
        listed = ", ".join(f"{wn} {show_value(wr)}" for wn, wr in whole)
        findings.deny(
            f"{c.label} mixes a GPU share ({name} {show_value(raw, value)}) with whole GPUs "
            f"({listed}); ask for one or the other"
        )
        return GpuPlan(c, has_gpu=True)
    if name in settings.metagpu_resources:
        units = _check_units(c, name=name, value=value, raw=raw, s=settings, findings=findings)
        target = name
    else:
        units = _check_fraction(c, name=name, value=value, raw=raw, s=settings, findings=findings)
        target = settings.resource_name
    if units is None:
        return GpuPlan(c, has_gpu=True)
    warnings: tuple[str, ...] = ()
    if previous_units is not None and previous_units != units:
        warnings = (
            f"{c.label}: {name} {show_value(raw, value)}: {target} {previous_units} → {units} "
            f"({settings.units_per_gpu} units per GPU)",
        )
    elif name != target:
        warnings = (
            f"{c.label}: {name} {show_value(raw, value)} converted to {target} {units} "
            f"({settings.units_per_gpu} units per GPU)",
        )
    if previous_units is None:
        ops = _resource_ops(
            c, source=name, target=target, units=units, resources=resources, limits=limits
        )
    else:
        ops = _reapply_ops(c, source=name, target=target, units=units, resources=resources)
    return GpuPlan(
        c,
        units=units,
        resource=target,
        has_gpu=True,
        resource_ops=ops,
        warnings=warnings,
        original={name: raw if isinstance(raw, str) else value.plain},
        reapplied_from=previous_units,
    )


class _Reapply(NamedTuple):
    """A container that carries the units the webhook wrote and the user's request again."""

    share: tuple[str, Quantity, Any]
    """What the manifest asks for now: (resource, value, raw)."""
    units: int
    """The units the object held (what the recorded request converted to)."""
    whole: bool
    """The manifest now asks for whole NVIDIA GPUs, which are not converted."""


def recorded_request(meta: Obj | None, container: str) -> Mapping[str, Any] | None:
    """What ``metagpu.io/original-request`` on ``meta`` says ``container`` asked for.

    None when there is no record, it is not a JSON object, or it does not name
    the container: then nothing can be a re-apply.
    """
    if not meta:
        return None
    annotations = meta.get("annotations")
    text = (
        annotations.get(ANNOTATION_ORIGINAL_REQUEST) if isinstance(annotations, Mapping) else None
    )
    if not isinstance(text, str):
        return None
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        return None
    entry = record.get(container) if isinstance(record, dict) else None
    return entry if isinstance(entry, dict) else None


def _as_reapply(
    c: Container,
    shares: list[tuple[str, Quantity, Any]],
    whole: list[tuple[str, Any]],
    *,
    meta: Obj | None,
    settings: RuleSettings,
) -> _Reapply | None:
    """The re-applied request, or None when the container really asks twice.

    A re-apply has exactly two requests: units of the resource the webhook
    writes, and a fraction (or whole NVIDIA GPUs, when the user moved to those);
    and those units are what the recorded request converts to with today's
    settings. Anything else was written by someone.
    """
    target = settings.resource_name
    held = [s for s in shares if s[0] == target]
    if len(shares) + len(whole) != 2 or len(held) != 1:
        return None
    _, held_value, _ = held[0]
    recorded = _recorded_units(recorded_request(meta, c.name), settings)
    if recorded is None or not held_value.whole or recorded[1] != held_value.numerator:
        return None
    if whole:
        name, raw = whole[0]
        try:
            value = read_quantity(raw)
        except QuantityError:
            return None  # (already denied while reading)
        return _Reapply((name, value, raw), recorded[1], whole=True)
    (asked,) = [s for s in shares if s[0] != target]
    if asked[0] not in settings.fraction_resources:
        return None
    return _Reapply(asked, recorded[1], whole=False)


def _two_ways(
    c: Container,
    shares: list[tuple[str, Quantity, Any]],
    *,
    meta: Obj | None,
    settings: RuleSettings,
) -> str:
    """Why a container that asks in two ways is denied, and how to fix its manifest."""
    listed = ", ".join(f"{n} {show_value(r, v)}" for n, v, r in shares)
    denial = f"{c.label} asks for a GPU share in more than one way ({listed})"
    target = settings.resource_name
    held = [s for s in shares if s[0] == target]
    if len(shares) != 2 or len(held) != 1:
        return f"{denial}; use only one, and delete the others from limits and requests"
    _, held_value, held_raw = held[0]
    ((other, other_value, other_raw),) = [s for s in shares if s[0] != target]
    fix = (
        f"keep {other} {show_value(other_raw, other_value)} and delete {target} from "
        f"limits and requests, or keep {target} {show_value(held_raw, held_value)} and delete "
        f"{other}"
    )
    entry = recorded_request(meta, c.name)
    if entry is None:
        return f"{denial}; use only one: {fix}"
    recorded = _recorded_units(entry, settings)
    wrote = (
        f"the recorded request ({recorded[0]}) converts to {recorded[1]} units"
        if recorded is not None
        else f"{ANNOTATION_ORIGINAL_REQUEST} records no fraction that metagpu converted"
    )
    return (
        f"{denial}, and {target} {show_value(held_raw, held_value)} is not what metagpu "
        f"wrote for this container ({wrote}), so this is not a re-applied manifest; "
        f"use only one: {fix}"
    )


def _back_to_whole_gpus(
    c: Container, reapply: _Reapply, *, resources: Obj, settings: RuleSettings
) -> GpuPlan:
    """A converted container whose manifest now asks for whole NVIDIA GPUs.

    Whole GPUs are NVIDIA's device plugin's to serve (``convert_whole_gpus``
    off), so the units go and the whole GPUs stay, as a fresh create would
    have them.
    """
    name, value, raw = reapply.share
    target = settings.resource_name
    base = c.path + "/resources"
    ops: list[PatchOperation] = []
    for side in ("limits", "requests"):
        current = as_map(resources.get(side), c.label, " resources.", side)
        if target not in current:
            continue
        # The units were the only thing there (the webhook added the map): the
        # map goes too, as a fresh create would not have it.
        path = f"{base}/{side}" if len(current) == 1 else f"{base}/{side}/{escape_pointer(target)}"
        ops.append({"op": "remove", "path": path})
    return GpuPlan(
        c,
        has_gpu=True,
        resource_ops=ops,
        warnings=(
            f"{c.label}: {name} {show_value(raw, value)}: {target} {reapply.units} removed; "
            f"whole GPUs are served by NVIDIA's device plugin",
        ),
        reapplied_from=reapply.units,
    )


def _recorded_units(
    entry: Mapping[str, Any] | None, settings: RuleSettings
) -> tuple[str, int] | None:
    """(what was recorded, the units it converts to today), or None if it is no fraction."""
    if entry is None or len(entry) != 1:
        return None
    ((name, raw),) = entry.items()
    if name not in settings.fraction_resources or not isinstance(raw, str):
        return None
    try:
        value = read_quantity(raw)
    except QuantityError:
        return None
    if value.numerator <= 0:
        return None
    units = _fraction_units(value, settings.units_per_gpu)
    if units is None:
        return None
    return f"{name} {show_value(raw, value)}", units


def check_pod_resources(spec: Obj, *, settings: RuleSettings, findings: Findings) -> None:
    """Pod-level ``spec.resources`` takes no GPUs; say so rather than let it through."""
    resources = as_map(spec.get("resources"), "spec.resources")
    if not resources:
        return  # most pods
    for side in ("limits", "requests"):
        for name in as_map(resources.get(side), "spec.resources.", side):
            if name in settings.gpu_resources:
                findings.deny(
                    f"pod-level spec.resources.{side} cannot hold {name}; "
                    "ask for GPUs in each container's resources instead"
                )


# ----------------------------------------------------------------- internals
def _read_pair(
    c: Container, name: str, limits: Obj, requests: Obj, findings: Findings
) -> tuple[Quantity, Any] | None:
    """Parse the limit and request of ``name``; they must agree when both are set.

    Returns the value and the text it was read from (the limit's when set).
    """
    limit_raw = limits.get(name, _MISSING)
    request_raw = requests.get(name, _MISSING)
    try:
        limit = None if limit_raw is _MISSING else read_quantity(limit_raw)
    except QuantityError as exc:
        findings.deny(f"{c.label}: limits {name}: {exc}")
        return None
    try:
        request = None if request_raw is _MISSING else read_quantity(request_raw)
    except QuantityError as exc:
        findings.deny(f"{c.label}: requests {name}: {exc}")
        return None
    if limit is None:
        assert request is not None
        return request, request_raw
    if request is not None and request is not limit and request.value != limit.value:
        findings.deny(
            f"{c.label}: {name} limits ({show_value(limit_raw, limit)}) and requests "
            f"({show_value(request_raw, request)}) disagree; extended resources need them "
            "equal: set both to the same value, or set only limits"
        )
        return None
    return limit, limit_raw


_MISSING: Any = object()


def _check_fraction(
    c: Container, *, name: str, value: Quantity, raw: Any, s: RuleSettings, findings: Findings
) -> int | None:
    """Units for a share of one GPU, or None (and a denial) when it has no exact answer.

    Exact integer arithmetic on the share's ratio: the common case builds no
    Decimal and no message.
    """
    numerator, denominator = value.numerator, value.denominator
    if numerator <= 0:
        what = "asks for no GPU" if numerator == 0 else "is negative"
        findings.deny(
            f"{c.label}: {name} {show_value(raw, value)} {what}; ask for {_share_range(s)}"
        )
        return None
    max_numerator, max_denominator = s.max_gpus_ratio
    if numerator * max_denominator > max_numerator * denominator:
        findings.deny(
            f"{c.label}: {name} {show_value(raw, value)} is more than the configured maximum "
            f"of {format_decimal(s.max_gpus)} GPUs per container; ask for {_share_range(s)}"
        )
        return None
    units = _fraction_units(value, s.units_per_gpu)
    if units is None:
        low, high = nearest_units(value.value, s.units_per_gpu)
        as_fraction = fraction_suggestion(value.value, s.units_per_gpu)
        as_units = " or ".join(str(u) for u in dict.fromkeys((low, high)) if u > 0)
        hint = f"{s.resource_name}: {as_units}"
        hint = f"use {as_fraction}, or {hint}" if as_fraction else f"use {hint}"
        findings.deny(
            f"{c.label}: {name} {show_value(raw, value)} is not a whole number of units "
            f"({s.units_per_gpu} units per GPU); {hint}"
        )
        return None
    return units


def _fraction_units(value: Quantity, units_per_gpu: int) -> int | None:
    """``value`` GPUs in units, or None when that is not a whole number of units.

    The one place a share of a GPU becomes units, for admission
    (:func:`_check_fraction`) and for re-reading a recorded request
    (:func:`_recorded_units`), so both always agree. Exact integer arithmetic
    on the share's ratio; callers decide what a non-positive share means.
    """
    units, remainder = divmod(value.numerator * units_per_gpu, value.denominator)
    return None if remainder else units


def _share_range(s: RuleSettings) -> str:
    """What to ask for instead, in values that are themselves accepted.

    GPU fractions when one unit and the largest share both have an exact decimal
    form (``0.01`` and ``8`` at 100 units per GPU); otherwise units, since a
    rounded fraction (``0.142857...`` at 7 per GPU) would be refused in turn.
    """
    low = units_as_fraction(1, s.units_per_gpu)
    high = units_as_fraction(s.max_units, s.units_per_gpu)
    if low is not None and high is not None:
        return f"a share between {low} and {high} of a GPU"
    return f"{s.resource_name}: 1 to {s.max_units} ({s.units_per_gpu} units per GPU)"


def _check_units(
    c: Container, *, name: str, value: Quantity, raw: Any, s: RuleSettings, findings: Findings
) -> int | None:
    """Units of a metagpu resource as they are, or None (and a denial) when not 1..max_units."""
    units = value.numerator
    if value.whole and 0 < units <= s.max_units:
        return units  # the common case: no message to build
    shown = show_value(raw, value)
    accepted = f"a whole number of units from 1 to {s.max_units} ({s.units_per_gpu} per GPU)"
    if not value.whole:
        example = (
            f"; for half a GPU write {name}: {s.units_per_gpu // 2}"
            if s.units_per_gpu % 2 == 0
            else ""
        )
        findings.deny(f"{c.label}: {name} {shown} is not {accepted}{example}")
    elif units <= 0:
        what = "asks for no GPU" if units == 0 else "is negative"
        findings.deny(f"{c.label}: {name} {shown} {what}; ask for {accepted}")
    else:
        findings.deny(
            f"{c.label}: {name} {shown} is more than the configured maximum of "
            f"{s.max_units} units ({format_decimal(s.max_gpus)} GPUs) per container; "
            f"ask for {accepted}"
        )
    return None


def _resource_ops(
    c: Container, *, source: str, target: str, units: int, resources: Obj, limits: Obj
) -> list[PatchOperation]:
    """Operations that leave ``target: units`` in limits and requests and no ``source``.

    A conversion writes both sides. A metagpu resource passed through only
    gets the limit it lacks: the API server refuses a request-only extended
    resource but copies a limit into the request itself (pods are defaulted
    before webhooks run; templates when their pods are created).
    """
    text = str(units)
    base = c.path + "/resources"
    if source == target:
        if not resources.get("limits"):
            return [add_op(f"{base}/limits", {target: text})]
        if target not in limits:
            return [add_op(f"{base}/limits/{escape_pointer(target)}", text)]
        return []
    ops: list[PatchOperation] = []
    for side in ("limits", "requests"):
        current = resources.get(side)
        if not current:
            ops.append(add_op(f"{base}/{side}", {target: text}))
            continue
        if source in current:
            ops.append({"op": "remove", "path": f"{base}/{side}/{escape_pointer(source)}"})
        ops.append(add_op(f"{base}/{side}/{escape_pointer(target)}", text))
    return ops


def _reapply_ops(
    c: Container, *, source: str, target: str, units: int, resources: Obj
) -> list[PatchOperation]:
    """Operations that drop the re-applied ``source`` and leave ``target: units`` on both sides.

    Only what differs from the object is written, so an unchanged manifest
    applied again is patched back to exactly the live object and ``kubectl diff``
    stays quiet.
    """
    text = str(units)
    base = c.path + "/resources"
    ops: list[PatchOperation] = []
    for side in ("limits", "requests"):
        current = as_map(resources.get(side), c.label, " resources.", side)
        if not current:
            ops.append(add_op(f"{base}/{side}", {target: text}))
            continue
        if source in current:
            ops.append({"op": "remove", "path": f"{base}/{side}/{escape_pointer(source)}"})
        if current.get(target) != text:
            ops.append(add_op(f"{base}/{side}/{escape_pointer(target)}", text))
    return ops
