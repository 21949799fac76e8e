"""The rules inside one dispatch: ``alias-in-dispatch`` (a read and a write of the same bytes
its kernel does not declare in-place) and ``partial-overlap`` (a read and a write, or two
writes, overlapping without being equal), by a sweep over each buffer's accesses.  The
rules between dispatches are the walk's (workbench/buffers/analyze.py)."""
from __future__ import annotations

from workbench.buffers.hazard import Hazard, bytes_at

#: at most this many pairwise comparisons inside one dispatch (pathological inputs only)
MAX_PAIR_CHECKS = 200_000


def check_dispatch(idx, me, name, kernel, pairs, reads, writes, producer, add, who) -> None:
    """alias-in-dispatch and partial-overlap among one dispatch's accesses (sweep per buffer).

    Each list of accesses still open is pruned only when it is compared against, and every
    comparison counts against ``MAX_PAIR_CHECKS``, so the sweep is linear plus the pairs."""
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
            act_w = [x for x in act_w if x[1] > s]
            checks += len(act_w)
            if isw:
                act_r = [x for x in act_r if x[1] > s]
                checks += len(act_r)
                for rs, re_, _, r in act_r:
                    _pair(idx, me, name, kdesc, decl, pairs, buf, r, rs, re_, a, s, e, add, producer, who)
                for ws, we, _, w in act_w:
                    lo, hi = max(s, ws), min(e, we)
                    add(Hazard("partial-overlap", idx, None, buf, (lo, hi),
                               f"{me} writes {w.arg} at {bytes_at(buf, ws, we)} and {a.arg} at [{s}, {e}); the two "
                               f"outputs overlap at [{lo}, {hi}), so what remains depends on which thread finishes "
                               f"last. Give {name}'s {a.arg} its own range."))
                act_w.append((s, e, 1, a))
            else:
                for ws, we, _, w in act_w:
                    _pair(idx, me, name, kdesc, decl, pairs, buf, a, s, e, w, ws, we, add, producer, who)
                act_r.append((s, e, 0, a))
            if checks > MAX_PAIR_CHECKS:
                return


def _pair(idx, me, name, kdesc, decl, pairs, buf, r, rs, re_, w, ws, we, add, producer, who) -> None:
    equal = rs == ws and re_ == we
    if equal and (r.arg, w.arg) in pairs:
        return  # declared in-place: the kernel reads each element before writing it
    rdesc = f"{r.arg} ({r.value!r})" if r.value is not None else r.arg
    lo, hi = max(rs, ws), min(re_, we)
    last = producer(buf, lo, hi)
    src = f" (the input there was last written by {who(last)})" if last >= 0 else ""
    if equal:
        add(Hazard("alias-in-dispatch", idx, None, buf, (rs, re_),
                   f"{me} reads {rdesc} and writes {w.arg} at the same {bytes_at(buf, rs, re_)}{src}, and {kdesc} does "
                   f"not declare ({r.arg!r}, {w.arg!r}) in-place: a kernel working tile by tile reads input its "
                   f"own output already overwrote. Give {name} its own output buffer (or, if it truly reads each "
                   f"element before writing it, declare [{r.arg!r}, {w.arg!r}] in {decl})."))
    else:
        add(Hazard("partial-overlap", idx, None, buf, (lo, hi),
                   f"{me} reads {rdesc} at [{rs}, {re_}) and writes {w.arg} at [{ws}, {we}) of buffer {buf!r}; "
                   f"they overlap at [{lo}, {hi}){src} without being the same range, so threads read bytes other threads "
                   f"of {name} already wrote. Give {name} its own output buffer, or move {w.arg} clear of {r.arg}."))
