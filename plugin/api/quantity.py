"""Kubernetes quantities, parsed exactly; GPU fractions turned into units; MiB (pure).

One parser for every component: the webhook reads users' fractions and memory
requests with it, the DRA plugin its ResourceSlice capacities and the allocated
claims' ``consumedCapacity``, and the webhook's "why a DRA pod waits" Events both.

A GPU share must be converted without rounding: ``0.333`` of a GPU at 100
units per GPU is *not* 33 units, it is a mistake the user should hear about.
So values are :class:`~decimal.Decimal`, never floats, and every operation here
is exact (a private context with enough precision for the longest input we
accept, with every inexact result trapped).

The grammar is the API server's (``k8s.io/apimachinery`` ``resource.Quantity``)::

    <quantity> ::= <sign>? <number> <suffix>
    <number>   ::= <digits> | <digits>.<digits>? | .<digits>
    <suffix>   ::= "" | n | u | m | k | M | G | T | P | E        (decimal SI)
                 | Ki | Mi | Gi | Ti | Pi | Ei                   (binary SI)
                 | (e | E) <sign>? <digits>                      (decimal exponent)

Decisions worth knowing:

* Exponents (``5e-1``) are legal Kubernetes quantities, so they are accepted
  and mean what the API server would make of them (``5e-1`` is ``0.5``).
  Exponents outside ±:data:`MAX_EXPONENT` are refused: no GPU share needs
  them and bounding them keeps the arithmetic cheap.
* ``E`` alone is the exa suffix (``1E`` = 10^18); ``E`` followed by digits is
  an exponent, as in Go.
* JSON/YAML numbers are accepted too (``metagpu mutate`` reads YAML, where
  ``0.5`` is a float): a float is taken by its shortest repr, so ``0.1`` is
  exactly one tenth. Booleans, ``null``, NaN and infinities are refused.
* Input longer than :data:`MAX_QUANTITY_CHARS` is refused before parsing.
"""

from __future__ import annotations

import decimal
import math
import re
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import Final, NamedTuple

MAX_QUANTITY_CHARS: Final = 64
"""The API server's own quantities are far shorter; anything longer is garbage."""

MAX_EXPONENT: Final = 30
"""Largest ``|exponent|`` accepted in ``<n>e<exp>`` (after SI suffixes it is at most 18)."""

_EXACT = decimal.Context(
    prec=MAX_QUANTITY_CHARS + 4 * MAX_EXPONENT,
    Emax=10 * MAX_EXPONENT + MAX_QUANTITY_CHARS,
    Emin=-(10 * MAX_EXPONENT + MAX_QUANTITY_CHARS),
    traps=[decimal.Inexact, decimal.Overflow, decimal.InvalidOperation, decimal.DivisionByZero],
)
"""Every product of an accepted mantissa and multiplier fits without rounding; a
result that would need rounding raises instead of silently losing a digit."""

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:[eE](?P<exp>[+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?",
    re.ASCII,
)

_SUFFIX_MULTIPLIER: Final[dict[str, Decimal]] = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(1024),
    "Mi": Decimal(1024**2),
    "Gi": Decimal(1024**3),
    "Ti": Decimal(1024**4),
    "Pi": Decimal(1024**5),
    "Ei": Decimal(1024**6),
}


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message quotes it."""


def parse_quantity(raw: object) -> Decimal:
    """The exact value of a quantity given as a string or a JSON/YAML number.

    Raises :class:`QuantityError` naming the value and the accepted forms.
    """
    if isinstance(raw, str):
        return _parse_text(raw)
    if isinstance(raw, bool) or raw is None:
        raise QuantityError(f"{raw!r} is not a quantity; {_ACCEPTED}")
    if isinstance(raw, int):
        return Decimal(raw)
    if isinstance(raw, float):
        if not math.isfinite(raw):
            raise QuantityError(f"{raw!r} is not a quantity; {_ACCEPTED}")
        return _parse_text(repr(raw))
    raise QuantityError(f"{_show(raw)} is not a quantity; {_ACCEPTED}")


_ACCEPTED: Final = "write a number such as 0.5, 500m, 1.5 or 2"


def _show(raw: object) -> str:
    text = repr(raw)
    return text if len(text) <= 40 else text[:37] + "..."


@lru_cache(maxsize=4096)
def _parse_text(text: str) -> Decimal:
    # Cached: a cluster sends the same few strings ("500m", "1", "50") all day.
    if len(text) > MAX_QUANTITY_CHARS:
        raise QuantityError(
            f"{_show(text)} is not a quantity (longer than {MAX_QUANTITY_CHARS} characters)"
        )
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise QuantityError(f"{text!r} is not a quantity; {_ACCEPTED}")
    value = Decimal(match["sign"] + match["number"])
    if match["exp"] is not None:
        exp = int(match["exp"])
        if abs(exp) > MAX_EXPONENT:
            raise QuantityError(f"{text!r}: exponent {exp} is out of range (at most ±30)")
        value = value.scaleb(exp, _EXACT)
    elif match["suffix"] is not None:
        value = _EXACT.multiply(value, _SUFFIX_MULTIPLIER[match["suffix"]])
    return value


class Quantity(NamedTuple):
    """A parsed quantity with what the rules ask of it, worked out once per distinct text.

    The rules compare and convert shares as exact integer ratios, which keeps
    the decimal module off the hot path; ``value`` and ``plain`` are for
    messages.
    """

    value: Decimal
    plain: str
    """:func:`format_decimal` of ``value``: ``0.5`` for ``500m``."""
    numerator: int
    denominator: int
    """``value == numerator / denominator`` in lowest terms; 1 for whole numbers."""

    @property
    def whole(self) -> bool:
        """A whole number (``1``, ``2000m``, ``1E``)."""
        return self.denominator == 1


def read_quantity(raw: object) -> Quantity:
    """:func:`parse_quantity`, with the value's plain text and exact ratio.

    Raises :class:`QuantityError` like :func:`parse_quantity`.
    """
    if isinstance(raw, str):
        return _read_text(raw)
    return _quantity_of(parse_quantity(raw))


@lru_cache(maxsize=4096)
def _read_text(text: str) -> Quantity:
    return _quantity_of(_parse_text(text))


def _quantity_of(value: Decimal) -> Quantity:
    numerator, denominator = value.as_integer_ratio()
    return Quantity(value, format_decimal(value), numerator, denominator)


@lru_cache(maxsize=4096)
def format_decimal(value: Decimal) -> str:
    """``0.5``, ``1.5``, ``2``: plain notation, no exponent, no trailing zeros."""
    if value == value.to_integral_value():
        return str(int(value))
    text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def to_units(value: Decimal, units_per_gpu: int) -> int | None:
    """``value`` GPUs in units, or None when it is not a whole number of units."""
    units = _EXACT.multiply(value, Decimal(units_per_gpu))
    if units != units.to_integral_value():
        return None
    return int(units)


def units_as_fraction(units: int, units_per_gpu: int) -> str | None:
    """``units`` as a GPU fraction in plain decimal (``33`` → ``0.33``).

    None when the fraction has no finite decimal form (1 unit of 3 per GPU),
    so a suggestion never shows a rounded value that would be refused again.
    """
    frac = Fraction(units, units_per_gpu)
    den = frac.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    if den != 1:
        return None
    return format_decimal(_EXACT.divide(Decimal(frac.numerator), Decimal(frac.denominator)))


def nearest_units(value: Decimal, units_per_gpu: int) -> tuple[int, int]:
    """The whole unit counts just below and just above ``value`` GPUs."""
    units = Fraction(value) * units_per_gpu
    return math.floor(units), math.ceil(units)


def fraction_suggestion(value: Decimal, units_per_gpu: int) -> str:
    """What to write instead of a fraction that is not a whole number of units.

    ``0.333`` at 100 units per GPU gives ``"0.33 or 0.34"``; a value below one
    unit gives only the smallest share. Values that have no exact decimal form
    are left out (the caller also offers the unit count).
    """
    low, high = nearest_units(value, units_per_gpu)
    options = [units_as_fraction(u, units_per_gpu) for u in (low, high) if u > 0]
    shown = [o for o in options if o is not None]
    return " or ".join(dict.fromkeys(shown))


# --------------------------------------------------------------------- memory
MIB: Final = 1024 * 1024


def bytes_to_mib(raw: object) -> int:
    """A memory quantity in whole MiB, floored: a limit never exceeds what was charged."""
    return int(parse_quantity(raw) // MIB)


def format_mib(memory_mib: int) -> str:
    """``81920`` → ``80Gi``; ``40536`` → ``40536Mi``: the shortest exact binary form."""
    if memory_mib % 1024 == 0:
        return f"{memory_mib // 1024}Gi"
    return f"{memory_mib}Mi"
