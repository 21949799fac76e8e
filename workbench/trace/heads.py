"""Attention, head by head, from any trace of an op program -- fused or explicit alike.

    head_stats(trace, "layers.3.self_attn.context")  # {"absmax": [H], "mean": [H], ...}
    probabilities(trace, 3)                           # ("layers.3.self_attn.softmax", [B, H, T, S])

* :func:`head_stats`: per-head statistics of an attention output (``[B, T, H*D]``, head h
  the slice h*D:(h+1)*D): absmax, mean, std over its finite values and the count of
  non-finite ones, from the captured value or recomputed from the op's inputs.  Cheap:
  never more than the output itself, no [T, S] values.
* :func:`probabilities`: a layer's attention probabilities [B, H, T, S]: the value of its
  ``softmax`` step when the layer is explicit, else recomputed from the fused op's
  queries, keys and mask for that one layer (what a view that draws a pattern needs).
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from workbench.attention import attention_mask, attention_scores, probabilities as _probabilities, real_keys
from workbench.trace.step import TraceError

#: the op kinds of an attention output: the fused kernel's op, the explicit context op
CONTEXT_KINDS = ("attention", "attend")
#: per-head statistics (float32 [H] arrays; ``nonfinite`` counts)
HEAD_STATS = ("absmax", "mean", "std", "nonfinite")


def context_op(layer: int) -> str:
    return f"layers.{layer}.self_attn.context"


def _attention_op(trace, name: str):
    try:
        op = trace.program[name]
    except KeyError:
        raise TraceError(f"{name}: no such op in this trace (see trace.ops)") from None
    if op.kind not in CONTEXT_KINDS:
        raise TraceError(f"{name}: not an attention output (kind {op.kind!r}; per-head statistics read "
                         f"layers.{{i}}.self_attn.context)")
    return op


def _ran(trace, name: str) -> None:
    if trace.program.index(name) >= trace.position:
        raise TraceError(f"{name} has not run yet (run the trace past it)")


def _value(trace, name: str) -> mx.array:
    """The op's value as captured, else recomputed from its inputs (the op must have run)."""
    _ran(trace, name)
    try:
        return trace.value(name)
    except KeyError:
        return trace.recompute(name, interventions=True)


def head_stats(trace, name: str) -> dict:
    """Per-head statistics of attention output ``name`` (see the module docstring):
    ``{"op", "heads", "absmax", "mean", "std", "nonfinite"}``, each statistic a numpy
    float32 [H] (over batch rows, tokens and the head's dimensions; padding included)."""
    op = _attention_op(trace, name)
    H, D = int(op.attrs["num_heads"]), int(op.attrs["head_dim"])
    v = _value(trace, name).astype(mx.float32)
    v = v.reshape(-1, H, D).swapaxes(0, 1).reshape(H, -1)  # [H, rows * D]
    finite = mx.isfinite(v)
    n = mx.maximum(finite.sum(axis=1), 1).astype(mx.float32)
    x = mx.where(finite, v, 0.0)
    mean = x.sum(axis=1) / n
    var = mx.where(finite, (v - mean[:, None]) ** 2, 0.0).sum(axis=1) / n
    out = mx.stack([mx.abs(x).max(axis=1), mean, mx.sqrt(var), (~finite).sum(axis=1).astype(mx.float32)])
    arr = np.array(out)
    return {"op": name, "heads": H, **{k: arr[j] for j, k in enumerate(HEAD_STATS)}}


def probabilities(trace, layer: int, scores: bool = False) -> tuple[str, mx.array]:
    """(name, [B, H, T, S]) attention probabilities of ``layer`` (``scores=True``: the
    scaled, masked scores instead).  An explicit layer's ``softmax`` (``scores``) step is
    read (captured, or recomputed); a fused layer's are recomputed from the inputs of
    ``layers.{layer}.self_attn.context`` -- the name returned is then that op's."""
    step = f"layers.{layer}.self_attn.{'scores' if scores else 'softmax'}"
    partial = step in trace.program and trace.program[step].attrs.get("queries") is not None
    if step in trace.program and not partial:
        return step, _value(trace, step)
    name = context_op(layer)
    if name not in trace.program:
        raise TraceError(f"{step}: no such op in this trace (see trace.ops)")
    op = _attention_op(trace, name)
    _ran(trace, name)
    q, k, _, valid = (v for _, v in trace.inputs(name)[:4])
    T, S = q.shape[2], k.shape[2]
    mask = attention_mask(S - T, T, 0, S, op.attrs.get("window"), real_keys(valid))
    scale = float(op.attrs["scale"])
    full = attention_scores(q, k, mask, scale) if scores else _probabilities(q, k, mask, scale)
    if not partial:
        return name, full
    # explicit for a range of queries only: its rows are the step's values (interventions
    # included), the other rows recomputed, so a view gets the whole [B, H, T, S] pattern
    rows = _value(trace, step)
    start = min(max(op.attrs["queries"][0] - (S - T), 0), T)
    return step, mx.concatenate([full[:, :, :start], rows.astype(full.dtype),
                                 full[:, :, start + rows.shape[2]:]], axis=2)
