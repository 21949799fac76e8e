"""The hazard analyzer: which dispatch aliases what, byte for byte.

It walks a validated :class:`~workbench.buffers.schedule.Schedule` once, in event order,
keeping per-buffer byte-interval maps (:class:`~workbench.buffers.ranges.RangeMap`), so a
100k-event schedule analyses in seconds.  Hazard kinds (stable strings) and exactly the
rules that produce them:

``alias-in-dispatch``
    a dispatch reads and writes exactly the same bytes of one buffer and its kernel does
    not declare that (read arg, write arg) pair in ``kernels[k].inplace``;
``partial-overlap``
    a read and a write of one dispatch overlap without being equal (an in-place
    declaration does not cover this: element k of the output lands on another element of
    the input), or two writes of one dispatch overlap at all;
``raw`` / ``war`` / ``waw``
    in ``"concurrent"`` mode, a dispatch reads bytes an earlier dispatch of the same
    concurrent region writes (raw), writes bytes it reads (war), or writes bytes it
    writes (waw).  A concurrent region ends at a ``barrier``, at a ``commit``, and
    wherever the command buffer changes from one dispatch to the next (command buffers
    of a queue run in order); ``"serial"`` schedules have no concurrent regions;
``stale-read``
    a read that carries a ``value`` label meets bytes whose last writer (a dispatch)
    labelled them differently; bytes written by the host (``initialized``) or by an
    unlabelled write are not judged;
``use-after-free``
    an access to a buffer after its ``free`` event (and before any new ``alloc``), or a
    second ``free`` of it;
``out-of-bounds``
    an access reaching past the buffer's current size (the rest of the checks see the
    part inside the buffer);
``uninitialized-read``
    a read of bytes of a buffer not marked ``initialized`` (declared, or on its latest
    ``alloc``) that no dispatch has written since it was allocated;
``cb-reuse``
    a dispatch encoded into, or a ``commit`` of, a command buffer already committed.

A read sees memory as it was before its dispatch's own writes.  ``alloc`` gives the
buffer fresh, unwritten bytes; ``free`` ends its life.  ``complete`` events are accepted
(timelines use them) and do not change any rule.

Each :class:`Hazard` carries ``event`` (the index of the event at fault), ``other`` (the
index of the earlier event involved, or null for a hazard inside one dispatch or with no
earlier party), ``buffer`` and ``range`` (half-open ``[start, end)`` bytes), and a
message naming both dispatches, the buffer, the bytes, and what to do.  When several
earlier dispatches conflict with one access, ``other`` is the latest of them; a
``stale-read`` is reported per clobbering writer, for at most :data:`MAX_WRITERS` writers
per read, the last message counting the rest.

Cost: one walk, near-linear in the accesses.  Identical accesses of one dispatch count
once.  Byte maps are :class:`~workbench.buffers.ranges.RangeMap` objects (a query costs the
pieces it covers, a few in real schedules); a query covering more than ``_WIDE`` pieces
(hostile schedules: 100k small writes, then whole-buffer reads) goes instead to a tree over
the buffer's access offsets (:class:`~workbench.buffers.ranges.MaxTree` for "the latest
event here", :class:`~workbench.buffers.ranges.LabelTree` for unwritten and
differently-labelled bytes), O(log n), fed lazily from each map's log.
"""
from __future__ import annotations

from typing import Any

from workbench.buffers.hazard import KINDS, Hazard, HazardList, bytes_at, summarize  # noqa: F401  (re-exported)
from workbench.buffers.ranges import LabelTree, MaxTree
from workbench.buffers.schedule import Schedule, as_schedule
from workbench.buffers.walk_state import BufferState, Coords, RegionMap
from workbench.buffers.within import check_dispatch
from workbench.nogc import no_gc

#: a stale read names at most this many clobbering writers; its last hazard counts the rest
MAX_WRITERS = 4
#: a query covering more segments of a byte map than this goes to a tree (O(log n))
_WIDE = 48
#: pieces a wide stale read looks at to name (and count) its writers
_STALE_PIECES = 4 * MAX_WRITERS

#: raw / war / waw: (kind, this dispatch's accesses, the region's earlier accesses, message)
_REGION_RULES = (
    ("raw", "reads", "writes",
     "{me} reads {arg} at {where}, which {other} writes in the same concurrent region (no barrier between "
     "them), so it may read them before or while they are written. Put a barrier between dispatch {o} and "
     "dispatch {idx}."),
    ("war", "writes", "reads",
     "{me} writes {arg} at {where}, which {other} reads in the same concurrent region (no barrier between "
     "them), so {oname} may read {name}'s output. Put a barrier between dispatch {o} and dispatch {idx}, "
     "or give {name} its own output buffer."),
    ("waw", "writes", "writes",
     "{me} writes {arg} at {where}, which {other} also writes in the same concurrent region (no barrier "
     "between them); what remains depends on timing. Put a barrier between dispatch {o} and dispatch {idx}, "
     "or give {name} its own output range."),
)


def analyze(schedule: Any, max_per_kind: int | None = None) -> HazardList:
    """All hazards of a schedule (a Schedule, a parsed dict, JSON text, or a path), in event order.

    ``max_per_kind``: keep at most this many hazards of each kind (memory stays bounded on
    hostile schedules); the others are counted in the result's ``omitted``.
    """
    sch: Schedule = as_schedule(schedule)
    with no_gc():
        return _analyze(sch, max_per_kind)


def _unique(accs, declared: set, keep: int) -> list:
    """A dispatch's accesses without repeats: identical ones (buffer, bytes, value, and the arg
    where an in-place declaration names it) are one access (``keep`` copies for writes, so two
    identical writes still show as overlapping)."""
    if len(accs) < 2:
        return accs
    seen: dict = {}
    out = []
    for a in accs:
        key = (a.buffer, a.offset, a.size, a.value, a.arg if a.arg in declared else None)
        n = seen.get(key, 0)
        if n < keep:
            seen[key] = n + 1
            out.append(a)
    return out


def _analyze(sch: Schedule, max_per_kind: int | None = None) -> HazardList:
    events = sch.events
    concurrent = sch.mode == "concurrent"
    inplace = {k: set(v) for k, v in sch.kernels.items()}
    declared_r = {k: {p[0] for p in v} for k, v in sch.kernels.items()}
    declared_w = {k: {p[1] for p in v} for k, v in sch.kernels.items()}
    bufs: dict[str, _Buf] = {b: BufferState(spec.size, spec.initialized, None) for b, spec in sch.buffers.items()}
    committed: dict[int, int] = {}
    out = HazardList()
    out.omitted = {}
    add = out.append
    if max_per_kind is not None:
        kept: dict[str, int] = {}

        def add(h: Hazard) -> None:  # noqa: F811
            n = kept[h.kind] = kept.get(h.kind, 0) + 1
            if n <= max_per_kind:
                out.append(h)
            else:
                out.omitted[h.kind] = out.omitted.get(h.kind, 0) + 1
    coords = Coords(sch)
    label_ids: dict[str, int] = {}
    label_names: list[str] = []
    label_trees: dict[str, LabelTree] = {}
    max_trees: dict[tuple[str, str], MaxTree] = {}

    def who(i: int) -> str:
        e = events[i]
        return f"dispatch {i} {e.name!r}" if e.type == "dispatch" else f"event {i} ({e.type})"

    def label_id(label: str | None) -> int:
        if label is None:
            return -1
        k = label_ids.get(label)
        if k is None:
            k = label_ids[label] = len(label_names)
            label_names.append(label)
        return k

    def label_tree(buf: str, b: BufferState) -> tuple[LabelTree, dict[int, int], list[int]]:
        """The buffer's contents as a LabelTree, brought up to date from its write log."""
        xs, pos = coords.of(buf)
        t = label_trees.get(buf)
        if t is None:
            t = label_trees[buf] = LabelTree(xs)
        for s, e, w, label in b.log[b.applied:]:
            if w is None:  # cleared: unwritten again
                t.assign(0, t.n, -1)
            else:
                t.assign(pos[s], pos[e], t.value(w, label_id(label)))
        b.applied = len(b.log)
        return t, pos, xs

    def latest(kind: str, buf: str, m: RegionMap, s: int, e: int) -> tuple[int, int, int]:
        """The latest event of the region's map overlapping [s, e), and the span of its bytes there."""
        if m.rm.count_overlaps(s, e) <= _WIDE:
            best, lo, hi = -1, 0, 0
            for ps, pe, v in m.rm.overlaps(s, e):
                if v > best:
                    best, lo, hi = v, ps, pe
                elif v == best:
                    hi = pe
            return best, lo, hi
        xs, pos = coords.of(buf)
        t = max_trees.get((kind, buf))
        if t is None:
            t = max_trees[(kind, buf)] = MaxTree(len(xs) - 1)
        for ps, pe, v in m.log[m.applied:]:
            t.paint(pos[ps], pos[pe], v)
        m.applied = len(m.log)
        best = t.query(pos[s], pos[e])  # the newest paint overlapping [s, e): its bytes there are intact
        return (best,) + m.span(best, s, e)

    def producer(buf: str, lo: int, hi: int) -> int:
        """The last dispatch that wrote any byte of [lo, hi) of the buffer's current allocation, or -1."""
        b = bufs[buf]
        if b.written.count_overlaps(lo, hi) <= _WIDE:
            return max((wi for _, _, (wi, _) in b.written.overlaps(lo, hi)), default=-1)
        xs, pos = coords.of(buf)
        t = max_trees.get(("written", buf))
        if t is None:
            t = max_trees[("written", buf)] = MaxTree(len(xs) - 1)
        for ps, pe, w, _ in b.log[b.applied_max:]:
            if w is not None:
                t.paint(pos[ps], pos[pe], w)
        b.applied_max = len(b.log)
        w = t.query(pos[lo], pos[hi])
        return w if b.alloc_at is None or w > b.alloc_at else -1  # older writes belong to a freed allocation

    # the current concurrent region: "reads" / "writes" -> buffer -> RegionMap
    region: dict[str, dict[str, RegionMap]] = {"reads": {}, "writes": {}}
    region_cb: Any = object()

    for idx, ev in enumerate(events):
        t = ev.type
        if t == "dispatch":
            name = ev.name
            me = f"dispatch {idx} {name!r}"
            cb = ev.cb
            if cb is not None and cb in committed:
                c = committed[cb]
                add(Hazard("cb-reuse", idx, c, None, None,
                           f"{me} is encoded into command buffer {cb}, already committed at event {c}; a committed "
                           f"command buffer cannot take more work (Metal asserts or crashes). Create a new command "
                           f"buffer after each commit (one per phase) and encode {name} into it."))
            if concurrent and cb != region_cb:
                region, region_cb = {"reads": {}, "writes": {}}, cb

            # 1. lifetime and bounds; collect the in-bounds parts
            reads: list[tuple[Any, int, int]] = []
            writes: list[tuple[Any, int, int]] = []
            kernel = ev.kernel
            for accs, dest, verb in ((_unique(ev.reads, declared_r.get(kernel, ()), 1), reads, "reads"),
                                     (_unique(ev.writes, declared_w.get(kernel, ()), 2), writes, "writes")):
                for a in accs:
                    b = bufs[a.buffer]
                    s, e = a.offset, a.offset + a.size
                    if not b.live:
                        add(Hazard("use-after-free", idx, b.freed_at, a.buffer, (s, e),
                                   f"{me} {verb} {a.arg} at {bytes_at(a.buffer, s, e)}, which was freed at event "
                                   f"{b.freed_at}. Free {a.buffer!r} only after its last use, or allocate it again "
                                   f"before {name}."))
                        continue
                    if e > b.size:
                        add(Hazard("out-of-bounds", idx, b.alloc_at, a.buffer, (s, e),
                                   f"{me} {verb} {a.arg} at {bytes_at(a.buffer, s, e)}, but {a.buffer!r} is only "
                                   f"{b.size} bytes ({e - b.size} bytes past its end). Allocate at least {e} bytes "
                                   f"for {a.buffer!r}, or fix the offset/size {name} uses for {a.arg}."))
                        e = b.size
                        if s > e:
                            s = e
                    if s < e:
                        dest.append((a, s, e))

            # 2. inside the dispatch: alias-in-dispatch, partial-overlap
            if writes:
                check_dispatch(idx, me, name, kernel, inplace.get(kernel, ()), reads, writes, producer, add, who)

            # 3. reads against memory contents: uninitialized-read, stale-read
            for a, s, e in reads:
                b = bufs[a.buffer]
                check_gaps, check_labels = not b.init, a.value is not None
                if not (check_gaps or check_labels):
                    continue
                gap_first = gap_last = None
                gap_bytes = 0
                stale: dict[int, list] = {}
                more = False  # a wide read with writers beyond the pieces looked at
                if b.written.count_overlaps(s, e) <= _WIDE:
                    pos = s
                    for ps, pe, (wi, label) in b.written.overlaps(s, e):
                        if ps > pos:
                            if gap_first is None:
                                gap_first = pos
                            gap_last = ps
                            gap_bytes += ps - pos
                        pos = pe
                        if check_labels and label is not None and label != a.value:
                            r = stale.get(wi)
                            if r is None:
                                stale[wi] = [ps, pe, label]
                            else:
                                r[1] = pe
                    if pos < e:
                        if gap_first is None:
                            gap_first = pos
                        gap_last = e
                        gap_bytes += e - pos
                else:
                    tree, pos, xs = label_tree(a.buffer, b)
                    l, r = pos[s], pos[e]
                    if check_gaps:
                        gap_bytes = (e - s) - tree.covered(l, r)
                        if gap_bytes:
                            gap_first, gap_last = xs[tree.gap(l, r)], xs[tree.gap(l, r, last=True) + 1]
                    if check_labels:
                        pieces = tree.stale(l, r, label_id(a.value), _STALE_PIECES + 1)
                        more = len(pieces) > _STALE_PIECES
                        for ps, pe, wi, lb in pieces[:_STALE_PIECES]:
                            q = stale.get(wi)
                            if q is None:
                                stale[wi] = [ps, pe, label_names[lb]]
                            else:
                                q[1] = pe
                if gap_first is not None and check_gaps:
                    part = "" if gap_bytes == gap_last - gap_first else f" ({gap_bytes} of them unwritten)"
                    src = f" since its alloc at event {b.alloc_at}" if b.alloc_at is not None else ""
                    add(Hazard("uninitialized-read", idx, b.alloc_at, a.buffer, (gap_first, gap_last),
                               f"{me} reads {a.arg}" + (f" (expecting {a.value!r})" if a.value is not None else "")
                               + f" at {bytes_at(a.buffer, gap_first, gap_last)}{part}, which nothing wrote{src}. "
                               f"Dispatch the producer of this input before {name}, or mark {a.buffer!r} "
                               f"\"initialized\": true if the host fills it."))
                if stale:
                    writers = sorted(stale)
                    shown = writers[:MAX_WRITERS]
                    for wi in shown:
                        ps, pe, label = stale[wi]
                        wname = events[wi].name
                        msg = (f"{me} reads {a.arg} expecting {a.value!r} at {bytes_at(a.buffer, ps, pe)}, but "
                               f"{who(wi)} overwrote them with {label!r} first. Give {wname} its own output buffer "
                               f"(a separate scratch, like attnH) so {a.value!r} survives until {name} reads it.")
                        rest = len(writers) - len(shown)
                        if wi == shown[-1] and rest:
                            msg += (f" {rest}{'+' if more else ''} more dispatch(es) (events {writers[MAX_WRITERS]}.."
                                    f"{writers[-1]}{', ...' if more else ''}) overwrote other bytes of this read; "
                                    f"only the first {len(shown)} are listed.")
                        elif wi == shown[-1] and more:
                            msg += (f" Other dispatches may have overwritten more bytes of this read (only its first "
                                    f"{_STALE_PIECES} overwritten pieces were looked at).")
                        add(Hazard("stale-read", idx, wi, a.buffer, (ps, pe), msg))

            # 4. concurrent region: raw / war / waw, one rule each
            if concurrent:
                mine = {"reads": reads, "writes": writes}
                for kind, acc_of, against, text in _REGION_RULES:
                    maps = region[against]
                    for a, s, e in mine[acc_of]:
                        m = maps.get(a.buffer)
                        if m is None or not m.rm.any_overlap(s, e):
                            continue
                        o, os_, oe = latest(against, a.buffer, m, s, e)
                        add(Hazard(kind, idx, o, a.buffer, (os_, oe), text.format(
                            me=me, arg=a.arg, where=bytes_at(a.buffer, os_, oe), other=who(o), o=o, idx=idx,
                            oname=events[o].name, name=name)))
                for kind, lst in (("reads", reads), ("writes", writes)):
                    maps = region[kind]
                    for a, s, e in lst:
                        m = maps.get(a.buffer)
                        if m is None:
                            m = maps[a.buffer] = RegionMap()
                        m.paint(s, e, idx)

            # 5. the writes land
            for a, s, e in writes:
                b = bufs[a.buffer]
                b.written.assign(s, e, (idx, a.value))
                b.log.append((s, e, idx, a.value))

        elif t == "barrier":
            if concurrent:
                region, region_cb = {"reads": {}, "writes": {}}, object()
        elif t == "commit":
            cb = ev.cb
            if concurrent:
                region, region_cb = {"reads": {}, "writes": {}}, object()
            if cb in committed:
                add(Hazard("cb-reuse", idx, committed[cb], None, None,
                           f"event {idx} commits command buffer {cb} again (first committed at event "
                           f"{committed[cb]}); a command buffer can be committed once. Create a new command buffer "
                           f"for the work encoded after event {committed[cb]}."))
            else:
                committed[cb] = idx
        elif t == "alloc":
            bufs[ev.buffer] = BufferState(ev.size, ev.initialized, idx)
        elif t == "free":
            b = bufs[ev.buffer]
            if not b.live:
                add(Hazard("use-after-free", idx, b.freed_at, ev.buffer, (0, b.size),
                           f"event {idx} frees buffer {ev.buffer!r} again (already freed at event {b.freed_at}). "
                           f"Free each allocation once."))
            else:
                b.live = False
                b.freed_at = idx
                b.written.clear()
                b.log.append((0, None, None, None))
        # "complete": no rule depends on it
    return out


