"""Qwen3 (dense): Llama's block plus per-head RMSNorm of queries and keys before RoPE.

Per layer ``i``::

    h  = input_layernorm(x)
    q = q_rope(q_norm(q_heads(q_proj(h))))           # q_norm over head_dim, [B, T, H, D]
    k = k_rope(k_norm(k_heads(k_proj(h))))
    v = v_heads(v_proj(h))
    k, v = k_cache(k), v_cache(v)
    x = attn_residual = x + o_proj(context(softmax(scores(q, k)), v))
    layers.{i} = x + down_proj(silu(gate_proj(h2)) * up_proj(h2)),  h2 = post_attention_layernorm(x)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from workbench.models.base import BaseConfig, Builder, rope_params
from workbench.models.llama import mlp

FAMILY = "qwen3"
MODEL_TYPES = ("qwen3",)


@dataclass
class Config(BaseConfig):
    hidden_size: int = 4096
    num_hidden_layers: int = 36
    intermediate_size: int = 12288
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    vocab_size: int = 151936
    rope_theta: Optional[float] = None
    rope_scaling: Optional[dict] = None
    rope_parameters: Optional[dict] = None
    max_position_embeddings: int = 40960
    tie_word_embeddings: bool = False

    def __post_init__(self):
        # transformers >= 5 nests rope_theta / rope_scaling under rope_parameters
        if self.rope_parameters:
            if self.rope_theta is None:
                self.rope_theta = self.rope_parameters.get("rope_theta")
            if self.rope_scaling is None:
                self.rope_scaling = self.rope_parameters
        if self.rope_theta is None:
            raise ValueError("config.json has no rope_theta")


def windows(cfg: Config) -> dict:
    return {"attn_mask": None}


def attention(b: Builder, cfg: Config, i: int, h: str, rp: dict) -> str:
    a = f"layers.{i}.self_attn"
    H, Hkv, D, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    q = b.rmsnorm(f"{a}.q_norm", b.heads(f"{a}.q_heads", b.linear(f"{a}.q_proj", h), H, D), eps)
    k = b.rmsnorm(f"{a}.k_norm", b.heads(f"{a}.k_heads", b.linear(f"{a}.k_proj", h), Hkv, D), eps)
    v = b.linear(f"{a}.v_proj", h)
    q = b.rope(f"{a}.q_rope", q, rp)
    k = b.rope(f"{a}.k_rope", k, rp)
    v = b.heads(f"{a}.v_heads", v, Hkv, D)
    k = b.kv_cache(f"{a}.k_cache", k, "k", i)
    v = b.kv_cache(f"{a}.v_cache", v, "v", i)
    s = b.scores(f"{a}.scores", q, k, "attn_mask", D ** -0.5, H, Hkv)
    o = b.attend(f"{a}.context", b.softmax(f"{a}.softmax", s), v, H, Hkv, D)
    return b.linear(f"{a}.o_proj", o)


def build(cfg: Config, b: Builder):
    rp = rope_params(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings)
    x = b.embedding("embed_tokens", "input_ids")
    for i in range(cfg.num_hidden_layers):
        h = b.rmsnorm(f"layers.{i}.input_layernorm", x, cfg.rms_norm_eps)
        x = b.add(f"layers.{i}.attn_residual", x, attention(b, cfg, i, h, rp))
        h = b.rmsnorm(f"layers.{i}.post_attention_layernorm", x, cfg.rms_norm_eps)
        x = b.add(f"layers.{i}", x, mlp(b, i, h))
    x = b.rmsnorm("norm", x, cfg.rms_norm_eps)
    x = b.lm_head(x, tie=cfg.tie_word_embeddings)
    b.identity("logits", x)
    return b.program(["input_ids", "rope_offset", "attn_mask"])
