"""Qwen3 (dense): Llama's block plus per-head RMSNorm of queries and keys before RoPE.

The op program; the config and tensors are workbench/checkpoint/families/qwen3.py.

Per layer ``i``::

    h  = input_layernorm(x)
    q = q_rope(q_norm(q_heads(q_proj(h))))           # q_norm over head_dim, [B, T, H, D]
    k = k_rope(k_norm(k_heads(k_proj(h))))
    v = v_heads(v_proj(h))
    k, v = k_cache(k), v_cache(v)
    x = attn_residual = x + o_proj(context(q, k, v))
    layers.{i} = x + down_proj(silu(gate_proj(h2)) * up_proj(h2)),  h2 = post_attention_layernorm(x)
"""
from __future__ import annotations

from workbench.checkpoint.families.qwen3 import FAMILY, MODEL_TYPES, Config  # noqa: F401  (the family's)
from workbench.models import llama
from workbench.models.builder import Builder
from workbench.models.llama import windows  # noqa: F401  (this family's)


def attention(b: Builder, cfg: Config, i: int, h: str, rope: dict) -> str:
    a = f"layers.{i}.self_attn"
    H, Hkv, D, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    q = b.rmsnorm(f"{a}.q_norm", b.heads(f"{a}.q_heads", b.linear(f"{a}.q_proj", h), H, D), eps)
    k = b.rmsnorm(f"{a}.k_norm", b.heads(f"{a}.k_heads", b.linear(f"{a}.k_proj", h), Hkv, D), eps)
    v = b.linear(f"{a}.v_proj", h)
    q = b.rope(f"{a}.q_rope", q, rope)
    k = b.rope(f"{a}.k_rope", k, rope)
    v = b.heads(f"{a}.v_heads", v, Hkv, D)
    return b.cached_attention(a, i, q, k, v, D ** -0.5, H, Hkv, D, llama.window(cfg, i))


def build(cfg: Config, b: Builder):
    """Llama's program with Qwen3's attention."""
    return llama.build(cfg, b, attention=attention)
