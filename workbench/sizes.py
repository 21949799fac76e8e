"""Sizes in bytes, read strictly: ``parse_bytes(8 * 2**30)``, ``parse_bytes("8GB")``,
``parse_bytes("512 MiB")``; and :func:`fmt_bytes` to print one back.

Units: B, kB/KB, MB, GB, TB (powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024),
case-insensitive.  Anything else (a negative number, a fraction of a byte, an unknown
unit, a bool) is a ValueError naming the argument and the value.
"""
from __future__ import annotations

import math
import re
from numbers import Integral, Real

UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*")


def parse_bytes(value, what: str = "size") -> int:
    """A number of bytes from an int or a string like ``"8GB"`` / ``"1.5 GiB"`` / ``"4096"``."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number of bytes or a string like '8GB', not {value!r}")
    if isinstance(value, Integral):
        n = int(value)
    elif isinstance(value, Real):
        f = float(value)
        if not math.isfinite(f) or f != int(f):
            raise ValueError(f"{what} must be a whole number of bytes, not {value!r}")
        n = int(f)
    elif isinstance(value, str):
        m = _SIZE.fullmatch(value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in UNITS and unit != "":
            raise ValueError(f"{what} {value!r} is not a size: write bytes (4096) or a number with one of the "
                             f"units {', '.join(['B', 'KB', 'MB', 'GB', 'TB', 'KiB', 'MiB', 'GiB', 'TiB'])} "
                             "('8GB', '512 MiB')")
        x = float(m.group(1)) * UNITS.get(unit, 1)
        if x != int(x):
            raise ValueError(f"{what} {value!r} is not a whole number of bytes")
        n = int(x)
    else:
        raise ValueError(f"{what} must be a number of bytes or a string like '8GB', not {type(value).__name__}")
    if n <= 0:
        raise ValueError(f"{what} must be positive, not {value!r}")
    return n


def fmt_bytes(n: int | float) -> str:
    """``1536 MiB`` -> ``'1.50 GiB'``: binary units, three significant figures or so."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
