"""Gemma 4 (text): what its config.json says and the tensors a sound checkpoint holds
(mlx-lm's models/gemma4_text.py names), dense and MoE.  The op program, and what is
particular to Gemma 4 in the order the forward pass meets it, is workbench/models/gemma4_text.py.

Read here: per-layer head_dim / KV heads (transformers' ``per_layer_config``, or the older
``global_head_dim`` / ``num_global_key_value_heads``), RoPE per layer type, KV sharing
(``num_kv_shared_layers``: the shared layers' k/v tensors may be absent), per-layer
embeddings (``hidden_size_per_layer_input``), MoE (``enable_moe_block``), and the keys
mlx-lm and transformers default differently (the config must state them).
"""
from __future__ import annotations

from dataclasses import dataclass

from workbench import registry
from workbench.checkpoint import fields as F
from workbench.checkpoint.fields import ConfigError, show

FAMILY = "gemma4_text"
MODEL_TYPES = registry.model_types(FAMILY)
#: config.json keys this family reads, knowingly ignores, or reads at given values only
KEYS = F.Keys(
    handled=frozenset({"hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                       "head_dim", "global_head_dim", "num_key_value_heads", "num_global_key_value_heads",
                       "per_layer_config", "rms_norm_eps", "vocab_size", "vocab_size_per_layer_input",
                       "hidden_size_per_layer_input", "num_kv_shared_layers", "rope_parameters",
                       "max_position_embeddings", "sliding_window", "sliding_window_pattern", "layer_types",
                       "attention_k_eq_v", "final_logit_softcapping", "use_double_wide_mlp",
                       "enable_moe_block", "num_experts", "top_k_experts", "moe_intermediate_size",
                       "tie_word_embeddings"}),
    # "vision": image tokens attend both ways; text tokens (all we run) stay causal;
    # mlx-lm's ModelArgs declares (and a config written from it carries) three more keys:
    # the two RoPE fractions it never reads (rope_parameters holds them) and its RoPE switch
    only={"hidden_activation": ("gelu_pytorch_tanh",), "attention_bias": (False,),
          "use_bidirectional_attention": (None, "vision"), "global_partial_rotary_factor": (0.25,),
          "partial_rotary_factor": (1.0,), "rope_traditional": (False,)})


@dataclass
class Config:
    """What the config reader (:func:`read`) returns and the program reads: per-layer
    ``head_dims`` / ``kv_heads`` (from transformers' ``per_layer_config``, or the older
    ``global_head_dim`` / ``num_global_key_value_heads`` of full layers) and ``rope`` per
    layer type."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    head_dims: list
    kv_heads: list
    rms_norm_eps: float
    vocab_size: int
    num_kv_shared_layers: int
    hidden_size_per_layer_input: int
    rope: dict
    sliding_window: int
    attention_k_eq_v: bool
    final_logit_softcapping: float | None
    use_double_wide_mlp: bool
    enable_moe_block: bool
    num_experts: int | None
    top_k_experts: int | None
    moe_intermediate_size: int | None
    layer_types: list
    tie_word_embeddings: bool
    vocab_size_per_layer_input: int | None = None

    # -- per-layer geometry
    def is_full(self, i: int) -> bool:
        return self.layer_types[i] == "full_attention"

    def head_dim_of(self, i: int) -> int:
        return self.head_dims[i]

    def k_eq_v(self, i: int) -> bool:
        return self.attention_k_eq_v and self.is_full(i)

    def kv_heads_of(self, i: int) -> int:
        return self.kv_heads[i]

    @property
    def first_kv_shared(self) -> int:
        return self.num_hidden_layers - self.num_kv_shared_layers

    def kv_source(self, i: int) -> int:
        """The layer whose keys/values layer ``i`` attends to (itself unless KV-shared)."""
        if i < self.first_kv_shared:
            return i
        same = [j for j in range(self.first_kv_shared) if self.layer_types[j] == self.layer_types[i]]
        if not same:
            raise ValueError(f"layer {i} shares KV but no earlier {self.layer_types[i]} layer computes it")
        return same[-1]


# --------------------------------------------------------------------------- config.json

#: RoPE per layer type where the config gives none (mlx-lm)
ROPE_DEFAULTS = {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                    "rope_type": "proportional"},
                 "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}


def _per_layer(tc, L, lt, hd, kvh, k_eq_v):
    """Per-layer head_dim and KV-head count: transformers >= 5 writes ``per_layer_config``
    (``{"3": {"head_dim": 512, "num_key_value_heads": 4}}``, full layers only); older configs
    ``global_head_dim`` / ``num_global_key_value_heads`` for the full layers."""
    plc = tc.get("per_layer_config")
    hds, kvs = [hd] * L, [kvh] * L
    if plc is None:
        ghd = F.read_int(tc, "global_head_dim", 512, allow_none=True)
        gkv = F.read_int(tc, "num_global_key_value_heads", None, allow_none=True)
        for i in range(L):
            if lt[i] == "full_attention":
                hds[i] = ghd or hd
                if k_eq_v and gkv is not None:
                    kvs[i] = gkv
        return hds, kvs
    if not isinstance(plc, dict):
        raise ConfigError(f"config.json: per_layer_config must be an object, got {show(plc)}")
    for key, over in plc.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < L):
            raise ConfigError(f"config.json: per_layer_config key {show(key)} is not a layer index below {L}")
        if not isinstance(over, dict):
            raise ConfigError(f"config.json: per_layer_config.{key} must be an object, got {show(over)}")
        i = int(key)
        for k in over:
            if k not in ("head_dim", "num_key_value_heads"):
                raise ConfigError(f"config.json: per_layer_config.{key}.{k} is not handled (per layer: head_dim, "
                                  "num_key_value_heads)")
        hds[i] = F.read_int(over, "head_dim", hd, where=f"per_layer_config.{key}.head_dim")
        kvs[i] = F.read_int(over, "num_key_value_heads", kvh, where=f"per_layer_config.{key}.num_key_value_heads")
    # the older keys may stand beside per_layer_config only when they agree with it
    for key, vals in (("global_head_dim", hds), ("num_global_key_value_heads", kvs)):
        v = tc.get(key)
        if v is not None and any(vals[i] != v for i in range(L) if lt[i] == "full_attention") and \
                (key == "global_head_dim" or k_eq_v):
            raise ConfigError(f"config.json: {key} = {show(v)} disagrees with per_layer_config")
    return hds, kvs


def _stated(tc, key, mlx_default, hf_default, unless=False):
    """``tc`` itself, when it gives ``key`` or ``unless`` (the key has no effect); otherwise a
    ConfigError: mlx-lm and transformers read a missing ``key`` differently (``mlx_default`` /
    ``hf_default``), so a config without it does not say which model it is."""
    if key in tc or unless:
        return tc
    raise ConfigError(f"config.json has no {key}: transformers reads {show(hf_default)} there, mlx-lm "
                      f"{show(mlx_default)}; add the one this checkpoint was trained with")


def read(tc: dict) -> Config:
    """The text config read (mlx-lm's defaults where a key may be omitted; where mlx-lm and
    transformers default differently the config must say: ``_stated``), every value checked."""
    D = F.read_int(tc, "hidden_size")
    L = F.read_int(tc, "num_hidden_layers")
    H = F.read_int(tc, "num_attention_heads")
    V = F.read_int(tc, "vocab_size")
    I = F.read_int(tc, "intermediate_size", 6144)
    hd = F.read_int(tc, "head_dim", 256)
    kvh = F.read_int(tc, "num_key_value_heads", 1)
    nshared = F.read_int(_stated(tc, "num_kv_shared_layers", 20, 0), "num_kv_shared_layers", positive=False)
    P = F.read_int(tc, "hidden_size_per_layer_input", 256, positive=False, allow_none=True) or 0
    Vp = F.read_int(tc, "vocab_size_per_layer_input", 262144, allow_none=True) or V
    k_eq_v = F.read_bool(tc, "attention_k_eq_v", False)
    double = F.read_bool(_stated(tc, "use_double_wide_mlp", True, False, unless=nshared == 0),
                         "use_double_wide_mlp", True)
    moe = F.read_bool(tc, "enable_moe_block", False)
    tied = F.read_bool(tc, "tie_word_embeddings", True)
    eps = F.read_float(tc, "rms_norm_eps", 1e-6, maximum=1.0)
    window = F.read_int(tc, "sliding_window", 512)
    cap = F.read_float(_stated(tc, "final_logit_softcapping", 30.0, None), "final_logit_softcapping",
                       allow_none=True)
    pat = F.read_int(tc, "sliding_window_pattern", 5)
    p = ["sliding_attention"] * (pat - 1) + ["full_attention"]
    lt = F.read_layer_types(tc, L, (p * (L // len(p) + 1))[:L])
    if nshared > L:
        raise ConfigError(f"config.json: num_kv_shared_layers {nshared} > num_hidden_layers {L}")
    hds, kvs = _per_layer(tc, L, lt, hd, kvh, k_eq_v)
    for t in set(lt):  # one RoPE table per layer type: its layers share head_dim and KV heads
        idx = [i for i in range(L) if lt[i] == t]
        if len({hds[i] for i in idx}) > 1 or len({kvs[i] for i in idx}) > 1:
            raise ConfigError(f"config.json: per_layer_config gives {t} layers different head_dim / "
                              "num_key_value_heads (not handled)")
    for i in range(L):
        F.check_heads(H, kvs[i], f"layer {i}'s num_key_value_heads")
        F.check_even(hds[i], f"layer {i}'s head_dim")
    first_shared = L - nshared
    for i in range(first_shared, L):
        if lt[i] not in lt[:first_shared]:
            raise ConfigError(f"config.json: layer {i} shares KV but no earlier {lt[i]} layer computes it "
                              f"(num_kv_shared_layers {nshared})")
    rope = F.read_rope_by_type(tc, ROPE_DEFAULTS)
    rope = {t: F.read_rope(r, f"rope_parameters.{t}") for t, r in rope.items()}
    E = Im = K = None
    if moe:
        E = F.read_int(tc, "num_experts")
        Im = F.read_int(tc, "moe_intermediate_size")
        K = F.read_int(tc, "top_k_experts")
        if K > E:
            raise ConfigError(f"config.json: top_k_experts {K} > num_experts {E}")
    return Config(hidden_size=D, num_hidden_layers=L, intermediate_size=I, num_attention_heads=H,
                  head_dims=hds, kv_heads=kvs, rms_norm_eps=eps, vocab_size=V, num_kv_shared_layers=nshared,
                  hidden_size_per_layer_input=P, rope=rope, sliding_window=window, attention_k_eq_v=k_eq_v,
                  final_logit_softcapping=cap, use_double_wide_mlp=double, enable_moe_block=moe, num_experts=E,
                  top_k_experts=K, moe_intermediate_size=Im, layer_types=list(lt), tie_word_embeddings=tied,
                  vocab_size_per_layer_input=Vp if P else None)


def tensors(cfg: Config, a: F.Arch) -> None:
    """The checkpoint's tensors (mlx-lm's models/gemma4_text.py names)."""
    D, H, V, L, I = cfg.hidden_size, cfg.num_attention_heads, cfg.vocab_size, cfg.num_hidden_layers, \
        cfg.intermediate_size
    P, first_shared = cfg.hidden_size_per_layer_input, cfg.first_kv_shared
    E, Im = cfg.num_experts, cfg.moe_intermediate_size
    if cfg.enable_moe_block:
        a.moe = {"num_experts": E, "top_k": cfg.top_k_experts, "moe_intermediate_size": Im}
    a.add("embed_tokens.weight", (V, D), "embedding")
    for i in range(L):
        h, nkv = cfg.head_dims[i], cfg.kv_heads[i]
        has_kv = i < first_shared
        pre = f"layers.{i}.self_attn"
        a.add(f"{pre}.q_proj.weight", (H * h, D), "linear", i)
        # KV-shared layers reuse an earlier layer's K/V: their k/v projections may be absent
        a.add(f"{pre}.k_proj.weight", (nkv * h, D), "linear", i, optional=not has_kv, ignored_if_present=not has_kv)
        if not cfg.k_eq_v(i):
            a.add(f"{pre}.v_proj.weight", (nkv * h, D), "linear", i, optional=not has_kv,
                  ignored_if_present=not has_kv)
        a.add(f"{pre}.o_proj.weight", (D, H * h), "linear", i)
        a.add(f"{pre}.q_norm.weight", (h,), "norm", i)
        a.add(f"{pre}.k_norm.weight", (h,), "norm", i, optional=not has_kv, ignored_if_present=not has_kv)
        Ii = I * (2 if (cfg.use_double_wide_mlp and i >= first_shared > 0) else 1)
        F.mlp_tensors(a, i, D, Ii)
        F.norm_tensors(a, i, D, ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                                 "post_feedforward_layernorm"))
        if cfg.enable_moe_block:
            a.add(f"layers.{i}.router.proj.weight", (E, D), "linear", i)
            a.add(f"layers.{i}.router.scale", (D,), "vector", i)
            a.add(f"layers.{i}.router.per_expert_scale", (E,), "vector", i)
            a.add(f"layers.{i}.experts.switch_glu.gate_proj.weight", (E, Im, D), "experts", i)
            a.add(f"layers.{i}.experts.switch_glu.up_proj.weight", (E, Im, D), "experts", i)
            a.add(f"layers.{i}.experts.switch_glu.down_proj.weight", (E, D, Im), "experts", i)
            F.norm_tensors(a, i, D, ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                                     "pre_feedforward_layernorm_2"))
        if P:
            a.add(f"layers.{i}.per_layer_input_gate.weight", (P, D), "linear", i)
            a.add(f"layers.{i}.per_layer_projection.weight", (D, P), "linear", i)
            a.add(f"layers.{i}.post_per_layer_input_norm.weight", (D,), "norm", i)
        a.add(f"layers.{i}.layer_scalar", (1,), "scalar", i)
    a.add("norm.weight", (D,), "norm")
    if P:
        a.add("embed_tokens_per_layer.weight", (cfg.vocab_size_per_layer_input, L * P), "embedding")
        a.add("per_layer_model_projection.weight", (L * P, D), "linear")
        a.add("per_layer_projection_norm.weight", (P,), "norm")
    if not cfg.tie_word_embeddings:
        a.add("lm_head.weight", (V, D), "linear")
