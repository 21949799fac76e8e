"""Rotary position embedding: the arguments of ``mx.fast.rope`` for every rope type a
config names (default, linear, llama3, yarn, proportional, dynamic), with transformers' formulas;
the op programs' (workbench/models/) and the reference corrections' (YaRN) alike."""
from __future__ import annotations

import math
from typing import Mapping

import mlx.core as mx


def rope_params(head_dim: int, rope: Mapping, traditional: bool = False) -> dict:
    """Arguments for ``mx.fast.rope`` from one normalised rope dict (a family Config's
    ``rope[type]``, see :func:`workbench.checkpoint.fields.read_rope`): rope types default,
    linear, llama3, yarn and proportional (Gemma 4's partial rotation over the full head dimension), with
    transformers' formulas."""
    params = _rope_params(head_dim, rope)
    params["traditional"] = bool(traditional)
    return params


def _rope_params(head_dim, r):
    rope_type, base = r["rope_type"], r["rope_theta"]
    if rope_type in ("default", "linear"):
        scale = 1.0 / r["factor"] if rope_type == "linear" else 1.0
        return dict(dims=head_dim, base=base, scale=scale, freqs=None, type=rope_type)
    if rope_type == "llama3":
        factor, low, high = r["factor"], r["low_freq_factor"], r["high_freq_factor"]
        old = r["original_max_position_embeddings"]
        low_wl, high_wl = old / low, old / high
        freqs = base ** (mx.arange(0, head_dim, 2) / head_dim)
        wl = 2 * mx.pi * freqs
        freqs = mx.where(wl > low_wl, freqs * factor, freqs)
        medium = (wl > high_wl) & (wl < low_wl)
        smooth = (old / wl - low) / (high - low)
        smooth_freqs = freqs / ((1 - smooth) / factor + smooth)
        freqs = mx.where(medium, smooth_freqs, freqs)
        return dict(dims=head_dim, base=None, scale=1.0, freqs=freqs, type=rope_type)
    if rope_type == "proportional":
        # transformers: the first int(prf * head_dim // 2) frequencies rotate (exponents over the
        # full head_dim), the rest do not (infinite wavelength); all divided by factor
        angles = int(r["partial_rotary_factor"] * head_dim // 2)
        exps = mx.arange(0, 2 * angles, 2, dtype=mx.float32) / head_dim
        freqs = mx.concatenate([r["factor"] * (base ** exps), mx.full((head_dim // 2 - angles,), mx.inf)])
        return dict(dims=head_dim, base=None, scale=1.0, freqs=freqs, type=rope_type, rotated_dims=2 * angles)
    if rope_type == "yarn":
        return _yarn(head_dim, base, r)
    if rope_type == "dynamic":  # (frequencies per forward: dynamic_freqs)
        return dict(dims=head_dim, base=None, scale=1.0, freqs=None, type=rope_type, dynamic=(
            base, r["factor"], r["max_position_embeddings"]))
    raise ValueError(f"unsupported rope type {rope_type!r} (supported: default, linear, llama3, yarn, proportional, dynamic)")


def _yarn(dims, base, r):
    """YaRN as transformers computes it: blended frequencies, and the attention factor
    applied to queries and keys (``mscale``)."""
    factor, orig = r["factor"], r["original_max_position_embeddings"]

    def correction_dim(rot):
        return dims * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    low, high = correction_dim(r["beta_fast"]), correction_dim(r["beta_slow"])
    if r["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001
    ramp = mx.clip((mx.arange(dims // 2, dtype=mx.float32) - low) / (high - low), 0, 1)
    mask = 1.0 - ramp
    extra = base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
    inter = factor * extra
    freqs = (inter * extra) / (inter * mask + extra * (1 - mask))
    ms = r["attention_factor"]
    if ms is None:
        m, mad = r["mscale"], r["mscale_all_dim"]
        ms = get_mscale(factor, m) / get_mscale(factor, mad) if (m and mad) else get_mscale(factor)
    return dict(dims=dims, base=None, scale=1.0, freqs=freqs, type="yarn", mscale=ms)


def dynamic_freqs(dims: int, dynamic: tuple, seq_len: mx.array) -> mx.array:
    """Dynamic NTK RoPE's wavelengths (``mx.fast.rope``'s ``freqs``) for a forward whose
    positions end at ``seq_len`` (transformers' ``_compute_dynamic_ntk_parameters`` with
    ``seq_len = max(position_ids) + 1``, as its ``dynamic_rope_update`` calls it): the base
    grows once the sequence passes ``max_position_embeddings``.  (transformers also keeps the
    grown frequencies for a later shorter call on the same model object, while that call is
    longer than the original: a fresh model's numbers are computed here.)"""
    base, factor, mpe = dynamic
    n = mx.maximum(seq_len.astype(mx.float32), float(mpe))
    grown = base * ((factor * n / mpe) - (factor - 1)) ** (dims / (dims - 2))
    return grown ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
