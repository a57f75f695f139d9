"""TEMPORARY shim while a concurrent change lands: use :mod:`plugin.api.quantity`."""

from plugin.api.quantity import MIB, QuantityError, bytes_to_mib, format_mib, parse_quantity

__all__ = ["MIB", "QuantityError", "bytes_to_mib", "format_mib", "parse_quantity"]
