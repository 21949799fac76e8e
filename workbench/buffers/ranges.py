"""A byte-interval map: disjoint, sorted half-open ranges of one buffer, each with a value.

Invariants (kept by every method, relied on by the analyzer):

1. ``starts``, ``ends`` and ``vals`` have the same length;
2. segments are non-empty (``starts[k] < ends[k]``), sorted and disjoint
   (``ends[k] <= starts[k + 1]``), so both ``starts`` and ``ends`` are sorted and a
   range query is two bisections plus the segments it touches;
3. bytes not covered by any segment have no value (never written, or cleared).

``assign`` overwrites the bytes it covers (the last writer wins, like memory), splitting
the segments it cuts; ``overlaps`` lists the pieces of segments that intersect a range.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any, Iterator


class RangeMap:
    __slots__ = ("starts", "ends", "vals")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.vals: list[Any] = []

    def __len__(self) -> int:
        return len(self.starts)

    def clear(self) -> None:
        self.starts.clear()
        self.ends.clear()
        self.vals.clear()

    def assign(self, s: int, e: int, v: Any) -> None:
        """Give bytes [s, e) the value v."""
        if s >= e:
            return
        starts, ends, vals = self.starts, self.ends, self.vals
        i = bisect_right(ends, s)
        j = bisect_left(starts, e, i)
        if i == j:  # touches nothing: plain insert
            starts.insert(i, s)
            ends.insert(i, e)
            vals.insert(i, v)
            return
        ns, ne, nv = [], [], []
        if starts[i] < s:
            ns.append(starts[i]); ne.append(s); nv.append(vals[i])
        ns.append(s); ne.append(e); nv.append(v)
        if ends[j - 1] > e:
            ns.append(e); ne.append(ends[j - 1]); nv.append(vals[j - 1])
        starts[i:j] = ns
        ends[i:j] = ne
        vals[i:j] = nv

    def overlaps(self, s: int, e: int) -> Iterator[tuple[int, int, Any]]:
        """(start, end, value) of every covered piece of [s, e), in address order."""
        if s >= e:
            return
        starts, ends, vals = self.starts, self.ends, self.vals
        i = bisect_right(ends, s)
        j = bisect_left(starts, e, i)
        for k in range(i, j):
            yield (starts[k] if starts[k] > s else s, ends[k] if ends[k] < e else e, vals[k])

    def any_overlap(self, s: int, e: int) -> bool:
        if s >= e:
            return False
        i = bisect_right(self.ends, s)
        return i < len(self.starts) and self.starts[i] < e

    def items(self) -> list[tuple[int, int, Any]]:
        return list(zip(self.starts, self.ends, self.vals))
