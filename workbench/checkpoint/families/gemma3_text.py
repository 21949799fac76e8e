"""Gemma 3 (text): what its config.json says (sliding / full layers and their RoPE, in every
form the references write) and the tensors a sound checkpoint holds (mlx-lm's
models/gemma3_text.py names).  The op program is workbench/models/gemma3_text.py."""
from __future__ import annotations

from dataclasses import dataclass

from workbench import registry
from workbench.checkpoint import fields as F
from workbench.checkpoint.families.common import Dense, decoder_tensors
from workbench.checkpoint.fields import ConfigError, show

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
class Config(Dense):
    """What the config reader (:func:`read`) returns and the program reads: ``rope`` per layer
    type, from ``rope_parameters.{full_attention, sliding_attention}`` or the older rope_theta /
    rope_local_base_freq / rope_scaling (which scales the full layers)."""

    rope: dict
    query_pre_attn_scalar: float
    sliding_window: int
    layer_types: list
    final_logit_softcapping: float | None
    tie_word_embeddings: bool


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
                  num_key_value_heads=kvh, head_dim=hd, rms_norm_eps=eps, vocab_size=V, rope=rope,
                  query_pre_attn_scalar=F.read_float(tc, "query_pre_attn_scalar", 256),
                  sliding_window=F.read_int(tc, "sliding_window", 512), layer_types=lt,
                  final_logit_softcapping=F.read_float(tc, "final_logit_softcapping", None, allow_none=True),
                  tie_word_embeddings=tied)


def tensors(cfg: Config, a: F.Arch) -> None:
    """The checkpoint's tensors (mlx-lm's models/gemma3_text.py names)."""
    decoder_tensors(a, cfg, ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                             "post_feedforward_layernorm"), qk_norm=True)
    # mlx-lm: an lm_head present is used; absent means tied to embed_tokens
    a.add("lm_head.weight", (cfg.vocab_size, cfg.hidden_size), "linear", optional=cfg.tie_word_embeddings)
