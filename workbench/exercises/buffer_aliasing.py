"""Notebook 05 (buffer aliasing): the exercises, their answers and their hints."""
from __future__ import annotations

import copy
from functools import lru_cache

from workbench.exercises import fixtures as fx
from workbench.exercises.core import Exercise, fields, partly, register, value, wrong, RIGHT


def tiny() -> dict:
    """The notebook's three-event schedule: a dispatch, the commit, a late dispatch."""
    def acc(arg, buf):
        return {"arg": arg, "buffer": buf, "offset": 0, "size": 64}
    return {"format": "workbench.schedule/1", "mode": "serial",
            "buffers": {"x": {"size": 64, "initialized": True}, "y": {"size": 64}},
            "events": [{"type": "dispatch", "name": "norm", "kernel": "rmsnorm", "cb": 0,
                        "reads": [acc("x", "x")], "writes": [acc("out", "y")]},
                       {"type": "commit", "cb": 0},
                       {"type": "dispatch", "name": "late_add", "kernel": "add", "cb": 0,
                        "reads": [acc("a", "y")], "writes": [acc("out", "x")]}]}


def _moved_commit_hazards() -> int:
    from workbench.buffers import analyze

    t = tiny()
    t["events"] = [t["events"][0], t["events"][2], t["events"][1]]
    return len(analyze(t))


@lru_cache(maxsize=None)
def _schedule() -> dict:
    from workbench.buffers import Emulator

    emu = Emulator(fx.demo(), fx.demo().encode(fx.RECALL_PROMPT))
    run = emu.run(emu.plan().place("layers.0.self_attn.o_proj", like="layers.0.self_attn.context"))
    return run.schedule.to_dict()


@lru_cache(maxsize=None)
def _inplace_residual() -> tuple[int, bool]:
    """Notebook 05's move: layers.1.attn_residual written over layers.0, on its zoo model."""
    import tempfile
    from pathlib import Path

    from workbench import zoo
    from workbench.buffers import Emulator
    from workbench.models import load

    model = load(zoo.build("gemma4_text", Path(tempfile.mkdtemp()) / "g4", dtype="float32"))
    emu = Emulator(model, [1, 5, 9, 3, 7, 2, 11, 4])
    run = emu.run(emu.plan().place("layers.1.attn_residual", like="layers.0"))
    return len(run.hazards), bool(run.exact)


def _overlap(a, b):
    return a["buffer"] == b["buffer"] and a["offset"] < b["offset"] + b["size"] and b["offset"] < a["offset"] + a["size"]


def _pairs_case():
    ev = [e for e in _schedule()["events"] if e["type"] == "dispatch"]
    pairs = [(w, r) for e, nxt in zip(ev, ev[1:]) for w in e["writes"] for r in nxt["reads"] + nxt["writes"]]
    pairs += [(w, dict(w, offset=w["offset"] + w["size"])) for w in (e["writes"][0] for e in ev[:20])]   # touching, not overlapping
    pairs = [(dict(a), dict(b)) for a, b in pairs]
    return (pairs,), [_overlap(a, b) for a, b in pairs]


def _judge_pairs(got, want, args):
    got = [bool(g) for g in got]
    if got == want:
        return RIGHT
    pairs = args[0]
    touching = [a["buffer"] == b["buffer"] and a["offset"] <= b["offset"] + b["size"] and b["offset"] <= a["offset"] + a["size"]
                for a, b in pairs]
    if got == touching:
        return wrong("ranges are half-open, [offset, offset + size): two ranges that only touch do not overlap")
    if got == [a["offset"] < b["offset"] + b["size"] and b["offset"] < a["offset"] + a["size"] for a, b in pairs]:
        return wrong("bytes of different buffers never overlap: compare the buffer names first")
    k = sum(g == w for g, w in zip(got, want))
    return partly(k, len(want), "pairs", "two ranges overlap when each starts before the other ends")


def _commit_cases():
    a = tiny()
    b = tiny()
    b["events"][2]["cb"] = 1                                  # the late dispatch in a new command buffer
    c = copy.deepcopy(a)
    c["events"].insert(2, {"type": "dispatch", "name": "other_cb", "kernel": "add", "cb": 1,
                           "reads": [dict(a["events"][2]["reads"][0])], "writes": [dict(a["events"][2]["writes"][0])]})
    c["events"].append({"type": "commit", "cb": 1})
    return [a, b, c]


def _after_commit(events, per_cb=True):
    done, out = set(), []
    for e in events:
        if e["type"] == "commit":
            done.add(e["cb"] if per_cb else "any")
        elif e["type"] == "dispatch" and (e["cb"] if per_cb else "any") in done:
            out.append(e["name"])
    return out


def _commit_case():
    from workbench.buffers import analyze

    schedules = _commit_cases()
    want = [sorted(s["events"][h.event]["name"] for h in analyze(s) if h.kind == "cb-reuse") for s in schedules]
    return ([s["events"] for s in schedules],), want


def _judge_commit(got, want, args):
    got = [sorted(g) for g in got]
    if got == want:
        return RIGHT
    if got == [sorted(_after_commit(ev, per_cb=False)) for ev in args[0]]:
        return wrong("a commit closes only its own command buffer: compare each dispatch's cb with the committed ones")
    k = sum(g == w for g, w in zip(got, want))
    return partly(k, len(want), "schedules", "a dispatch is late when its own command buffer was committed before it")


register(
    Exercise(
        "05.1", "predict", "a number",
        value("late_add reads y after norm wrote it, and writes x after norm's read: what is left to go wrong?",
              mistakes=[(1, "the commit now comes after both dispatches: is anything encoded into a committed buffer?")]),
        expected=_moved_commit_hazards,
        solution="""moved = dict(tiny, events=[tiny["events"][0], tiny["events"][2], tiny["events"][1]])
len(analyze(moved))
# none: every read finds the value it expects and every dispatch is encoded before the commit"""),
    Exercise(
        "05.2", "predict", "a tuple (hazards, exact), e.g. (1, False)",
        fields(("hazards", "exact"),
               ("an add is element-wise: does any output element need an input element already overwritten?",
                "if no element is read after it was overwritten, are the logits changed?"),
               swapped="the order is (number of hazards, logits exact)"),
        expected=_inplace_residual,
        solution="""inplace = emu.run(plan.place("layers.1.attn_residual", like="layers.0"))
len(inplace.hazards), inplace.exact
# the add is element-wise and its kernel declares that pair safe in place, and layers.0 has
# no reader after it: the buffer trick that broke o_proj is a correct saving here"""),
    Exercise(
        "05.3", "implement", "a function overlaps(a, b) returning True or False for two accesses "
        "{'buffer', 'offset', 'size'}",
        _judge_pairs,
        case=_pairs_case, call=lambda fn, pairs: [fn(a, b) for a, b in pairs],
        solution="""def overlaps(a, b):
    return (a["buffer"] == b["buffer"]
            and a["offset"] < b["offset"] + b["size"]      # [offset, offset + size) is half-open
            and b["offset"] < a["offset"] + a["size"])"""),
    Exercise(
        "05.4", "implement", "a function late_dispatches(events) returning a list of dispatch names",
        _judge_commit,
        case=_commit_case, call=lambda fn, schedules: [list(fn(ev)) for ev in schedules],
        solution="""def late_dispatches(events):
    committed, late = set(), []
    for e in events:
        if e["type"] == "commit":
            committed.add(e["cb"])
        elif e["type"] == "dispatch" and e["cb"] in committed:   # its own command buffer, already committed
            late.append(e["name"])
    return late"""),
)
