"""Mixture-of-experts routing as transformers weighs the chosen experts (see the package doc)."""
from __future__ import annotations

import math
from typing import Mapping

import mlx.core as mx
import mlx.nn as nn

from workbench.checkpoint.corrections.common import subclass, subclass_all
from workbench.errors import ConfigError


def top_k(scores: mx.array, k: int, pick: mx.array | None = None) -> tuple[mx.array, mx.array]:
    """(indices, their scores) of the ``k`` experts with the largest ``pick`` (``scores`` where
    not given: a router whose choice adds a bias the weights do not carry), as the routers
    below all choose."""
    inds = mx.stop_gradient(mx.argpartition(-(scores if pick is None else pick), kth=k - 1, axis=-1)[..., :k])
    return inds, mx.take_along_axis(scores, inds, axis=-1)


def jamba(model: nn.Module) -> None:
    """mlx-lm's Jamba MoE blocks weight their top-k experts by the softmax over all experts,
    unrenormalised (transformers' ``JambaTopKRouter``), not by the softmax over the top k."""
    def attrs(base):
        def call(self, x):
            gates = self.router(x)
            k = self.num_experts_per_tok
            inds, scores = top_k(mx.softmax(gates.astype(mx.float32), axis=-1), k)
            scores = scores.astype(x.dtype)
            y = self.switch_mlp(x, inds)
            return (y * scores[..., None]).sum(axis=-2)
        return {"__call__": call}

    subclass_all(model, "JambaSparseMoeBlock", attrs)


def qwen2_moe(model: nn.Module, config: Mapping) -> None:
    """``norm_topk_prob: true``: the top-k softmax weights divided by their sum, as transformers'
    ``Qwen2MoeTopKRouter`` does (mlx-lm's qwen2_moe never reads the key)."""
    if config.get("norm_topk_prob") is not True:
        return

    def attrs(base):
        def call(self, x):
            inds, scores = top_k(mx.softmax(self.gate(x), axis=-1, precise=True), self.top_k)
            scores = scores / scores.sum(axis=-1, keepdims=True)
            y = (self.switch_mlp(x, inds) * scores[..., None]).sum(axis=-2)
            return y + mx.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return {"__call__": call}

    subclass_all(model, "Qwen2MoeSparseMoeBlock", attrs)


def hunyuan(model: nn.Module, config: Mapping) -> None:
    """transformers' HunYuanMoEV1 (mlx-lm's hunyuan): the top-k of the softmax over all experts
    divided by their sum (``HunYuanMoEV1Gate``), and the shared MLP always added."""
    if config.get("model_type") != "hunyuan_v1_moe":
        return

    def attrs(base):
        def call(self, x):
            inds, scores = top_k(mx.softmax(self.gate(x).astype(mx.float32), axis=-1), self.top_k)
            scores = scores / scores.sum(axis=-1, keepdims=True)
            y = self.switch_mlp(x, inds)
            y = (y * scores[..., None]).sum(axis=-2).astype(y.dtype)
            return y + self.shared_mlp(x)
        return {"__call__": call}

    subclass_all(model, "MoeBlock", attrs, where=lambda m: hasattr(m, "shared_mlp"))



class _Statics(nn.Module):
    """transformers' ``Ernie4_5_MoeStatics``: the aux-free balancing bias, one per expert."""

    def __init__(self, num_experts: int):
        super().__init__()
        self.e_score_correction_bias = mx.zeros((1, num_experts), dtype=mx.float32)


def ernie4_5_moe_prepare(model: nn.Module) -> None:
    """Before the weights load: each of mlx-lm's ERNIE 4.5 MoE blocks gets the original's
    ``moe_statics.e_score_correction_bias``, and the model's sanitize keeps it (mlx-lm's drops
    it); idempotent.  A checkpoint without it (mlx-lm's own conversions dropped it) fails the
    strict load naming it: the original's experts cannot be told without it."""
    blocks = [m for _, m in model.named_modules() if type(m).__name__ == "Ernie4_5_MoeMLP"]
    if not blocks or "moe_statics" in blocks[0]:
        return
    for m in blocks:
        m.moe_statics = _Statics(m.gate.weight.shape[0])

    def attrs(base):
        def sanitize(self, weights):
            keep = {k: v for k, v in weights.items() if k.endswith("moe_statics.e_score_correction_bias")}
            out = base.sanitize(self, {k: v for k, v in weights.items() if k not in keep})
            return {**out, **keep}
        return {"sanitize": sanitize}

    subclass(model, {}, attrs)


def ernie4_5_moe(model: nn.Module, config: Mapping) -> None:
    """transformers' ``Ernie4_5_MoeTopKRouter``: the top-k experts picked by the softmax plus
    ``e_score_correction_bias``, weighted by the softmax alone divided by their sum (at least
    ``moe_norm_min``); always a softmax (mlx-lm's ``moe_gate_act`` is no option of the original)."""
    ernie4_5_moe_prepare(model)
    norm_min = config.get("moe_norm_min", 1e-12)
    if norm_min is not None and (isinstance(norm_min, bool) or not isinstance(norm_min, (int, float))
                                 or not math.isfinite(norm_min)):
        raise ConfigError(f"config.json: moe_norm_min = {norm_min!r} is not a finite number (nor null)")
    norm_min = 0.0 if norm_min is None else float(norm_min)  # (torch.clamp(min=None): no floor)

    def attrs(base):
        def call(self, x):
            probs = mx.softmax(self.gate(x).astype(mx.float32), axis=-1, precise=True)
            bias = self.moe_statics.e_score_correction_bias.reshape(-1).astype(mx.float32)
            inds, scores = top_k(probs, self.k, probs + bias)
            scores = scores / mx.maximum(scores.sum(axis=-1, keepdims=True), norm_min)
            y = self.switch_mlp(x, inds)
            y = (y * scores[..., None]).sum(axis=-2).astype(y.dtype)
            return y if self.shared_experts is None else y + self.shared_experts(x)
        return {"__call__": call}

    subclass_all(model, "Ernie4_5_MoeMLP", attrs)


def afmoe(model: nn.Module) -> None:
    """transformers' ``AfmoeTokenChoiceRouter``: sigmoid scores, the top-k picked with
    ``expert_bias``, always divided by their sum (mlx-lm's afmoe skips the division for one expert
    a token, and reads ``route_norm``, ``score_func``, ``n_group`` and ``topk_group``, options the
    original does not have), times ``route_scale``; the shared experts added."""
    def attrs(base):
        def call(self, x):
            scores = mx.sigmoid(self.router(x).astype(mx.float32))
            inds, top = top_k(scores, self.num_experts_per_tok, scores + self.expert_bias)
            top = top / (top.sum(axis=-1, keepdims=True) + 1e-20) * self.route_scale
            y = self.experts(x, inds)
            y = (y * top[..., None]).sum(axis=-2).astype(y.dtype)
            return y + self.shared_experts(x) if "shared_experts" in self else y
        return {"__call__": call}

    subclass_all(model, "AfmoeMoE", attrs)
