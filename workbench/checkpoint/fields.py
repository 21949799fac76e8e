"""What a family file (workbench/checkpoint/families/<family>.py) reads config.json with,
and writes its tensor table into: the one set of config-reading rules every family shares.

* :class:`ConfigError`: config.json does not describe a usable model (the message names the
  key); every refusal in one line;
* :class:`Keys`: what a family does with each key (read, knowingly ignored, read at given
  values only); :func:`check_keys` refuses every other key by name;
* ``read_int`` / ``read_float`` / ``read_bool`` / ``read_layer_types``: numbers range-checked
  before anything is allocated (no booleans for counts, positive finite eps / theta /
  factors, implausible sizes refused);
* RoPE in every form the references write (:func:`read_rope`, :func:`read_rope_flat`,
  :func:`read_rope_by_type`), normalised to what the op program needs;
* :class:`Arch` / :class:`Expected`: the expected tensors (a family's table) and its Config
  (``spec``), with the table helpers the families share (:func:`attention_tensors`,
  :func:`mlp_tensors`, :func:`norm_tensors`).

Nothing here knows a family; workbench/checkpoint/arch.py picks the family file.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from workbench.checkpoint.reference_config import COMMON_IGNORED  # (one list for both granularities)
from workbench.errors import ConfigError  # noqa: F401  (re-exported: the family files raise it)


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
    spec: Any = None  # the family's Config (checkpoint/families/<family>.py): what its op program reads

    def add(self, name, shape, kind, layer=None, **kw):
        self.expected[name] = Expected(name, tuple(int(s) for s in shape), kind, layer, **kw)

    def modules(self) -> dict:
        """quantizable module path -> Expected of its weight."""
        return {e.module: e for e in self.expected.values() if e.quantizable and e.name.endswith(".weight")}


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


ROPE_KEYS = {"rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings"}
#: the keys every Llama-shaped family reads (llama.py, qwen3.py)
DENSE_KEYS = {"hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "head_dim", "rms_norm_eps", "vocab_size", "tie_word_embeddings", "layer_types", "sliding_window",
              "use_sliding_window", "max_window_layers", "attention_bias"} | ROPE_KEYS


def _same(v, allowed) -> bool:
    return any(v is a if (a is None or isinstance(a, bool) or isinstance(v, bool)) else
               (isinstance(v, type(a)) or (isinstance(v, (int, float)) and isinstance(a, (int, float)))) and v == a
               for a in allowed)


def show(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def check_keys(tc: dict, family: str, k: Keys) -> None:
    """Refuse (ConfigError naming it) every key of the text config that ``family`` neither
    reads nor knowingly ignores (``k``), and every ``only`` key at a value it does not implement."""
    for key in tc:
        if not isinstance(key, str):
            raise ConfigError(f"config.json: key {show(key)} is not a string")
        if key in k.only:
            if not _same(tc[key], k.only[key]):
                ok = " or ".join(show(a) for a in k.only[key])
                raise ConfigError(f"config.json: {key} = {show(tc[key])} changes the numbers and is not handled "
                                  f"by {family} (handled: {ok})")
        elif key not in k.handled and key not in k.ignored and key not in COMMON_IGNORED:
            raise ConfigError(f"config.json: key {key!r} is not handled by {family}: refusing rather than guessing "
                              "whether it changes the numbers")


# ---------------------------------------------------------------------- numbers

#: sanity caps: a config beyond them describes no real model (and must not make us hang or allocate)
_CAPS = {"num_hidden_layers": 10_000, "num_experts": 100_000, "head_dim": 65_536, "global_head_dim": 65_536,
         "num_attention_heads": 65_536, "num_key_value_heads": 65_536, "num_global_key_value_heads": 65_536}
_CAP = 1 << 31


def read_int(cfg, key, default=None, *, positive=True, allow_none=False, where=None):
    v = cfg.get(key, default)
    if v is None and allow_none:
        return None
    name = where or key
    if isinstance(v, bool) or not isinstance(v, int) or (v <= 0 if positive else v < 0):
        if v is None:
            raise ConfigError(f"config.json: required field {name!r} is missing")
        raise ConfigError(f"config.json: field {name!r} must be a {'positive' if positive else 'non-negative'} "
                          f"integer, got {show(v)}")
    if v > _CAPS.get(key, _CAP):
        raise ConfigError(f"config.json: field {name!r} = {v} is implausibly large")
    return v


def read_float(cfg, key, default=None, *, allow_none=False, where=None, minimum=0.0, inclusive=False,
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
                          f"{minimum:g}, got {show(v)}")
    if v > maximum:
        raise ConfigError(f"config.json: field {name!r} = {v:g} is implausibly large (at most {maximum:g})")
    return float(v)


def read_bool(cfg, key, default):
    v = cfg.get(key, default)
    if v is None:
        v = default
    if not isinstance(v, bool):
        raise ConfigError(f"config.json: field {key!r} must be true or false, got {show(v)}")
    return v


LAYER_TYPES = ("sliding_attention", "full_attention")


def read_layer_types(tc, L, default):
    lt = tc.get("layer_types")
    if lt is None:
        return list(default)
    if not isinstance(lt, list) or len(lt) != L or any(not isinstance(t, str) or t not in LAYER_TYPES for t in lt):
        raise ConfigError(f"config.json: layer_types must list {L} entries of sliding_attention/full_attention")
    return list(lt)



def check_heads(H, kvh, where):
    if H % kvh:
        raise ConfigError(f"config.json: num_attention_heads {H} is not a multiple of {where} {kvh}")


def check_even(hd, where):
    if hd % 2:
        raise ConfigError(f"config.json: {where} = {hd} is odd (RoPE rotates pairs of dimensions)")


# ---------------------------------------------------------------------- RoPE

#: rope type -> its parameters besides rope_type / rope_theta (transformers' RopeParameters)
ROPE_TYPES = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
             "mscale", "mscale_all_dim", "truncate"),
    "proportional": ("factor", "partial_rotary_factor"),
    # (the frequencies depend on the sequence's length past the config's max_position_embeddings,
    # which read_rope_flat adds: workbench/rope.py computes them per forward)
    "dynamic": ("factor",),
}


def read_rope(p, where: str, theta_default=None) -> dict:
    """One rope_parameters / rope_scaling dict, normalised to what the op program needs:
    ``{"rope_type", "rope_theta", ...}`` with every parameter of the type present and
    checked.  Parameters whose default the references disagree on are required."""
    if not isinstance(p, dict):
        raise ConfigError(f"config.json: {where} must be an object, got {show(p)}")
    t = p.get("rope_type", p.get("type", "default"))
    if "type" in p and "rope_type" in p and p["type"] != p["rope_type"]:
        raise ConfigError(f"config.json: {where} has rope_type {show(p['rope_type'])} and type {show(p['type'])}")
    if not isinstance(t, str) or t not in ROPE_TYPES:
        raise ConfigError(f"config.json: {where}.rope_type {show(t)} is not handled (handled: "
                          f"{', '.join(ROPE_TYPES)})")
    for key in p:
        if key not in ("rope_type", "type", "rope_theta", "partial_rotary_factor") + ROPE_TYPES[t]:
            raise ConfigError(f"config.json: {where}.{key} is not handled for rope type {t!r}")
    out = {"rope_type": t, "rope_theta": read_float(p, "rope_theta", theta_default, where=f"{where}.rope_theta",
                                                minimum=1.0)}
    prf = read_float(p, "partial_rotary_factor", 1.0, where=f"{where}.partial_rotary_factor")
    if t == "proportional":
        if prf > 1.0:
            raise ConfigError(f"config.json: {where}.partial_rotary_factor must be in (0, 1], got {prf:g}")
        out["partial_rotary_factor"] = prf
        out["factor"] = read_float(p, "factor", 1.0, where=f"{where}.factor")
    elif prf != 1.0:
        raise ConfigError(f"config.json: {where}.partial_rotary_factor = {prf:g} is not handled for rope type {t!r} "
                          "(only 1.0: every dimension rotates)")
    if t in ("linear", "llama3", "yarn", "dynamic"):
        out["factor"] = read_float(p, "factor", where=f"{where}.factor")
    if t == "llama3":
        for k in ("low_freq_factor", "high_freq_factor"):
            out[k] = read_float(p, k, where=f"{where}.{k}")
        if out["high_freq_factor"] <= out["low_freq_factor"]:
            raise ConfigError(f"config.json: {where}.high_freq_factor must exceed low_freq_factor")
    if t in ("llama3", "yarn"):
        out["original_max_position_embeddings"] = read_int(p, "original_max_position_embeddings",
                                                       where=f"{where}.original_max_position_embeddings")
    if t == "yarn":
        out["attention_factor"] = read_float(p, "attention_factor", allow_none=True, where=f"{where}.attention_factor")
        # (rotations: YaRN's correction dims take their log, so far below one is no real model)
        out["beta_fast"] = read_float(p, "beta_fast", 32.0, where=f"{where}.beta_fast", minimum=1e-6, maximum=1e6)
        out["beta_slow"] = read_float(p, "beta_slow", 1.0, where=f"{where}.beta_slow", minimum=1e-6, maximum=1e6)
        for k in ("mscale", "mscale_all_dim"):
            out[k] = read_float(p, k, allow_none=True, inclusive=True, where=f"{where}.{k}")
        out["truncate"] = read_bool(p, "truncate", True)
    return out


def read_rope_flat(tc, theta_default) -> dict:
    """Llama / Qwen: ``rope_parameters`` (transformers >= 5) or ``rope_theta`` + ``rope_scaling``
    (older); both may be present when they agree.  The same RoPE for every layer type."""
    rp, rs, theta = tc.get("rope_parameters"), tc.get("rope_scaling"), tc.get("rope_theta")
    forms = []
    if rp is not None:
        forms.append(("rope_parameters", dict(rp) if isinstance(rp, dict) else rp))
    if rs is not None or rp is None:
        if rs is not None and not isinstance(rs, dict):
            raise ConfigError(f"config.json: rope_scaling must be an object, got {show(rs)}")
        forms.append(("rope_scaling", dict(rs or {})))
    read = []
    for where, p in forms:
        if isinstance(p, dict) and theta is not None and "rope_theta" not in p:
            p["rope_theta"] = theta
        read.append(read_rope(p, where, theta_default))
    if isinstance(rp, dict) and theta is not None and "rope_theta" in rp and rp["rope_theta"] != theta:
        raise ConfigError(f"config.json: rope_theta = {show(theta)} and rope_parameters.rope_theta = "
                          f"{show(rp['rope_theta'])} disagree")
    if len(read) == 2 and read[0] != read[1]:
        raise ConfigError("config.json: rope_parameters and rope_scaling describe different RoPE")
    if read[0]["rope_type"] == "dynamic":  # (transformers scales past the config's max_position_embeddings)
        read[0]["max_position_embeddings"] = read_int(tc, "max_position_embeddings", where="max_position_embeddings")
    return {"full_attention": read[0], "sliding_attention": read[0]}


def read_rope_by_type(tc, defaults: dict, where="rope_parameters") -> dict:
    """Gemma 3 / 4: ``rope_parameters.{full_attention, sliding_attention}``."""
    rp = tc.get("rope_parameters")
    if rp is None:
        rp = {}
    if not isinstance(rp, dict):
        raise ConfigError(f"config.json: {where} must be an object, got {show(rp)}")
    for key in rp:
        if key not in LAYER_TYPES:
            raise ConfigError(f"config.json: {where}.{key} is not handled: this family takes RoPE per layer type "
                              "(rope_parameters.full_attention / .sliding_attention)")
    out = {}
    for lt in LAYER_TYPES:
        p = rp.get(lt, defaults[lt])
        if p is None:
            raise ConfigError(f"config.json: {where}.{lt} is null (a layer type without RoPE is not handled)")
        out[lt] = dict(p) if isinstance(p, dict) else p
        if isinstance(p, dict) and p.get("rope_type", p.get("type")) == "dynamic":
            raise ConfigError(f"config.json: {where}.{lt}.rope_type 'dynamic' is not handled per layer type "
                              "(it is for one RoPE of every layer: rope_parameters.rope_type)")
    return out


# ---------------------------------------------------------------------- tables

def norm_tensors(a, i, D, names):
    for n in names:
        a.add(f"layers.{i}.{n}.weight", (D,), "norm", i)


def attention_tensors(a, i, D, H, kvh, hd, *, qk_norm: bool, bias: bool = False, o_bias: bool | None = None):
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


def mlp_tensors(a, i, D, I, *, bias: bool = False):
    """gate/up/down projections of layer i's dense MLP."""
    for n, shp in (("gate_proj", (I, D)), ("up_proj", (I, D)), ("down_proj", (D, I))):
        a.add(f"layers.{i}.mlp.{n}.weight", shp, "linear", i)
        if bias:
            a.add(f"layers.{i}.mlp.{n}.bias", (shp[0],), "vector", i)

