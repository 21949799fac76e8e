"""RoPE and the layer pattern in the form mlx-lm's family reads: steps of
:func:`workbench.checkpoint.reference_config.normalise` (its doc says why).

* :func:`apply_rope`: ``rope_parameters`` (flat, or per layer type) into the fields the family
  reads; the older form's missing base or rotated fraction, the original's;
* :func:`alpha_rope`: HunYuan's NTK-alpha scaling, the only one mlx-lm's hunyuan computes;
* :func:`apply_layer_types`: ``layer_types`` as the period a family reads instead;
* :func:`apply_per_layer_config`: Gemma 4's per-layer head sizes;
* :func:`window_everywhere`: a window the original applies to every layer and the family only
  where layer_types says: prompts bounded by it.

Each takes the config being filled, the :class:`~.reference_config_common.Normalised` it
reports into, the fields the family's dataclass reads and the family's name, and refuses
(ConfigError, one line) what the family cannot express.
"""
from __future__ import annotations

import json
from typing import Mapping

from workbench.checkpoint.reference_config_common import Normalised, equal, set_field, show
from workbench.checkpoint.reference_config_keys import PERIODS, WINDOWS_APPLIED
from workbench.errors import ConfigError


# ---------------------------------------------------------------------- RoPE

#: family -> (the mlx-lm field for rope theta, the one for the rotated fraction)
_ROPE_FIELDS = {"gpt_neox": ("rotary_emb_base", "rotary_pct")}


_ROPE_META = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


def _flat_rope(rp: Mapping) -> bool:
    """One RoPE for every layer (not one per layer type: a model whose original reads RoPE per
    layer type reads the per-type entries, even beside flat keys)."""
    return not any(isinstance(v, Mapping) for v in rp.values())


def _scaling(rp: Mapping) -> dict | None:
    t = rp.get("rope_type", rp.get("type", "default"))
    if t in (None, "default"):
        return None
    s = {k: v for k, v in rp.items() if k not in _ROPE_META}
    return {"type": t, "rope_type": t, **s}


def _apply_flat_rope(cfg: dict, out: Normalised, fields: Mapping, family: str, rp: Mapping, where: str) -> None:
    theta_f, frac_f = _ROPE_FIELDS.get(family, ("rope_theta", "partial_rotary_factor"))
    if "rope_theta" in rp:
        if theta_f in fields:
            set_field(cfg, out, theta_f, rp["rope_theta"], f"{where}.rope_theta")
        elif "rope_parameters" not in fields:
            raise ConfigError(f"config.json: {where}.rope_theta = {show(rp['rope_theta'])}, but mlx-lm's "
                              f"{family} reads no RoPE base")
    if "partial_rotary_factor" in rp:
        frac = rp["partial_rotary_factor"]
        if frac_f in fields:
            set_field(cfg, out, frac_f, frac, f"{where}.partial_rotary_factor")
        elif "rope_parameters" not in fields and not equal(frac, 1.0):
            raise ConfigError(f"config.json: {where}.partial_rotary_factor = {show(frac)}, but mlx-lm's "
                              f"{family} rotates every dimension")
    if "original_max_position_embeddings" in rp and "original_max_position_embeddings" in fields:
        set_field(cfg, out, "original_max_position_embeddings", rp["original_max_position_embeddings"],
             f"{where}.original_max_position_embeddings")
    s = _scaling(rp)
    if s is not None:
        if "rope_scaling" in fields:
            if cfg.get("rope_scaling") is None:
                cfg["rope_scaling"] = s
                out.filled["rope_scaling"] = s
        elif "rope_parameters" not in fields:
            raise ConfigError(f"config.json: {where}.rope_type = {show(s['type'])}, but mlx-lm's {family} "
                              "reads no RoPE scaling")


def apply_rope(cfg: dict, out: Normalised, fields: Mapping, family: str, original=None) -> None:
    """``rope_parameters`` into the RoPE fields ``family`` reads (flat, per layer type as Gemma 3's
    two, or one RoPE for every type); without it, the base and rotated fraction the config does
    not give taken from ``original`` (transformers' reading of the config)."""
    rp = cfg.get("rope_parameters")
    if rp is None:
        # the older form: its keys are read as they are; a RoPE base or rotated fraction it does
        # not give is the original's default, which transformers keeps in rope_parameters (Phi-3
        # 4k publishes no partial_rotary_factor: 1.0).  Only those two: transformers' defaults
        # for scaling are its own
        orp = getattr(original, "rope_parameters", None) if original is not None else None
        if not (isinstance(orp, Mapping) and _flat_rope(orp)):
            return
        for key, f in zip(("rope_theta", "partial_rotary_factor"),
                          _ROPE_FIELDS.get(family, ("rope_theta", "partial_rotary_factor"))):
            if key in orp and f in fields and f not in cfg and key not in cfg:
                set_field(cfg, out, f, orp[key], f"the original's default {key}")
        return
    if not isinstance(rp, Mapping):
        raise ConfigError(f"config.json: rope_parameters must be an object, got {show(rp)}")
    if _flat_rope(rp):
        _apply_flat_rope(cfg, out, fields, family, rp, "rope_parameters")
        return
    # per layer type (Gemma 3 and others): {"full_attention": {...}, "sliding_attention": {...}}
    rp = {k: v for k, v in rp.items() if isinstance(v, Mapping)}
    if "rope_local_base_freq" in fields and set(rp) <= {"full_attention", "sliding_attention"}:
        full, slide = rp.get("full_attention", {}), rp.get("sliding_attention", {})
        if _scaling(slide) is not None:
            raise ConfigError("config.json: rope_parameters.sliding_attention scales its RoPE "
                              f"({show(slide.get('rope_type'))}), which mlx-lm's {family} does not")
        if "rope_theta" in slide:
            set_field(cfg, out, "rope_local_base_freq", slide["rope_theta"],
                      "rope_parameters.sliding_attention.rope_theta")
        _apply_flat_rope(cfg, out, fields, family, full, "rope_parameters.full_attention")
        return
    kinds = list(rp.values())
    if all(equal(k, kinds[0]) for k in kinds):
        _apply_flat_rope(cfg, out, fields, family, kinds[0], f"rope_parameters.{next(iter(rp))}")
        return
    if "rope_parameters" not in fields:
        raise ConfigError(f"config.json: rope_parameters differ per layer type ({', '.join(map(str, rp))}), "
                          f"which mlx-lm's {family} does not read")


def alpha_rope(cfg: dict, out: Normalised) -> None:
    """mlx-lm's hunyuan always rotates with NTK-alpha scaling (``rope_scaling["alpha"]``: the base
    times alpha ** (d / (d - 2)), transformers' HunYuanMoEV1 "ntk_alpha"); its plain RoPE is alpha 1;
    a scaling of another kind (linear, dynamic NTK without alpha) it cannot compute: refused."""
    if cfg.get("model_type") != "hunyuan_v1_moe":
        return
    s = cfg.get("rope_scaling")
    if s is None:
        s = {"type": "dynamic", "factor": 1.0, "alpha": 1.0}
    elif isinstance(s, Mapping) and s.get("rope_type", s.get("type")) == "dynamic" and \
            isinstance(s.get("alpha"), (int, float)) and not isinstance(s.get("alpha"), bool) and s["alpha"] > 0:
        s = {"factor": 1.0, **s, "type": "dynamic"}
    else:
        raise ConfigError(f"config.json: RoPE scaling {show(s)}: mlx-lm's hunyuan rotates with NTK alpha scaling "
                          "only (rope type dynamic with an alpha)")
    if not equal(s, cfg.get("rope_scaling")):
        cfg["rope_scaling"] = s
        out.filled["rope_scaling"] = s


# ---------------------------------------------------------------------- layer types and windows

#: families that read the period as a string of layer kinds ("LLLG": three local, one global)
_PERIOD_AS_STRING = ("exaone4",)


def apply_layer_types(cfg: dict, out: Normalised, fields: Mapping, family: str) -> None:
    """``layer_types`` (transformers 5, which derives it from a period only when absent and
    reads it first) for a family that reads a period instead: the period, or refused."""
    lt = cfg.get("layer_types")
    if lt is None or "layer_types" in fields:
        return
    for period, (kind, every) in PERIODS.items():
        if period not in fields:
            continue
        if not isinstance(lt, list) or not lt or any(t not in (kind, every) for t in lt):
            raise ConfigError(f"config.json: layer_types = {show(lt)}: mlx-lm's {family} reads {kind} and "
                              f"{every} layers only")
        p = lt.index(every) + 1 if every in lt else len(lt) + 1
        if any((t == every) != ((i + 1) % p == 0) for i, t in enumerate(lt)):
            raise ConfigError(f"config.json: layer_types = {show(lt)} is not every {p}-th layer {every}, the "
                              f"only pattern mlx-lm's {family} reads ({period})")
        value = "L" * (p - 1) + ("G" if p <= len(lt) else "") if family in _PERIOD_AS_STRING else p
        if cfg.get(period) != value:
            cfg[period] = value
            out.filled[period] = value
        out.consumed.add("layer_types")
        return


def apply_per_layer_config(cfg: dict, out: Normalised, fields: Mapping, family: str) -> None:
    """Gemma 4's ``per_layer_config`` (transformers 5: {layer: {"head_dim", "num_key_value_heads"}}
    for the full-attention layers) as the global_head_dim / num_global_key_value_heads mlx-lm reads."""
    plc = cfg.get("per_layer_config")
    if plc is None or "global_head_dim" not in fields:
        return
    if not isinstance(plc, Mapping) or any(not isinstance(v, Mapping) for v in plc.values()):
        raise ConfigError(f"config.json: per_layer_config = {show(plc)} is not one object per layer")
    lt = cfg.get("layer_types")
    full = {str(i) for i, t in enumerate(lt) if t == "full_attention"} if isinstance(lt, list) else None
    keys = {str(int(k)) if str(k).isdigit() else str(k) for k in plc}
    if full is not None and keys != full:
        raise ConfigError("config.json: per_layer_config sets other layers than the full-attention ones "
                          f"({', '.join(sorted(keys))}), which mlx-lm's {family} cannot express")
    for key, target in (("head_dim", "global_head_dim"), ("num_key_value_heads", "num_global_key_value_heads")):
        vals = {json.dumps(v.get(key)) for v in plc.values()}
        if len(vals) > 1:
            raise ConfigError(f"config.json: per_layer_config gives full-attention layers different {key}s, which "
                              f"mlx-lm's {family} cannot express")
        v = next(iter(plc.values())).get(key) if plc else None
        if v is not None:
            set_field(cfg, out, target, v, f"per_layer_config.*.{key}")
    other = {k for v in plc.values() for k in v} - {"head_dim", "num_key_value_heads"}
    if other:
        raise ConfigError(f"config.json: per_layer_config sets {', '.join(sorted(other))}, which mlx-lm's {family} "
                          "does not read per layer")
    out.consumed.add("per_layer_config")


def window_everywhere(cfg: dict, out: Normalised, fields: Mapping, family: str) -> None:
    """A family that applies ``sliding_window`` only to the layers ``layer_types`` marks
    (mlx-lm's llama) given a config whose original applies it to every layer (Mistral:
    no layer_types): exact up to the window, bounded there."""
    w = cfg.get("sliding_window")
    if cfg.get("model_type") in WINDOWS_APPLIED:
        return  # (applied at module level: checkpoint/corrections/windows.py)
    if "layer_types" not in fields or "sliding_window" not in fields or cfg.get("layer_types") is not None \
            or isinstance(w, bool) or not isinstance(w, int) or w <= 0 or cfg.get("use_sliding_window") is False \
            or any(p in cfg for p in PERIODS):  # (a pattern is given: the window is the sliding layers')
        return
    out.max_tokens = w if out.max_tokens is None else min(out.max_tokens, w)
    out.why_max = (f"config.json: sliding_window = {w} on every layer, which mlx-lm's {family} applies only to "
                   f"layers that layer_types marks sliding: its numbers are exact for prompts up to {w} tokens")
