"""Local errors: our op applied to the engine's own inputs (where the bug *is*, not where it shows).

Split out of api.py (issue 34); api re-exports every name.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from workbench.diff.metrics import error_metrics, local_diverged
from workbench.diff.report import DiffReport, to_numpy


def is_module_level(m) -> bool:
    return getattr(m, "granularity", "op") == "module"


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


def local_errors(report: DiffReport, model: Any, aligned: Mapping[str, np.ndarray], ids: Sequence[int],
                 dtype: str | None = None, dtypes: Mapping[str, str] | None = None, logit_rows=None,
                 decode: bool = False) -> int:
    """Fill each op's local error: our op applied to the engine's own (aligned) inputs.

    Program inputs (token ids, RoPE offsets, masks) come from our feeds; an op with an
    input the engine did not dump is left without a local error.  Returns how many ops
    got one.  ``dtypes``: our ops' own dtypes, so integer values (expert indices) are fed
    back as integers.  ``logit_rows``: the positions the head's tensors were compared at
    (a :class:`workbench.trace.logits.LogitRows`; None: every one): the head recomputes those rows.
    """
    import mlx.core as mx

    if is_module_level(model):  # a module call is not re-run on another engine's inputs (yet)
        return 0
    program = model.program
    ctx = model.context(dtype)
    ctx.logit_rows = logit_rows
    feeds = model.feeds(mx.array([list(ids)], dtype=mx.int32))
    tol = report.tolerance
    n = 0
    pending: list = []
    pending_bytes = 0

    def flush():
        nonlocal n, pending, pending_bytes
        if not pending:
            return
        try:
            mx.eval([out for _, _, out in pending])
        except (ValueError, RuntimeError):
            pass  # evaluated one by one below, where the failing op is named
        for od, op, out in pending:
            try:
                ours = to_numpy(out)
            except (ValueError, TypeError, IndexError, RuntimeError) as e:
                od.reasons.append(f"local error not computed: {e}")
                continue
            theirs = aligned[od.op]
            if ours.shape != theirs.shape:
                continue
            if op.kind == "topk":  # a set of indices: compare it as a set
                ours, theirs = np.sort(ours, axis=-1), np.sort(theirs, axis=-1)
            m = error_metrics(ours, theirs, mask_below=tol.mask_below)
            od.local_cosine, od.local_nmse, od.local_max_abs = m["cosine"], m["nmse"], m["max_abs"]
            od.local_diverged = local_diverged(m, tol)
            n += 1
        pending, pending_bytes = [], 0

    for od in report.ops:
        if not od.compared or od.op not in aligned or od.op not in program:  # (a module-level dump's names)
            continue
        op = program[od.op]
        if decode and any(src in feeds and src != "input_ids" for src in op.inputs):
            continue  # positions and masks of a decode step are not the full forward's feeds
        args = []
        for src in op.inputs:
            if src in feeds:
                args.append(feeds[src])
            elif src in aligned:
                own = (dtypes or {}).get(src, "")
                want = getattr(mx, own) if own.startswith(("int", "uint", "bool")) else ctx.dtype
                args.append(mx.array(aligned[src]).astype(want))
            else:
                break
        else:
            try:
                out = op.fn(ctx, *args)  # lazy: evaluated in batches
            except (ValueError, TypeError, IndexError, RuntimeError) as e:  # cannot run on these inputs
                od.reasons.append(f"local error not computed: {e}")
                continue
            pending.append((od, op, out))
            pending_bytes += aligned[od.op].nbytes
            if pending_bytes > 256 * 2**20:
                flush()
    flush()
    return n
