"""Errors shared by library modules and the command line.

``UsageError`` is unusable input: the CLI reports it as one line on stderr and exits 2.
Library modules raise it from here, so none of them imports the CLI.  ``ConfigError``: a
config.json that cannot be used as written, one class for every reader of configs.
"""
from __future__ import annotations


class UsageError(Exception):
    """Unusable input: reported as one line on stderr, exit status 2."""


class ConfigError(ValueError):
    """config.json does not describe a model we can run or check as written (the message
    names the key): raised by the family files, the reference's config readers and
    corrections, and the reference tables alike."""


def parse_ids(text: str) -> list[int]:
    """``--ids 2,15,16`` -> [2, 15, 16]; anything else is a UsageError naming the bad part:
    each id ASCII digits (no sign, no other script's digits, no underscores), separated by
    single commas or by spaces, none empty."""
    if not isinstance(text, str) or not text.strip():
        raise UsageError("--ids is empty: give comma-separated token ids, e.g. --ids 2,15,16")
    parts = []
    for i, chunk in enumerate(text.split(",")):
        if not chunk.strip():
            raise UsageError(f"--ids {printable(text)!r}: an empty id at position {i + 1} "
                             "(give comma-separated integers like 1,2,3)")
        parts += chunk.split()
    out = []
    for i, p in enumerate(parts):
        if not p:
            raise UsageError(f"--ids {printable(text)!r}: an empty id at position {i + 1} "
                             "(give comma-separated integers like 1,2,3)")
        if p.startswith("-") and p[1:].isascii() and p[1:].isdigit():
            raise UsageError(f"--ids: token id {p} is negative")
        if not (p.isascii() and p.isdigit()):
            raise UsageError(f"--ids: {printable(p)!r} is not an integer token id "
                             "(expected comma-separated ASCII digits like 1,2,3)")
        if len(p) > 30:
            raise UsageError(f"--ids: token id {p[:20]}... is {len(p)} digits long: no vocabulary is that big")
        out.append(int(p))
    return out


def printable(text) -> str:
    """``text`` with every character that is not printable (newlines, carriage returns,
    terminal escapes, bidi overrides, zero-width marks) written as its Python escape, so a
    name read from a file prints as one line that says what it holds and can move no cursor."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def printable_lines(lines) -> str:
    """Lines joined by newlines, each made :func:`printable` (a newline inside one is escaped)."""
    return "\n".join(printable(line) for line in lines)


def number_arg(lo: float | None = None, hi: float | None = None, *, above: bool = False,
               integer: bool = False, what: str = ""):
    """An argparse ``type=`` for a number in its domain: finite, ``>= lo`` (``> lo`` when
    ``above``), ``<= hi``; an integer when ``integer``.  Anything else is one line naming
    the value and the domain (the parser reports it, exit 2)."""
    import argparse
    import math

    dom = []
    if lo is not None:
        dom.append(f"{'>' if above else '>='} {lo:g}")
    if hi is not None:
        dom.append(f"<= {hi:g}")
    kind = "an integer" if integer else "a finite number"
    want = kind + (" " + " and ".join(dom) if dom else "") + (f" ({what})" if what else "")

    def parse(text: str):
        t = text.strip()
        try:
            if integer:
                if not (t.isascii() and t.lstrip("+-").isdigit()):
                    raise ValueError
                v = int(t)
            else:
                if not t.isascii():
                    raise ValueError
                v = float(t)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{printable(text)!r} is not {want}") from None
        if not math.isfinite(v) or (lo is not None and (v <= lo if above else v < lo)) or \
                (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{printable(text)} is out of range: give {want}")
        return v

    parse.__name__ = "integer" if integer else "number"
    return parse
