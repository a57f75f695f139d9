"""The kube-apiserver's checks on a ResourceSlice that our slices can trip (pure).

Each rule and its wording is one a v1.36.2 API server applied to a captured variant
(``../shared/fixtures/dra/resourceslice-consumable-variants.json`` and the
``resourceslice-meta-*`` files); nothing else is checked here, so passing is necessary,
not sufficient. Run before every publish, so a slice the API server would refuse is an
error naming the rule in our log instead of a 422 retried forever, and tested against
every captured verdict so the two cannot drift apart silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from plugin.api.quantity import QuantityError, parse_quantity

MAX_DEVICES: Final = 128
MAX_DEVICES_RESTRICTED: Final = 64
"""When any device has taints, consumes counters or has list attributes (captured:
65 tainted devices were refused; 65 and 128 multi-allocatable devices were accepted)."""


def slice_errors(body: Mapping[str, Any]) -> list[str]:
    """The API server's error causes for ``body`` (``field: detail``), in device order."""
    devices = (body.get("spec") or {}).get("devices") or []
    errors: list[str] = []
    limit = MAX_DEVICES_RESTRICTED if any(_restricted(d) for d in devices) else MAX_DEVICES
    if len(devices) > limit:
        errors.append(f"spec.devices: Too many: {len(devices)}: must have at most {limit} items")
    for i, device in enumerate(devices):
        for name, capacity in (device.get("capacity") or {}).items():
            path = f"spec.devices[{i}].capacity[{name}].requestPolicy"
            try:
                errors.extend(_policy_errors(path, capacity, device))
            except QuantityError as exc:  # the API server words this differently
                errors.append(f"{path}: {exc}")
    return errors


def _restricted(device: Mapping[str, Any]) -> bool:
    attributes = device.get("attributes") or {}
    has_list = any(isinstance(v, dict) and "list" in v for v in attributes.values())
    return bool(device.get("taints") or device.get("consumesCounters") or has_list)


def _policy_errors(path: str, capacity: Mapping[str, Any], device: Mapping[str, Any]) -> list[str]:
    policy = capacity.get("requestPolicy")
    if policy is None:
        return []
    if device.get("allowMultipleAllocations") is not True:
        return [f"{path}: Forbidden: allowMultipleAllocations must be true"]
    valid_range, valid_values = policy.get("validRange"), policy.get("validValues")
    if valid_range is not None and valid_values is not None:
        return [
            f"{path}: Forbidden: exactly one policy can be specified, "
            'cannot specify "validValues" and "validRange" at the same time'
        ]
    default = policy.get("default")
    errors: list[str] = []
    if valid_range is not None:
        if default is None:
            return [f"{path}.default: Required value: required when validRange is defined"]
        maximum, minimum = valid_range.get("max"), valid_range.get("min")
        if maximum is not None and _q(maximum) > _q(capacity.get("value")):
            errors.append(
                f'{path}.validRange.max: Invalid value: "{maximum}": '
                f"max is larger than capacity value: {capacity.get('value')}"
            )
        if minimum is not None and _q(default) < _q(minimum):
            errors.append(
                f'{path}.validRange.min: Invalid value: "{default}": '
                f"default is less than min: {minimum}"
            )
    if valid_values is not None:
        values = [_q(v) for v in valid_values]
        for j in range(1, len(values)):
            if values[j] <= values[j - 1]:
                errors.append(
                    f'{path}.validValues[{j}]: Invalid value: "{valid_values[j]}": '
                    "values must be sorted in ascending order"
                )
                break
        if default is not None and _q(default) not in values:
            errors.append(
                f'{path}.validValues: Invalid value: "{default}": '
                "default value is not valid according to the requestPolicy"
            )
    return errors


def _q(raw: object) -> Decimal:
    return parse_quantity(raw)
