"""Check a recorded dispatch schedule (workbench.schedule/1) for buffer hazards.

Exit 0 when clean, 1 when hazards are found, 2 when the schedule is unreadable or
invalid (one line naming the event index and field), not a regular file, or larger than
``schedule.MAX_FILE_BYTES``.
"""
from __future__ import annotations

import json
import time

from workbench.buffers.analyze import analyze, summarize
from workbench.buffers.schedule import ScheduleError, load_schedule


#: --json lists at most this many hazards of each kind by default (hostile schedules: bounded output)
MAX_JSON = 10_000


def add_arguments(p) -> None:
    from workbench.errors import number_arg

    p.add_argument("schedule", metavar="SCHEDULE.json", help="a workbench.schedule/1 file written by your engine")
    p.add_argument("--json", action="store_true",
                   help="print the result as JSON (every hazard, up to --max-json of each kind)")
    p.add_argument("--max-json", type=number_arg(0, integer=True), default=MAX_JSON, metavar="N",
                   help=f"list at most N hazards of each kind in --json (default {MAX_JSON}; 0: all); "
                        "the counts are always complete and \"omitted\" says how many were left out")
    p.add_argument("--max", type=number_arg(0, integer=True), default=50, metavar="N",
                   help="show at most N hazards in the text report (default 50; --json shows up to --max-json of each kind)")
    p.add_argument("--kind", action="append", metavar="KIND",
                   help="only report hazards of this kind (repeatable), e.g. --kind alias-in-dispatch")


def run(args) -> int:
    from workbench.errors import UsageError

    t0 = time.perf_counter()
    try:
        sch = load_schedule(args.schedule)
    except ScheduleError as e:
        raise UsageError(str(e)) from None
    # hostile schedules: keep a bounded number of each kind (the counts stay complete)
    hazards = analyze(sch, max_per_kind=args.max_json if args.json and args.max_json > 0 else
                      None if args.json else max(MAX_JSON, args.max))
    if args.kind:
        from workbench.buffers.analyze import KINDS
        bad = [k for k in args.kind if k not in KINDS]
        if bad:
            raise UsageError(f"unknown hazard kind {bad[0]!r} (kinds: {', '.join(KINDS)})")
        kept = [h for h in hazards if h.kind in args.kind]
        kept_omitted = {k: n for k, n in hazards.omitted.items() if k in args.kind}
        hazards = type(hazards)(kept)
        hazards.omitted = kept_omitted
    n_disp = sum(1 for e in sch.events if e.type == "dispatch")
    if args.json:
        print(json.dumps({"schedule": args.schedule, "mode": sch.mode, "events": len(sch.events),
                          "dispatches": n_disp, "buffers": len(sch.buffers), "counts": summarize(hazards),
                          "omitted": dict(hazards.omitted), "hazards": [h.to_dict() for h in hazards]}))
    else:
        head = (f"{args.schedule}: {len(sch.events)} events ({n_disp} dispatches), mode {sch.mode}, "
                f"analysed in {time.perf_counter() - t0:.2f}s")
        if not hazards:
            _print(f"{head}: no hazards")
        else:
            found = summarize(hazards)
            total = sum(found.values())
            counts = ", ".join(f"{n} {k}" for k, n in found.items())
            _print(f"{head}: {total} hazard{'s' if total != 1 else ''} ({counts})")
            groups = _group(hazards)
            for first, rest in groups[: max(args.max, 0)]:
                h = first
                rng = f" {h.buffer}[{h.range[0]}:{h.range[1]}]" if h.range is not None else ""
                oth = f" (with event {h.other})" if h.other is not None else ""
                _print(f"  event {h.event} {h.kind}{rng}{oth}")
                _print(f"    {h.message}")
                if rest:
                    _print(f"    ... and {len(rest)} more {h.kind} with event {h.other} in a row "
                          f"(events {rest[0].event}..{rest[-1].event})")
            if len(groups) > args.max:
                _print(f"  ... {len(groups) - args.max} more (--max N, or --json for all)")
    return 1 if hazards else 0


def _print(line: str) -> None:
    """One line of the text report; names from the schedule are escaped (no forged lines)."""
    from workbench.errors import printable
    print(printable(line))


def _group(hazards):
    """Runs of hazards of one kind caused by one earlier event (every dispatch encoded into
    a committed command buffer, say) print as their first one plus a count."""
    groups: list[tuple] = []
    for h in hazards:
        if groups and h.other is not None:
            first, rest = groups[-1]
            if first.kind == h.kind and first.other == h.other and first.buffer == h.buffer \
                    and first.kind in ("cb-reuse", "use-after-free"):
                rest.append(h)
                continue
        groups.append((h, []))
    return groups
