"""Activation patching: which activations carry the difference between two prompts.

Run a *clean* prompt and a *corrupted* one of the same length (e.g. ``apple river stone |
apple`` and ``apple river stone | river``).  Then run the corrupted prompt again, each
time with one activation taken from the clean run, and measure how far the metric moves
back towards its clean value:

* :func:`activation_patching` -- one site (``"resid"``: the residual stream, the
  embedding then after each layer; ``"attn"`` / ``"mlp"``: each layer's attention or MLP
  output as added to the stream) at one position at a time: a layer x position map;
* :func:`patch_heads` -- one attention head's output (its slice of
  ``layers.{i}.self_attn.context``) at every position: a layer x head map.

The default metric is the logit difference between the clean run's top token and the
corrupted run's top token at the last position.  ``result.effect`` normalises it:
0 = as corrupted, 1 = as clean.  Each patched run is a trace with a
:func:`workbench.trace.patch` intervention; the runs of one row go as one batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from workbench.causal.common import (DEFAULT_DTYPE, Prompt, as_metric, decode_tokens, logit_diff, logits3,
                                     prompt, require_op, residual_chain, run)
from workbench.trace import patch

SITES = ("resid", "attn", "mlp")


@dataclass
class PatchingResult:
    values: np.ndarray           # [rows, cols] the metric with that activation patched from clean
    rows: list[str]              # e.g. "embed", "L0" ... or "L0 attn" ...
    cols: list[str]              # positions ("3 stone/river") or heads ("H0")
    clean: float                 # the metric on the clean run
    corrupted: float             # the metric on the corrupted run
    metric: str
    site: str                    # "resid" | "attn" | "mlp" | "heads"
    ops: list[str] = field(default_factory=list)  # the op patched in each row
    clean_tokens: list[str] = field(default_factory=list)
    corrupted_tokens: list[str] = field(default_factory=list)

    @property
    def effect(self) -> np.ndarray:
        """(patched - corrupted) / (clean - corrupted): 0 = no effect, 1 = fully restored
        (NaN where clean and corrupted agree)."""
        span = self.clean - self.corrupted
        if abs(span) < 1e-12:
            return np.full_like(self.values, np.nan)
        return (self.values - self.corrupted) / span

    def to_dict(self) -> dict:
        eff = self.effect
        return {"site": self.site, "metric": self.metric, "clean": float(self.clean),
                "corrupted": float(self.corrupted), "rows": list(self.rows), "cols": list(self.cols),
                "ops": list(self.ops), "values": self.values.tolist(),
                "effect": np.where(np.isnan(eff), None, eff).tolist(),
                "clean_tokens": list(self.clean_tokens), "corrupted_tokens": list(self.corrupted_tokens)}


def _pair(model, clean, corrupted) -> tuple[Prompt, Prompt]:
    pc, pr = prompt(model, clean), prompt(model, corrupted)
    for what, p in (("clean", pc), ("corrupted", pr)):
        if p.shape[0] != 1:
            raise ValueError(f"activation patching takes one {what} prompt, got a batch of {p.shape[0]}")
    if pc.shape != pr.shape:
        raise ValueError(f"the clean and corrupted prompts must have the same number of tokens "
                         f"({pc.shape[1]} vs {pr.shape[1]})")
    return pc, pr


def _baselines(model, pc: Prompt, pr: Prompt, metric, capture, dtype):
    if metric is not None:  # its token ids checked (texts encoded) before anything runs
        metric = as_metric(metric, model)
    tc = run(model, pc, capture=capture, dtype=dtype)
    lr = logits3(run(model, pr, dtype=dtype))
    lc = logits3(tc)
    if metric is None:
        a, b = int(mx.argmax(lc[0, -1]).item()), int(mx.argmax(lr[0, -1]).item())
        if a == b:
            raise ValueError(f"the clean and corrupted prompts both predict token {a} ({model.decode([a])!r}) "
                             "at the last position; pass metric=logit_diff(answer, wrong)")
        metric = as_metric(logit_diff(a, b, -1), model)  # labelled with the tokens' texts
    m = as_metric(metric)
    return tc, m, float(m(lc).mean()), float(m(lr).mean())


def _result(model, values, rows, cols, ops, clean, corrupted, m, site, pc, pr) -> PatchingResult:
    return PatchingResult(np.asarray(values, dtype=np.float64), rows, cols, clean, corrupted, m.label, site, ops,
                          decode_tokens(model, pc.ids[0]), decode_tokens(model, pr.ids[0]))


def _take(sel: mx.array, src: mx.array):
    """v -> src where sel, else v (one argument: ``patch`` passes the op to two-argument functions)."""
    return lambda v: mx.where(sel, src.astype(v.dtype), v)


def activation_patching(model, clean, corrupted, metric=None, site: str = "resid", batch_size: int = 16,
                        dtype=DEFAULT_DTYPE) -> PatchingResult:
    """Patch ``site`` from the clean run into the corrupted one, one (row, position) at a time.

    Rows: ``"resid"`` -- the embedding and the residual stream after each layer
    (``layers.{i}``); ``"attn"`` / ``"mlp"`` -- what each layer's attention / MLP block
    adds to the stream (the writer of its residual ``add``).  Returns a
    :class:`PatchingResult` [rows, positions].
    """
    if site not in SITES:
        raise ValueError(f"unknown patching site {site!r}: use one of {', '.join(SITES)}")
    pc, pr = _pair(model, clean, corrupted)
    chain = residual_chain(model.program)
    if site == "resid":
        rows = chain.residuals()
    else:
        rows = [(s.label, s.writer) for s in chain.writers(site)]
        if not rows:
            raise ValueError(f"this model's residual stream has no {site} writers")
    ops = [op for _, op in rows]
    tc, m, c0, r0 = _baselines(model, pc, pr, metric, ops, dtype)
    T = pc.shape[1]
    values = np.zeros((len(rows), T))
    for r, op in enumerate(ops):
        src = tc.value(op).astype(mx.float32)  # [1, T, ...]
        for start in range(0, T, batch_size):
            pos = mx.arange(start, min(T, start + batch_size))
            n = int(pos.size)
            sel = (mx.arange(T)[None, :] == pos[:, None]).reshape(n, T, *([1] * (src.ndim - 2)))
            tr = run(model, pr.repeat(n), interventions=[patch(op, _take(sel, src), label=f"patch_from_clean({op})")],
                     dtype=dtype)
            values[r, start:start + n] = m(logits3(tr))
    toks_c, toks_r = decode_tokens(model, pc.ids[0]), decode_tokens(model, pr.ids[0])
    cols = [f"{t} {a.strip()}" + ("" if a == b else f"/{b.strip()}") for t, (a, b) in enumerate(zip(toks_c, toks_r))]
    return _result(model, values, [label for label, _ in rows], cols, ops, c0, r0, m, site, pc, pr)


def patch_heads(model, clean, corrupted, metric=None, dtype=DEFAULT_DTYPE) -> PatchingResult:
    """Patch one attention head's output (every position) from clean into corrupted, for
    every head: a :class:`PatchingResult` [layers, heads] (NaN where a layer has fewer heads)."""
    pc, pr = _pair(model, clean, corrupted)
    names = [f"layers.{i}.self_attn.context" for i in range(model.num_layers)]
    geo = [(require_op(model, n).attrs["num_heads"], require_op(model, n).attrs["head_dim"]) for n in names]
    tc, m, c0, r0 = _baselines(model, pc, pr, metric, names, dtype)
    Hmax = max(H for H, _ in geo)
    values = np.full((len(names), Hmax), np.nan)
    for i, (op, (H, d)) in enumerate(zip(names, geo)):
        src = tc.value(op).astype(mx.float32)  # [1, T, H*d]
        sel = ((mx.arange(H * d)[None, :] // d) == mx.arange(H)[:, None])[:, None, :]  # [H, 1, H*d]: row h = head h
        tr = run(model, pr.repeat(H), interventions=[patch(op, _take(sel, src), label=f"patch_heads_from_clean({op})")],
                 dtype=dtype)
        values[i, :H] = m(logits3(tr))
    return _result(model, values, [f"L{i}" for i in range(len(names))], [f"H{h}" for h in range(Hmax)], names,
                   c0, r0, m, "heads", pc, pr)
