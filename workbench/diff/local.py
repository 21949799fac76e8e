"""Local errors: our op applied to the engine's own inputs (where the bug *is*, not where it shows).

For each compared op, the inputs come from the engine's dump; an input the engine did not
dump is recomputed from the nearest dumped tensors through our program (a *segment*: at most
:data:`MAX_SEGMENT` ops, e.g. ``mlp.act`` from ``gate_proj`` and ``up_proj`` for
``down_proj``).  With the engine's precision known (:mod:`workbench.diff.budget`) the op (or
segment) runs twice: *exact* in a finer format and *honest* at the op's precision; the
engine's output is judged against the exact one, within :data:`budget.FACTOR` x the honest
one's distance (rule ``"budget"``).  Without it (module-level records aside, a dump of printed
values), the fixed local limits of the tolerance decide (rule ``"fixed"``).
"""
from __future__ import annotations

import contextlib
from typing import Any, Mapping, Sequence

import numpy as np

from workbench.diff import budget as rounding
from workbench.diff.metrics import error_metrics, local_diverged
from workbench.diff.report import DiffReport, to_numpy
from workbench.dtypes import dtype_name, parse_dtype

#: at most this many ops are recomputed to stand in for inputs the engine did not dump (an
#: attention block from its layer's input norm: 16 in Gemma 4, with q/k/v norms and caches)
MAX_SEGMENT = 24


def is_module_level(m) -> bool:
    return m.granularity == "module"


def topk_dependents(program) -> dict[str, list[str]]:
    """Every top-k index op (expert selection) -> the ops of its layer that read it, directly or not."""
    out = {}
    for op in program.ops:
        if op.kind != "topk":
            continue
        reach, deps = {op.name}, []
        for later in program.ops[program.index(op.name) + 1:]:
            if later.layer != op.layer or later.kind == "topk":
                continue
            if any(s in reach for s in later.inputs):
                reach.add(later.name)
                deps.append(later.name)
        out[op.name] = deps
    return out


def segment(program, name: str, have) -> list[str] | None:
    """The ops to run, in program order and ``name`` last, to compute ``name`` from the values
    in ``have`` (dumped or fed); None when that takes more than :data:`MAX_SEGMENT` ops or an
    input is neither dumped nor made by an op."""
    order: list[str] = []
    entered: set[str] = set()

    def visit(n: str) -> bool:
        if n in entered:
            return True
        if n != name and n in have:
            return True
        if n not in program or len(entered) > MAX_SEGMENT:  # (the op itself is not counted)
            return False
        entered.add(n)
        for s in program[n].inputs:
            if not visit(s):
                return False
        order.append(n)
        return True

    return order if visit(name) else None


class _Runs:
    """Contexts to recompute ops in: ``"float64"`` on the CPU, the others as the model runs;
    the weights cast to each, kept for this diff only."""

    def __init__(self, model, logit_rows):
        self.model, self.logit_rows = model, logit_rows
        self._ctx: dict[str, Any] = {}

    def ctx(self, fmt: str | None):
        c = self._ctx.get(fmt)
        if c is None:
            import mlx.core as mx

            from workbench.models.model import Context, Weights

            if fmt is None:  # the model's own (storage) dtypes
                c = self.model.context(None)
            else:
                dt = getattr(mx, fmt)
                c = Context(dtype=dt, weights=Weights(self.model.weights().raw, dt), model=self.model, uniform=True)
            c.logit_rows = self.logit_rows
            self._ctx[fmt] = c
        return c

    def release(self) -> None:
        """Forget the weights cast so far (each batch reads its own ops' weights: no model's
        worth of float64 copies is ever held)."""
        for fmt, c in self._ctx.items():
            if fmt is not None:
                c.weights.release()

    def run(self, program, order: list[str], fmt: str | None, feeds, aligned, dtypes):
        """``order``'s last op computed in ``fmt`` (None: the model's own dtypes) from the
        engine's tensors (rounded to it)."""
        import mlx.core as mx

        ctx = self.ctx(fmt)
        vals: dict = {}

        def value(s):
            if s in vals:
                return vals[s]
            if s in feeds:
                return feeds[s]
            own = (dtypes or {}).get(s, "")
            want = getattr(mx, own) if own.startswith(("int", "uint", "bool")) else ctx.dtype
            return mx.array(aligned[s]).astype(want)

        with mx.stream(mx.cpu) if fmt == "float64" else contextlib.nullcontext():
            for n in order:
                op = program[n]
                vals[n] = op.fn(ctx, *[value(s) for s in op.inputs])
        return vals[order[-1]]


def local_errors(report: DiffReport, model: Any, aligned: Mapping[str, np.ndarray], ids: Sequence[int],
                 dtype: str | None = None, dtypes: Mapping[str, str] | None = None, logit_rows=None,
                 decode: bool = False, precision: rounding.EnginePrecision | None = None) -> int:
    """Fill each op's local error: our op (or segment) applied to the engine's own (aligned)
    inputs, and with ``precision`` its rounding budget and verdict.  Returns how many ops got one.

    Program inputs (token ids, RoPE offsets, masks) come from our feeds.  ``dtype``: the
    compute dtype without ``precision``; ``dtypes``: our ops' own dtypes, so integer values
    (expert indices) are fed back as integers.  ``logit_rows``: the positions the head's
    tensors were compared at (a :class:`workbench.trace.logits.LogitRows`; None: every one).
    """
    import mlx.core as mx

    if is_module_level(model):  # a module call is not re-run on another engine's inputs (yet)
        return 0
    program = model.program
    runs = _Runs(model, logit_rows)
    feeds = model.feeds(mx.array([list(ids)], dtype=mx.int32))
    have = set(aligned) | set(feeds)
    fixed_fmt = None if dtype is None else dtype_name(parse_dtype(dtype))
    tol = report.tolerance
    n = 0
    pending: list = []
    pending_bytes = 0

    def numpy_or_reason(od, out):
        try:
            return to_numpy(out)
        except (ValueError, TypeError, IndexError, RuntimeError) as e:
            od.reasons.append(f"local error not computed: {e}")
            return None

    def flush():
        nonlocal n, pending, pending_bytes
        if not pending:
            return
        try:
            mx.eval([x for _, _, ex, ho, _ in pending for x in (ex, ho) if x is not None])
        except (ValueError, RuntimeError):
            pass  # evaluated one by one below, where the failing op is named
        for od, op, ex, ho, p in pending:
            exact = numpy_or_reason(od, ex)
            theirs = aligned[od.op]
            if exact is None or exact.shape != theirs.shape:
                continue
            honest = None if ho is None else numpy_or_reason(od, ho)
            if op.kind == "topk":  # a set of indices: compare it as a set
                exact, theirs = np.sort(exact, axis=-1), np.sort(theirs, axis=-1)
                honest = None if honest is None else np.sort(honest, axis=-1)
            m = error_metrics(exact, theirs, mask_below=tol.mask_below)
            od.local_cosine, od.local_nmse, od.local_max_abs = m["cosine"], m["nmse"], m["max_abs"]
            od.local_power = m["nmse_power"]
            fixed = local_diverged(m, tol)
            od.local_rule = "fixed"
            if honest is not None and honest.shape == exact.shape:
                b = error_metrics(exact, honest, mask_below=tol.mask_below)
                if not b["nonfinite"]:  # (an honest run that overflows tells no budget)
                    od.precision, od.budget_power = p, b["nmse_power"]
                    od.ratio, beyond = rounding.judge(m["nmse_power"], b["nmse_power"], p)
                    od.limit_power = rounding.limit(b["nmse_power"], p)
                    od.local_rule = "budget"
                    fixed = bool(m["nonfinite_new"] or m.get("nonfinite_ref_only")) or beyond
            od.local_diverged = fixed
            n += 1
        pending, pending_bytes = [], 0
        runs.release()

    for od in report.ops:
        if not od.compared or od.op not in aligned or od.op not in program:  # (a module-level dump's names)
            continue
        order = segment(program, od.op, have)
        if order is None:
            continue
        if decode and any(src in feeds and src != "input_ids" for n_ in order for src in program[n_].inputs):
            continue  # positions and masks of a decode step are not the full forward's feeds
        p = precision.of(od.op) if precision is not None else None
        od.recomputed = order[:-1]
        if pending and pending[-1][1].layer != program[od.op].layer:
            flush()  # (a layer at a time: its weights cast to the recomputes' formats, then released)
        try:
            if p is None:
                ex, ho = runs.run(program, order, fixed_fmt, feeds, aligned, dtypes), None
            else:
                fine = rounding.FINER[p]
                try:
                    ex = runs.run(program, order, fine, feeds, aligned, dtypes)
                    if fine == "float64":
                        mx.eval(ex)  # (an op with no float64 kernel, e.g. a quantized matmul, fails here)
                except (ValueError, TypeError, RuntimeError):  # float32 then stands for exact: the budget
                    ex = runs.run(program, order, "float32", feeds, aligned, dtypes)  # is one rounding (u^2)
                ho = ex if rounding.FINER[p] == "float64" and ex.dtype != mx.float64 else \
                    runs.run(program, order, p, feeds, aligned, dtypes)
        except (ValueError, TypeError, IndexError, RuntimeError) as e:  # cannot run on these inputs
            od.reasons.append(f"local error not computed: {e}")
            continue
        pending.append((od, program[od.op], ex, ho, p))
        pending_bytes += aligned[od.op].nbytes
        if pending_bytes > 256 * 2**20:
            flush()
    flush()
    return n


def growth_verdicts(report: DiffReport, program, precision: rounding.EnginePrecision | None) -> int:
    """Judge the compared ops that got no local error (their inputs neither dumped nor
    recomputable) by their error's growth over their nearest compared inputs' (rule
    ``"growth"``): beyond :data:`workbench.diff.budget.GROWTH` x is a finding.  Returns how many were judged."""
    by = {o.op: o for o in report.ops if o.compared and o.nmse is not None and np.isfinite(o.nmse)}
    n = 0
    for od in report.ops:
        if od.op not in by or od.local_rule is not None or od.op not in program:
            continue
        seen, frontier, anc = set(), list(program[od.op].inputs), []
        while frontier and len(seen) < MAX_SEGMENT:
            src = frontier.pop()
            if src in seen:
                continue
            seen.add(src)
            if src in by:
                anc.append(by[src].nmse)
            elif src in program:
                frontier.extend(program[src].inputs)
        if not anc:
            continue
        p = precision.of(od.op) if precision is not None else "float32"
        g = od.nmse / max(max(anc), rounding.floor_power(p))
        od.precision, od.ratio, od.local_rule = p, g, "growth"
        od.local_diverged = bool(g > rounding.GROWTH)
        n += 1
    return n
