"""Architecture knowledge: what a config.json means, and the tensors a sound checkpoint holds.

Reading a config (:func:`build_arch`) is the same for ``inspect`` and ``workbench.load``:

* every key of the (text) config is either read by the family, or knowingly ignored
  (``KEYS``: provenance, token ids, generation settings ...), or read only at the values
  the family implements (``hidden_act: silu``); any other key or value changes the numbers
  in a way we do not implement and is a :class:`ConfigError` naming it, never a default;
* every form the reference implementations write is read: transformers >= 5
  ``rope_parameters`` (flat, or per layer type for Gemma 3 / 4) and Gemma 4's
  ``per_layer_config``, the older flat keys (``rope_theta``, ``rope_scaling``,
  ``rope_local_base_freq``, ``global_head_dim``), nested ``text_config`` and multimodal
  wrappers with or without a top-level ``vocab_size``;
* numbers are range-checked before anything is allocated (no booleans for counts,
  positive finite eps / theta / factors, implausible sizes refused);
* the result, :class:`Arch`, carries ``spec``: the normalised values the op program is
  built from (workbench/models/), and ``expected``: every language-model tensor with its
  float shape (quantization is applied on top, see quant.py).

The tensor lists follow the reference implementations (mlx-lm's models/gemma4_text.py,
gemma3_text.py, qwen3.py, llama.py; transformers' for what mlx-lm does not read); defaults
for keys a config.json may omit follow mlx-lm, and where the references disagree on a
default the key is required.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from workbench import registry
from workbench.checkpoint.reference_config import COMMON_IGNORED  # (one list for both granularities)

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
    spec: dict = field(default_factory=dict)  # normalised values the op program is built from

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


# ---------------------------------------------------------------------- config keys

@dataclass(frozen=True)
class Keys:
    """What a family does with each config.json key: ``handled`` keys are read (and
    range-checked), ``ignored`` ones do not change its numbers, ``only`` keys are read at
    the listed values alone (any other value would change the numbers in a way the family
    does not implement).  Any other key is refused by name."""

    handled: frozenset
    ignored: frozenset = frozenset()
    only: dict = field(default_factory=dict)


_ROPE_KEYS = {"rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings"}
_DENSE = {"hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "num_key_value_heads",
          "head_dim", "rms_norm_eps", "vocab_size", "tie_word_embeddings", "layer_types", "sliding_window",
          "use_sliding_window", "max_window_layers", "attention_bias"} | _ROPE_KEYS

KEYS = {
    "llama": Keys(  # llama, mistral, qwen2
        handled=frozenset(_DENSE | {"mlp_bias", "rope_traditional"}),
        ignored=frozenset({"pretraining_tp"}),  # tensor-parallel slicing of the same products
        only={"hidden_act": ("silu",), "partial_rotary_factor": (1.0,)}),
    "qwen3": Keys(
        handled=frozenset(_DENSE),
        only={"hidden_act": ("silu",), "partial_rotary_factor": (1.0,)}),
    "gemma3_text": Keys(
        handled=frozenset({"hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                           "num_key_value_heads", "head_dim", "rms_norm_eps", "vocab_size", "rope_local_base_freq",
                           "query_pre_attn_scalar", "sliding_window", "sliding_window_pattern", "layer_types",
                           "final_logit_softcapping", "tie_word_embeddings"} | _ROPE_KEYS),
        # transformers writes the pattern it derived from sliding_window_pattern, and reads it back from there
        ignored=frozenset({"_sliding_window_pattern"}),
        only={"hidden_activation": ("gelu_pytorch_tanh",), "hidden_act": ("gelu_pytorch_tanh",),
              "attn_logit_softcapping": (None,), "use_bidirectional_attention": (False, None),
              "attention_bias": (False,)}),
    "gemma4_text": Keys(
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
              "partial_rotary_factor": (1.0,), "rope_traditional": (False,)}),
}
#: keys a multimodal wrapper (the config around text_config) may hold that the text model reads
WRAPPER_HANDLED = frozenset({"model_type", "text_config", "vocab_size", "tie_word_embeddings",
                             "quantization", "quantization_config"})


def _same(v, allowed) -> bool:
    return any(v is a if (a is None or isinstance(a, bool) or isinstance(v, bool)) else
               (isinstance(v, type(a)) or (isinstance(v, (int, float)) and isinstance(a, (int, float)))) and v == a
               for a in allowed)


def _show(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def check_keys(tc: dict, family: str) -> None:
    """Refuse (ConfigError naming it) every key of the text config that ``family`` neither
    reads nor knowingly ignores, and every ``only`` key at a value it does not implement."""
    k = KEYS.get(family)
    if k is None:  # inspect-only families: only the keys their tensor shapes need are read
        return
    for key in tc:
        if not isinstance(key, str):
            raise ConfigError(f"config.json: key {_show(key)} is not a string")
        if key in k.only:
            if not _same(tc[key], k.only[key]):
                ok = " or ".join(_show(a) for a in k.only[key])
                raise ConfigError(f"config.json: {key} = {_show(tc[key])} changes the numbers and is not handled "
                                  f"by {family} (handled: {ok})")
        elif key not in k.handled and key not in k.ignored and key not in COMMON_IGNORED:
            raise ConfigError(f"config.json: key {key!r} is not handled by {family}: refusing rather than guessing "
                              "whether it changes the numbers")


# ---------------------------------------------------------------------- numbers

#: sanity caps: a config beyond them describes no real model (and must not make us hang or allocate)
_CAPS = {"num_hidden_layers": 10_000, "num_experts": 100_000, "head_dim": 65_536, "global_head_dim": 65_536,
         "num_attention_heads": 65_536, "num_key_value_heads": 65_536, "num_global_key_value_heads": 65_536}
_CAP = 1 << 31


def _int(cfg, key, default=None, *, positive=True, allow_none=False, where=None):
    v = cfg.get(key, default)
    if v is None and allow_none:
        return None
    name = where or key
    if isinstance(v, bool) or not isinstance(v, int) or (v <= 0 if positive else v < 0):
        if v is None:
            raise ConfigError(f"config.json: required field {name!r} is missing")
        raise ConfigError(f"config.json: field {name!r} must be a {'positive' if positive else 'non-negative'} "
                          f"integer, got {_show(v)}")
    if v > _CAPS.get(key, _CAP):
        raise ConfigError(f"config.json: field {name!r} = {v} is implausibly large")
    return v


def _float(cfg, key, default=None, *, allow_none=False, where=None, minimum=0.0, inclusive=False,
           maximum=1e12):
    """A finite number > minimum (>= with ``inclusive``) and <= maximum; booleans and strings refused."""
    v = cfg.get(key, default)
    if v is None and allow_none:
        return None
    name = where or key
    if v is None:
        raise ConfigError(f"config.json: required field {name!r} is missing")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
            (v < minimum if inclusive else v <= minimum):
        raise ConfigError(f"config.json: field {name!r} must be a finite number {'>=' if inclusive else '>'} "
                          f"{minimum:g}, got {_show(v)}")
    if v > maximum:
        raise ConfigError(f"config.json: field {name!r} = {v:g} is implausibly large (at most {maximum:g})")
    return float(v)


def _bool(cfg, key, default):
    v = cfg.get(key, default)
    if v is None:
        v = default
    if not isinstance(v, bool):
        raise ConfigError(f"config.json: field {key!r} must be true or false, got {_show(v)}")
    return v


_LAYER_TYPES = ("sliding_attention", "full_attention")


def _layer_types(tc, L, default):
    lt = tc.get("layer_types")
    if lt is None:
        return list(default)
    if not isinstance(lt, list) or len(lt) != L or any(not isinstance(t, str) or t not in _LAYER_TYPES for t in lt):
        raise ConfigError(f"config.json: layer_types must list {L} entries of sliding_attention/full_attention")
    return list(lt)


# ---------------------------------------------------------------------- RoPE

#: rope type -> its parameters besides rope_type / rope_theta (transformers' RopeParameters)
ROPE_TYPES = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
             "mscale", "mscale_all_dim", "truncate"),
    "proportional": ("factor", "partial_rotary_factor"),
}


def read_rope(p, where: str, theta_default=None) -> dict:
    """One rope_parameters / rope_scaling dict, normalised to what the op program needs:
    ``{"rope_type", "rope_theta", ...}`` with every parameter of the type present and
    checked.  Parameters whose default the references disagree on are required."""
    if not isinstance(p, dict):
        raise ConfigError(f"config.json: {where} must be an object, got {_show(p)}")
    t = p.get("rope_type", p.get("type", "default"))
    if "type" in p and "rope_type" in p and p["type"] != p["rope_type"]:
        raise ConfigError(f"config.json: {where} has rope_type {_show(p['rope_type'])} and type {_show(p['type'])}")
    if not isinstance(t, str) or t not in ROPE_TYPES:
        raise ConfigError(f"config.json: {where}.rope_type {_show(t)} is not handled (handled: "
                          f"{', '.join(ROPE_TYPES)})")
    for key in p:
        if key not in ("rope_type", "type", "rope_theta", "partial_rotary_factor") + ROPE_TYPES[t]:
            raise ConfigError(f"config.json: {where}.{key} is not handled for rope type {t!r}")
    out = {"rope_type": t, "rope_theta": _float(p, "rope_theta", theta_default, where=f"{where}.rope_theta",
                                                minimum=1.0)}
    prf = _float(p, "partial_rotary_factor", 1.0, where=f"{where}.partial_rotary_factor")
    if t == "proportional":
        if prf > 1.0:
            raise ConfigError(f"config.json: {where}.partial_rotary_factor must be in (0, 1], got {prf:g}")
        out["partial_rotary_factor"] = prf
        out["factor"] = _float(p, "factor", 1.0, where=f"{where}.factor")
    elif prf != 1.0:
        raise ConfigError(f"config.json: {where}.partial_rotary_factor = {prf:g} is not handled for rope type {t!r} "
                          "(only 1.0: every dimension rotates)")
    if t in ("linear", "llama3", "yarn"):
        out["factor"] = _float(p, "factor", where=f"{where}.factor")
    if t == "llama3":
        for k in ("low_freq_factor", "high_freq_factor"):
            out[k] = _float(p, k, where=f"{where}.{k}")
        if out["high_freq_factor"] <= out["low_freq_factor"]:
            raise ConfigError(f"config.json: {where}.high_freq_factor must exceed low_freq_factor")
    if t in ("llama3", "yarn"):
        out["original_max_position_embeddings"] = _int(p, "original_max_position_embeddings",
                                                       where=f"{where}.original_max_position_embeddings")
    if t == "yarn":
        out["attention_factor"] = _float(p, "attention_factor", allow_none=True, where=f"{where}.attention_factor")
        # (rotations: YaRN's correction dims take their log, so far below one is no real model)
        out["beta_fast"] = _float(p, "beta_fast", 32.0, where=f"{where}.beta_fast", minimum=1e-6, maximum=1e6)
        out["beta_slow"] = _float(p, "beta_slow", 1.0, where=f"{where}.beta_slow", minimum=1e-6, maximum=1e6)
        for k in ("mscale", "mscale_all_dim"):
            out[k] = _float(p, k, allow_none=True, inclusive=True, where=f"{where}.{k}")
        out["truncate"] = _bool(p, "truncate", True)
    return out


def _rope_flat(tc, theta_default) -> dict:
    """Llama / Qwen: ``rope_parameters`` (transformers >= 5) or ``rope_theta`` + ``rope_scaling``
    (older); both may be present when they agree.  The same RoPE for every layer type."""
    rp, rs, theta = tc.get("rope_parameters"), tc.get("rope_scaling"), tc.get("rope_theta")
    forms = []
    if rp is not None:
        forms.append(("rope_parameters", dict(rp) if isinstance(rp, dict) else rp))
    if rs is not None or rp is None:
        if rs is not None and not isinstance(rs, dict):
            raise ConfigError(f"config.json: rope_scaling must be an object, got {_show(rs)}")
        forms.append(("rope_scaling", dict(rs or {})))
    read = []
    for where, p in forms:
        if isinstance(p, dict) and theta is not None and "rope_theta" not in p:
            p["rope_theta"] = theta
        read.append(read_rope(p, where, theta_default))
    if isinstance(rp, dict) and theta is not None and "rope_theta" in rp and rp["rope_theta"] != theta:
        raise ConfigError(f"config.json: rope_theta = {_show(theta)} and rope_parameters.rope_theta = "
                          f"{_show(rp['rope_theta'])} disagree")
    if len(read) == 2 and read[0] != read[1]:
        raise ConfigError("config.json: rope_parameters and rope_scaling describe different RoPE")
    return {"full_attention": read[0], "sliding_attention": read[0]}


def _rope_by_type(tc, defaults: dict, where="rope_parameters") -> dict:
    """Gemma 3 / 4: ``rope_parameters.{full_attention, sliding_attention}``."""
    rp = tc.get("rope_parameters")
    if rp is None:
        rp = {}
    if not isinstance(rp, dict):
        raise ConfigError(f"config.json: {where} must be an object, got {_show(rp)}")
    for key in rp:
        if key not in _LAYER_TYPES:
            raise ConfigError(f"config.json: {where}.{key} is not handled: this family takes RoPE per layer type "
                              "(rope_parameters.full_attention / .sliding_attention)")
    out = {}
    for lt in _LAYER_TYPES:
        p = rp.get(lt, defaults[lt])
        if p is None:
            raise ConfigError(f"config.json: {where}.{lt} is null (a layer type without RoPE is not handled)")
        out[lt] = dict(p) if isinstance(p, dict) else p
    return out


# ---------------------------------------------------------------------- entry

def build_arch(config: dict) -> Arch:
    """Read a config.json dict: its normalised ``spec`` and expected tensors. Raises
    ConfigError (bad-config) naming the key."""
    if not isinstance(config, dict):
        raise ConfigError("config.json is not a JSON object")
    fam = family_of(config)
    if not isinstance(config.get("model_type"), str):
        raise ConfigError("config.json: required field 'model_type' is missing or not a string")
    if fam is None:
        return _from_reference(config)
    tc = dict(text_config(config))
    if isinstance(config.get("text_config"), dict):
        # multimodal wrappers: the top-level vocab_size (mlx-lm) or the text config's (transformers,
        # which writes none at the top), else mlx-lm's wrapper default; head counts a Hugging Face
        # config omits take the wrapper's defaults (mlx-lm gemma3.py / gemma4.py)
        top, inner = config.get("vocab_size"), tc.get("vocab_size")
        if top is not None and inner is not None and top != inner:
            raise ConfigError(f"config.json: vocab_size = {_show(top)} and text_config.vocab_size = {_show(inner)} "
                              "disagree")
        mt = config.get("model_type")
        default_vocab = {"gemma3": 262208, "gemma4": 262144}.get(mt)
        vocab = top if top is not None else inner if inner is not None else default_vocab
        if vocab is not None:
            tc["vocab_size"] = vocab
        if mt == "gemma3":
            tc.setdefault("num_attention_heads", 8)
            tc.setdefault("num_key_value_heads", 4)
        elif mt == "gemma4":
            tc.setdefault("num_attention_heads", 8)
            tc.setdefault("num_key_value_heads", 1)
        tie_top, tie_in = config.get("tie_word_embeddings"), tc.get("tie_word_embeddings")
        if tie_top is not None and tie_in is not None and tie_top != tie_in:
            raise ConfigError(f"config.json: tie_word_embeddings = {_show(tie_top)} and "
                              f"text_config.tie_word_embeddings = {_show(tie_in)} disagree")
        if tie_in is None and tie_top is not None:
            tc["tie_word_embeddings"] = tie_top
    check_keys(tc, fam)
    if fam == "gemma4_text":
        return _gemma4(tc)
    if fam == "gemma3_text":
        return _gemma3(tc)
    if fam == "gemma3n":
        return _gemma3n(tc)
    return _dense(fam, tc)


def _attn_norms(a, i, D, names):
    for n in names:
        a.add(f"layers.{i}.{n}.weight", (D,), "norm", i)


def _attention(a, i, D, H, kvh, hd, *, qk_norm: bool, bias: bool = False, o_bias: bool | None = None):
    """q/k/v/o projections of layer i (with their biases, and q_norm/k_norm, when asked)."""
    pre = f"layers.{i}.self_attn"
    o_bias = bias if o_bias is None else o_bias
    for n, shp in (("q_proj", (H * hd, D)), ("k_proj", (kvh * hd, D)), ("v_proj", (kvh * hd, D)),
                   ("o_proj", (D, H * hd))):
        a.add(f"{pre}.{n}.weight", shp, "linear", i)
        if bias if n != "o_proj" else o_bias:
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


def _heads(H, kvh, where):
    if H % kvh:
        raise ConfigError(f"config.json: num_attention_heads {H} is not a multiple of {where} {kvh}")


def _even(hd, where):
    if hd % 2:
        raise ConfigError(f"config.json: {where} = {hd} is odd (RoPE rotates pairs of dimensions)")


# ---------------------------------------------------------------------- Gemma 4

_G4_ROPE = {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}


def _per_layer(tc, L, lt, hd, kvh, k_eq_v):
    """Per-layer head_dim and KV-head count: transformers >= 5 writes ``per_layer_config``
    (``{"3": {"head_dim": 512, "num_key_value_heads": 4}}``, full layers only); older configs
    ``global_head_dim`` / ``num_global_key_value_heads`` for the full layers."""
    plc = tc.get("per_layer_config")
    hds, kvs = [hd] * L, [kvh] * L
    if plc is None:
        ghd = _int(tc, "global_head_dim", 512, allow_none=True)
        gkv = _int(tc, "num_global_key_value_heads", None, allow_none=True)
        for i in range(L):
            if lt[i] == "full_attention":
                hds[i] = ghd or hd
                if k_eq_v and gkv is not None:
                    kvs[i] = gkv
        return hds, kvs
    if not isinstance(plc, dict):
        raise ConfigError(f"config.json: per_layer_config must be an object, got {_show(plc)}")
    for key, over in plc.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < L):
            raise ConfigError(f"config.json: per_layer_config key {_show(key)} is not a layer index below {L}")
        if not isinstance(over, dict):
            raise ConfigError(f"config.json: per_layer_config.{key} must be an object, got {_show(over)}")
        i = int(key)
        for k in over:
            if k not in ("head_dim", "num_key_value_heads"):
                raise ConfigError(f"config.json: per_layer_config.{key}.{k} is not handled (per layer: head_dim, "
                                  "num_key_value_heads)")
        hds[i] = _int(over, "head_dim", hd, where=f"per_layer_config.{key}.head_dim")
        kvs[i] = _int(over, "num_key_value_heads", kvh, where=f"per_layer_config.{key}.num_key_value_heads")
    # the older keys may stand beside per_layer_config only when they agree with it
    for key, vals in (("global_head_dim", hds), ("num_global_key_value_heads", kvs)):
        v = tc.get(key)
        if v is not None and any(vals[i] != v for i in range(L) if lt[i] == "full_attention") and \
                (key == "global_head_dim" or k_eq_v):
            raise ConfigError(f"config.json: {key} = {_show(v)} disagrees with per_layer_config")
    return hds, kvs


def _stated(tc, key, mlx_default, hf_default, unless=False):
    """``tc`` itself, when it gives ``key`` or ``unless`` (the key has no effect); otherwise a
    ConfigError: mlx-lm and transformers read a missing ``key`` differently (``mlx_default`` /
    ``hf_default``), so a config without it does not say which model it is."""
    if key in tc or unless:
        return tc
    raise ConfigError(f"config.json has no {key}: transformers reads {_show(hf_default)} there, mlx-lm "
                      f"{_show(mlx_default)}; add the one this checkpoint was trained with")


def _gemma4(tc) -> Arch:
    D = _int(tc, "hidden_size")
    L = _int(tc, "num_hidden_layers")
    H = _int(tc, "num_attention_heads")
    V = _int(tc, "vocab_size")
    I = _int(tc, "intermediate_size", 6144)
    hd = _int(tc, "head_dim", 256)
    kvh = _int(tc, "num_key_value_heads", 1)
    # (where mlx-lm and transformers default differently, the config must say: _stated)
    nshared = _int(_stated(tc, "num_kv_shared_layers", 20, 0), "num_kv_shared_layers", positive=False)
    P = _int(tc, "hidden_size_per_layer_input", 256, positive=False, allow_none=True) or 0
    Vp = _int(tc, "vocab_size_per_layer_input", 262144, allow_none=True) or V
    k_eq_v = _bool(tc, "attention_k_eq_v", False)
    double = _bool(_stated(tc, "use_double_wide_mlp", True, False, unless=nshared == 0), "use_double_wide_mlp", True)
    moe = _bool(tc, "enable_moe_block", False)
    tied = _bool(tc, "tie_word_embeddings", True)
    eps = _float(tc, "rms_norm_eps", 1e-6, maximum=1.0)
    window = _int(tc, "sliding_window", 512)
    cap = _float(_stated(tc, "final_logit_softcapping", 30.0, None), "final_logit_softcapping", allow_none=True)
    pat = _int(tc, "sliding_window_pattern", 5)
    p = ["sliding_attention"] * (pat - 1) + ["full_attention"]
    lt = _layer_types(tc, L, (p * (L // len(p) + 1))[:L])
    if nshared > L:
        raise ConfigError(f"config.json: num_kv_shared_layers {nshared} > num_hidden_layers {L}")
    hds, kvs = _per_layer(tc, L, lt, hd, kvh, k_eq_v)
    for t in set(lt):  # one RoPE table per layer type: its layers share head_dim and KV heads
        idx = [i for i in range(L) if lt[i] == t]
        if len({hds[i] for i in idx}) > 1 or len({kvs[i] for i in idx}) > 1:
            raise ConfigError(f"config.json: per_layer_config gives {t} layers different head_dim / "
                              "num_key_value_heads (not handled)")
    for i in range(L):
        _heads(H, kvs[i], f"layer {i}'s num_key_value_heads")
        _even(hds[i], f"layer {i}'s head_dim")
    first_shared = L - nshared
    for i in range(first_shared, L):
        if lt[i] not in lt[:first_shared]:
            raise ConfigError(f"config.json: layer {i} shares KV but no earlier {lt[i]} layer computes it "
                              f"(num_kv_shared_layers {nshared})")
    rope = _rope_by_type(tc, _G4_ROPE)
    rope = {t: read_rope(r, f"rope_parameters.{t}") for t, r in rope.items()}
    a = Arch("gemma4_text", tc, L, layer_types=list(lt), neutral_norm=1.0, tied=tied)
    E = Im = K = None
    if moe:
        E = _int(tc, "num_experts")
        Im = _int(tc, "moe_intermediate_size")
        K = _int(tc, "top_k_experts")
        if K > E:
            raise ConfigError(f"config.json: top_k_experts {K} > num_experts {E}")
        a.moe = {"num_experts": E, "top_k": K, "moe_intermediate_size": Im}
    a.spec = dict(hidden_size=D, num_hidden_layers=L, intermediate_size=I, num_attention_heads=H,
                  head_dims=hds, kv_heads=kvs, rms_norm_eps=eps, vocab_size=V, num_kv_shared_layers=nshared,
                  hidden_size_per_layer_input=P, rope=rope, sliding_window=window, attention_k_eq_v=k_eq_v,
                  final_logit_softcapping=cap, use_double_wide_mlp=double, enable_moe_block=moe, num_experts=E,
                  top_k_experts=K, moe_intermediate_size=Im, layer_types=list(lt), tie_word_embeddings=tied)
    a.add("embed_tokens.weight", (V, D), "embedding")
    for i in range(L):
        full = lt[i] == "full_attention"
        h, nkv = hds[i], kvs[i]
        use_kev = k_eq_v and full
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


# ---------------------------------------------------------------------- Gemma 3

def _gemma3(tc) -> Arch:
    D = _int(tc, "hidden_size")
    L = _int(tc, "num_hidden_layers")
    H = _int(tc, "num_attention_heads", 4)
    V = _int(tc, "vocab_size", 262144)
    I = _int(tc, "intermediate_size", 6912)
    hd = _int(tc, "head_dim", 256)
    kvh = _int(tc, "num_key_value_heads", 1)
    _heads(H, kvh, "num_key_value_heads")
    _even(hd, "head_dim")
    pat = _int(tc, "sliding_window_pattern", 6)  # (transformers' _sliding_window_pattern is derived from it)
    lt = _layer_types(tc, L, ["full_attention" if (i % pat == pat - 1) else "sliding_attention" for i in range(L)])
    tied = _bool(tc, "tie_word_embeddings", True)
    # per layer type (transformers >= 5), or rope_theta / rope_local_base_freq / rope_scaling (older);
    # the older rope_scaling applies to the full-attention layers
    rope = _rope_by_type(tc, {"full_attention": {}, "sliding_attention": {}})
    rs = tc.get("rope_scaling")
    if rs is not None:
        if not isinstance(rs, dict) or not isinstance(rope["full_attention"], dict):
            raise ConfigError(f"config.json: rope_scaling must be an object, got {_show(rs)}")
        for k, v in rs.items():
            if k in rope["full_attention"] and rope["full_attention"][k] != v:
                raise ConfigError(f"config.json: rope_scaling.{k} and rope_parameters.full_attention.{k} disagree")
        rope["full_attention"].update(rs)
    for t, key, dflt in (("full_attention", "rope_theta", 1_000_000.0),
                         ("sliding_attention", "rope_local_base_freq", 10_000.0)):
        p = rope[t]
        if isinstance(p, dict) and tc.get(key) is not None:
            if "rope_theta" in p and p["rope_theta"] != tc[key]:
                raise ConfigError(f"config.json: {key} = {_show(tc[key])} and rope_parameters.{t}.rope_theta = "
                                  f"{_show(p['rope_theta'])} disagree")
            p.setdefault("rope_theta", tc[key])
        rope[t] = read_rope(p, f"rope_parameters.{t}", dflt)
    if tc.get("max_position_embeddings") is not None:
        _int(tc, "max_position_embeddings")
    a = Arch("gemma3_text", tc, L, layer_types=lt, neutral_norm=0.0, tied=tied)
    a.spec = dict(hidden_size=D, num_hidden_layers=L, intermediate_size=I, num_attention_heads=H,
                  num_key_value_heads=kvh, head_dim=hd, rms_norm_eps=_float(tc, "rms_norm_eps", 1e-6, maximum=1.0),
                  vocab_size=V, rope=rope, query_pre_attn_scalar=_float(tc, "query_pre_attn_scalar", 256),
                  sliding_window=_int(tc, "sliding_window", 512), layer_types=lt,
                  final_logit_softcapping=_float(tc, "final_logit_softcapping", None, allow_none=True),
                  tie_word_embeddings=tied)
    a.add("embed_tokens.weight", (V, D), "embedding")
    for i in range(L):
        _attention(a, i, D, H, kvh, hd, qk_norm=True)
        _mlp(a, i, D, I)
        _attn_norms(a, i, D, ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                              "post_feedforward_layernorm"))
    a.add("norm.weight", (D,), "norm")
    # mlx-lm: an lm_head present is used; absent means tied to embed_tokens
    a.add("lm_head.weight", (V, D), "linear", optional=tied)
    return a


# ---------------------------------------------------------------------- Llama, Mistral, Qwen 2, Qwen 3

def _dense(fam, tc) -> Arch:
    mt = tc.get("model_type")
    D = _int(tc, "hidden_size")
    L = _int(tc, "num_hidden_layers")
    H = _int(tc, "num_attention_heads")
    V = _int(tc, "vocab_size")
    I = _int(tc, "intermediate_size")
    kvh = _int(tc, "num_key_value_heads", H)
    hd = _int(tc, "head_dim", None, allow_none=True) or D // H
    if hd <= 0:
        raise ConfigError(f"config.json: head_dim is missing and hidden_size {D} < num_attention_heads {H}")
    _heads(H, kvh, "num_key_value_heads")
    _even(hd, "head_dim")
    tied = _bool(tc, "tie_word_embeddings", fam == "llama")
    # sliding-window layers: layer_types, or (Qwen) use_sliding_window from max_window_layers on,
    # or (Mistral) every layer when sliding_window is set
    window = _int(tc, "sliding_window", None, allow_none=True)
    use_sw = _bool(tc, "use_sliding_window", False)
    if mt in ("qwen2", "qwen3") and not use_sw:
        window = None
    if mt == "mistral" and "layer_types" in tc:
        raise ConfigError("config.json: key 'layer_types' is not handled by mistral (every layer slides when "
                          "sliding_window is set)")
    if mt == "mistral":
        default_lt = ["sliding_attention" if window else "full_attention"] * L
    else:
        mwl = _int(tc, "max_window_layers", 28, positive=False)
        default_lt = ["sliding_attention" if (window and use_sw and i >= mwl) else "full_attention"
                      for i in range(L)]
    lt = _layer_types(tc, L, default_lt)
    if "sliding_attention" in lt and window is None:
        if mt in ("qwen2", "qwen3"):  # transformers: no window unless use_sliding_window
            lt = ["full_attention"] * L
        else:
            raise ConfigError("config.json: layer_types has sliding_attention layers but sliding_window is not set")
    abias = _bool(tc, "attention_bias", False)
    mbias = fam == "llama" and _bool(tc, "mlp_bias", False)
    if tc.get("max_position_embeddings") is not None:
        _int(tc, "max_position_embeddings")
    rope = _rope_flat(tc, 10000.0 if fam == "llama" else None)
    a = Arch(fam, tc, L, layer_types=lt, neutral_norm=1.0, tied=tied)
    eps = _float(tc, "rms_norm_eps", 1e-6 if fam == "qwen3" else 1e-5, maximum=1.0)
    a.spec = dict(hidden_size=D, num_hidden_layers=L, intermediate_size=I, num_attention_heads=H,
                  num_key_value_heads=kvh, head_dim=hd, rms_norm_eps=eps, vocab_size=V, rope=rope,
                  tie_word_embeddings=tied, layer_types=lt, sliding_window=window)
    if fam == "llama":
        a.spec["rope_traditional"] = _bool(tc, "rope_traditional", False)
    a.add("embed_tokens.weight", (V, D), "embedding")
    for i in range(L):
        # Qwen 2: biases on q/k/v (not o) always; Llama / Qwen 3: on all four with attention_bias
        _attention(a, i, D, H, kvh, hd, qk_norm=fam == "qwen3", bias=abias or mt == "qwen2", o_bias=abias)
        _mlp(a, i, D, I, bias=mbias)
        _attn_norms(a, i, D, ("input_layernorm", "post_attention_layernorm"))
    a.add("norm.weight", (D,), "norm")
    # tied: mlx-lm's sanitize drops an lm_head that is present anyway
    a.add("lm_head.weight", (V, D), "linear", optional=tied, ignored_if_present=tied)
    return a


# ---------------------------------------------------------------------- Gemma 3n (inspect only)

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
