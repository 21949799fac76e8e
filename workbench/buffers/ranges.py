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

    def count_overlaps(self, s: int, e: int) -> int:
        """How many segments intersect [s, e) (two bisections, no scan)."""
        if s >= e:
            return 0
        i = bisect_right(self.ends, s)
        return bisect_left(self.starts, e, i) - i


# --------------------------------------------------------------------------- wide queries
#
# A RangeMap answers a query in time proportional to the segments the range covers; a
# hostile schedule (100k small writes, then 100k reads of the whole buffer) makes that
# quadratic.  The analyzer keeps its RangeMaps (fast for the usual few segments) and, for a
# query covering more than a few dozen segments, asks one of these trees instead.  Both
# work over a buffer's *elementary intervals*: the sorted byte offsets where any access of
# that buffer starts or ends (``coords``), leaf k being [coords[k], coords[k+1]).  Writes
# are fed to a tree lazily (a log, replayed on the first wide query), so schedules without
# wide queries never pay for them.


class MaxTree:
    """Paint leaf ranges with *increasing* stamps; the largest stamp painted over any leaf of
    a range, in O(log n).  With increasing stamps "last painted wins" is "largest wins", so
    that stamp is the newest paint overlapping the range, and nothing newer overlaps it."""

    __slots__ = ("size", "tag", "sub")

    def __init__(self, leaves: int):
        size = 1
        while size < leaves:
            size *= 2
        self.size = size
        self.tag = [-1] * (2 * size)  # a paint covering the whole node
        self.sub = [-1] * (2 * size)  # the largest paint touching the node's subtree

    def paint(self, l: int, r: int, t: int) -> None:
        if l >= r:
            return
        tag, sub = self.tag, self.sub
        l += self.size
        r += self.size
        a, b = l >> 1, (r - 1) >> 1
        while l < r:
            if l & 1:
                tag[l] = sub[l] = t
                l += 1
            if r & 1:
                r -= 1
                tag[r] = sub[r] = t
            l >>= 1
            r >>= 1
        while a:
            sub[a] = t
            a >>= 1
        while b:
            sub[b] = t
            b >>= 1

    def query(self, l: int, r: int) -> int:
        if l >= r:
            return -1
        tag, sub = self.tag, self.sub
        l += self.size
        r += self.size
        a, b = l >> 1, (r - 1) >> 1
        res = -1
        while l < r:
            if l & 1:
                if sub[l] > res:
                    res = sub[l]
                l += 1
            if r & 1:
                r -= 1
                if sub[r] > res:
                    res = sub[r]
            l >>= 1
            r >>= 1
        while a:
            if tag[a] > res:
                res = tag[a]
            a >>= 1
        while b:
            if tag[b] > res:
                res = tag[b]
            b >>= 1
        return res


_MIXED = -2


class LabelTree:
    """Lazy-assignment segment tree over a buffer's elementary intervals, for a buffer's
    contents: each leaf holds a value id (-1: unwritten) with its writer and label.  Covered
    bytes, the first and last unwritten leaf, and the written pieces whose label differs from
    a given one come out in O(log n) (plus the pieces listed)."""

    __slots__ = ("xs", "n", "size", "val", "cov", "lab", "writer", "label")

    def __init__(self, coords: list[int]):
        self.xs = coords
        self.n = len(coords) - 1
        size = 1
        while size < max(self.n, 1):
            size *= 2
        self.size = size
        self.val = [-1] * (2 * size)   # uniform value id over the node, or _MIXED
        self.cov = [0] * (2 * size)    # written bytes in the node
        self.lab = [-1] * (2 * size)   # -1 no labelled byte, a label id if all labelled bytes agree, or _MIXED
        self.writer: list[int] = []    # value id -> writer event
        self.label: list[int] = []     # value id -> label id (-1: unlabelled)

    def _x(self, k: int) -> int:
        return self.xs[k if k < self.n else self.n]

    def value(self, writer: int, label: int) -> int:
        self.writer.append(writer)
        self.label.append(label)
        return len(self.writer) - 1

    def _set(self, node: int, nl: int, nr: int, vid: int) -> None:
        self.val[node] = vid
        if vid < 0:
            self.cov[node], self.lab[node] = 0, -1
        else:
            self.cov[node] = self._x(nr) - self._x(nl)
            self.lab[node] = self.label[vid]

    def assign(self, l: int, r: int, vid: int) -> None:
        """Leaves [l, r) get value id ``vid`` (-1: unwritten again)."""
        if l < r:
            self._assign(1, 0, self.size, l, r, vid)

    def _assign(self, node, nl, nr, l, r, vid) -> None:
        if l <= nl and nr <= r:
            self._set(node, nl, nr, vid)
            return
        mid = (nl + nr) >> 1
        v = self.val[node]
        if v != _MIXED:  # push the uniform value down
            self._set(2 * node, nl, mid, v)
            self._set(2 * node + 1, mid, nr, v)
        if l < mid:
            self._assign(2 * node, nl, mid, l, r, vid)
        if r > mid:
            self._assign(2 * node + 1, mid, nr, l, r, vid)
        a, b = 2 * node, 2 * node + 1
        va, vb = self.val[a], self.val[b]
        self.val[node] = va if va == vb else _MIXED
        self.cov[node] = self.cov[a] + self.cov[b]
        la, lb = self.lab[a], self.lab[b]
        self.lab[node] = lb if la == -1 else la if (lb == -1 or lb == la) else _MIXED

    def covered(self, l: int, r: int) -> int:
        """Written bytes in leaves [l, r)."""
        return self._covered(1, 0, self.size, l, r) if l < r else 0

    def _covered(self, node, nl, nr, l, r) -> int:
        if l <= nl and nr <= r:
            return self.cov[node]
        v = self.val[node]
        if v != _MIXED:
            return 0 if v < 0 else self._x(min(nr, r)) - self._x(max(nl, l))
        mid = (nl + nr) >> 1
        out = 0
        if l < mid:
            out += self._covered(2 * node, nl, mid, l, r)
        if r > mid:
            out += self._covered(2 * node + 1, mid, nr, l, r)
        return out

    def gap(self, l: int, r: int, last: bool = False) -> int | None:
        """The first (or last) unwritten leaf in [l, r), or None."""
        return self._gap(1, 0, self.size, l, r, last) if l < r else None

    def _gap(self, node, nl, nr, l, r, last) -> int | None:
        if r <= nl or nr <= l:
            return None
        v = self.val[node]
        if v != _MIXED:
            if v >= 0:
                return None
            return (min(nr, r) - 1) if last else max(nl, l)
        if l <= nl and nr <= r and self.cov[node] == self._x(nr) - self._x(nl):
            return None
        mid = (nl + nr) >> 1
        kids = ((2 * node + 1, mid, nr), (2 * node, nl, mid)) if last else ((2 * node, nl, mid), (2 * node + 1, mid, nr))
        for c, cl, cr in kids:
            g = self._gap(c, cl, cr, l, r, last)
            if g is not None:
                return g
        return None

    def stale(self, l: int, r: int, label: int, limit: int) -> list[tuple[int, int, int, int]]:
        """Up to ``limit`` written pieces of leaves [l, r) labelled other than ``label`` (and not
        unlabelled), in address order: (start byte, end byte, writer, label id)."""
        out: list = []
        if l < r:
            self._stale(1, 0, self.size, l, r, label, limit, out)
        return out

    def _stale(self, node, nl, nr, l, r, label, limit, out) -> None:
        if r <= nl or nr <= l or len(out) >= limit:
            return
        lb = self.lab[node]
        if lb == -1 or lb == label:
            return
        v = self.val[node]
        if v != _MIXED:
            s, e = self._x(max(nl, l)), self._x(min(nr, r))
            w = self.writer[v]
            if out and out[-1][1] == s and out[-1][2] == w:
                out[-1] = (out[-1][0], e, w, lb)  # one piece split by the tree: join it again
            else:
                out.append((s, e, w, lb))
            return
        mid = (nl + nr) >> 1
        self._stale(2 * node, nl, mid, l, r, label, limit, out)
        self._stale(2 * node + 1, mid, nr, l, r, label, limit, out)
