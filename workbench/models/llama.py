"""Llama (and Llama-shaped checkpoints: Mistral, Qwen2): pre-norm decoder, RoPE, GQA, SwiGLU MLP.

Linear layers add their ``.bias`` when the checkpoint has one (Qwen2's q/k/v).

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

from dataclasses import dataclass

from workbench import registry
from workbench.checkpoint import fields as F
from workbench.checkpoint.fields import ConfigError
from workbench.models.builder import Builder
from workbench.models.rope import rope_params

FAMILY = "llama"
MODEL_TYPES = registry.model_types(FAMILY)  # llama, mistral, qwen2 (llama with q/k/v biases)
#: config.json keys this family reads, knowingly ignores, or reads at given values only (any
#: other key is refused by name: ``inspect`` and ``load`` read a config alike)
KEYS = F.Keys(
    handled=frozenset(F.DENSE_KEYS | {"mlp_bias", "rope_traditional"}),
    ignored=frozenset({"pretraining_tp"}),  # tensor-parallel slicing of the same products
    only={"hidden_act": ("silu",), "partial_rotary_factor": (1.0,)})


@dataclass
class Config:
    """What the config reader (:func:`read`) returns and the program reads: ``rope`` holds one
    normalised rope dict per layer type; sliding layers (``layer_types``) attend within
    ``sliding_window``; the biases say which the tensor table expects (the program adds a
    ``.bias`` the checkpoint has)."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int
    rope: dict
    tie_word_embeddings: bool
    layer_types: list
    sliding_window: int | None
    rope_traditional: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False


# --------------------------------------------------------------------------- config.json

def read(tc: dict, family: str = FAMILY, config=Config) -> Config:
    """The text config read (llama, mistral, qwen2; ``family="qwen3"`` for Qwen 3): every
    value range-checked, refused (ConfigError naming the key) where it cannot be used."""
    mt = tc.get("model_type")
    D = F.read_int(tc, "hidden_size")
    L = F.read_int(tc, "num_hidden_layers")
    H = F.read_int(tc, "num_attention_heads")
    V = F.read_int(tc, "vocab_size")
    I = F.read_int(tc, "intermediate_size")
    kvh = F.read_int(tc, "num_key_value_heads", H)
    hd = F.read_int(tc, "head_dim", None, allow_none=True) or D // H
    if hd <= 0:
        raise ConfigError(f"config.json: head_dim is missing and hidden_size {D} < num_attention_heads {H}")
    F.check_heads(H, kvh, "num_key_value_heads")
    F.check_even(hd, "head_dim")
    tied = F.read_bool(tc, "tie_word_embeddings", family == "llama")
    # sliding-window layers: layer_types, or (Qwen) use_sliding_window from max_window_layers on,
    # or (Mistral) every layer when sliding_window is set
    window = F.read_int(tc, "sliding_window", None, allow_none=True)
    use_sw = F.read_bool(tc, "use_sliding_window", False)
    if mt in ("qwen2", "qwen3") and not use_sw:
        window = None
    if mt == "mistral" and "layer_types" in tc:
        raise ConfigError("config.json: key 'layer_types' is not handled by mistral (every layer slides when "
                          "sliding_window is set)")
    if mt == "mistral":
        default_lt = ["sliding_attention" if window else "full_attention"] * L
    else:
        mwl = F.read_int(tc, "max_window_layers", 28, positive=False)
        default_lt = ["sliding_attention" if (window and use_sw and i >= mwl) else "full_attention"
                      for i in range(L)]
    lt = F.read_layer_types(tc, L, default_lt)
    if "sliding_attention" in lt and window is None:
        if mt in ("qwen2", "qwen3"):  # transformers: no window unless use_sliding_window
            lt = ["full_attention"] * L
        else:
            raise ConfigError("config.json: layer_types has sliding_attention layers but sliding_window is not set")
    abias = F.read_bool(tc, "attention_bias", False)
    mbias = family == "llama" and F.read_bool(tc, "mlp_bias", False)
    if tc.get("max_position_embeddings") is not None:
        F.read_int(tc, "max_position_embeddings")
    rope = F.read_rope_flat(tc, 10000.0 if family == "llama" else None)
    eps = F.read_float(tc, "rms_norm_eps", 1e-6 if family == "qwen3" else 1e-5, maximum=1.0)
    return config(hidden_size=D, num_hidden_layers=L, intermediate_size=I, num_attention_heads=H,
                  num_key_value_heads=kvh, head_dim=hd, rms_norm_eps=eps, vocab_size=V, rope=rope,
                  tie_word_embeddings=tied, layer_types=lt, sliding_window=window,
                  rope_traditional=family == "llama" and F.read_bool(tc, "rope_traditional", False),
                  # Qwen 2: biases on q/k/v (not o) always; Llama / Qwen 3: on all four with attention_bias
                  qkv_bias=abias or mt == "qwen2", o_bias=abias, mlp_bias=mbias)


def tensors(cfg: Config, a: F.Arch, qk_norm: bool = False) -> None:
    """The checkpoint's tensors (mlx-lm's models/llama.py names; Qwen 3 adds q_norm / k_norm)."""
    D, H, kvh, hd, V = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size
    a.add("embed_tokens.weight", (V, D), "embedding")
    for i in range(cfg.num_hidden_layers):
        F.attention_tensors(a, i, D, H, kvh, hd, qk_norm=qk_norm, bias=cfg.qkv_bias, o_bias=cfg.o_bias)
        F.mlp_tensors(a, i, D, cfg.intermediate_size, bias=cfg.mlp_bias)
        F.norm_tensors(a, i, D, ("input_layernorm", "post_attention_layernorm"))
    a.add("norm.weight", (D,), "norm")
    # tied: mlx-lm's sanitize drops an lm_head that is present anyway
    tied = cfg.tie_word_embeddings
    a.add("lm_head.weight", (V, D), "linear", optional=tied, ignored_if_present=tied)


# --------------------------------------------------------------------------- program

def windows(cfg: Config) -> dict:
    w = {"attn_mask": None}
    if "sliding_attention" in cfg.layer_types:
        w["attn_mask_sliding"] = cfg.sliding_window
    return w


def attention(b: Builder, cfg: Config, i: int, h: str, rope: dict) -> str:
    a = f"layers.{i}.self_attn"
    H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = b.linear(f"{a}.q_proj", h)
    k = b.linear(f"{a}.k_proj", h)
    v = b.linear(f"{a}.v_proj", h)
    q = b.rope(f"{a}.q_rope", b.heads(f"{a}.q_heads", q, H, D), rope)
    k = b.rope(f"{a}.k_rope", b.heads(f"{a}.k_heads", k, Hkv, D), rope)
    v = b.heads(f"{a}.v_heads", v, Hkv, D)
    k = b.kv_cache(f"{a}.k_cache", k, "k", i)
    v = b.kv_cache(f"{a}.v_cache", v, "v", i)
    sliding = cfg.layer_types[i] == "sliding_attention"
    mask = "attn_mask_sliding" if sliding else "attn_mask"
    o = b.attention(a, q, k, v, mask, D ** -0.5, H, Hkv, D, window=cfg.sliding_window if sliding else None)
    return b.linear(f"{a}.o_proj", o)


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
