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
earlier dispatches conflict with one access, ``other`` is the latest of them.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any

from workbench.buffers.ranges import RangeMap
from workbench.buffers.schedule import Schedule, as_schedule, no_gc

KINDS = ("alias-in-dispatch", "partial-overlap", "raw", "war", "waw", "stale-read",
         "use-after-free", "out-of-bounds", "uninitialized-read", "cb-reuse")

#: at most this many pairwise comparisons inside one dispatch (pathological inputs only)
_MAX_PAIR_CHECKS = 200_000


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


def _bytes(buf: str, s: int, e: int) -> str:
    return f"bytes [{s}, {e}) of buffer {buf!r}"


class _Buf:
    __slots__ = ("size", "live", "init", "alloc_at", "freed_at", "written")

    def __init__(self, size: int, init: bool, alloc_at: int | None):
        self.size, self.init, self.alloc_at = size, init, alloc_at
        self.live = True
        self.freed_at: int | None = None
        self.written = RangeMap()  # bytes -> (writer event index, label or None)


def analyze(schedule: Any) -> list[Hazard]:
    """All hazards of a schedule (a Schedule, a parsed dict, JSON text, or a path), in event order."""
    sch: Schedule = as_schedule(schedule)
    with no_gc():
        return _analyze(sch)


def _analyze(sch: Schedule) -> list[Hazard]:
    events = sch.events
    concurrent = sch.mode == "concurrent"
    inplace = {k: set(v) for k, v in sch.kernels.items()}
    bufs: dict[str, _Buf] = {b: _Buf(spec.size, spec.initialized, None) for b, spec in sch.buffers.items()}
    committed: dict[int, int] = {}
    out: list[Hazard] = []
    add = out.append

    def who(i: int) -> str:
        e = events[i]
        return f"dispatch {i} {e.name!r}" if e.type == "dispatch" else f"event {i} ({e.type})"

    # current concurrent region: buffer -> RangeMap of bytes -> latest reader / writer event
    region_reads: dict[str, RangeMap] = {}
    region_writes: dict[str, RangeMap] = {}
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
                region_reads, region_writes, region_cb = {}, {}, cb

            # 1. lifetime and bounds; collect the in-bounds parts
            reads: list[tuple[Any, int, int]] = []
            writes: list[tuple[Any, int, int]] = []
            for accs, dest, verb in ((ev.reads, reads, "reads"), (ev.writes, writes, "writes")):
                for a in accs:
                    b = bufs[a.buffer]
                    s, e = a.offset, a.offset + a.size
                    if not b.live:
                        add(Hazard("use-after-free", idx, b.freed_at, a.buffer, (s, e),
                                   f"{me} {verb} {a.arg} at {_bytes(a.buffer, s, e)}, which was freed at event "
                                   f"{b.freed_at}. Free {a.buffer!r} only after its last use, or allocate it again "
                                   f"before {name}."))
                        continue
                    if e > b.size:
                        add(Hazard("out-of-bounds", idx, b.alloc_at, a.buffer, (s, e),
                                   f"{me} {verb} {a.arg} at {_bytes(a.buffer, s, e)}, but {a.buffer!r} is only "
                                   f"{b.size} bytes ({e - b.size} bytes past its end). Allocate at least {e} bytes "
                                   f"for {a.buffer!r}, or fix the offset/size {name} uses for {a.arg}."))
                        e = b.size
                        if s > e:
                            s = e
                    if s < e:
                        dest.append((a, s, e))

            # 2. inside the dispatch: alias-in-dispatch, partial-overlap
            if writes:
                _intra(idx, me, name, ev.kernel, inplace.get(ev.kernel, ()), reads, writes, bufs, add, who)

            # 3. reads against memory contents: uninitialized-read, stale-read
            for a, s, e in reads:
                b = bufs[a.buffer]
                wmap = b.written
                gap_first = gap_last = None
                gap_bytes = 0
                pos = s
                stale: dict[int, list] = {}
                for ps, pe, (wi, label) in wmap.overlaps(s, e):
                    if ps > pos:
                        if gap_first is None:
                            gap_first = pos
                        gap_last = ps
                        gap_bytes += ps - pos
                    pos = pe
                    if a.value is not None and label is not None and label != a.value:
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
                if gap_first is not None and not b.init:
                    part = "" if gap_bytes == gap_last - gap_first else f" ({gap_bytes} of them unwritten)"
                    src = f" since its alloc at event {b.alloc_at}" if b.alloc_at is not None else ""
                    add(Hazard("uninitialized-read", idx, b.alloc_at, a.buffer, (gap_first, gap_last),
                               f"{me} reads {a.arg}" + (f" (expecting {a.value!r})" if a.value is not None else "")
                               + f" at {_bytes(a.buffer, gap_first, gap_last)}{part}, which nothing wrote{src}. "
                               f"Dispatch the producer of this input before {name}, or mark {a.buffer!r} "
                               f"\"initialized\": true if the host fills it."))
                for wi in sorted(stale):
                    ps, pe, label = stale[wi]
                    wname = events[wi].name
                    add(Hazard("stale-read", idx, wi, a.buffer, (ps, pe),
                               f"{me} reads {a.arg} expecting {a.value!r} at {_bytes(a.buffer, ps, pe)}, but "
                               f"{who(wi)} overwrote them with {label!r} first. Give {wname} its own output buffer "
                               f"(a separate scratch, like attnH) so {a.value!r} survives until {name} reads it."))

            # 4. concurrent region: raw / war / waw
            if concurrent:
                for a, s, e in reads:
                    rw = region_writes.get(a.buffer)
                    if rw is not None and rw.any_overlap(s, e):
                        o, os_, oe = _latest(rw, s, e)
                        add(Hazard("raw", idx, o, a.buffer, (os_, oe),
                                   f"{me} reads {a.arg} at {_bytes(a.buffer, os_, oe)}, which {who(o)} writes in "
                                   f"the same concurrent region (no barrier between them), so it may read them "
                                   f"before or while they are written. Put a barrier between dispatch {o} and "
                                   f"dispatch {idx}."))
                for a, s, e in writes:
                    rr = region_reads.get(a.buffer)
                    if rr is not None and rr.any_overlap(s, e):
                        o, os_, oe = _latest(rr, s, e)
                        add(Hazard("war", idx, o, a.buffer, (os_, oe),
                                   f"{me} writes {a.arg} at {_bytes(a.buffer, os_, oe)}, which {who(o)} reads in "
                                   f"the same concurrent region (no barrier between them), so {events[o].name} may "
                                   f"read {name}'s output. Put a barrier between dispatch {o} and dispatch {idx}, "
                                   f"or give {name} its own output buffer."))
                    rw = region_writes.get(a.buffer)
                    if rw is not None and rw.any_overlap(s, e):
                        o, os_, oe = _latest(rw, s, e)
                        add(Hazard("waw", idx, o, a.buffer, (os_, oe),
                                   f"{me} writes {a.arg} at {_bytes(a.buffer, os_, oe)}, which {who(o)} also writes "
                                   f"in the same concurrent region (no barrier between them); what remains depends "
                                   f"on timing. Put a barrier between dispatch {o} and dispatch {idx}, or give "
                                   f"{name} its own output range."))
                for a, s, e in reads:
                    m = region_reads.get(a.buffer)
                    if m is None:
                        m = region_reads[a.buffer] = RangeMap()
                    m.assign(s, e, idx)
                for a, s, e in writes:
                    m = region_writes.get(a.buffer)
                    if m is None:
                        m = region_writes[a.buffer] = RangeMap()
                    m.assign(s, e, idx)

            # 5. the writes land
            for a, s, e in writes:
                bufs[a.buffer].written.assign(s, e, (idx, a.value))

        elif t == "barrier":
            if concurrent:
                region_reads, region_writes, region_cb = {}, {}, object()
        elif t == "commit":
            cb = ev.cb
            if concurrent:
                region_reads, region_writes, region_cb = {}, {}, object()
            if cb in committed:
                add(Hazard("cb-reuse", idx, committed[cb], None, None,
                           f"event {idx} commits command buffer {cb} again (first committed at event "
                           f"{committed[cb]}); a command buffer can be committed once. Create a new command buffer "
                           f"for the work encoded after event {committed[cb]}."))
            else:
                committed[cb] = idx
        elif t == "alloc":
            bufs[ev.buffer] = _Buf(ev.size, ev.initialized, idx)
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
        # "complete": no rule depends on it
    return out


def _latest(rm: RangeMap, s: int, e: int) -> tuple[int, int, int]:
    """The latest event among the pieces of [s, e) in rm, and the span of its pieces."""
    best = -1
    lo = hi = 0
    for ps, pe, v in rm.overlaps(s, e):
        if v > best:
            best, lo, hi = v, ps, pe
        elif v == best:
            hi = pe
    return best, lo, hi


def _intra(idx, me, name, kernel, pairs, reads, writes, bufs, add, who) -> None:
    """alias-in-dispatch and partial-overlap among one dispatch's accesses (sweep per buffer)."""
    items: dict[str, list] = {}
    for a, s, e in writes:
        items.setdefault(a.buffer, []).append((s, e, 1, a))
    for a, s, e in reads:
        if a.buffer in items:
            items[a.buffer].append((s, e, 0, a))
    checks = 0
    kdesc = f"kernel {kernel!r}" if kernel is not None else "its kernel (none named)"
    decl = f"kernels[{kernel!r}].inplace" if kernel is not None else "a kernel's inplace list (name the kernel)"
    for buf, lst in items.items():
        if len(lst) < 2:
            continue
        lst.sort(key=lambda x: (x[0], x[1], x[2]))
        act_r: list = []
        act_w: list = []
        for s, e, isw, a in lst:
            act_r = [x for x in act_r if x[1] > s]
            act_w = [x for x in act_w if x[1] > s]
            if isw:
                for rs, re_, _, r in act_r:
                    checks += 1
                    _pair(idx, me, name, kdesc, decl, pairs, buf, r, rs, re_, a, s, e, add, bufs, who)
                for ws, we, _, w in act_w:
                    checks += 1
                    lo, hi = max(s, ws), min(e, we)
                    add(Hazard("partial-overlap", idx, None, buf, (lo, hi),
                               f"{me} writes {w.arg} at {_bytes(buf, ws, we)} and {a.arg} at [{s}, {e}); the two "
                               f"outputs overlap at [{lo}, {hi}), so what remains depends on which thread finishes "
                               f"last. Give {name}'s {a.arg} its own range."))
                act_w.append((s, e, 1, a))
            else:
                for ws, we, _, w in act_w:
                    checks += 1
                    _pair(idx, me, name, kdesc, decl, pairs, buf, a, s, e, w, ws, we, add, bufs, who)
                act_r.append((s, e, 0, a))
            if checks > _MAX_PAIR_CHECKS:
                return


def _pair(idx, me, name, kdesc, decl, pairs, buf, r, rs, re_, w, ws, we, add, bufs, who) -> None:
    equal = rs == ws and re_ == we
    if equal and (r.arg, w.arg) in pairs:
        return  # declared in-place: the kernel reads each element before writing it
    rdesc = f"{r.arg} ({r.value!r})" if r.value is not None else r.arg
    lo, hi = max(rs, ws), min(re_, we)
    producer = -1
    for _, _, (wi, _) in bufs[buf].written.overlaps(lo, hi):
        producer = max(producer, wi)
    src = f" (the input there was last written by {who(producer)})" if producer >= 0 else ""
    if equal:
        add(Hazard("alias-in-dispatch", idx, None, buf, (rs, re_),
                   f"{me} reads {rdesc} and writes {w.arg} at the same {_bytes(buf, rs, re_)}{src}, and {kdesc} does "
                   f"not declare ({r.arg!r}, {w.arg!r}) in-place: a kernel working tile by tile reads input its "
                   f"own output already overwrote. Give {name} its own output buffer (or, if it truly reads each "
                   f"element before writing it, declare [{r.arg!r}, {w.arg!r}] in {decl})."))
    else:
        add(Hazard("partial-overlap", idx, None, buf, (lo, hi),
                   f"{me} reads {rdesc} at [{rs}, {re_}) and writes {w.arg} at [{ws}, {we}) of buffer {buf!r}; "
                   f"they overlap at [{lo}, {hi}){src} without being the same range, so threads read bytes other threads "
                   f"of {name} already wrote. Give {name} its own output buffer, or move {w.arg} clear of {r.arg}."))


def summarize(hazards: list[Hazard]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for h in hazards:
        counts[h.kind] = counts.get(h.kind, 0) + 1
    return counts
