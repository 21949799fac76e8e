"""Gemma 3 (text): sandwich norms with (1 + w) weights, local/global attention.

* embeddings scaled by sqrt(hidden_size) in the compute dtype (transformers; mlx-lm rounds it to
  bfloat16 in every dtype);
* every RMSNorm multiplies by ``1 + weight``;
* q_norm / k_norm per head; scores scaled by ``query_pre_attn_scalar ** -0.5``;
* sliding layers: their RoPE (``rope_parameters.sliding_attention``, or base
  ``rope_local_base_freq``) and a ``sliding_window`` mask; full layers (``layer_types``,
  or every ``sliding_window_pattern``-th): ``rope_parameters.full_attention`` (or base
  ``rope_theta`` with ``rope_scaling``: linear x8 for the 4B+ models) and the causal mask;
* GeGLU MLP (tanh-approximated GELU);
* a final logit soft-cap when the config sets final_logit_softcapping (transformers);
* in float16 the residual adds are computed in float32 and clipped to ±65504, as the
  reference (mlx-lm) does.

The op program; what the config says and the checkpoint's tensors are the family's file,
workbench/checkpoint/families/gemma3_text.py (its Config is what :func:`build` reads).

Per layer ``i``::

    h = input_layernorm(x)
    q = q_rope(q_norm(q_heads(q_proj(h)))); k = k_rope(k_norm(k_heads(k_proj(h)))); v = v_heads(v_proj(h))
    x = attn_residual = x + post_attention_layernorm(o_proj(context(q, k, v)))
    layers.{i} = x + post_feedforward_layernorm(down_proj(gelu(gate_proj(h2)) * up_proj(h2))),
                 h2 = pre_feedforward_layernorm(x)
"""
from __future__ import annotations

from functools import partial

import mlx.core as mx

from workbench.checkpoint.families.gemma3_text import FAMILY, MODEL_TYPES, Config  # noqa: F401  (the family's)
from workbench.dtypes import FP16_MAX
from workbench.models.builder import Builder
from workbench.rope import rope_params


def windows(cfg: Config) -> dict:
    return {"attn_mask": None, "attn_mask_sliding": cfg.sliding_window}


@partial(mx.compile, shapeless=True)
def clip_residual(x, y):
    if x.dtype != mx.float16:
        return x + y
    return mx.clip(x.astype(mx.float32) + y.astype(mx.float32), -FP16_MAX, FP16_MAX).astype(mx.float16)


def residual(b: Builder, name: str, x: str, y: str) -> str:
    return b.op(name, "add", lambda ctx, x, y: clip_residual(x, y), [x, y], clip_float16=True)


def attention(b: Builder, cfg: Config, i: int, h: str, rope: dict) -> str:
    a = f"layers.{i}.self_attn"
    H, Hkv, D, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    sliding = cfg.layer_types[i] == "sliding_attention"
    layer_rope = rope[cfg.layer_types[i]]
    q = b.heads(f"{a}.q_heads", b.linear(f"{a}.q_proj", h), H, D)
    k = b.heads(f"{a}.k_heads", b.linear(f"{a}.k_proj", h), Hkv, D)
    v = b.heads(f"{a}.v_heads", b.linear(f"{a}.v_proj", h), Hkv, D)
    q = b.rope(f"{a}.q_rope", b.rmsnorm(f"{a}.q_norm", q, eps, plus_one=True), layer_rope)
    k = b.rope(f"{a}.k_rope", b.rmsnorm(f"{a}.k_norm", k, eps, plus_one=True), layer_rope)
    return b.cached_attention(a, i, q, k, v, cfg.query_pre_attn_scalar ** -0.5, H, Hkv, D,
                              cfg.sliding_window if sliding else None)


def mlp(b: Builder, i: int, h: str) -> str:
    return b.gated_mlp(f"layers.{i}.mlp", h, "gelu_approx")


def build(cfg: Config, b: Builder):
    eps = cfg.rms_norm_eps
    rope = {t: rope_params(cfg.head_dim, r) for t, r in cfg.rope.items()}
    x = b.embedding("embed_tokens", "input_ids")
    # sqrt(hidden) in the compute dtype, as transformers (`embed_scale.to(weight.dtype)`):
    # exact in float32 (mlx-lm rounds it to bfloat16 whatever the dtype)
    x = b.scale("embed_scale", x, cfg.hidden_size ** 0.5)
    for i in range(cfg.num_hidden_layers):
        L = f"layers.{i}"
        h = b.rmsnorm(f"{L}.input_layernorm", x, eps, plus_one=True)
        r = b.rmsnorm(f"{L}.post_attention_layernorm", attention(b, cfg, i, h, rope), eps, plus_one=True)
        x = residual(b, f"{L}.attn_residual", x, r)
        h = b.rmsnorm(f"{L}.pre_feedforward_layernorm", x, eps, plus_one=True)
        r = b.rmsnorm(f"{L}.post_feedforward_layernorm", mlp(b, i, h), eps, plus_one=True)
        x = residual(b, L, x, r)
    x = b.rmsnorm("norm", x, eps, plus_one=True)
    x = b.lm_head(x, tie=cfg.tie_word_embeddings)
    b.logits(x, cap=cfg.final_logit_softcapping)
    return b.program(["input_ids", "rope_offset", "attn_mask", "attn_mask_sliding"])
