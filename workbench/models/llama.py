"""Llama (and Llama-shaped checkpoints: Mistral, Qwen2): pre-norm decoder, RoPE, GQA, SwiGLU MLP.

The op program; what the config says and the checkpoint's tensors are the family's file,
workbench/checkpoint/families/llama.py (its Config is what :func:`build` reads).  Linear
layers add their ``.bias`` when the checkpoint has one (Qwen2's q/k/v).

Per layer ``i`` (x = ``layers.{i-1}``, or ``embed_tokens`` for the first layer)::

    h  = input_layernorm(x)
    q, k, v = q_proj(h), k_proj(h), v_proj(h)        # [B, T, H*D]
    q, k, v = q_heads(q), k_heads(k), v_heads(v)     # [B, H, T, D]
    q, k = q_rope(q), k_rope(k)                      # rotated at their positions
    k, v = k_cache(k), v_cache(v)                    # + cached positions
    o = context(q, k, v)                             # [B, T, H*D], fused (or explicit:
                                                     #  softmax(scores(q, k)) @ v, docs/ops.md)
    x = attn_residual = x + o_proj(o)
    h = post_attention_layernorm(x)
    layers.{i} = x + down_proj(act(gate_proj(h), up_proj(h)))     # act = silu(g) * u
"""
from __future__ import annotations

from workbench.checkpoint.families.llama import FAMILY, MODEL_TYPES, Config  # noqa: F401  (the family's)
from workbench.models.builder import Builder
from workbench.rope import rope_params


def windows(cfg: Config) -> dict:
    w = {"attn_mask": None}
    if "sliding_attention" in cfg.layer_types:
        w["attn_mask_sliding"] = cfg.sliding_window
    return w


def window(cfg: Config, i: int) -> int | None:
    """Layer ``i``'s sliding window (None: a full-attention layer)."""
    return cfg.sliding_window if cfg.layer_types[i] == "sliding_attention" else None


def attention(b: Builder, cfg: Config, i: int, h: str, rope: dict) -> str:
    a = f"layers.{i}.self_attn"
    H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = b.linear(f"{a}.q_proj", h)
    k = b.linear(f"{a}.k_proj", h)
    v = b.linear(f"{a}.v_proj", h)
    q = b.rope(f"{a}.q_rope", b.heads(f"{a}.q_heads", q, H, D), rope)
    k = b.rope(f"{a}.k_rope", b.heads(f"{a}.k_heads", k, Hkv, D), rope)
    v = b.heads(f"{a}.v_heads", v, Hkv, D)
    return b.cached_attention(a, i, q, k, v, D ** -0.5, H, Hkv, D, window(cfg, i))


def mlp(b: Builder, i: int, h: str) -> str:
    return b.gated_mlp(f"layers.{i}.mlp", h, "silu")


def build(cfg: Config, b: Builder, attention=attention):
    """The op program; ``attention``: the block's attention (Qwen3 passes its own)."""
    rope = rope_params(cfg.head_dim, cfg.rope["full_attention"], cfg.rope_traditional)
    x = b.embedding("embed_tokens", "input_ids")
    for i in range(cfg.num_hidden_layers):
        h = b.rmsnorm(f"layers.{i}.input_layernorm", x, cfg.rms_norm_eps)
        x = b.add(f"layers.{i}.attn_residual", x, attention(b, cfg, i, h, rope))
        h = b.rmsnorm(f"layers.{i}.post_attention_layernorm", x, cfg.rms_norm_eps)
        x = b.add(f"layers.{i}", x, mlp(b, i, h))
    x = b.rmsnorm("norm", x, cfg.rms_norm_eps)
    x = b.lm_head(x, tie=cfg.tie_word_embeddings)
    b.logits(x)
    return b.program(["input_ids", "rope_offset", *windows(cfg)])
