"""What the analyzer reports: a :class:`Hazard` (kind, the event at fault, the earlier one,
the buffer and its bytes, the message), the kinds (:data:`KINDS`, stable strings; the rules
that produce them: workbench/buffers/analyze.py), the list an analysis returns and its
counts (:func:`summarize`)."""
from __future__ import annotations

from dataclasses import dataclass

#: every kind, in the order the docs list them
KINDS = ("alias-in-dispatch", "partial-overlap", "raw", "war", "waw", "stale-read",
         "use-after-free", "out-of-bounds", "uninitialized-read", "cb-reuse")


@dataclass(frozen=True)
class Hazard:
    kind: str
    event: int
    other: int | None
    buffer: str | None
    range: tuple[int, int] | None
    message: str

    def to_dict(self) -> dict:
        return {"kind": self.kind, "event": self.event, "other": self.other, "buffer": self.buffer,
                "range": list(self.range) if self.range is not None else None, "message": self.message}

    def __str__(self) -> str:
        return f"event {self.event} [{self.kind}]: {self.message}"


def bytes_at(buf: str, s: int, e: int) -> str:
    return f"bytes [{s}, {e}) of buffer {buf!r}"


class HazardList(list):
    """The hazards found, in event order; ``omitted``: kind -> how many more were found but not
    kept (``analyze(..., max_per_kind=N)``)."""

    omitted: dict[str, int]


def summarize(hazards: list[Hazard]) -> dict[str, int]:
    """kind -> how many were found (those an analysis kept, plus its ``omitted``)."""
    counts: dict[str, int] = {}
    for h in hazards:
        counts[h.kind] = counts.get(h.kind, 0) + 1
    for k, n in getattr(hazards, "omitted", {}).items():
        counts[k] = counts.get(k, 0) + n
    return counts
