"""Exact Kubernetes quantity parsing and fraction → unit conversion."""

from __future__ import annotations

from decimal import Decimal

import pytest

from plugin.api.quantity import (
    QuantityError,
    format_decimal,
    fraction_suggestion,
    parse_quantity,
    to_units,
    units_as_fraction,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param("0.5", "0.5", id="decimal"),
        pytest.param("500m", "0.5", id="milli"),
        pytest.param("1.5", "1.5", id="one-and-a-half"),
        pytest.param("1", "1", id="one"),
        pytest.param("2", "2", id="two"),
        pytest.param("+2", "2", id="plus-sign"),
        pytest.param("-500m", "-0.5", id="negative"),
        pytest.param("5e-1", "0.5", id="exponent"),
        pytest.param("5E-1", "0.5", id="capital-exponent"),
        pytest.param("1e3", "1000", id="positive-exponent"),
        pytest.param("1E", "1000000000000000000", id="exa-suffix-not-exponent"),
        pytest.param(".5", "0.5", id="leading-dot"),
        pytest.param("5.", "5", id="trailing-dot"),
        pytest.param("250000u", "0.25", id="micro"),
        pytest.param("333333333n", "0.333333333", id="nano"),
        pytest.param("1k", "1000", id="kilo"),
        pytest.param("1Ki", "1024", id="kibi"),
        pytest.param("0.5Ki", "512", id="fractional-kibi"),
        pytest.param(0.5, "0.5", id="yaml-float"),
        pytest.param(0.1, "0.1", id="float-shortest-repr"),
        pytest.param(3, "3", id="yaml-int"),
    ],
)
def test_parses_exactly(raw: object, expected: str) -> None:
    assert format_decimal(parse_quantity(raw)) == expected


@pytest.mark.parametrize(
    ("raw", "must_contain"),
    [
        pytest.param("abc", "'abc' is not a quantity", id="word"),
        pytest.param("", "'' is not a quantity", id="empty"),
        pytest.param(" 1", "' 1' is not a quantity", id="space"),
        pytest.param("1.2.3", "is not a quantity", id="two-dots"),
        pytest.param("0x10", "is not a quantity", id="hex"),
        pytest.param("１", "is not a quantity", id="fullwidth-digit"),
        pytest.param("1e", "is not a quantity", id="exponent-without-digits"),
        pytest.param("1Mb", "is not a quantity", id="unknown-suffix"),
        pytest.param("1e31", "exponent 31 is out of range", id="exponent-too-large"),
        pytest.param("1" * 65, "longer than 64 characters", id="too-long"),
        pytest.param(True, "True is not a quantity", id="bool"),
        pytest.param(None, "None is not a quantity", id="null"),
        pytest.param(float("nan"), "nan is not a quantity", id="nan"),
        pytest.param(float("inf"), "inf is not a quantity", id="inf"),
        pytest.param([1], "[1] is not a quantity", id="list"),
    ],
)
def test_rejects_garbage_with_the_value(raw: object, must_contain: str) -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity(raw)
    assert must_contain in str(info.value)
    assert (
        "0.5, 500m" in str(info.value)
        or "out of range" in str(info.value)
        or "longer" in str(info.value)
    )


@pytest.mark.parametrize(
    ("value", "per_gpu", "units"),
    [
        ("0.5", 100, 50),
        ("0.333", 100, None),
        ("0.333", 1000, 333),
        ("1.5", 100, 150),
        ("0.01", 100, 1),
    ],
)
def test_to_units_is_exact(value: str, per_gpu: int, units: int | None) -> None:
    assert to_units(Decimal(value), per_gpu) == units


@pytest.mark.parametrize(
    ("value", "per_gpu", "suggestion"),
    [
        ("0.333", 100, "0.33 or 0.34"),
        ("0.001", 100, "0.01"),
        ("2.005", 100, "2 or 2.01"),
        ("0.5", 3, ""),
        ("0.3", 8, "0.25 or 0.375"),
    ],
)
def test_fraction_suggestion(value: str, per_gpu: int, suggestion: str) -> None:
    assert fraction_suggestion(Decimal(value), per_gpu) == suggestion


def test_units_as_fraction_only_when_exact() -> None:
    assert units_as_fraction(33, 100) == "0.33"
    assert units_as_fraction(1, 3) is None
    assert units_as_fraction(3, 3) == "1"
