"""Kubernetes quantities as the DRA objects carry them ("100", "80Gi", "1500Mi") (pure).

Only what a ResourceSlice we write and an allocation result we read can hold: plain
integers and the binary (Ki..Ei) and decimal (k..E) suffixes. Kept here rather than
shared with the webhook's parser because plugin may not import webhook, and this one
needs no fractions: the scheduler rounds capacity up to the request policy's step.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Final

MIB: Final = 1024 * 1024

_SUFFIX: Final[dict[str, int]] = {
    "": 1,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
    "Ei": 1024**6,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")


class QuantityError(ValueError):
    """Not a quantity this driver understands; the message names the value."""


def parse_quantity(raw: object) -> Decimal:
    """The value of ``raw`` in base units (bytes for memory, units for units)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return Decimal(raw)
    if not isinstance(raw, str):
        raise QuantityError(f"not a quantity: {raw!r}")
    match = _QUANTITY.match(raw.strip())
    if match is None:
        raise QuantityError(f"not a quantity: {raw!r}")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only digits
        raise QuantityError(f"not a quantity: {raw!r}") from exc
    return number * _SUFFIX[match.group(2) or ""]


def bytes_to_mib(raw: object) -> int:
    """A memory quantity in whole MiB, floored: a limit never exceeds what was charged."""
    return int(parse_quantity(raw) // MIB)


def format_mib(memory_mib: int) -> str:
    """``81920`` → ``80Gi``; ``40536`` → ``40536Mi``: the shortest exact binary form."""
    if memory_mib % 1024 == 0:
        return f"{memory_mib // 1024}Gi"
    return f"{memory_mib}Mi"
