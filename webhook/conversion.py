"""Rule 1: GPU fractions in a container's resources become whole metagpu units.

``nvidia.com/gpu: 0.5`` reaches the webhook as ``500m`` (the API server
normalises quantities, and has already copied limits into requests). It
leaves as ``cnvrg.io/metagpu: "50"`` in limits *and* requests: extended
resources must be whole numbers with equal limit and request, or the API
server refuses the pod right after the webhook.

Conversion is exact (:mod:`webhook.quantity`): a share that is not a whole
number of units, zero, negative, above the maximum or unreadable is denied
with a message naming the container, the value and what would be accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from plugin.api.resources import NVIDIA_GPU_RESOURCE
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
from webhook.quantity import (
    QuantityError,
    format_decimal,
    fraction_suggestion,
    nearest_units,
    parse_quantity,
    to_units,
)


@dataclass(slots=True)
class GpuPlan:
    """What rule 1 decided for one container."""

    container: Container
    units: int = 0
    """Units of a metagpu resource after conversion; 0: no metagpu."""
    resource: str = ""
    """The metagpu resource the units are of."""
    has_gpu: bool = False
    """Asks for any GPU (metagpu or whole NVIDIA GPUs): such a container is never voided."""
    resource_ops: list[PatchOperation] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    original: dict[str, str] = field(default_factory=dict)
    """What the container asked for, as sent: ``{"nvidia.com/gpu": "500m"}``."""


def show_value(raw: Any, value: Decimal | None = None) -> str:
    """``0.333 ("333m")``: the value in plain notation, and as sent if that differs."""
    if value is None:
        return f'"{raw}"' if isinstance(raw, str) else repr(raw)
    plain = format_decimal(value)
    if isinstance(raw, str) and raw != plain:
        return f'{plain} ("{raw}")'
    return plain


def plan_gpu(c: Container, *, settings: RuleSettings, findings: Findings) -> GpuPlan:
    """Rule 1 for one container: which GPU it asks for and how to rewrite it.

    Problems go to ``findings``; the plan's own warnings are kept on the plan
    so a caller (the workload rule) can word them for its context.
    """
    plan = GpuPlan(c)
    resources = as_map(c.obj.get("resources"), c.label, " resources")
    if not resources:
        return plan
    limits = as_map(resources.get("limits"), c.label, " resources.limits")
    requests = as_map(resources.get("requests"), c.label, " resources.requests")
    gpu = settings.gpu_resources
    names = [n for n in limits if n in gpu]
    names.extend(n for n in requests if n in gpu and n not in limits)
    if not names:
        return plan

    plan.has_gpu = True
    shares: list[tuple[str, Decimal, Any]] = []  # (resource, value, raw): ours
    whole: list[tuple[str, Any]] = []  # whole NVIDIA GPUs: NVIDIA's device plugin serves them
    before = len(findings.problems)
    for name in names:
        read = _read_pair(c, name, limits, requests, findings)
        if read is None:
            continue
        value, raw = read
        is_whole = value == value.to_integral_value()
        if name in settings.metagpu_resources or (
            name in settings.fraction_resources
            and not (name == NVIDIA_GPU_RESOURCE and is_whole and not settings.convert_whole_gpus)
        ):
            shares.append((name, value, raw))
        else:
            whole.append((name, raw))
    if len(findings.problems) > before or not shares:
        return plan
    if len(shares) > 1:
        listed = ", ".join(f"{n} {show_value(r, v)}" for n, v, r in shares)
        findings.deny(
            f"{c.label} asks for a GPU share in more than one way ({listed}); use only one"
        )
        return plan
    name, value, raw = shares[0]
    if whole:
        listed = ", ".join(f"{wn} {show_value(wr)}" for wn, wr in whole)
        findings.deny(
            f"{c.label} mixes a GPU share ({name} {show_value(raw, value)}) with whole GPUs "
            f"({listed}); ask for one or the other"
        )
        return plan
    if name in settings.metagpu_resources:
        units = _check_units(c, name=name, value=value, raw=raw, s=settings, findings=findings)
        target = name
    else:
        units = _check_fraction(c, name=name, value=value, raw=raw, s=settings, findings=findings)
        target = settings.resource_name
    if units is None:
        return plan
    plan.units = units
    plan.resource = target
    plan.original = {name: _original_text(limits.get(name, requests.get(name)))}
    plan.resource_ops = _resource_ops(
        c, source=name, target=target, units=units, resources=resources, limits=limits
    )
    if name != target:
        plan.warnings.append(
            f"{c.label}: {name} {show_value(raw, value)} converted to {target} {units} "
            f"({settings.units_per_gpu} units per GPU)"
        )
    return plan


def check_pod_resources(spec: Obj, *, settings: RuleSettings, findings: Findings) -> None:
    """Pod-level ``spec.resources`` takes no GPUs; say so rather than let it through."""
    resources = as_map(spec.get("resources"), "spec.resources")
    for side in ("limits", "requests"):
        for name in as_map(resources.get(side), "spec.resources.", side):
            if name in settings.gpu_resources:
                findings.deny(
                    f"pod-level spec.resources.{side} cannot hold {name}; "
                    "ask for GPUs in each container's resources instead"
                )


# ----------------------------------------------------------------- internals
def _original_text(raw: Any) -> str:
    if isinstance(raw, str):
        return raw
    try:
        return format_decimal(parse_quantity(raw))
    except QuantityError:
        return str(raw)


def _read_pair(
    c: Container, name: str, limits: Obj, requests: Obj, findings: Findings
) -> tuple[Decimal, Any] | None:
    """Parse the limit and request of ``name``; they must agree when both are set."""
    limit_raw = limits.get(name, _MISSING)
    request_raw = requests.get(name, _MISSING)
    try:
        limit = None if limit_raw is _MISSING else parse_quantity(limit_raw)
    except QuantityError as exc:
        findings.deny(f"{c.label}: limits {name}: {exc}")
        return None
    try:
        request = None if request_raw is _MISSING else parse_quantity(request_raw)
    except QuantityError as exc:
        findings.deny(f"{c.label}: requests {name}: {exc}")
        return None
    if limit is None:
        assert request is not None
        return request, request_raw
    if request is not None and request != limit:
        findings.deny(
            f"{c.label}: {name} limits ({show_value(limit_raw, limit)}) and requests "
            f"({show_value(request_raw, request)}) disagree; extended resources need them "
            "equal: set both to the same value, or set only limits"
        )
        return None
    return limit, limit_raw


_MISSING: Any = object()


def _check_fraction(
    c: Container, *, name: str, value: Decimal, raw: Any, s: RuleSettings, findings: Findings
) -> int | None:
    if value <= 0:
        what = "asks for no GPU" if value == 0 else "is negative"
        findings.deny(
            f"{c.label}: {name} {show_value(raw, value)} {what}; ask for {_share_range(s)}"
        )
        return None
    if value > s.max_gpus:
        findings.deny(
            f"{c.label}: {name} {show_value(raw, value)} is more than the configured maximum "
            f"of {format_decimal(s.max_gpus)} GPUs per container; ask for {_share_range(s)}"
        )
        return None
    units = to_units(value, s.units_per_gpu)
    if units is None:
        low, high = nearest_units(value, s.units_per_gpu)
        as_fraction = fraction_suggestion(value, s.units_per_gpu)
        as_units = " or ".join(str(u) for u in dict.fromkeys((low, high)) if u > 0)
        hint = f"{s.resource_name}: {as_units}"
        hint = f"use {as_fraction}, or {hint}" if as_fraction else f"use {hint}"
        findings.deny(
            f"{c.label}: {name} {show_value(raw, value)} is not a whole number of units "
            f"({s.units_per_gpu} units per GPU); {hint}"
        )
        return None
    return units


def _share_range(s: RuleSettings) -> str:
    one_unit = format_decimal(Decimal(1) / Decimal(s.units_per_gpu))
    return f"a share between {one_unit} and {format_decimal(s.max_gpus)} of a GPU"


def _check_units(
    c: Container, *, name: str, value: Decimal, raw: Any, s: RuleSettings, findings: Findings
) -> int | None:
    units = int(value)
    if units == value and 0 < units <= s.max_units:
        return units  # the common case: no message to build
    shown = show_value(raw, value)
    accepted = f"a whole number of units from 1 to {s.max_units} ({s.units_per_gpu} per GPU)"
    if units != value:
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
