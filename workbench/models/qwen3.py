"""Qwen3 (dense): Llama's block plus per-head RMSNorm of queries and keys before RoPE.

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

from dataclasses import dataclass

from workbench import registry
from workbench.checkpoint import fields as F
from workbench.models import llama
from workbench.models.builder import Builder
from workbench.models.llama import windows  # noqa: F401  (this family's)

FAMILY = "qwen3"
MODEL_TYPES = registry.model_types(FAMILY)
#: config.json keys this family reads, knowingly ignores, or reads at given values only
KEYS = F.Keys(handled=frozenset(F.DENSE_KEYS), only={"hidden_act": ("silu",), "partial_rotary_factor": (1.0,)})


@dataclass
class Config(llama.Config):
    """Llama's fields (``rope_traditional`` stays False); sliding layers (transformers'
    use_sliding_window / max_window_layers, or layer_types) attend within sliding_window."""


def read(tc: dict) -> Config:
    """Llama's reader, with Qwen 3's defaults (rms_norm_eps 1e-6, untied, no rope_theta default)."""
    return llama.read(tc, FAMILY, Config)


def tensors(cfg: Config, a: F.Arch) -> None:
    """Llama's tensors plus q_norm / k_norm."""
    llama.tensors(cfg, a, qk_norm=True)


def attention(b: Builder, cfg: Config, i: int, h: str, rope: dict) -> str:
    a = f"layers.{i}.self_attn"
    H, Hkv, D, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    q = b.rmsnorm(f"{a}.q_norm", b.heads(f"{a}.q_heads", b.linear(f"{a}.q_proj", h), H, D), eps)
    k = b.rmsnorm(f"{a}.k_norm", b.heads(f"{a}.k_heads", b.linear(f"{a}.k_proj", h), Hkv, D), eps)
    v = b.linear(f"{a}.v_proj", h)
    q = b.rope(f"{a}.q_rope", q, rope)
    k = b.rope(f"{a}.k_rope", k, rope)
    v = b.heads(f"{a}.v_heads", v, Hkv, D)
    k = b.kv_cache(f"{a}.k_cache", k, "k", i)
    v = b.kv_cache(f"{a}.v_cache", v, "v", i)
    sliding = cfg.layer_types[i] == "sliding_attention"
    mask = "attn_mask_sliding" if sliding else "attn_mask"
    o = b.attention(a, q, k, v, mask, D ** -0.5, H, Hkv, D, window=cfg.sliding_window if sliding else None)
    return b.linear(f"{a}.o_proj", o)


def build(cfg: Config, b: Builder):
    """Llama's program with Qwen3's attention."""
    return llama.build(cfg, b, attention=attention)
