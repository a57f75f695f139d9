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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    Quantity,
    QuantityError,
    format_decimal,
    fraction_suggestion,
    nearest_units,
    read_quantity,
    units_as_fraction,
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


def show_value(raw: Any, value: Decimal | Quantity | None = None) -> str:
    """``0.333 ("333m")``: the value in plain notation, and as sent if that differs."""
    if value is None:
        return f'"{raw}"' if isinstance(raw, str) else repr(raw)
    plain = value.plain if isinstance(value, Quantity) else format_decimal(value)
    if isinstance(raw, str) and raw != plain:
        return f'{plain} ("{raw}")'
    return plain


def plan_gpu(c: Container, *, settings: RuleSettings, findings: Findings) -> GpuPlan:
    """Rule 1 for one container: which GPU it asks for and how to rewrite it.

    Problems go to ``findings``; the plan's own warnings are kept on the plan
    so a caller (the workload rule) can word them for its context.
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
    if len(shares) > 1:
        listed = ", ".join(f"{n} {show_value(r, v)}" for n, v, r in shares)
        findings.deny(
            f"{c.label} asks for a GPU share in more than one way ({listed}); use only one"
        )
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
    if name != target:
        warnings = (
            f"{c.label}: {name} {show_value(raw, value)} converted to {target} {units} "
            f"({settings.units_per_gpu} units per GPU)",
        )
    return GpuPlan(
        c,
        units=units,
        resource=target,
        has_gpu=True,
        resource_ops=_resource_ops(
            c, source=name, target=target, units=units, resources=resources, limits=limits
        ),
        warnings=warnings,
        original={name: raw if isinstance(raw, str) else value.plain},
    )


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
    units, remainder = divmod(numerator * s.units_per_gpu, denominator)
    if remainder:
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
