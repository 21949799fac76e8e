"""Fused or explicit attention, per layer: what ``workbench.load(path, attention=...)`` and
``model.trace(..., attention=...)`` accept, and the programs built for each choice.

* ``"fused"`` (the default): every layer's attention is one op,
  ``layers.{i}.self_attn.context`` (kind "attention"), computed by
  ``mx.fast.scaled_dot_product_attention`` as mlx-lm does: the [B, H, T, S] scores are
  never materialised, so long prompts fit;
* ``"explicit"``: every layer's attention is three steps, ``.scores`` -> ``.softmax`` ->
  ``.context`` (the same context values; see docs/ops.md, Attention);
* layers: ``3``, ``"layers.3"`` or a list of them -- those layers explicit, the others fused;
* ``{"layers": <"explicit" or layers>, "queries": (start, stop)}``: those layers explicit for
  the query positions ``start .. stop - 1`` only (a slice works too): their ``scores`` and
  ``softmax`` steps are [B, H, rows, S], and ``context`` is the fused kernel's for the other
  rows, ``softmax @ values`` for those (so an intervention on the softmax reaches the output);
  positions count from the sequence's start (a cached prefix included), so a long prompt's
  window of interest stays explicit, and small, at any length.

A program is cheap to build, so a model keeps one per choice (:class:`Programs`).
"""
from __future__ import annotations

from typing import Callable

from workbench.attention import CHOICES
from workbench.program import Program, layer_of


def attention_spec(attention, num_layers: int) -> tuple[frozenset[int], tuple[int, int] | None]:
    """(explicit layers, query positions ``(start, stop)`` or None for all) of ``attention``
    (see the module docstring)."""
    if not isinstance(attention, dict):
        return explicit_layers(attention, num_layers), None
    unknown = sorted(set(attention) - {"layers", "queries"})
    if unknown or "layers" not in attention:
        raise ValueError(f"attention: a dict takes 'layers' (required) and 'queries', not {sorted(attention)}")
    layers = explicit_layers(attention["layers"], num_layers)
    q = attention.get("queries")
    if q is None:
        return layers, None
    if isinstance(q, slice):
        if q.step not in (None, 1):
            raise ValueError(f"attention: queries {q!r} must be a contiguous range (no step)")
        q = (q.start if q.start is not None else 0, q.stop)
    try:
        start, stop = q
    except (TypeError, ValueError):
        raise ValueError(f"attention: queries must be (start, stop) or a slice, not {q!r}") from None
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (start, stop)) or not 0 <= start < stop:
        raise ValueError(f"attention: queries must be positions 0 <= start < stop, not {q!r}")
    return layers, (start, stop)


def explicit_layers(attention, num_layers: int) -> frozenset[int]:
    """The layers whose attention is explicit under ``attention`` (see the module docstring)."""
    if isinstance(attention, dict):
        return attention_spec(attention, num_layers)[0]
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
    """One model's op programs, one per attention choice, built on first use and kept.

    ``build(explicit, queries, prune)`` builds the program with attention explicit in those
    layers (for the query positions ``queries``, or all of them when None); ``prune``: with
    the family's ``live_rows`` op (workbench.models.builder.Builder.live_rows)."""

    def __init__(self, build: Callable[[frozenset, tuple | None, bool], Program], num_layers: int):
        self._build = build
        self.num_layers = num_layers
        self._built: dict[tuple, Program] = {}

    def get(self, attention, prune: bool = False) -> Program:
        explicit, queries = attention_spec(attention, self.num_layers)
        key = (explicit, queries if explicit else None, bool(prune))
        program = self._built.get(key)
        if program is None:
            program = self._built[key] = self._build(*key)
        return program
