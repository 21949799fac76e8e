"""Fused or explicit attention, per layer: what ``workbench.load(path, attention=...)`` and
``model.trace(..., attention=...)`` accept, and the programs built for each choice.

* ``"fused"`` (the default): every layer's attention is one op,
  ``layers.{i}.self_attn.context`` (kind "attention"), computed by
  ``mx.fast.scaled_dot_product_attention`` as mlx-lm does: the [B, H, T, S] scores are
  never materialised, so long prompts fit;
* ``"explicit"``: every layer's attention is three steps, ``.scores`` -> ``.softmax`` ->
  ``.context`` (the same context values; see docs/ops.md, Attention);
* layers: ``3``, ``"layers.3"`` or a list of them -- those layers explicit, the others fused.

A program is cheap to build, so a model keeps one per choice (:class:`Programs`).
"""
from __future__ import annotations

from typing import Callable

from workbench.program import Program, layer_of

CHOICES = ("fused", "explicit")


def explicit_layers(attention, num_layers: int) -> frozenset[int]:
    """The layers whose attention is explicit under ``attention`` (see the module docstring)."""
    if attention is None or attention == "fused":
        return frozenset()
    if attention == "explicit":
        return frozenset(range(num_layers))
    items = [attention] if isinstance(attention, (int, str)) else attention
    try:
        items = list(items)
    except TypeError:
        raise ValueError(f"attention must be 'fused', 'explicit' or layers (3, 'layers.3' or a list), "
                         f"not {attention!r}") from None
    out = set()
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise ValueError(f"attention: {item!r} is not a layer (3 or 'layers.3')")
        i = item if isinstance(item, int) else layer_of(item)
        if i is None or (isinstance(item, str) and item != f"layers.{i}"):
            raise ValueError(f"attention: {item!r} is not 'fused', 'explicit' or a layer name like 'layers.3'")
        if not 0 <= i < num_layers:
            raise ValueError(f"attention: layer {i} out of range (the model has {num_layers} layers)")
        out.add(i)
    return frozenset(out)


class Programs:
    """One model's op programs, one per set of explicit layers, built on first use and kept.

    ``build(explicit)`` builds the program with attention explicit in those layers."""

    def __init__(self, build: Callable[[frozenset], Program], num_layers: int):
        self._build = build
        self.num_layers = num_layers
        self._built: dict[frozenset, Program] = {}

    def get(self, attention) -> Program:
        key = explicit_layers(attention, self.num_layers)
        program = self._built.get(key)
        if program is None:
            program = self._built[key] = self._build(key)
        return program
