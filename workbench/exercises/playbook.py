"""Notebook 10 (the engineer's NaN playbook): the exercises, their answers and their hints."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from workbench.exercises import fixtures as fx
from workbench.exercises.core import Exercise, RIGHT, fields, partly, register, value, wrong


@lru_cache(maxsize=None)
def _emulator():
    from workbench.buffers import Emulator

    model = fx.demo()
    ids = model.encode(fx.RECALL_PROMPT)
    emu = Emulator(model, ids)
    return emu, emu.plan(), len(ids)


@lru_cache(maxsize=None)
def _notebook_emulator():
    """Notebook 10's engine: the demo in the checkpoint's own dtype, on its prompt."""
    from workbench.buffers import Emulator
    from workbench.demo.paths import DEMO
    from workbench.models import load

    model = load(DEMO, attention="explicit")
    ids = model.encode(fx.RECALL_PROMPT)
    emu = Emulator(model, ids)
    return model, emu, emu.plan(), len(ids)


def _compared(run):
    from workbench.diff import compare_arrays

    model, _, _, T = _notebook_emulator()
    return compare_arrays(run.reference, run.outputs, order=model.program.names, tokens=T)


@lru_cache(maxsize=None)
def _over_queries():
    _, emu, plan, _ = _notebook_emulator()
    run = emu.run(plan.place("layers.0.self_attn.scores", like="layers.0.self_attn.q_rope"))
    return bool(run.exact), run.hazards[0].kind if run.hazards else None


@lru_cache(maxsize=None)
def _missing_barrier():
    _, emu, plan, _ = _notebook_emulator()
    run = emu.run(plan, mode="concurrent", skip_barriers=["layers.3.self_attn.o_proj"])
    fd = _compared(run).first_divergence
    (first, last), = fd.nonfinite["rows"]
    return int(first), int(last), fd.nonfinite["pattern"], run.hazards[0].kind


@lru_cache(maxsize=None)
def _scores_over_values():
    _, emu, plan, _ = _notebook_emulator()
    run = emu.run(plan.place("layers.0.self_attn.scores", like="layers.0.self_attn.v_cache"))
    fd = _compared(run).first_divergence
    return fd.op, fd.nonfinite is not None, run.hazards[0].kind


@lru_cache(maxsize=None)
def _late():
    from workbench.diff import compare_arrays

    emu, plan, T = _emulator()
    late = emu.run(plan, mode="concurrent", skip_barriers=["layers.3.self_attn.o_proj"])
    return late, compare_arrays(late.reference, late.outputs, order=fx.demo().program.names, tokens=T)


@lru_cache(maxsize=None)
def _over_values():
    from workbench.diff import compare_arrays

    emu, plan, T = _emulator()
    run = emu.run(plan.place("layers.0.self_attn.scores", like="layers.0.self_attn.v_cache"))
    return run, compare_arrays(run.reference, run.outputs, order=fx.demo().program.names, tokens=T)


def _rows_case():
    late, report = _late()
    fd = report.first_divergence
    x = np.array(late.outputs[fd.op], dtype=np.float64).reshape(-1, np.shape(late.outputs[fd.op])[-1])
    return (x,), [list(r) for r in fd.nonfinite["rows"]]


def _runs(mask):
    out, start = [], None
    for i, m in enumerate(list(mask) + [False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append([start, i - 1])
            start = None
    return out


def _judge_rows(got, want, args):
    got = [list(map(int, r)) for r in got]
    if got == want:
        return RIGHT
    x = args[0]
    if got == [[int(i), int(i)] for i in np.flatnonzero(np.isnan(x).any(-1))]:
        return wrong("merge neighbouring rows into one [first, last] run")
    if got == _runs(np.isnan(x).all(-1)):
        return wrong("a row holds NaN when *any* of its channels is NaN, not all")
    k = sum(g in want for g in got)
    return partly(k, len(want), "runs", "the runs of consecutive token rows with a NaN, each as [first, last]")


def _first_nan_case():
    run, report = _over_values()
    names = [n for n in fx.demo().program.names if n in run.outputs]
    values = {n: np.array(run.outputs[n]) for n in names}
    return (names, values), next(o.op for o in report.ops if o.nonfinite)


register(
    Exercise(
        "10.1", "predict", '(logits exact, hazard kind), e.g. (False, "raw")',
        fields(("exact", "hazard kind"),
               ("follow the element numbers: is each query row read before the scores reach it?",
                "the output lands on *part* of the bytes an input occupies")),
        expected=_over_queries,
        solution="""q_run = emu.run(plan.place("layers.0.self_attn.scores", like="layers.0.self_attn.q_rope"))
q_run.exact, [hz.kind for hz in q_run.hazards]
# bit-exact on this input, and still a hazard: from 33 tokens on the scores outrun the
# queries and the logits go NaN. A clean diff on one input does not prove a clean schedule.""",
        giveaways=("exact numbers on one input",)),
    Exercise(
        "10.2", "predict", '(first NaN token, last NaN token, pattern, hazard kind), e.g. (0, 3, "everywhere", "raw")',
        fields(("first NaN token", "last NaN token", "pattern", "hazard kind"),
               ("which part of layer 3's wider context buffer was never written?",
                "the context has one row per token: where does the unwritten half end?",
                "whole token rows: the diff's name for that shape",
                "o_proj reads what another dispatch of the same concurrent stretch writes")),
        expected=_missing_barrier,
        solution="""late = emu.run(plan, mode="concurrent", skip_barriers=["layers.3.self_attn.o_proj"])
late_fd = compare_arrays(late.reference, late.outputs, order=model.program.names, tokens=len(ids)).first_divergence
late_fd.nonfinite["rows"], late_fd.nonfinite["pattern"], [hz.kind for hz in late.hazards]
# tokens 7-13 NaN: the first half of the context buffer holds layer 2's (stale, finite)
# context, the second half was never written (0xFF: NaN): query rows 7-13 of 14 x 256"""),
    Exercise(
        "10.3", "predict", '(first divergence op, NaN there, hazard kind), e.g. ("layers.0.self_attn.scores", True, "raw")',
        fields(("first divergence", "NaN there", "hazard kind"),
               ("the scores are computed right; which op reads V after the scores overwrote it?",
                "-3.39e38 times a probability is huge, but is it NaN?",
                "the reader expected V's bytes and found the scores'")),
        expected=_scores_over_values,
        solution="""v_run = emu.run(plan.place("layers.0.self_attn.scores", like="layers.0.self_attn.v_cache"))
v_fd = compare_arrays(v_run.reference, v_run.outputs, order=model.program.names, tokens=len(ids)).first_divergence
v_fd.op, v_fd.nonfinite is not None, v_run.hazards[0].kind
# huge but finite values in context; the first NaN comes one op later, in o_proj"""),
    Exercise(
        "10.4", "implement", "a function nan_rows(x) returning a list of [first, last] token-row runs",
        _judge_rows, case=_rows_case,
        solution="""def nan_rows(x):
    bad = np.isnan(x).any(-1)                 # one flag per token row
    runs, start = [], None
    for i, b in enumerate(list(bad) + [False]):
        if b and start is None:
            start = i
        elif not b and start is not None:
            runs.append([start, i - 1]); start = None
    return runs"""),
    Exercise(
        "10.5", "implement", "a function first_nan_op(names, values) returning an op name",
        value("walk the ops in order; the first whose value holds a NaN or an infinity",
              mistakes=[(lambda e, a: next((n for n in a[0] if np.abs(np.nan_to_num(a[1][n])).max() > 1e30), None),
                         "that op's values are huge but finite: test np.isfinite, not the size")]),
        case=_first_nan_case,
        solution="""def first_nan_op(names, values):
    return next(n for n in names if not np.isfinite(values[n]).all())"""),
)
