"""What the dense families share: the fields of their Config every one of them reads first
(:class:`Dense`), and the decoder stack's tensor table (:func:`decoder_tensors`)."""
from __future__ import annotations

from dataclasses import dataclass

from workbench.checkpoint import fields as F


@dataclass
class Dense:
    """The sizes every dense family's Config begins with (each family adds its own after)."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int


def decoder_tensors(a: F.Arch, cfg: Dense, norms: tuple, *, qk_norm: bool = False, qkv_bias: bool = False,
                    o_bias: bool = False, mlp_bias: bool = False) -> None:
    """embed_tokens, every layer's attention, MLP and ``norms``, and the final norm (mlx-lm's
    names); the family adds its head (``lm_head``: tied or not, each family its own rule)."""
    D, H, kvh, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    a.add("embed_tokens.weight", (cfg.vocab_size, D), "embedding")
    for i in range(cfg.num_hidden_layers):
        F.attention_tensors(a, i, D, H, kvh, hd, qk_norm=qk_norm, bias=qkv_bias, o_bias=o_bias)
        F.mlp_tensors(a, i, D, cfg.intermediate_size, bias=mlp_bias)
        F.norm_tensors(a, i, D, norms)
    a.add("norm.weight", (D,), "norm")
