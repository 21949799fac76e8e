"""config.json read once, in every form the references write, into what mlx-lm's model reads.

mlx-lm builds a model from config.json through its family's ``ModelArgs`` dataclass: a field
the config lacks silently takes mlx-lm's default, and a key no field reads is silently
dropped.  Checkpoints saved by transformers 5 keep their RoPE only under
``rope_parameters`` (``rope_theta``, ``partial_rotary_factor``, the scaling type), and
rename keys, so mlx-lm would build them with its own defaults: logits that look fine and
are wrong.  :func:`normalise` makes the config explicit before mlx-lm sees it:

1. **RoPE**: ``rope_parameters`` (flat, or per layer type) becomes the fields the family
   reads (``rope_theta`` / ``rotary_emb_base``, ``partial_rotary_factor`` / ``rotary_pct``,
   ``rope_scaling`` with both ``type`` and ``rope_type``, Gemma 3's ``rope_local_base_freq``);
   a value both forms give differently, or a RoPE the family has no field for, is refused;
   the older form's missing base or rotated fraction is the original's (transformers keeps
   those defaults in its config class's ``rope_parameters``).
2. **The original's values**: where the model's own config class (transformers', which
   mlx-lm depends on; no torch) reads the config, every ``ModelArgs`` field the config lacks
   takes the value the original model uses (transformers' default or derived value), not
   mlx-lm's default.  Renamed keys the original reads under another name are in
   :data:`ALIASES`.
3. **Keys nobody reads**: a key the family's ``ModelArgs`` does not read is accepted only
   when it cannot change the numbers: provenance and training settings
   (:data:`IGNORED`), leftovers the original keeps and never reads (:data:`KEPT_UNREAD`), a
   value equal to what the original derives without it, or a key the original reads only to
   derive others where it derives the same (:data:`DERIVATION_ONLY`).  Anything else is refused
   by name (``ConfigError``: one line).  A required field the config leaves null or out is
   derived as the original's code derives it (:data:`DERIVED`); where mlx-lm's family computes
   a config otherwise than the original and no key can say so, :data:`DEPARTURES` refuses it
   naming how; a field mlx-lm reads under the original's key with another meaning is given the
   value that means the original's (:data:`REMEANT`: Jamba's expert layers), and one the original
   has no option for is filled at what the original computes, another value refused
   (:data:`FIXED`).  A sliding window mlx-lm's family
   never applies is applied at module level where :data:`WINDOWS_APPLIED` has the original's
   rule (checkpoint/corrections/windows.py); any other becomes :attr:`Normalised.max_tokens`:
   prompts up to it are exact, longer ones are refused at trace time (but a window no module
   reads, :data:`WINDOW_UNREAD`).  Keys a correction reads
   as the original does are in :data:`READ_BY_CORRECTIONS`; transformers' tagged floats
   (``{"__float__": "Infinity"}``) are read as the floats they are.

Everything here is pure config work: nothing is built, nothing allocated.  This file holds
:func:`normalise`, its fills and checks, and the two readings it compares (the family's
dataclass fields, transformers' config class); the tables with their reasons are
reference_config_keys.py, RoPE and the layer pattern reference_config_rope.py, the shared value
helpers reference_config_common.py.  Every name of those is importable from here.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import warnings
from typing import Any, Mapping

from workbench import registry
from workbench.checkpoint.reference_config_common import (  # noqa: F401  (re-exported)
    Normalised, equal, set_field, show, special_floats)
from workbench.checkpoint.reference_config_keys import (  # noqa: F401  (re-exported)
    ALIASES, COMMON_IGNORED, DEPARTURES, DERIVATION_ONLY, DERIVED, FIXED, IGNORED, IMPLIED, KEPT_UNREAD, PERIODS,
    READ_BY_CORRECTIONS, REMEANT, REVIEWED_DEFAULTS, WINDOW_UNREAD, WINDOWS_APPLIED)
from workbench.checkpoint.reference_config_rope import (
    alpha_rope, apply_layer_types, apply_per_layer_config, apply_rope, window_everywhere)
from workbench.errors import ConfigError  # (config.json holds something the reference would get wrong)


def _fields(library: str, family: str, args: str = "ModelArgs") -> dict[str, dataclasses.Field] | None:
    mod = registry.import_reference(library, family)
    args = getattr(mod, args, None)
    return {f.name: f for f in dataclasses.fields(args)} if dataclasses.is_dataclass(args) else None


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _default(f: dataclasses.Field):
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def config_fields(library: str, family: str, args: str = "ModelArgs") -> dict[str, Any] | None:
    """The fields ``family``'s dataclass ``args`` reads, with their defaults (None: required)."""
    fields = _fields(library, family, args)
    if fields is None:
        return None
    return {n: (_default(f) if _has_default(f) else None) for n, f in fields.items()}


# ---------------------------------------------------------------------- transformers' view

def _original_class(model_type: str):
    """transformers' config class for ``model_type`` (None if it has none)."""
    try:
        from transformers import CONFIG_MAPPING
        return CONFIG_MAPPING[model_type]
    except Exception:  # noqa: BLE001 - no transformers, or no such model type
        return None


def _read_with(cls, cfg: Mapping):
    """``cls.from_dict(cfg)``, quietly; None when transformers refuses the config."""
    tlog = logging.getLogger("transformers")
    level = tlog.level
    tlog.setLevel(logging.CRITICAL)  # (its "Can't set ..." errors: a config it refuses, None here)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cls.from_dict(copy.deepcopy(dict(cfg)))
    except Exception:  # noqa: BLE001 - the original cannot read it: our own rules only
        return None
    finally:
        tlog.setLevel(level)


_DECLARED: dict = {}


def _declared(cls) -> frozenset:
    """The keys the original's config class declares (its default instance's)."""
    if cls not in _DECLARED:
        d = _read_with(cls, {})
        _DECLARED[cls] = frozenset(d.to_dict()) if d is not None else frozenset()
    return _DECLARED[cls]


def original_config(cfg: Mapping):
    """transformers' own reading of ``cfg`` (its config class for ``model_type``: defaults and
    derived values filled in), or None when it has no such class or refuses the config."""
    mt = cfg.get("model_type")
    cls = _original_class(mt) if isinstance(mt, str) else None
    return _read_with(cls, cfg) if cls is not None else None


def _jsonable(v) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------------- the whole config

def normalise(config: Mapping, library: str, family: str, *, args: str = "ModelArgs") -> Normalised:
    """The config (a deep copy) in the form ``library``'s ``family`` reads (through its
    dataclass ``args``); ConfigError naming the key when something it would get wrong cannot
    be made explicit."""
    cfg = special_floats(copy.deepcopy(dict(config)))
    out = Normalised(cfg)
    if library != "mlx_lm":
        return out
    if args == "ModelArgs" and registry.WRAPPED_TEXT.get(cfg.get("model_type")) == family:
        # a text-only checkpoint of a family mlx-lm builds through its wrapper: the config,
        # read as the wrapper's TextConfig, is its text_config (its keys stay at the top too)
        inner = normalise(config, library, family, args="TextConfig")
        inner.config = dict(inner.config, model_type=family, text_config=copy.deepcopy(inner.config))
        return inner
    fields = _fields(library, family, args)
    if fields is None:
        return out
    if "text_config" in fields:  # a wrapper: its language model reads text_config
        tc = cfg.get("text_config")
        tmt = tc.get("model_type") if isinstance(tc, Mapping) else None
        if isinstance(tmt, str) and registry.lm_module(tmt) is not None:
            fam = registry.lm_module(tmt)
            inner = normalise(tc, library, fam, args="TextConfig" if registry.WRAPPED_TEXT.get(tmt) == fam
                              else "ModelArgs")
            cfg["text_config"] = inner.config
            out.filled.update({f"text_config.{k}": v for k, v in inner.filled.items()})
            out.max_tokens, out.why_max = inner.max_tokens, inner.why_max
            # (mlx-lm's wrappers copy their own vocab_size into text_config: transformers
            #  writes it in text_config only)
            if "vocab_size" in fields and "vocab_size" not in cfg and "vocab_size" in inner.config:
                cfg["vocab_size"] = inner.config["vocab_size"]
                out.filled["vocab_size"] = cfg["vocab_size"]
        return out  # (the wrapper's other keys configure towers mlx-lm does not build)
    mt = cfg.get("model_type")
    cls = _original_class(mt) if isinstance(mt, str) else None
    original = _read_with(cls, cfg) if cls is not None else None
    apply_per_layer_config(cfg, out, fields, family)
    apply_rope(cfg, out, fields, family, original)
    apply_layer_types(cfg, out, fields, family)
    window_everywhere(cfg, out, fields, family)
    for target, source in ALIASES.get(family, {}).items():
        if source in cfg and target in fields:
            set_field(cfg, out, target, cfg[source], source)
    if original is not None:
        _fill_derived(cfg, out, fields, family, original)
        _fill_from_original(cfg, out, fields, original)
    _fill_fixed(cfg, out, fields, family, cls)
    alpha_rope(cfg, out)
    _remeant(cfg, out, fields, family)
    if original is not None:
        _check_unread(cfg, out, fields, family, cls, original)
        _check_defaulted(cfg, fields, family)
    _check_departures(cfg, family)
    return out


# ---------------------------------------------------------------------- fills

def _fill_derived(cfg: dict, out: Normalised, fields: Mapping, family: str, original) -> None:
    """A required field the config leaves out or null, derived as the original's code derives it."""
    for name, (derive, _where) in DERIVED.get(family, {}).items():
        if name in fields and cfg.get(name) is None:
            v = derive(original)
            if v is not None:
                cfg[name] = v
                out.filled[name] = v


def _fill_fixed(cfg: dict, out: Normalised, fields: Mapping, family: str, cls=None) -> None:
    """Required fields the original never writes: the architecture's fixed values, the head
    size transformers implies (hidden / heads), no RoPE scaling when rope_parameters says none."""
    mt = cfg.get("model_type")
    for k, v in FIXED.get(mt, {}).items():
        if k in fields and k not in cfg:
            cfg[k] = v
            out.filled[k] = v
        elif k in fields and cls is not None and k not in _declared(cls) and not _as_fixed(cfg, k, v):
            raise ConfigError(f"config.json: {k} = {show(cfg[k])}, but the original {mt} has no such option "
                              f"(it computes as {k} = {show(v)}), and mlx-lm's {family} would read it")
    if "head_dim" in fields and cfg.get("head_dim") is None:
        hd = _implied_head_dim(cfg)
        if hd is not None:
            cfg["head_dim"] = hd
            out.filled["head_dim"] = hd
    if "rope_scaling" in fields and "rope_scaling" not in cfg:  # (no scaling in any form: none)
        cfg["rope_scaling"] = None


def _as_fixed(cfg: Mapping, key: str, fixed) -> bool:
    """A config's own value of a FIXED field computes what the original's fixed one does: per
    layer, the same everywhere; HunYuan's expert size, the MLP's; a factor its switch turns off."""
    if key == "cla_share_factor":
        return cfg.get("use_cla") is False
    vals = cfg[key] if isinstance(cfg[key], list) and cfg[key] else [cfg[key]]
    want = cfg.get("intermediate_size") if key == "moe_intermediate_size" else fixed
    return all(equal(v, want) for v in vals)


def _remeant(cfg: dict, out: Normalised, fields: Mapping, family: str) -> None:
    """Each :data:`REMEANT` field given the value that means to mlx-lm what the config means."""
    for name, (value, _why) in REMEANT.get(family, {}).items():
        v = value(cfg) if name in fields else None
        if v is not None and not equal(v, cfg.get(name)):
            cfg[name] = v
            out.filled[name] = v


#: fields never taken from the original's attributes: RoPE comes from rope_parameters alone
#: (transformers 5 keeps a rope_scaling attribute for compatibility, in its own form)
_NOT_FILLED = ("model_type", "rope_parameters", "rope_scaling", "quantization", "quantization_config")


def _fill_from_original(cfg: dict, out: Normalised, fields: Mapping, original) -> None:
    """Every field mlx-lm reads that the config lacks takes the original model's value."""
    for name, f in fields.items():
        if name in cfg or name in _NOT_FILLED:
            continue
        if name == "layer_types" and any(p in cfg and p in fields for p in PERIODS):
            continue  # the config gives the pattern as a period the family reads
        try:
            v = getattr(original, name)
        except Exception:  # noqa: BLE001 - the original has no such attribute
            continue
        if callable(v) or not _jsonable(v):
            continue
        cfg[name] = copy.deepcopy(v)
        if not (_has_default(f) and equal(v, _default(f))):
            out.filled[name] = v  # (where it differs from what mlx-lm alone would have used)


def _implied_head_dim(cfg: Mapping):
    h, n = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    return h // n if isinstance(h, int) and isinstance(n, int) and n > 0 else None


# ---------------------------------------------------------------------- checks

#: unread keys whose non-default values are a sliding window the family never applies
_WINDOW_KEYS = ("sliding_window",)


def _check_unread(cfg: dict, out: Normalised, fields: Mapping, family: str, cls, original) -> None:
    """A key the family does not read must not change the numbers (see the module doc)."""
    consumed = set(ALIASES.get(family, {}).values()) | {"rope_parameters", "text_config"} | out.consumed
    for key in list(cfg):
        if key in fields or key in IGNORED or key in consumed or key.endswith("_token_id") or \
                key in out.filled:
            continue
        if key not in _declared(cls):
            continue  # neither the reference nor the original declares it: nobody reads it
        if key in READ_BY_CORRECTIONS.get(family, {}):
            continue
        if cfg.get("model_type") in WINDOWS_APPLIED and (key in _WINDOW_KEYS or (
                key == "layer_types" and WINDOWS_APPLIED[cfg["model_type"]] == "layer_types")):
            continue  # (applied at module level, on the layers it marks: checkpoint/corrections/windows.py)
        without = {k: v for k, v in cfg.items() if k != key}
        derived = _read_with(cls, without)
        if derived is None:  # (the original cannot read the config without it: its class default)
            derived = _read_with(cls, {"model_type": cfg.get("model_type")})
        default = getattr(derived, key, None) if derived is not None else None
        if key in _WINDOW_KEYS and cfg.get("model_type") in WINDOW_UNREAD:
            continue  # (a window nobody applies: WINDOW_UNREAD)
        if key in _WINDOW_KEYS:
            w = cfg[key]
            # (a window the original switches off, as Qwen's use_sliding_window false does, bounds nothing)
            on = getattr(original, key, w) not in (None, 0)
            if isinstance(w, int) and not isinstance(w, bool) and w > 0 and on:
                out.max_tokens = w if out.max_tokens is None else min(out.max_tokens, w)
                out.why_max = (f"config.json: sliding_window = {w}, which mlx-lm's {family} never applies: "
                               f"its numbers are exact for prompts up to {w} tokens")
            continue
        if derived is not None and equal(cfg[key], default):
            continue
        if derived is not None and equal(getattr(original, key, None), default):
            continue  # the original reads the same without it (it derives the field itself)
        if key in DERIVATION_ONLY and derived is not None and _same_reading(derived, original, key):
            continue  # the original derives nothing different from it
        if key == "head_dim" and default is None and equal(cfg[key], _implied_head_dim(cfg)):
            continue
        implied = IMPLIED.get(family, {}).get(key)
        if implied is not None and equal(cfg[key], implied(cfg)):
            continue
        raise ConfigError(f"config.json: {key} = {show(cfg[key])} is not read by mlx-lm's {family} "
                          f"(the original model's default: {show(default)}): its numbers would ignore it")


def _same_reading(a, b, key: str) -> bool:
    """Two readings of a config by the original's class agree on everything but ``key``."""
    da, db = a.to_dict(), b.to_dict()
    da.pop(key, None), db.pop(key, None)
    da.pop("transformers_version", None), db.pop("transformers_version", None)
    return equal(json.loads(json.dumps(da, default=str)), json.loads(json.dumps(db, default=str)))


def _check_departures(cfg: Mapping, family: str) -> None:
    for when, why in DEPARTURES.get(family, ()):
        if when(cfg):
            raise ConfigError(f"config.json: {why}")


def _check_defaulted(cfg: dict, fields: Mapping, family: str) -> None:
    """A field mlx-lm reads, absent from the config and from the original's, takes mlx-lm's
    default: refused unless that default was checked against the original."""
    ok = REVIEWED_DEFAULTS["*"] | REVIEWED_DEFAULTS.get(family, frozenset())
    for name, f in fields.items():
        if name in cfg or name in ok or name in _NOT_FILLED:
            continue
        if name == "layer_types" and any(p in cfg and p in fields for p in PERIODS):
            continue  # given as a period
        d = _default(f) if _has_default(f) else None
        raise ConfigError(f"config.json has no {name!r}, which mlx-lm's {family} reads (its default: {show(d)}) "
                          "and the original model's config does not carry: workbench has not checked that "
                          "default against the original")
