"""mlx-lm's YaRN and LongRoPE modules given transformers' numbers (see the package doc)."""
from __future__ import annotations

import math
from typing import Mapping

import mlx.core as mx
import mlx.nn as nn

from workbench.errors import ConfigError
from workbench.checkpoint.corrections.common import number, subclass


def apply(model: nn.Module, family: str) -> None:
    """From the arguments the family was built with (the normalised config)."""
    from mlx_lm.models.rope_utils import SuScaledRoPE, YarnRoPE

    args = getattr(model, "args", None)
    scaling = getattr(args, "rope_scaling", None)
    if not isinstance(scaling, Mapping):
        return
    kind = scaling.get("rope_type", scaling.get("type"))
    fixed: dict = {}
    yarns = 0
    for _, m in model.named_modules():
        if isinstance(m, YarnRoPE) and kind == "yarn":
            _yarn(m, args, scaling)
            yarns += 1
        elif isinstance(m, SuScaledRoPE) and kind in ("longrope", "su"):
            _longrope(m, args, scaling, fixed, family)
    if kind == "yarn" and not yarns and scaling.get("truncate", True) is not True:
        raise ConfigError(f"config.json: rope_scaling.truncate = {scaling['truncate']!r}, which mlx-lm's "
                          f"{type(model).__module__.rsplit('.', 1)[-1]} does not read (its YaRN always truncates)")


def _yarn(m: nn.Module, args, scaling: Mapping) -> None:
    """transformers' YaRN frequencies (``truncate`` read) and attention factor on ``m``."""
    from workbench.rope import rope_params

    truncate = scaling.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ConfigError(f"config.json: rope_scaling.truncate = {truncate!r} is not true or false")
    factor = scaling.get("factor")
    orig = scaling.get("original_max_position_embeddings")
    if factor is None and orig:
        factor = number(args, "max_position_embeddings") / orig
    r = {"rope_type": "yarn", "rope_theta": number(args, "rope_theta"), "factor": factor,
         "original_max_position_embeddings": orig, "truncate": truncate,
         "beta_fast": scaling.get("beta_fast") or 32, "beta_slow": scaling.get("beta_slow") or 1,
         "attention_factor": scaling.get("attention_factor"), "mscale": scaling.get("mscale"),
         "mscale_all_dim": scaling.get("mscale_all_dim")}
    p = rope_params(m.dims, r)
    m._freqs, m.mscale = p["freqs"], float(p["mscale"])


def _scale(scaling: Mapping, key: str) -> float:
    v = scaling.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ConfigError(f"config.json: rope_scaling.{key} = {v!r} is not a positive number")
    return float(v)


def _longrope(m: nn.Module, args, scaling: Mapping, cache: dict, family: str) -> None:
    """``m`` rotates with the short set (frequencies, attention factor) up to
    original_max_position_embeddings positions, with the long set past them."""
    orig = m.original_max_position_embeddings
    exps = number(args, "rope_theta") ** (mx.arange(0, m.dim, 2, dtype=mx.float32) / m.dim)
    factors = {}
    for key in ("short_factor", "long_factor"):
        f = scaling.get(key)
        if not isinstance(f, (list, tuple)) or len(f) != m.dim // 2:
            raise ConfigError(f"config.json: rope_scaling.{key} must be {m.dim // 2} numbers (one per rotated "
                              f"frequency), got {f!r}"[:200])
        factors[key] = mx.array(f, dtype=mx.float32) * exps
    if family == "phimoe":
        # (transformers' PhimoeRotaryEmbedding: short_factor at every length, short_mscale / long_mscale)
        m._short_freqs = m._freqs = factors["short_factor"]
        m._short_scale, m._scale = _scale(scaling, "short_mscale"), _scale(scaling, "long_mscale")
    else:
        # (short_mscale / long_mscale: read by transformers' Phi-3.5-MoE only)
        attention = scaling.get("attention_factor")
        if attention is None:
            factor = scaling.get("factor") or number(args, "max_position_embeddings") / orig
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        m._short_freqs, m._freqs = factors["short_factor"], factors["long_factor"]
        m._short_scale = m._scale = float(attention)

    def attrs(base):
        def call(self, x, offset=0):
            start = int(mx.max(offset).item()) if isinstance(offset, mx.array) else int(offset)
            long = start + x.shape[-2] > self.original_max_position_embeddings
            return mx.fast.rope(x.at[..., : self.dim].multiply(self._scale if long else self._short_scale),
                                self.dim, traditional=False, base=None, scale=1.0, offset=offset,
                                freqs=self._freqs if long else self._short_freqs)
        return {"__call__": call}

    subclass(m, cache, attrs)
