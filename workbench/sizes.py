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
_SIZE = re.compile(r"\s*([-+]?)\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*")


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
        unit = m.group(3).lower() if m else None
        if m is None or unit not in UNITS and unit != "":
            raise ValueError(f"{what} {value!r} is not a size: write bytes (4096) or a number with one of the "
                             f"units {', '.join(['B', 'KB', 'MB', 'GB', 'TB', 'KiB', 'MiB', 'GiB', 'TiB'])} "
                             "('8GB', '512 MiB')")
        x = float(m.group(2)) * UNITS.get(unit, 1)
        if m.group(1) == "-" and x:
            raise ValueError(f"{what} must be positive, not {value!r}")
        if x != int(x):
            raise ValueError(f"{what} {value!r} is not a whole number of bytes")
        n = int(x)
    else:
        raise ValueError(f"{what} must be a number of bytes or a string like '8GB', not {type(value).__name__}")
    if n <= 0:
        raise ValueError(f"{what} must be positive, not {value!r}")
    return n


#: argparse's test for "a negative number, not an option", widened to sizes ("-5GB", "-1.5 GiB")
_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$|^-\d+(?:\.\d+)?\s*[a-zA-Z]+$")


def accept_negative_sizes(parser) -> None:
    """Let ``parser`` read ``--memory-budget -5GB`` as an option and its (negative) value,
    to be refused by :func:`parse_bytes` in one line: argparse takes an argument that starts
    with '-' and is not a plain negative number for an option of its own, and the option
    before it then "expected one argument"."""
    if hasattr(parser, "_negative_number_matcher"):
        parser._negative_number_matcher = _NEGATIVE


def round_size(n: int, up: bool = False) -> str:
    """``n`` bytes as a size to type, two significant figures in decimal units, rounded down
    (or ``up``): ``round_size(16.7e9) == "16GB"``, ``round_size(1.23e9, up=True) == "1.3GB"``."""
    n = max(int(n), 1)
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3), ("B", 1)):
        if n >= scale or unit == "B":
            x = n / scale
            step = 10 ** (math.floor(math.log10(x)) - 1) if x >= 10 else 0.1
            q = (math.ceil if up else math.floor)(x / step - (1e-9 if up else -1e-9))
            v = max(q * step, step if up else 0)
            if v == 0:  # (below 0.1 of this unit rounded down: try the next one)
                continue
            text = f"{v:.1f}".rstrip("0").rstrip(".") if step < 1 else f"{round(v):d}"
            return f"{text}{unit}"
    return f"{n}B"


def fmt_bytes(n: int | float) -> str:
    """``1536 MiB`` -> ``'1.50 GiB'``: binary units, three significant figures or so."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
