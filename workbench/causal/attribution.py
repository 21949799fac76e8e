"""Direct logit attribution (DLA): how much each component writes the answer directly.

The residual stream entering the final norm is a sum: the token embedding plus what every
layer's attention, MLP (and, on Gemma 4, per-layer input) block added, each carried
through the linear maps later on the stream (Gemma 4's ``layer_scalar``).  DLA projects
each of those pieces through the model's tail -- final RMS norm, unembedding -- and
reads off its share of ``logit[answer] - logit[wrong]`` (or of ``logit[answer]``).

**The final norm is linearised** the way TransformerLens does (``apply_ln_to_stack``):
its scale ``weight / rms(x)`` is computed once, from the *whole* residual ``x``, and
applied to every piece, so the pieces sum exactly to the ``lm_head`` output.  The same
holds inside a block for the per-head split: a head's output is its slice of
``self_attn.context`` through ``o_proj`` and, where the family has one (Gemma), through
``post_attention_layernorm`` with *its* scale frozen at the value the whole attention
output gave it; the heads of a layer then sum to that layer's attention piece.
Two things are not linear and stay out: Gemma's final logit soft-cap
(``tanh(x / cap) * cap``, applied after ``lm_head``: the attributions explain the logits
before it, ``lm_head_value``; ``logits_value`` is the model's actual, capped, metric),
and the dependence of the frozen scales on the pieces themselves (DLA says what each piece
writes *given* the others, not what removing it would do: that is ablation).

Exact in float32 (the default) up to rounding; in half precision the residual adds round.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from workbench.causal.common import (DEFAULT_DTYPE, check_position, decode_tokens, logits3, prompt, residual_chain,
                                     run, token_id)
from workbench.trace.entry import check_token_id

_CHUNK = 64  # components projected through lm_head at a time (its output is [n, vocab])


@dataclass
class DLAResult:
    labels: list[str]            # "embed", "L0 attn", "L0 mlp", "L0 ple", ...
    values: np.ndarray           # [n] each component's direct contribution to the metric
    layers: np.ndarray           # [L] per layer: the sum of its components
    heads: np.ndarray            # [L, H] per attention head (NaN: no such head); rows sum to the "attn" values
    total: float                 # values.sum()
    lm_head_value: float         # the metric read from the lm_head op (before any soft-cap): == total
    logits_value: float          # the metric from the model's logits (soft-capped on Gemma)
    answer: int
    wrong: int | None
    position: int
    tokens: list[str] = field(default_factory=list)
    answer_token: str = ""
    wrong_token: str = ""
    residual_error: float = 0.0  # max |sum of the pieces - the residual entering the final norm|

    @property
    def metric(self) -> str:
        w = "" if self.wrong is None else f" - logit[{self.wrong_token!r}]"
        return f"logit[{self.answer_token!r}]{w} @ {self.position}"

    def to_dict(self) -> dict:
        return {"labels": list(self.labels), "values": self.values.tolist(), "layers": self.layers.tolist(),
                "heads": np.where(np.isnan(self.heads), None, self.heads).tolist(), "total": self.total,
                "lm_head_value": self.lm_head_value, "logits_value": self.logits_value, "answer": self.answer,
                "wrong": self.wrong, "position": self.position, "tokens": list(self.tokens),
                "answer_token": self.answer_token, "wrong_token": self.wrong_token, "metric": self.metric,
                "residual_error": self.residual_error}


def frozen_rmsnorm(op, ctx, total: mx.array):
    """The linear map ``c -> c * weight / rms(total)`` of RMS-norm ``op`` with its scale frozen
    at ``total`` (``[..., D]``, the op's actual input).  Its weight is read by running the op
    on ones (``rms(ones) = sqrt(1 + eps)``), so Gemma 3's ``1 + w`` needs no special case."""
    eps = op.attrs.get("eps")
    if op.kind != "rmsnorm" or eps is None:
        raise ValueError(f"cannot linearise {op.name!r} ({op.kind}): only RMS norms are handled")
    D = total.shape[-1]
    g = op.fn(ctx, mx.ones((1, 1, D), mx.float32)).reshape(D).astype(mx.float32) * (1.0 + eps) ** 0.5
    t = total.astype(mx.float32)
    scale = g / mx.sqrt(mx.mean(t * t, axis=-1, keepdims=True) + eps)
    exact = op.fn(ctx, t[None, None] if t.ndim == 1 else t).reshape(t.shape).astype(mx.float32)
    err = float(mx.max(mx.abs(scale * t - exact)).item())
    tol = 1e-4 if getattr(ctx, "dtype", mx.float32) == mx.float32 else 2e-2  # half precision rounds
    if err > tol * (float(mx.max(mx.abs(exact)).item()) + 1e-6):
        raise ValueError(f"cannot linearise {op.name!r}: weight / rms(x) does not reproduce the op (off by {err:.3g})")
    return lambda c: c * scale


def _linear(op, ctx):
    """The linear part of an affine op (``fn(c) - fn(0)``) on [n, D] rows."""
    def f(c):
        z = op.fn(ctx, mx.zeros((1, 1, c.shape[-1]), c.dtype))
        return (op.fn(ctx, c[:, None, :]) - z)[:, 0, :]
    return f


def _head_path(program, writer: str, layer: int) -> list | None:
    """The ops from ``layers.{layer}.self_attn.context`` to the attention writer (o_proj,
    then norms), or None when the path has anything but linear maps and RMS norms."""
    target = f"layers.{layer}.self_attn.context"
    path, name = [], writer
    while name != target:
        op = program[name]
        if op.kind not in ("linear", "rmsnorm", "scale", "output") or len(op.inputs) != 1:
            return None
        path.append(op)
        name = op.inputs[0]
    return path[::-1]


def direct_logit_attribution(model, text_or_ids, answer: int | str | None = None, wrong: int | str | None = None,
                             position: int = -1, dtype=DEFAULT_DTYPE, first_token: bool = False) -> DLAResult:
    """DLA of every residual writer and every attention head at ``position`` (one prompt).

    ``answer``: the token whose logit is explained (default: the model's top token there);
    ``wrong``: explain ``logit[answer] - logit[wrong]`` instead.  Each is a token id in the
    vocabulary or the text of one token (``" blue"``; several tokens are refused, naming the
    pieces, unless ``first_token=True``), checked before anything runs; the result names
    each as text and id (``answer_token``, ``answer``).
    """
    if answer is not None:
        answer = token_id(model, answer, "answer", first_token)
    if wrong is not None:
        wrong = token_id(model, wrong, "wrong", first_token)
    position = check_position(position)
    p = prompt(model, text_or_ids)
    if p.shape[0] != 1:
        raise ValueError(f"direct logit attribution takes one prompt, got a batch of {p.shape[0]}")
    prog = model.program
    chain = residual_chain(prog)
    norm, unembed = prog[chain.norm], prog[chain.unembed]
    heads = {s.layer: _head_path(prog, s.writer, s.layer) for s in chain.writers("attn")}
    need = {chain.start, norm.inputs[0], unembed.name}
    need |= {s.writer for s in chain.writers()}
    for layer, path in heads.items():
        if path:
            need.add(f"layers.{layer}.self_attn.context")
            need |= {op.inputs[0] for op in path if op.kind == "rmsnorm"}
    tr = run(model, p, capture=sorted(need), dtype=dtype)
    ctx = tr.ctx
    T = p.shape[1]
    if not -T <= position < T:
        raise ValueError(f"position {position} out of range for {T} positions")
    pos = position % T

    def at(name):  # [1, D] float32 at the position
        return tr.value(name)[0, pos].astype(mx.float32)[None]
    logits = logits3(tr)[0, pos]
    for what, t in (("answer", answer), ("wrong", wrong)):  # the logits' own width, before any gather
        if t is not None:
            check_token_id(t, logits.shape[-1], f"{what} token id")
    if answer is None:
        answer = int(mx.argmax(logits).item())

    # pieces: (label, layer, [n, D] value in the stream, index of the chain step that added it)
    blocks = [(["embed"], [None], at(chain.start), -1)]
    head_blocks = {}
    for k, s in enumerate(chain.steps):
        if s.kind != "add":
            continue
        blocks.append(([s.label], [s.layer], at(s.writer), k))
        path = heads.get(s.layer) if s.component == "attn" else None
        if path:
            cop = prog[f"layers.{s.layer}.self_attn.context"]
            H, d = cop.attrs["num_heads"], cop.attrs["head_dim"]
            sel = (mx.arange(H * d)[None, :] // d) == mx.arange(H)[:, None]          # [H, H*d]
            x = at(cop.name) * sel                                                  # [H, H*d]
            for op in path:
                x = frozen_rmsnorm(op, ctx, at(op.inputs[0]))(x) if op.kind == "rmsnorm" else _linear(op, ctx)(x)
            head_blocks[s.layer] = (len(blocks) - 1, x)
    # carry each piece through the linear maps after it on the stream
    for k, s in enumerate(chain.steps):
        if s.kind == "linear":
            f = _linear(prog[s.op], ctx)
            blocks = [(lab, lay, f(v) if k > at_k else v, at_k) for lab, lay, v, at_k in blocks]
            head_blocks = {l: (b, f(v) if k > blocks[b][3] else v) for l, (b, v) in head_blocks.items()}
    resid = at(norm.inputs[0])
    summed = sum(v for _, _, v, _ in blocks)
    residual_error = float(mx.max(mx.abs(summed - resid)).item())
    fnorm = frozen_rmsnorm(norm, ctx, resid)
    f_un = _linear(unembed, ctx)

    def project(v):  # [n, D] -> [n] contribution to the metric
        out = []
        for i in range(0, v.shape[0], _CHUNK):
            y = f_un(fnorm(v[i:i + _CHUNK]))
            m = y[:, answer] - (y[:, wrong] if wrong is not None else 0)
            out.append(np.array(m, dtype=np.float64))
        return np.concatenate(out)
    labels = [lab[0] for lab, _, _, _ in blocks]
    values = project(mx.concatenate([v for _, _, v, _ in blocks]))
    bias = _linear_bias(unembed, ctx, resid.shape[-1], answer, wrong)
    if bias != 0.0:
        labels.append("lm_head bias")
        values = np.append(values, bias)
    L = model.num_layers
    layer_of = [lay[0] for _, lay, _, _ in blocks] + ([None] if bias != 0.0 else [])
    layers = np.array([sum(v for v, l in zip(values, layer_of) if l == i) for i in range(L)])
    Hmax = max([v.shape[0] for _, v in head_blocks.values()], default=0)
    head_vals = np.full((L, Hmax), np.nan)
    for l, (_, v) in head_blocks.items():
        head_vals[l, :v.shape[0]] = project(v)
    lm = tr.value(unembed.name)[0, pos].astype(mx.float32)

    def metric(x):
        return float((x[answer] - (x[wrong] if wrong is not None else 0)).item())
    toks = decode_tokens(model, p.ids[0])
    return DLAResult(labels, values, layers, head_vals, float(values.sum()), metric(lm), metric(logits.astype(mx.float32)),
                     int(answer), None if wrong is None else int(wrong), pos, toks,
                     decode_tokens(model, [answer])[0], "" if wrong is None else decode_tokens(model, [wrong])[0],
                     residual_error)


def _linear_bias(op, ctx, D: int, answer: int, wrong: int | None) -> float:
    """The metric's share of the unembedding's bias (0 without one)."""
    z = op.fn(ctx, mx.zeros((1, 1, D), mx.float32))[0, 0].astype(mx.float32)
    return float((z[answer] - (z[wrong] if wrong is not None else 0)).item())
