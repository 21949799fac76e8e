"""Errors shared by library modules and the command line.

``UsageError`` is unusable input: the CLI reports it as one line on stderr and exits 2.
Library modules raise it from here, so none of them imports the CLI.
"""
from __future__ import annotations


class UsageError(Exception):
    """Unusable input: reported as one line on stderr, exit status 2."""


def parse_ids(text: str) -> list[int]:
    """``--ids 2,15,16`` -> [2, 15, 16]; anything else is a UsageError naming the bad part."""
    parts = [p.strip() for p in text.replace(" ", ",").split(",") if p.strip()]
    if not parts:
        raise UsageError("--ids is empty: give comma-separated token ids, e.g. --ids 2,15,16")
    out = []
    for p in parts:
        try:
            v = int(p)
        except ValueError:
            raise UsageError(f"--ids: {p!r} is not an integer token id (expected comma-separated integers like 1,2,3)") from None
        if v < 0:
            raise UsageError(f"--ids: token id {v} is negative")
        out.append(v)
    return out
