"""What the analyzer keeps while it walks a schedule (workbench/buffers/analyze.py): each
buffer's byte coordinates (:class:`Coords`, for the trees of wide queries), its life and
written bytes (:class:`BufferState`), and what the current concurrent region read or wrote
of it (:class:`RegionMap`)."""
from __future__ import annotations

from bisect import bisect_left, bisect_right

from workbench.buffers.ranges import RangeMap
from workbench.buffers.schedule import Schedule


class Coords:
    """Per buffer, the sorted byte offsets where any of its accesses starts or ends (and its
    sizes): the elementary intervals the trees work on.  Built on first use, in one pass."""

    def __init__(self, sch: Schedule):
        self.sch = sch
        self.xs: dict[str, list[int]] | None = None
        self.pos: dict[str, dict[int, int]] = {}

    def of(self, buf: str) -> tuple[list[int], dict[int, int]]:
        if self.xs is None:
            pts: dict[str, set] = {b: {0, spec.size} for b, spec in self.sch.buffers.items()}
            for ev in self.sch.events:
                if ev.type == "dispatch":
                    for lst in (ev.reads, ev.writes):
                        for a in lst:
                            p = pts.get(a.buffer)
                            if p is None:
                                p = pts[a.buffer] = {0}
                            p.add(a.offset)
                            p.add(a.offset + a.size)
                elif ev.type == "alloc":
                    pts.setdefault(ev.buffer, {0}).add(ev.size)
            self.xs = {b: sorted(p) for b, p in pts.items()}
        xs = self.xs[buf]
        pos = self.pos.get(buf)
        if pos is None:
            pos = self.pos[buf] = {x: k for k, x in enumerate(xs)}
        return xs, pos


class BufferState:
    __slots__ = ("size", "live", "init", "alloc_at", "freed_at", "written", "log", "applied", "applied_max")

    def __init__(self, size: int, init: bool, alloc_at: int | None):
        self.size, self.init, self.alloc_at = size, init, alloc_at
        self.live = True
        self.freed_at: int | None = None
        self.written = RangeMap()  # bytes -> (writer event index, label or None)
        # every write (s, e, writer, label) and clear (s, e, None, None), for the buffer's LabelTree
        self.log: list[tuple] = [(0, None, None, None)]  # starts unwritten
        self.applied = 0  # log entries already in the buffer's LabelTree
        self.applied_max = 0  # ... and in its MaxTree of writers


class RegionMap:
    """The bytes of one buffer that the current concurrent region read (or wrote): the latest
    event per byte, the paints in order (for a MaxTree on wide queries), each event's ranges."""

    __slots__ = ("rm", "log", "applied", "ranges", "sorted")

    def __init__(self):
        self.rm = RangeMap()
        self.log: list[tuple[int, int, int]] = []
        self.applied = 0
        self.ranges: dict[int, list[tuple[int, int]]] = {}
        self.sorted: dict[int, tuple[list[int], list[int]]] = {}

    def paint(self, s: int, e: int, idx: int) -> None:
        self.rm.assign(s, e, idx)
        self.log.append((s, e, idx))
        r = self.ranges.get(idx)
        if r is None:
            self.ranges[idx] = [(s, e)]
        else:
            r.append((s, e))

    def span(self, idx: int, s: int, e: int) -> tuple[int, int]:
        """The first and last byte of [s, e) that event ``idx`` painted here (it overlaps [s, e))."""
        rs = self.ranges[idx]
        if len(rs) <= 8:
            lo, hi = e, s
            for ps, pe in rs:
                if ps < e and pe > s:
                    lo, hi = min(lo, max(ps, s)), max(hi, min(pe, e))
            return lo, hi
        srt = self.sorted.get(idx)
        if srt is None:  # many ranges of one event: starts sorted, with the running max of their ends
            rs = sorted(rs)
            starts, reach, m = [], [], -1
            for ps, pe in rs:
                m = max(m, pe)
                starts.append(ps)
                reach.append(m)
            srt = self.sorted[idx] = (starts, reach)
        starts, reach = srt
        k = bisect_right(starts, s)  # ranges starting at or before s
        if k and reach[k - 1] > s:
            lo = s
        else:
            lo = starts[k]  # the first range starting after s (one overlaps, so it starts before e)
        j = bisect_left(starts, e)  # ranges starting before e
        hi = min(reach[j - 1], e)
        return lo, hi
