"""The NaN hunt: the first op whose output holds a non-finite element, and why.

Causes, decided in this order for the first non-finite op:

``injected``          an intervention of the trace put it there (the op's own output,
                      recomputed without the intervention, is finite) — for teaching;
``nonfinite-input``   one of the op's inputs already holds NaN / Inf (a program input:
                      ids are fine, but embeddings or audio features fed in may not be);
``nonfinite-weight``  a weight, scale or bias the op reads is NaN / Inf in the checkpoint
                      (packed quantized data too: E8M0 scale 0xFF, E4M3 NaN codes), or is
                      finite in storage but past the compute dtype's range (a bfloat16
                      weight of 1e5 becomes Inf in float16);
``overflow``          inputs and weights finite, and the result is past the dtype's
                      range: the same op recomputed in float32 on the same inputs is
                      finite (its absmax is reported), or the output holds an infinity;
``invalid``           inputs and weights finite, the output holds NaN but no infinity,
                      and float32 does not help: an invalid operation (inf - inf, 0/0,
                      sqrt of a negative ...) inside the op.

Counts are per element (NaN, +Inf, -Inf separately). Every float op also gets a
headroom (absmax / the dtype's largest finite value), so ops close to overflow show
before they overflow.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from workbench.dtypes import dtype_name
from workbench.stats_schema import nonfinite_count
from workbench.trace import stats as _stats

CAUSES = ("injected", "nonfinite-input", "nonfinite-weight", "overflow", "invalid")


@dataclass
class Finding:
    op: str
    layer: int | None
    kind: str
    index: int
    cause: str
    nan: int
    posinf: int
    neginf: int
    size: int
    shape: tuple
    dtype: str
    detail: str
    inputs: list = field(default_factory=list)
    weights: list = field(default_factory=list)
    float32_absmax: float | None = None
    #: what the float32 recompute's matmuls ran as ("float32", "tf32", "n/a (cpu)"; None: none ran)
    float32_precision: str | None = None
    closest_before: list = field(default_factory=list)
    first_index: tuple | None = None  # index of the first non-finite element (row-major)
    step: Any = field(default=None, repr=False)
    #: fused attention: the layer's scores and softmax recomputed explicitly, {step name:
    #: {nan, posinf, neginf}} (None for other ops, or when they would be too large)
    inside: dict | None = None
    #: the op's rows are positions ``start .. stop - 1`` of the forward (``[start, stop]``,
    #: ``Positions(prune=True)``); None: every position (or the head's, ``logits``)
    positions: list | None = None

    def to_dict(self) -> dict:
        d = {"op": self.op, "layer": self.layer, "cause": self.cause, "nan": self.nan,
             "posinf": self.posinf, "neginf": self.neginf, "kind": self.kind, "index": self.index,
             "size": self.size, "shape": list(self.shape), "dtype": self.dtype, "detail": self.detail,
             "inputs": self.inputs, "weights": self.weights, "float32_absmax": self.float32_absmax,
             "float32_precision": self.float32_precision,
             "closest_before": [{"op": n, "headroom": h} for n, h in self.closest_before],
             "first_index": list(self.first_index) if self.first_index is not None else None,
             "inside": self.inside, "positions": self.positions}
        return _stats.jsonable(d)

    def __repr__(self) -> str:
        return f"<Finding {self}>"

    def __str__(self) -> str:
        where = f"layer {self.layer}, " if self.layer is not None else ""
        rows = f" Its rows are positions {self.positions[0]}..{self.positions[1] - 1} (pruned)." \
            if self.positions else ""
        return (f"{self.op} ({where}{self.kind}, op {self.index}): {self.cause} — nan {self.nan}, "
                f"+inf {self.posinf}, -inf {self.neginf} of {self.size} ({self.dtype}). {self.detail}{rows}")


def _absmax(x: mx.array) -> float:
    if x.size == 0:
        return 0.0
    fin = mx.isfinite(x) if mx.issubdtype(x.dtype, mx.floating) else None
    a = mx.abs(x.astype(mx.float32))
    if fin is not None:
        a = mx.where(fin, a, 0)
    return float(a.max().item())


def _quant_nan(name: str, x: mx.array, mode: str | None) -> int:
    """NaN encodings in packed quantized tensors: E8M0 scales (mxfp4 / mxfp8) use 0xFF,
    E4M3 values (nvfp4 scales, mxfp8 weights) use S.1111.111."""
    if mode is None or mx.issubdtype(x.dtype, mx.floating):
        return 0
    if name.endswith(".scales") and mode in ("mxfp4", "mxfp8"):
        return int((x.astype(mx.uint8) == 255).sum().item()) if x.dtype == mx.uint8 else 0
    if (name.endswith(".scales") and mode == "nvfp4") or (name.endswith(".weight") and mode == "mxfp8"):
        b = x if x.dtype == mx.uint8 else mx.view(x, mx.uint8)
        return int(((b & 0x7F) == 0x7F).sum().item())
    return 0


def _tensor_info(name: str, x: mx.array, compute_max: float | None, mode: str | None = None) -> dict:
    nan, pinf, ninf = _stats.nonfinite_counts(x)
    nan += _quant_nan(name, x, mode)
    info = {"name": name, "dtype": dtype_name(x.dtype), "shape": list(x.shape),
            "nan": nan, "posinf": pinf, "neginf": ninf}
    if mx.issubdtype(x.dtype, mx.floating):
        am = _absmax(x)
        info["absmax"] = am
        if compute_max is not None:
            info["out_of_range"] = am > compute_max
    return info


def _first_bad_index(trace, name: str):
    """Row-major index of the op's first non-finite element (e.g. [batch, token, feature])."""
    try:
        v = trace.value(name)
    except KeyError:
        v = trace.recompute(name, interventions=True)
    if not mx.issubdtype(v.dtype, mx.floating):
        return None
    bad = mx.logical_not(mx.isfinite(v)).reshape(-1)
    if not bool(mx.any(bad).item()):
        return None
    k = int(mx.argmax(bad.astype(mx.int32)).item())
    idx = []
    for n in reversed(v.shape):
        idx.append(k % n)
        k //= n
    return tuple(reversed(idx))


def diagnose(trace, step) -> Finding:
    """Why op ``step`` (the first non-finite one) went non-finite."""
    i = step.index
    op = trace.program.ops[i]
    st = step.stats
    dmax = _stats.dtype_max(trace.dtype) if trace.dtype is not None else None
    dname = dtype_name(trace.dtype) if trace.dtype is not None else step.dtype

    inputs = [_tensor_info(n, v, None) for n, v in trace.inputs(op.name)]
    for d in inputs:
        d.pop("out_of_range", None)
    mode = (op.attrs.get("quant") or {}).get("mode") if isinstance(op.attrs.get("quant"), dict) else None
    weights = [_tensor_info(n, w, dmax, mode) for n, w in trace.op_tensors(op.name).items()]
    for w in weights:  # packed quantized weights are integers: only float tensors can overflow
        w.setdefault("out_of_range", False)
    closest = [(n, h) for n, h in trace.headroom() if trace.program.index(n) < i][:5]

    f = Finding(op=op.name, layer=op.layer, kind=op.kind, index=i, cause="", nan=st["nan"],
                posinf=st["posinf"], neginf=st["neginf"], size=math.prod(step.output_shape),
                shape=step.output_shape, dtype=step.dtype, detail="", inputs=inputs, weights=weights,
                closest_before=closest, step=step)

    f.first_index = _first_bad_index(trace, op.name)
    if getattr(trace, "pruned", None) is not None and trace.pruned_at(op.name):
        f.positions = [trace.pruned.start, trace.pruned.T]
    if op.kind == "attention":
        f.inside = _inside_attention(trace, op, step)
    bad_in = [d for d in inputs if nonfinite_count(d)]
    bad_w = [d for d in weights if nonfinite_count(d)]
    range_w = [d for d in weights if d.get("out_of_range")]

    if step.intervened:
        raw = trace.recompute(op.name)
        if sum(_stats.nonfinite_counts(raw)) == 0:
            f.cause = "injected"
            f.detail = (f"the op's own output is finite; the intervention(s) {', '.join(step.intervened)} "
                        "made it non-finite")
            return f
    if bad_in:
        f.cause = "nonfinite-input"
        f.detail = "input " + "; ".join(f"{d['name']} has nan {d['nan']}, +inf {d['posinf']}, -inf {d['neginf']}"
                                        for d in bad_in)
        return f
    if bad_w:
        f.cause = "nonfinite-weight"
        f.detail = "checkpoint tensor " + "; ".join(
            f"{d['name']} has nan {d['nan']}, +inf {d['posinf']}, -inf {d['neginf']}" for d in bad_w)
        return f
    if range_w:
        f.cause = "nonfinite-weight"
        f.detail = "checkpoint tensor " + "; ".join(
            f"{d['name']} ({d['dtype']}) has absmax {d['absmax']:.6g}, past {dname}'s largest finite value "
            f"{dmax:.6g}: it is infinite once cast" for d in range_w)
        return f

    f32 = None
    if trace.dtype is not None and trace.dtype != mx.float32:
        from workbench.precision import TF32, exact_float32

        try:
            with exact_float32() as prec:  # TF32 off on CUDA, the user's MLX_ENABLE_TF32 restored after
                y = trace.recompute(op.name, dtype=mx.float32)
                counts = _stats.nonfinite_counts(y)
                f32 = (counts, _absmax(y))
            f.float32_precision = prec
            if prec == TF32:
                f.detail = ("(the float32 recompute ran as TF32: this process fixed TF32 at an earlier float32 "
                            "matmul; start it with MLX_ENABLE_TF32=0 for full float32) ")
        except Exception as e:  # the float32 check is an extra; its absence is reported
            f32 = None
            f.detail = f"(float32 recompute failed: {e}) "
    f.detail += _inside_note(f.inside)
    if f32 is not None and sum(f32[0]) == 0:
        f.cause = "overflow"
        f.float32_absmax = f32[1]
        where = ("its result" if f32[1] > (dmax or math.inf) else "an intermediate value inside the op")
        f.detail += (f"inputs and weights are finite; recomputed in float32 the op is finite with absmax "
                     f"{f32[1]:.6g}, so {where} passes {dname}'s largest finite value {dmax:.6g}")
        return f
    if f32 is not None:
        f.float32_absmax = f32[1]
    if st["posinf"] or st["neginf"]:
        f.cause = "overflow"
        f.detail += (f"inputs and weights are finite and the result is past {dname}'s range "
                     f"(+inf {st['posinf']}, -inf {st['neginf']})"
                     + (" even in float32" if f32 is not None else ""))
        return f
    f.cause = "invalid"
    f.detail += ("inputs and weights are finite, the output holds NaN and no infinity"
                 + (", in float32 too" if f32 is not None else "")
                 + ": an invalid operation inside the op (inf - inf, 0/0, sqrt of a negative ...)")
    return f


#: the most bytes of [B, H, T, S] scores the hunt recomputes to look inside fused attention
INSIDE_MAX_BYTES = 2**30


def _inside_attention(trace, op, step) -> dict | None:
    """A fused attention op that went non-finite, recomputed explicitly for its layer (the
    trace's dtype): the non-finite counts of its scores and softmax, so the finding can say
    which of them went first.  None when they would pass :data:`INSIDE_MAX_BYTES`."""
    from workbench.trace.heads import probabilities

    (B, H, T, _), S = step.input_shapes[0], step.input_shapes[1][2]
    if B * H * T * S * 4 > INSIDE_MAX_BYTES:
        return None
    out = {}
    for which in ("scores", "softmax"):
        _, v = probabilities(trace, op.layer, scores=which == "scores")
        nan, pos, neg = _stats.nonfinite_counts(v)
        out[f"layers.{op.layer}.self_attn.{which}"] = {"nan": nan, "posinf": pos, "neginf": neg}
    return out


def _inside_note(inside: dict | None) -> str:
    """'explicitly: scores has nan 3 ...; ' for a finding's detail ('' when not looked inside)."""
    if not inside:
        return ""
    first = next((n for n, c in inside.items() if sum(c.values())), None)
    parts = "; ".join(f"{n.rsplit('.', 1)[1]} nan {c['nan']}, +inf {c['posinf']}, -inf {c['neginf']}"
                      for n, c in inside.items())
    where = (f"first non-finite inside: {first}" if first else
             "scores and softmax finite: it went non-finite in the product with the values")
    return f"fused attention recomputed explicitly ({parts}): {where}. "


@dataclass
class HuntResult:
    """``report``: the JSON of ``workbench hunt``; ``finding``: the :class:`Finding` (or
    None); ``trace``: the trace, stopped at the first non-finite op (or done)."""

    report: dict
    finding: Finding | None
    trace: Any = field(repr=False)

    @property
    def found(self) -> bool:
        return self.finding is not None

    def __str__(self) -> str:
        if self.finding is None:
            return f"clean: no NaN or Inf in any of {self.report['ops_checked']} ops"
        return f"first non-finite op: {self.finding} ({self.report['ops_checked']} ops checked)"

    def __repr__(self) -> str:
        return f"<HuntResult {self}>"


def hunt(model, ids_or_text, dtype=None, **trace_kwargs) -> HuntResult:
    """Run a forward with statistics of every op and find the first non-finite op.

    ``report`` is ``{"first_nonfinite": {op, layer, cause, nan, posinf, neginf, ...} | None,
    "ops_checked": int, "logits": {"positions": "all" | [int], "of": T, "note": str | None}}``
    (the positions the head computed: ``positions=Positions(logits=)`` among ``trace_kwargs``,
    or the default),
    ``"pruned": {"op", "positions", "of"} | None`` (``prune=True``: the rows the ops from
    ``op`` on computed).
    """
    t = model.trace(ids_or_text, capture="stats", dtype=dtype, **trace_kwargs)
    found = t.first_nonfinite()
    pruned = getattr(t, "pruned", None)
    report = {"first_nonfinite": found.to_dict() if found else None, "ops_checked": t.position,
              "logits": logits_report(t), "pruned": pruned.to_json() if pruned is not None else None}
    return HuntResult(report, found, t)


def logits_report(t) -> dict | None:
    """``{"positions": "all" | [int], "of": T, "note": str | None}``: which positions a trace's
    logits have (None: a trace that does not say)."""
    rows = getattr(t, "logit_rows", None)
    if rows is None:
        return None
    return {"positions": rows.to_json(), "of": rows.T, "note": rows.note}
