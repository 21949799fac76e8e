"""Llama (and Llama-shaped checkpoints: Mistral, Qwen2): what its config.json says and the
tensors a sound checkpoint holds (mlx-lm's models/llama.py names).  The op program is
workbench/models/llama.py."""
from __future__ import annotations

from dataclasses import dataclass

from workbench import registry
from workbench.checkpoint import fields as F
from workbench.checkpoint.families.common import Dense, decoder_tensors
from workbench.checkpoint.fields import ConfigError

FAMILY = "llama"
MODEL_TYPES = registry.model_types(FAMILY)  # llama, mistral, qwen2 (llama with q/k/v biases)
#: config.json keys this family reads, knowingly ignores, or reads at given values only (any
#: other key is refused by name: ``inspect`` and ``load`` read a config alike)
KEYS = F.Keys(
    handled=frozenset(F.DENSE_KEYS | {"mlp_bias", "rope_traditional"}),
    ignored=frozenset({"pretraining_tp"}),  # tensor-parallel slicing of the same products
    only={"hidden_act": ("silu",), "partial_rotary_factor": (1.0,)})


@dataclass
class Config(Dense):
    """What the config reader (:func:`read`) returns and the program reads: ``rope`` holds one
    normalised rope dict per layer type; sliding layers (``layer_types``) attend within
    ``sliding_window``; the biases say which the tensor table expects (the program adds a
    ``.bias`` the checkpoint has)."""

    rope: dict
    tie_word_embeddings: bool
    layer_types: list
    sliding_window: int | None
    rope_traditional: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False


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
    decoder_tensors(a, cfg, ("input_layernorm", "post_attention_layernorm"), qk_norm=qk_norm,
                    qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias, mlp_bias=cfg.mlp_bias)
    # tied: mlx-lm's sanitize drops an lm_head that is present anyway
    tied = cfg.tie_word_embeddings
    a.add("lm_head.weight", (cfg.vocab_size, cfg.hidden_size), "linear", optional=tied, ignored_if_present=tied)
