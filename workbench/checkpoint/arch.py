"""Architecture knowledge: from config.json, the tensors a sound checkpoint holds.

For every supported family the expected language-model tensors are listed per layer
with their float shapes (quantization is applied on top, see quant.py), written from the
reference implementations (mlx-lm's models/gemma4_text.py, gemma3_text.py, qwen3.py,
llama.py).  Defaults for fields a config.json may omit follow the same reference.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from workbench import registry

#: config model_type -> family of the hand-written tables below (one registry: workbench.registry);
#: any other type's expected tensors come from its reference model (reference_arch.py)
FAMILIES = registry.TABLE_FAMILIES
#: families whose RMSNorm computes x * (1 + w): their neutral norm weight is 0
ZERO_CENTRED_NORMS = {"gemma3_text"}


class ConfigError(ValueError):
    """config.json does not describe a usable model (message names the field)."""


@dataclass(frozen=True)
class Expected:
    name: str              # canonical tensor name
    shape: tuple           # float shape
    kind: str              # linear | embedding | experts | norm | vector | scalar
    layer: int | None = None
    optional: bool = False  # may be absent (KV-shared k/v, tied lm_head, ...)
    ignored_if_present: bool = False  # loaders drop it when present (not unexpected)

    @property
    def module(self) -> str:
        return self.name.rsplit(".", 1)[0]

    @property
    def quantizable(self) -> bool:
        return self.kind in ("linear", "embedding", "experts")


@dataclass
class Arch:
    family: str
    config: dict          # the text config
    num_layers: int
    expected: dict = field(default_factory=dict)  # canonical name -> Expected
    layer_types: list = field(default_factory=list)
    moe: dict | None = None
    neutral_norm: float = 1.0
    tied: bool = True

    def add(self, name, shape, kind, layer=None, **kw):
        self.expected[name] = Expected(name, tuple(int(s) for s in shape), kind, layer, **kw)

    def modules(self) -> dict:
        """quantizable module path -> Expected of its weight."""
        return {e.module: e for e in self.expected.values() if e.quantizable and e.name.endswith(".weight")}


def text_config(config: dict) -> dict:
    tc = config.get("text_config")
    return tc if isinstance(tc, dict) else config


def family_of(config: dict) -> str | None:
    return registry.table_family(config)


def _from_reference(config: dict) -> Arch:
    """Expected tensors of a model type with no table here: the reference model's own
    parameters (reference_arch.py)."""
    from workbench.checkpoint import reference_arch as R

    try:
        r = R.reference_tensors(config)
    except R.ConfigError as e:
        raise ConfigError(str(e)) from None
    tc = text_config(config)
    lt = tc.get("layer_types")
    a = Arch(r.family, dict(tc), r.num_layers, layer_types=list(lt) if isinstance(lt, list) else [], tied=r.tied,
             moe=r.moe)
    for t in r.tensors.values():
        a.add(t.name, t.shape, t.kind, t.layer, optional=t.optional, ignored_if_present=t.ignored_if_present)
    return a


#: sanity caps: a config beyond them describes no real model (and must not make us hang)
_CAPS = {"num_hidden_layers": 10_000, "num_experts": 100_000}
_CAP = 1 << 31


def _int(cfg, key, default=None, *, positive=True, allow_none=False):
    v = cfg.get(key, default)
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or (v <= 0 if positive else v < 0):
        if v is None:
            raise ConfigError(f"config.json: required field {key!r} is missing")
        raise ConfigError(f"config.json: field {key!r} must be a {'positive' if positive else 'non-negative'} "
                          f"integer, got {v!r}")
    if v > _CAPS.get(key, _CAP):
        raise ConfigError(f"config.json: field {key!r} = {v} is implausibly large")
    return v


def build_arch(config: dict) -> Arch:
    """Expected tensors for a config.json dict. Raises ConfigError (bad-config)."""
    if not isinstance(config, dict):
        raise ConfigError("config.json is not a JSON object")
    fam = family_of(config)
    if not isinstance(config.get("model_type"), str):
        raise ConfigError("config.json: required field 'model_type' is missing or not a string")
    if fam is None:
        return _from_reference(config)
    tc = dict(text_config(config))
    if isinstance(config.get("text_config"), dict):
        # multimodal wrappers (mlx-lm gemma3.py / gemma4.py): the top-level vocab_size wins,
        # and head counts a Hugging Face config omits take the wrapper's defaults
        mt = config.get("model_type")
        if mt == "gemma3":
            tc["vocab_size"] = config.get("vocab_size", 262208)
            tc.setdefault("num_attention_heads", 8)
            tc.setdefault("num_key_value_heads", 4)
        elif mt == "gemma4":
            tc["vocab_size"] = config.get("vocab_size", 262144)
            tc.setdefault("num_attention_heads", 8)
            tc.setdefault("num_key_value_heads", 1)
        elif "vocab_size" in config and "vocab_size" not in tc:
            tc["vocab_size"] = config["vocab_size"]
    if fam == "gemma4_text":
        return _gemma4(tc)
    if fam == "gemma3_text":
        return _gemma3(tc)
    if fam == "gemma3n":
        return _gemma3n(tc)
    return _dense(fam, tc)


def _common(tc, fam):
    D = _int(tc, "hidden_size")
    L = _int(tc, "num_hidden_layers")
    H = _int(tc, "num_attention_heads")
    V = _int(tc, "vocab_size")
    return D, L, H, V


def _attn_norms(a, i, D, names):
    for n in names:
        a.add(f"layers.{i}.{n}.weight", (D,), "norm", i)


def _attention(a, i, D, H, kvh, hd, *, qk_norm: bool, bias: bool = False):
    """q/k/v/o projections of layer i (with their biases, and q_norm/k_norm, when asked)."""
    pre = f"layers.{i}.self_attn"
    for n, shp in (("q_proj", (H * hd, D)), ("k_proj", (kvh * hd, D)), ("v_proj", (kvh * hd, D)),
                   ("o_proj", (D, H * hd))):
        a.add(f"{pre}.{n}.weight", shp, "linear", i)
        if bias:
            a.add(f"{pre}.{n}.bias", (shp[0],), "vector", i)
    if qk_norm:
        a.add(f"{pre}.q_norm.weight", (hd,), "norm", i)
        a.add(f"{pre}.k_norm.weight", (hd,), "norm", i)


def _mlp(a, i, D, I, *, bias: bool = False):
    """gate/up/down projections of layer i's dense MLP."""
    for n, shp in (("gate_proj", (I, D)), ("up_proj", (I, D)), ("down_proj", (D, I))):
        a.add(f"layers.{i}.mlp.{n}.weight", shp, "linear", i)
        if bias:
            a.add(f"layers.{i}.mlp.{n}.bias", (shp[0],), "vector", i)


def _gemma4(tc) -> Arch:
    D = _int(tc, "hidden_size")
    L = _int(tc, "num_hidden_layers")
    H = _int(tc, "num_attention_heads")
    V = _int(tc, "vocab_size")
    I = _int(tc, "intermediate_size", 6144)
    hd = _int(tc, "head_dim", 256)
    ghd = tc.get("global_head_dim", 512)
    kvh = _int(tc, "num_key_value_heads", 1)
    gkvh = _int(tc, "num_global_key_value_heads", None, allow_none=True)
    nshared = _int(tc, "num_kv_shared_layers", 20, positive=False)
    P = _int(tc, "hidden_size_per_layer_input", 256, positive=False, allow_none=True) or 0
    Vp = _int(tc, "vocab_size_per_layer_input", 262144, allow_none=True) or V
    k_eq_v = bool(tc.get("attention_k_eq_v", False))
    double = bool(tc.get("use_double_wide_mlp", True))
    moe = bool(tc.get("enable_moe_block", False))
    tied = bool(tc.get("tie_word_embeddings", True))
    lt = tc.get("layer_types")
    if lt is None:
        pat = _int(tc, "sliding_window_pattern", 5)
        p = ["sliding_attention"] * (pat - 1) + ["full_attention"]
        lt = (p * (L // len(p) + 1))[:L]
    if not isinstance(lt, list) or len(lt) != L or any(t not in ("sliding_attention", "full_attention") for t in lt):
        raise ConfigError(f"config.json: layer_types must list {L} entries of sliding_attention/full_attention")
    if nshared > L:
        raise ConfigError(f"config.json: num_kv_shared_layers {nshared} > num_hidden_layers {L}")
    a = Arch("gemma4_text", tc, L, layer_types=list(lt), neutral_norm=1.0, tied=tied)
    if moe:
        E = _int(tc, "num_experts")
        Im = _int(tc, "moe_intermediate_size")
        a.moe = {"num_experts": E, "top_k": tc.get("top_k_experts"), "moe_intermediate_size": Im}
    first_shared = L - nshared
    a.add("embed_tokens.weight", (V, D), "embedding")
    for i in range(L):
        full = lt[i] == "full_attention"
        h = ghd if (full and ghd) else hd
        use_kev = k_eq_v and full
        nkv = gkvh if (use_kev and gkvh is not None) else kvh
        has_kv = i < first_shared
        pre = f"layers.{i}.self_attn"
        a.add(f"{pre}.q_proj.weight", (H * h, D), "linear", i)
        # KV-shared layers reuse an earlier layer's K/V: their k/v projections may be absent
        a.add(f"{pre}.k_proj.weight", (nkv * h, D), "linear", i, optional=not has_kv, ignored_if_present=not has_kv)
        if not use_kev:
            a.add(f"{pre}.v_proj.weight", (nkv * h, D), "linear", i, optional=not has_kv,
                  ignored_if_present=not has_kv)
        a.add(f"{pre}.o_proj.weight", (D, H * h), "linear", i)
        a.add(f"{pre}.q_norm.weight", (h,), "norm", i)
        a.add(f"{pre}.k_norm.weight", (h,), "norm", i, optional=not has_kv, ignored_if_present=not has_kv)
        Ii = I * (2 if (double and i >= first_shared > 0) else 1)
        a.add(f"layers.{i}.mlp.gate_proj.weight", (Ii, D), "linear", i)
        a.add(f"layers.{i}.mlp.up_proj.weight", (Ii, D), "linear", i)
        a.add(f"layers.{i}.mlp.down_proj.weight", (D, Ii), "linear", i)
        _attn_norms(a, i, D, ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                              "post_feedforward_layernorm"))
        if moe:
            a.add(f"layers.{i}.router.proj.weight", (E, D), "linear", i)
            a.add(f"layers.{i}.router.scale", (D,), "vector", i)
            a.add(f"layers.{i}.router.per_expert_scale", (E,), "vector", i)
            a.add(f"layers.{i}.experts.switch_glu.gate_proj.weight", (E, Im, D), "experts", i)
            a.add(f"layers.{i}.experts.switch_glu.up_proj.weight", (E, Im, D), "experts", i)
            a.add(f"layers.{i}.experts.switch_glu.down_proj.weight", (E, D, Im), "experts", i)
            _attn_norms(a, i, D, ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                                  "pre_feedforward_layernorm_2"))
        if P:
            a.add(f"layers.{i}.per_layer_input_gate.weight", (P, D), "linear", i)
            a.add(f"layers.{i}.per_layer_projection.weight", (D, P), "linear", i)
            a.add(f"layers.{i}.post_per_layer_input_norm.weight", (D,), "norm", i)
        a.add(f"layers.{i}.layer_scalar", (1,), "scalar", i)
    a.add("norm.weight", (D,), "norm")
    if P:
        a.add("embed_tokens_per_layer.weight", (Vp, L * P), "embedding")
        a.add("per_layer_model_projection.weight", (L * P, D), "linear")
        a.add("per_layer_projection_norm.weight", (P,), "norm")
    if not tied:
        a.add("lm_head.weight", (V, D), "linear")
    return a


def _gemma3(tc) -> Arch:
    D = _int(tc, "hidden_size")
    L = _int(tc, "num_hidden_layers")
    H = _int(tc, "num_attention_heads", 4)
    V = _int(tc, "vocab_size", 262144)
    I = _int(tc, "intermediate_size", 6912)
    hd = _int(tc, "head_dim", 256)
    kvh = _int(tc, "num_key_value_heads", 1)
    pat = _int(tc, "sliding_window_pattern", 6)
    lt = ["full_attention" if (i % pat == pat - 1) else "sliding_attention" for i in range(L)]
    a = Arch("gemma3_text", tc, L, layer_types=lt, neutral_norm=0.0, tied=True)
    a.add("embed_tokens.weight", (V, D), "embedding")
    for i in range(L):
        _attention(a, i, D, H, kvh, hd, qk_norm=True)
        _mlp(a, i, D, I)
        _attn_norms(a, i, D, ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                              "post_feedforward_layernorm"))
    a.add("norm.weight", (D,), "norm")
    # mlx-lm: an lm_head present is used; absent means tied to embed_tokens
    a.add("lm_head.weight", (V, D), "linear", optional=True)
    return a


def _dense(fam, tc) -> Arch:
    D, L, H, V = _common(tc, fam)
    I = _int(tc, "intermediate_size")
    kvh = _int(tc, "num_key_value_heads", H)
    hd = _int(tc, "head_dim", None, allow_none=True) or D // H
    tied = bool(tc.get("tie_word_embeddings", fam == "llama"))
    a = Arch(fam, tc, L, layer_types=list(tc.get("layer_types") or ["full_attention"] * L),
             neutral_norm=1.0, tied=tied)
    abias = fam == "llama" and bool(tc.get("attention_bias", False))
    mbias = fam == "llama" and bool(tc.get("mlp_bias", False))
    a.add("embed_tokens.weight", (V, D), "embedding")
    for i in range(L):
        _attention(a, i, D, H, kvh, hd, qk_norm=fam == "qwen3", bias=abias)
        _mlp(a, i, D, I, bias=mbias)
        _attn_norms(a, i, D, ("input_layernorm", "post_attention_layernorm"))
    a.add("norm.weight", (D,), "norm")
    # tied: mlx-lm's sanitize drops an lm_head that is present anyway
    a.add("lm_head.weight", (V, D), "linear", optional=tied, ignored_if_present=tied)
    return a


def _gemma3n(tc) -> Arch:
    """Gemma 3n (mlx-lm models/gemma3n.py): AltUp, LAuReL, per-layer inputs; every layer
    keeps its k/v projections; per-layer intermediate sizes may be a list."""
    D = _int(tc, "hidden_size")
    L = _int(tc, "num_hidden_layers")
    H = _int(tc, "num_attention_heads")
    V = _int(tc, "vocab_size")
    hd = _int(tc, "head_dim")
    kvh = _int(tc, "num_key_value_heads")
    P = _int(tc, "hidden_size_per_layer_input")
    Vp = _int(tc, "vocab_size_per_layer_input")
    n = _int(tc, "altup_num_inputs")
    r = _int(tc, "laurel_rank")
    Is = tc.get("intermediate_size")
    if isinstance(Is, list):
        if len(Is) != L or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in Is):
            raise ConfigError(f"config.json: intermediate_size must list {L} positive integers")
    else:
        Is = [_int(tc, "intermediate_size")] * L
    lt = tc.get("layer_types")
    if not isinstance(lt, list) or len(lt) != L or any(t not in ("sliding_attention", "full_attention") for t in lt):
        raise ConfigError(f"config.json: layer_types must list {L} entries of sliding_attention/full_attention")
    a = Arch("gemma3n", tc, L, layer_types=list(lt), neutral_norm=1.0, tied=True)
    a.add("embed_tokens.weight", (V, D), "embedding")
    for i in range(L):
        _attention(a, i, D, H, kvh, hd, qk_norm=True)
        _mlp(a, i, D, Is[i])
        _attn_norms(a, i, D, ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                              "post_feedforward_layernorm", "post_per_layer_input_norm"))
        a.add(f"layers.{i}.altup.correct_output_scale", (D,), "vector", i)
        a.add(f"layers.{i}.altup.correction_coefs.weight", (n, n), "linear", i)
        a.add(f"layers.{i}.altup.prediction_coefs.weight", (n * n, n), "linear", i)
        a.add(f"layers.{i}.altup.modality_router.weight", (n, D), "linear", i)
        a.add(f"layers.{i}.altup.router_norm.weight", (D,), "norm", i)
        a.add(f"layers.{i}.laurel.linear_left.weight", (r, D), "linear", i)
        a.add(f"layers.{i}.laurel.linear_right.weight", (D, r), "linear", i)
        a.add(f"layers.{i}.laurel.post_laurel_norm.weight", (D,), "norm", i)
        a.add(f"layers.{i}.per_layer_input_gate.weight", (P, D), "linear", i)
        a.add(f"layers.{i}.per_layer_projection.weight", (D, P), "linear", i)
    a.add("embed_tokens_per_layer.weight", (Vp, L * P), "embedding")
    a.add("per_layer_model_projection.weight", (L * P, D), "linear")
    a.add("per_layer_projection_norm.weight", (P,), "norm")
    for j in range(n - 1):
        a.add(f"altup_projections.{j}.weight", (D, D), "linear")
        a.add(f"altup_unembed_projections.{j}.weight", (D, D), "linear")
    a.add("norm.weight", (D,), "norm")
    return a
