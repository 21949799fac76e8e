"""Sliding windows the original applies and mlx-lm's family does not (see the package doc).

Every original listed in ``reference_config.WINDOWS_APPLIED`` masks with transformers'
``sliding_window_causal_mask_function``: query position ``i`` sees key position ``j`` when
``i - window < j <= i`` (the window counts the query's own position).  Each attention module
of a layer the original slides builds that mask itself, from its own KV cache (the offset
before this call: a decoding step past the window is masked as the prompt was), and the mask
mlx-lm's model body passes it (causal) is ANDed in.
"""
from __future__ import annotations

from typing import Mapping

import mlx.core as mx
import mlx.nn as nn

from workbench.checkpoint import reference_config
from workbench.errors import ConfigError
from workbench.checkpoint.corrections.common import subclass


def sliding_layers(config: Mapping, n_layers: int) -> tuple[int | None, list[bool]]:
    """(window, which of ``n_layers`` layers the original slides) for ``config``; (None, []) when
    the original applies no window or workbench has no rule for its model type."""
    mt = config.get("model_type")
    rule = reference_config.WINDOWS_APPLIED.get(mt) if isinstance(mt, str) else None
    if rule is None:
        return None, []
    original = reference_config.original_config(config)
    src = (lambda k: getattr(original, k, None)) if original is not None else config.get
    w = src("sliding_window")
    if isinstance(w, bool) or not isinstance(w, int) or w <= 0 or src("use_sliding_window") is False:
        return None, []
    if rule == "every layer":
        return w, [True] * n_layers
    kinds = src("layer_types")
    if not isinstance(kinds, (list, tuple)) or len(kinds) != n_layers:
        raise ConfigError(f"config.json: layer_types = {reference_config.show(kinds)} does not say which of the "
                          f"{n_layers} layers slide (sliding_window = {w})")
    return w, [k == "sliding_attention" for k in kinds]


def window_mask(x: mx.array, mask, cache, window: int):
    """transformers' sliding-window causal mask for the ``x.shape[1]`` new positions (past ones
    read from ``cache``), ANDed with ``mask`` when that is an array."""
    n = x.shape[1]
    if cache is not None and hasattr(cache, "make_mask"):
        win = cache.make_mask(n, window_size=window, return_array=True)
    else:
        from mlx_lm.models.base import create_causal_mask
        win = create_causal_mask(n, 0, window_size=window)
    if win is None or not isinstance(mask, mx.array):
        return win if win is not None else mask
    if mask.dtype == mx.bool_:
        return mx.logical_and(mask, win)
    return mx.where(win, mask, mx.array(-mx.inf, mask.dtype))


def apply(model: nn.Module, config: Mapping) -> int:
    """Window the attention of every layer the original slides and mlx-lm does not; how many."""
    layers = list(getattr(model, "layers", None) or [])
    window, slides = sliding_layers(config, len(layers))
    if window is None:
        return 0

    def attrs(base):
        def call(self, x, mask=None, cache=None):
            return base.__call__(self, x, window_mask(x, mask, cache, self.sliding_window), cache)
        return {"__call__": call}

    fixed: dict = {}
    done = 0
    for layer, slides_here in zip(layers, slides):
        attn = getattr(layer, "self_attn", None)
        if not slides_here or getattr(layer, "use_sliding", False) or attn is None:
            continue  # (mlx-lm's llama windows the layers layer_types marks itself)
        attn.sliding_window = window
        subclass(attn, fixed, attrs)
        done += 1
    return done
