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

Per layer ``i``::

    h = input_layernorm(x)
    q = q_rope(q_norm(q_heads(q_proj(h)))); k = k_rope(k_norm(k_heads(k_proj(h)))); v = v_heads(v_proj(h))
    x = attn_residual = x + post_attention_layernorm(o_proj(context(q, k, v)))
    layers.{i} = x + post_feedforward_layernorm(down_proj(gelu(gate_proj(h2)) * up_proj(h2))),
                 h2 = pre_feedforward_layernorm(x)
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import mlx.core as mx

from workbench import registry
from workbench.checkpoint import fields as F
from workbench.checkpoint.fields import ConfigError, show
from workbench.models.builder import Builder
from workbench.models.rope import rope_params

FAMILY = "gemma3_text"
MODEL_TYPES = registry.model_types(FAMILY)
#: config.json keys this family reads, knowingly ignores, or reads at given values only
KEYS = F.Keys(
    handled=frozenset({"hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                       "num_key_value_heads", "head_dim", "rms_norm_eps", "vocab_size", "rope_local_base_freq",
                       "query_pre_attn_scalar", "sliding_window", "sliding_window_pattern", "layer_types",
                       "final_logit_softcapping", "tie_word_embeddings"} | F.ROPE_KEYS),
    # transformers writes the pattern it derived from sliding_window_pattern, and reads it back from there
    ignored=frozenset({"_sliding_window_pattern"}),
    only={"hidden_activation": ("gelu_pytorch_tanh",), "hidden_act": ("gelu_pytorch_tanh",),
          "attn_logit_softcapping": (None,), "use_bidirectional_attention": (False, None),
          "attention_bias": (False,)})


@dataclass
class Config:
    """What the config reader (:func:`read`) returns and the program reads: ``rope`` per layer
    type, from ``rope_parameters.{full_attention, sliding_attention}`` or the older rope_theta /
    rope_local_base_freq / rope_scaling (which scales the full layers)."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int
    rope: dict
    query_pre_attn_scalar: float
    sliding_window: int
    layer_types: list
    final_logit_softcapping: float | None
    tie_word_embeddings: bool


# --------------------------------------------------------------------------- config.json

def read(tc: dict) -> Config:
    """The text config read (mlx-lm's defaults where a key may be omitted), every value checked."""
    D = F.read_int(tc, "hidden_size")
    L = F.read_int(tc, "num_hidden_layers")
    H = F.read_int(tc, "num_attention_heads", 4)
    V = F.read_int(tc, "vocab_size", 262144)
    I = F.read_int(tc, "intermediate_size", 6912)
    hd = F.read_int(tc, "head_dim", 256)
    kvh = F.read_int(tc, "num_key_value_heads", 1)
    F.check_heads(H, kvh, "num_key_value_heads")
    F.check_even(hd, "head_dim")
    pat = F.read_int(tc, "sliding_window_pattern", 6)  # (transformers' _sliding_window_pattern is derived from it)
    lt = F.read_layer_types(tc, L, ["full_attention" if (i % pat == pat - 1) else "sliding_attention"
                                    for i in range(L)])
    tied = F.read_bool(tc, "tie_word_embeddings", True)
    # per layer type (transformers >= 5), or rope_theta / rope_local_base_freq / rope_scaling (older);
    # the older rope_scaling applies to the full-attention layers
    rope = F.read_rope_by_type(tc, {"full_attention": {}, "sliding_attention": {}})
    rs = tc.get("rope_scaling")
    if rs is not None:
        if not isinstance(rs, dict) or not isinstance(rope["full_attention"], dict):
            raise ConfigError(f"config.json: rope_scaling must be an object, got {show(rs)}")
        for k, v in rs.items():
            if k in rope["full_attention"] and rope["full_attention"][k] != v:
                raise ConfigError(f"config.json: rope_scaling.{k} and rope_parameters.full_attention.{k} disagree")
        rope["full_attention"].update(rs)
    for t, key, dflt in (("full_attention", "rope_theta", 1_000_000.0),
                         ("sliding_attention", "rope_local_base_freq", 10_000.0)):
        p = rope[t]
        if isinstance(p, dict) and tc.get(key) is not None:
            if "rope_theta" in p and p["rope_theta"] != tc[key]:
                raise ConfigError(f"config.json: {key} = {show(tc[key])} and rope_parameters.{t}.rope_theta = "
                                  f"{show(p['rope_theta'])} disagree")
            p.setdefault("rope_theta", tc[key])
        rope[t] = F.read_rope(p, f"rope_parameters.{t}", dflt)
    if tc.get("max_position_embeddings") is not None:
        F.read_int(tc, "max_position_embeddings")
    eps = F.read_float(tc, "rms_norm_eps", 1e-6, maximum=1.0)
    return Config(hidden_size=D, num_hidden_layers=L, intermediate_size=I, num_attention_heads=H,
                  num_key_value_heads=kvh, head_dim=hd, rms_norm_eps=eps, vocab_size=V, rope=rope, query_pre_attn_scalar=F.read_float(tc, "query_pre_attn_scalar", 256),
                  sliding_window=F.read_int(tc, "sliding_window", 512), layer_types=lt,
                  final_logit_softcapping=F.read_float(tc, "final_logit_softcapping", None, allow_none=True),
                  tie_word_embeddings=tied)


def tensors(cfg: Config, a: F.Arch) -> None:
    """The checkpoint's tensors (mlx-lm's models/gemma3_text.py names)."""
    D, H, kvh, hd, V = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size
    a.add("embed_tokens.weight", (V, D), "embedding")
    for i in range(cfg.num_hidden_layers):
        F.attention_tensors(a, i, D, H, kvh, hd, qk_norm=True)
        F.mlp_tensors(a, i, D, cfg.intermediate_size)
        F.norm_tensors(a, i, D, ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                                 "post_feedforward_layernorm"))
    a.add("norm.weight", (D,), "norm")
    # mlx-lm: an lm_head present is used; absent means tied to embed_tokens
    a.add("lm_head.weight", (V, D), "linear", optional=cfg.tie_word_embeddings)


# --------------------------------------------------------------------------- program

def windows(cfg: Config) -> dict:
    return {"attn_mask": None, "attn_mask_sliding": cfg.sliding_window}


@partial(mx.compile, shapeless=True)
def clip_residual(x, y):
    if x.dtype != mx.float16:
        return x + y
    bound = mx.finfo(mx.float16).max
    return mx.clip(x.astype(mx.float32) + y.astype(mx.float32), -bound, bound).astype(mx.float16)


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
    k = b.kv_cache(f"{a}.k_cache", k, "k", i)
    v = b.kv_cache(f"{a}.v_cache", v, "v", i)
    mask = "attn_mask_sliding" if sliding else "attn_mask"
    o = b.attention(a, q, k, v, mask, cfg.query_pre_attn_scalar ** -0.5, H, Hkv, D,
                    window=cfg.sliding_window if sliding else None)
    return b.linear(f"{a}.o_proj", o)


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
