"""Gemma 3n's KV-shared layers as transformers computes them (see the package doc).

transformers' ``Gemma3nTextConfig.kv_sharing_modes``: the last ``num_kv_shared_layers`` layers
("reuse") have no k/v projections or norms (what ``save_pretrained`` writes holds none) and
attend over the keys and values of the last earlier layer of their kind ("store"), as that
layer computed them in the same forward (after its cache update), with or without a cache.
mlx-lm builds k/v weights for every layer (a strict load of such a checkpoint fails) and, with
no cache, has the shared layers compute their own.
"""
from __future__ import annotations

import mlx.nn as nn

from workbench.checkpoint.corrections.common import subclass

#: what a reusing layer's attention does not have in the original
_KV_MODULES = ("k_proj", "v_proj", "k_norm", "v_norm")


class _Shared:
    """One forward's stored keys and values, per layer kind (a plain object: not a parameter)."""

    def __init__(self):
        self.kv: dict = {}


class _Store:
    """The cache a storing layer updates (or none), recording what the update returns."""

    def __init__(self, cache, shared: _Shared, kind: str):
        self._cache, self._shared, self._kind = cache, shared, kind

    def update_and_fetch(self, keys, values):
        if self._cache is not None:
            keys, values = self._cache.update_and_fetch(keys, values)
        self._shared.kv[self._kind] = (keys, values)
        return keys, values

    def __getattr__(self, name):  # (what attention asks of a cache: bits, group_size ...)
        if self._cache is None:
            raise AttributeError(name)
        return getattr(self._cache, name)


class _Reuse(_Store):
    """What a reusing layer reads: this forward's keys and values of its storing layer."""

    def keys_and_values(self):
        return self._shared.kv[self._kind]


def _language_model(model: nn.Module) -> tuple[str, nn.Module | None]:
    """(path, module) of mlx-lm's gemma3n LanguageModel in ``model`` ("", None: none)."""
    for path, m in model.named_modules():
        if hasattr(m, "first_kv_shared_layer_idx") and hasattr(m, "layer_idx_to_cache_idx"):
            return path, m
    return "", None


def unread(model: nn.Module, weights: dict) -> dict:
    """``weights`` less the reusing layers' k/v (an older save holds them; nothing reads them)."""
    path, lm = _language_model(model)
    if lm is None:
        return weights
    drop = tuple(f"{path}.layers.{i}.self_attn.{m}." for i in range(lm.first_kv_shared_layer_idx, len(lm.layers))
                 for m in _KV_MODULES)
    return {k: v for k, v in weights.items() if not k.startswith(drop)}


def prepare(model: nn.Module) -> None:
    """Before the weights load: no k/v modules on the reusing layers (idempotent)."""
    _, lm = _language_model(model)
    if lm is None:
        return
    for layer in lm.layers[lm.first_kv_shared_layer_idx:]:
        for name in _KV_MODULES:
            if name in layer.self_attn:
                layer.self_attn.pop(name)


def apply(model: nn.Module) -> int:
    """Storing and reusing layers share this forward's k/v; how many layers reuse (idempotent)."""
    _, lm = _language_model(model)
    if lm is None or isinstance(getattr(lm, "shared_kv", None), _Shared):
        return 0
    prepare(model)
    first = lm.first_kv_shared_layer_idx
    if first >= len(lm.layers):
        return 0
    shared = _Shared()
    lm.shared_kv = shared
    kinds = lm.config.layer_types
    stores = {lm.layer_idx_to_cache_idx[i] for i in range(first, len(lm.layers))}

    def attrs(base):
        def call(self, x, mask=None, cache=None, offset=0):
            wrap = _Reuse if self.kv_role == "reuse" else _Store
            return base.__call__(self, x, mask, wrap(cache, self.kv_shared, self.kv_kind), offset=offset)
        return {"__call__": call}

    fixed: dict = {}
    for i, layer in enumerate(lm.layers):
        role = "reuse" if i >= first else "store" if i in stores else None
        if role is None:
            continue
        attn = layer.self_attn
        attn.kv_role, attn.kv_kind, attn.kv_shared = role, kinds[i], shared
        subclass(attn, fixed, attrs)
    return len(lm.layers) - first
