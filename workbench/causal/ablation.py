"""Ablation: knock a component out and measure what the model loses.

Sites (what can be ablated):

* :func:`head` ``(layer, h)`` -- one attention head's output before ``o_proj``: the slice
  ``h*d:(h+1)*d`` of ``layers.{layer}.self_attn.context`` ([B, T, H*d]);
* :func:`mlp` ``(layer)`` -- the dense MLP's output, ``layers.{layer}.mlp.down_proj``;
* :func:`expert` ``(layer, e)`` -- one MoE expert: its slot of
  ``layers.{layer}.experts.switch_glu.down_proj`` ([B, T, k, D]) for the tokens the
  router sent to it (read from ``layers.{layer}.router.top_k`` in the same run); tokens
  not routed to it are untouched.

Modes:

* ``"zero"`` -- the output is replaced by zeros;
* ``"mean"`` -- by its mean over every (real) position of a reference batch (default:
  the prompt itself); for an expert, over the reference tokens routed to it;
* ``"resample"`` -- by its value on another prompt of the same length at the same
  position (``reference=``, or, for a batch of prompts, the next prompt of the batch);
  not defined for experts (the other token may not be routed to the same expert).

Everything is done with the trace's interventions (:func:`workbench.trace.zero_head`,
:func:`~workbench.trace.patch`), so an ablated trace can be stepped, captured and
plotted like any other: ``workbench.trace(model, ids, interventions=ablation(model, [head(1, 0)]))``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import mlx.core as mx
import numpy as np

from workbench.causal.common import (DEFAULT_DTYPE, Metric, Prompt, as_metric, logits3, prompt, require_op, run,
                                     token_prob)
from workbench.trace import patch, zero_head

MODES = ("zero", "mean", "resample")


@dataclass(frozen=True)
class Site:
    kind: str  # "head" | "mlp" | "expert"
    layer: int
    index: int | None = None

    @property
    def label(self) -> str:
        return {"head": f"L{self.layer}H{self.index}", "mlp": f"L{self.layer} mlp",
                "expert": f"L{self.layer}E{self.index}"}[self.kind]

    def op(self) -> str:
        """The op whose output the ablation changes."""
        return {"head": f"layers.{self.layer}.self_attn.context", "mlp": f"layers.{self.layer}.mlp.down_proj",
                "expert": f"layers.{self.layer}.experts.switch_glu.down_proj"}[self.kind]

    def router(self) -> str:
        return f"layers.{self.layer}.router.top_k"


def head(layer: int, h: int) -> Site:
    return Site("head", int(layer), int(h))


def mlp(layer: int) -> Site:
    return Site("mlp", int(layer))


def expert(layer: int, e: int) -> Site:
    return Site("expert", int(layer), int(e))


def all_heads(model) -> list[Site]:
    """Every attention head of every layer, layer by layer."""
    out = []
    for i in range(model.num_layers):
        H = require_op(model, f"layers.{i}.self_attn.context").attrs["num_heads"]
        out += [head(i, h) for h in range(H)]
    return out


def _head_geometry(model, site: Site) -> tuple[int, int]:
    op = require_op(model, site.op())
    H, d = op.attrs["num_heads"], op.attrs["head_dim"]
    if not 0 <= site.index < H:
        raise ValueError(f"head {site.index} out of range: layer {site.layer} has {H} heads")
    return H, d


def _check(model, site: Site) -> None:
    if not isinstance(site, Site):
        raise TypeError(f"not an ablation site: {site!r} (use head(l, h), mlp(l), expert(l, e))")
    require_op(model, site.op())
    if site.kind == "head":
        _head_geometry(model, site)
    elif site.kind == "expert":
        r = require_op(model, site.router())
        E = model.config.get("num_experts") or 0
        if not 0 <= site.index < E:
            raise ValueError(f"expert {site.index} out of range: layer {site.layer} has {E} experts "
                             f"({r.attrs.get('k')} per token)")


def _head_mask(model, site: Site, dtype) -> mx.array:
    H, d = _head_geometry(model, site)
    return ((mx.arange(H * d) // d) == site.index).astype(dtype)


def ablation(model, sites: Sequence[Site], mode: str = "zero", reference=None,
             dtype=DEFAULT_DTYPE) -> list:
    """The interventions that ablate ``sites`` (all at once) in ``mode``.

    ``reference``: prompts the mean (or the resampled values) come from; for ``"mean"``
    it is required (any batch: the mean is over its real positions), for ``"resample"`` it
    must have the ablated prompt's shape [B, T] (or B = 1).
    """
    if mode not in MODES:
        raise ValueError(f"unknown ablation mode {mode!r}: use one of {', '.join(MODES)}")
    for s in sites:
        _check(model, s)
    ivs = []
    ref_tr = ref = None
    if mode != "zero":
        if reference is None:
            raise ValueError(f"{mode} ablation needs reference= (prompts to take the {mode} from)")
        if mode == "resample" and any(s.kind == "expert" for s in sites):
            raise ValueError("resample ablation of an expert is not defined (the other token may be routed "
                             "elsewhere); use mode='zero' or 'mean'")
        ref = prompt(model, reference)
        if mode == "resample" and ref.mask is not None:
            raise ValueError("resample ablation needs a reference without padding (prompts of one length)")
        names = sorted({s.op() for s in sites} | {s.router() for s in sites if s.kind == "expert"})
        ref_tr = run(model, ref, capture=names, dtype=dtype)
    valid = None if ref is None else mx.array(ref.valid())  # [B, T]
    for s in sites:
        if s.kind == "head":
            if mode == "zero":
                ivs.append(zero_head(s.op(), s.index))
                continue
            keep = _head_mask(model, s, mx.float32)
            v = ref_tr.value(s.op()).astype(mx.float32)
            if mode == "mean":
                v = _masked_mean(v, valid)  # [H*d]
            ivs.append(patch(s.op(), _blend(keep, v, s.label, mode), label=f"{mode}_ablate({s.label})"))
        elif s.kind == "mlp":
            if mode == "zero":
                ivs.append(patch(s.op(), lambda v: mx.zeros_like(v), label=f"zero_ablate({s.label})"))
                continue
            v = ref_tr.value(s.op()).astype(mx.float32)
            if mode == "mean":
                v = _masked_mean(v, valid)
            ivs.append(patch(s.op(), _blend(mx.array(1.0), v, s.label, mode), label=f"{mode}_ablate({s.label})"))
        else:  # expert
            mean = None
            if mode == "mean":
                idx = ref_tr.value(s.router())                      # [B, T, k]
                d = ref_tr.value(s.op()).astype(mx.float32)         # [B, T, k, D]
                sel = (idx == s.index) & valid[..., None]
                n = int(sel.sum().item())
                if n == 0:
                    raise ValueError(f"mean ablation of {s.label}: no reference token is routed to expert {s.index}")
                mean = (d * sel[..., None]).sum(axis=(0, 1, 2)) / n
            ivs += _expert_interventions(s, mean)
    return ivs


def _masked_mean(v: mx.array, valid: mx.array) -> mx.array:
    """Mean of [B, T, ...] over the valid (b, t)."""
    w = valid.astype(v.dtype).reshape(*valid.shape, *([1] * (v.ndim - 2)))
    return (v * w).sum(axis=(0, 1)) / w.sum()


def _blend(keep: mx.array, value: mx.array, label: str, mode: str):
    """v -> v with the ``keep`` channels replaced by ``value`` (broadcast to v)."""
    def fn(v):
        if mode == "resample" and (value.shape[1:] != v.shape[1:] or value.shape[0] not in (1, v.shape[0])):
            raise ValueError(f"resample ablation of {label}: the reference has shape {tuple(value.shape)}, "
                             f"the ablated run {tuple(v.shape)} (give prompts of the same length)")
        new = mx.broadcast_to(value, v.shape).astype(v.dtype)
        k = keep.astype(v.dtype)
        return new * k + v * (1 - k)
    return fn


def _expert_interventions(s: Site, mean: mx.array | None) -> list:
    """A pass-through intervention on the router's top-k that remembers this run's routing,
    and one on the experts' down_proj that replaces expert ``s.index``'s slots."""
    seen = {}

    def remember(idx):
        seen["idx"] = idx
        return idx

    def ablate(d):
        hit = (seen["idx"] == s.index)[..., None]  # [B, T, k, 1]
        new = mx.zeros_like(d) if mean is None else mx.broadcast_to(mean.astype(d.dtype), d.shape)
        return mx.where(hit, new, d)
    mode = "zero" if mean is None else "mean"
    return [patch(s.router(), remember, label=f"routing({s.label})"),
            patch(s.op(), ablate, label=f"{mode}_ablate({s.label})")]


# --------------------------------------------------------------------------- experiments

@dataclass
class AblationResult:
    """The metric with each group of sites ablated (one forward per group)."""

    labels: list[str]
    values: np.ndarray        # [n] metric (mean over the batch) with group i ablated
    per_example: np.ndarray   # [n, B]
    baseline: float           # the metric without ablation
    baseline_per_example: np.ndarray  # [B]
    mode: str
    metric: str
    grid: np.ndarray | None = None   # [L, H] the values again, for ablate_heads (NaN: no such head)
    grid_rows: list[str] = field(default_factory=list)
    grid_cols: list[str] = field(default_factory=list)

    @property
    def effect(self) -> np.ndarray:
        """values - baseline (negative: the ablation hurt the metric)."""
        return self.values - self.baseline

    def to_dict(self) -> dict:
        d = {"labels": list(self.labels), "values": self.values.tolist(), "effect": self.effect.tolist(),
             "per_example": self.per_example.tolist(), "baseline": float(self.baseline),
             "baseline_per_example": self.baseline_per_example.tolist(), "mode": self.mode, "metric": self.metric}
        if self.grid is not None:
            d.update(grid=np.where(np.isnan(self.grid), None, self.grid).tolist(), grid_rows=list(self.grid_rows),
                     grid_cols=list(self.grid_cols))
        return d


def _groups(sites) -> list[tuple[Site, ...]]:
    out = []
    for g in sites:
        out.append((g,) if isinstance(g, Site) else tuple(g))
    if not out:
        raise ValueError("nothing to ablate: pass sites such as [head(1, 0), (head(1, 0), head(1, 1)), mlp(2)]")
    return out


def ablate(model, text_or_ids, sites, mode: str = "zero", metric=None, reference=None,
           dtype=DEFAULT_DTYPE) -> AblationResult:
    """Ablate each entry of ``sites`` in turn (a :class:`Site`, or a tuple of sites ablated
    together) and measure ``metric`` (default: the probability of the unablated run's top
    token at the last position, per sequence).

    ``reference`` (mean / resample): see :func:`ablation`.  For ``"mean"`` it defaults to
    the prompt itself; for ``"resample"`` on a batch of prompts, to the batch rolled by one
    (sequence b takes sequence b+1's values).
    """
    p = prompt(model, text_or_ids)
    groups = _groups(sites)
    m = None if metric is None else as_metric(metric, model)  # its token ids checked before anything runs
    base = logits3(run(model, p, dtype=dtype))
    if m is None:
        m = Metric("p(unablated top token) @ -1",
                   token_prob(np.array(mx.argmax(base[:, -1, :], axis=-1)), -1).fn)
    b0 = m(base)
    if reference is None and mode == "mean":
        reference = p
    if reference is None and mode == "resample":
        if p.shape[0] < 2 or p.mask is not None:
            raise ValueError("resample ablation needs reference= (prompts of the same length), or a batch of "
                             "at least 2 prompts of one length")
        reference = Prompt(mx.roll(p.ids, -1, axis=0), None)
    per = []
    for g in groups:
        ivs = ablation(model, g, mode, reference, dtype=dtype)
        per.append(m(logits3(run(model, p, interventions=ivs, dtype=dtype))))
    per = np.stack(per)
    return AblationResult(["+".join(s.label for s in g) for g in groups], per.mean(axis=1), per,
                          float(b0.mean()), b0, mode, m.label)


def ablate_heads(model, text_or_ids, mode: str = "zero", metric=None, reference=None,
                 dtype=DEFAULT_DTYPE) -> AblationResult:
    """:func:`ablate` every attention head on its own; ``.grid`` is [layers, heads]."""
    sites = all_heads(model)
    r = ablate(model, text_or_ids, sites, mode, metric, reference, dtype)
    H = max(s.index for s in sites) + 1
    grid = np.full((model.num_layers, H), np.nan)
    for s, v in zip(sites, r.values):
        grid[s.layer, s.index] = v
    r.grid, r.grid_rows, r.grid_cols = grid, [f"L{i}" for i in range(model.num_layers)], [f"H{h}" for h in range(H)]
    return r
