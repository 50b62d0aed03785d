"""Byte quantities in text: one parser and one formatter for the whole package.

Options, command-line arguments and reports all speak of bytes. :func:`parse_bytes` reads
``"6GiB"``, ``"512 MB"``, ``"1.5KiB"`` or a plain integer (decimal units are powers of
1000, binary ``*iB`` units powers of 1024); :func:`format_bytes` writes a count for people
with the largest binary unit that keeps it at least 1 (``"1.50 KiB"``, ``"-"`` when
unknown); :func:`format_mib` writes it as a number of MiB, for tables whose column
header carries the unit. A leaf module (no fxopt imports), so any layer may use it.
"""

from __future__ import annotations

import re

__all__ = ["UNITS", "format_bytes", "format_mib", "parse_bytes"]

UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_QUANTITY_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
_BINARY = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def parse_bytes(text: str) -> int:
    """The byte count ``text`` names (``"6GiB"``, ``"512 MB"``, ``"4096"``).

    Raises ValueError, listing the units, when ``text`` is not a number with a known unit."""
    match = _QUANTITY_RE.match(text)
    if match is None or match.group(2).lower() not in UNITS:
        units = ", ".join(u for u in UNITS if u)
        raise ValueError(f"cannot read {text!r} as bytes (a number with a unit: {units})")
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


def format_bytes(n: float | None) -> str:
    """Bytes for people: ``"512 B"``, ``"1.50 KiB"``, ``"3.20 MiB"``; ``"-"`` when unknown."""
    if n is None:
        return "-"
    for unit, size in _BINARY:
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{round(n)} B"


def format_mib(n: float | None) -> str:
    """Bytes as a number of MiB with two decimals (``"3.20"``); ``"-"`` when unknown."""
    return "-" if n is None else f"{n / 2**20:.2f}"
