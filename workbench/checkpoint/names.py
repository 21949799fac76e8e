"""Name layouts: map a tensor name as stored in a checkpoint onto (component, canonical name).

Canonical language-model names are MLX style with the model prefix stripped
(``layers.3.self_attn.q_proj.weight``, ``embed_tokens.weight``, ``lm_head.weight``).
Recognised layouts:

* MLX-converted: ``language_model.model.layers.N...`` (multimodal), ``model.layers.N...``
  (text only), ``language_model.lm_head.weight`` / ``lm_head.weight``;
* original Hugging Face: ``model.language_model.layers.N...`` (Gemma 3 / 4 multimodal),
  ``model.layers.N...``, MoE experts fused as ``experts.gate_up_proj`` [E, 2I, D] and
  ``experts.down_proj`` [E, D, I] (mapped to ``experts.switch_glu.{gate,up,down}_proj.weight``,
  as mlx-lm's sanitize does).

Vision / audio towers and projectors are separate components, never language-model
tensors.
"""
from __future__ import annotations

import difflib
import re
from collections import Counter

#: component prefixes (after an optional leading ``model.``)
COMPONENT_PREFIXES = (
    ("vision_tower", "vision_tower"),
    ("vision_model", "vision_tower"),
    ("audio_tower", "audio_tower"),
    ("embed_vision", "embed_vision"),
    ("embed_audio", "embed_audio"),
    ("multi_modal_projector", "multi_modal_projector"),
    ("vision_embedder", "vision_embedder"),
)

#: LM prefixes, longest first: (prefix, layout)
LM_PREFIXES = (
    ("model.language_model.model.", "hf"),
    ("model.language_model.", "hf"),
    ("language_model.model.", "mlx"),
    ("language_model.", "mlx"),
    ("model.", "any"),
)

#: tensors that loaders drop on purpose (precomputed rotary tables, calibration ranges)
IGNORED_PATTERNS = ("rotary_emb.inv_freq", "self_attn.rotary_emb", "input_max", "input_min",
                    "output_max", "output_min")

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def split_name(name: str) -> tuple[str, str, str]:
    """(component, stripped name, layout) for a checkpoint tensor name.

    ``layout`` is "hf" when the name can only come from the original Hugging Face layout,
    "mlx" otherwise (text-only models share one layout).
    """
    bare = name[len("model."):] if name.startswith("model.") else name
    for pre, comp in COMPONENT_PREFIXES:
        if bare == pre or bare.startswith(pre + "."):
            return comp, bare, "any"
    for pre, layout in LM_PREFIXES:
        if name.startswith(pre):
            return "language_model", name[len(pre):], layout
    return "language_model", name, "any"


def canonical(name: str, split: tuple | None = None) -> list[tuple[str, str | None]]:
    """Canonical LM names a checkpoint tensor provides: [(canonical, part)], where part
    is None (the whole tensor), "gate" or "up" (a half of a fused HF gate_up_proj).
    ``split``: ``split_name(name)`` when the caller has it already."""
    comp, bare, _ = split or split_name(name)
    if comp != "language_model":
        return []
    if bare.endswith(".experts.gate_up_proj"):
        base = bare[: -len(".gate_up_proj")]
        return [(f"{base}.switch_glu.gate_proj.weight", "gate"), (f"{base}.switch_glu.up_proj.weight", "up")]
    if bare.endswith(".experts.down_proj"):
        base = bare[: -len(".down_proj")]
        return [(f"{base}.switch_glu.down_proj.weight", None)]
    return [(bare, None)]


def is_ignored(name: str) -> bool:
    return any(p in name for p in IGNORED_PATTERNS)


def layer_of(name: str) -> int | None:
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def module_of(canon: str) -> str:
    """``layers.3.self_attn.q_proj.weight`` -> ``layers.3.self_attn.q_proj``."""
    return canon.rsplit(".", 1)[0] if "." in canon else canon


_TOKENS = re.compile(r"[._]")


class NearIndex:
    """The nearest name to a query among candidates of the same layer (difflib ratio >=
    ``cutoff``), in bounded time per query: a layer with at most ``SMALL`` candidates is
    searched whole (difflib, as before); a larger one (100k unexpected tensors) only on a
    shortlist from an index of name tokens (split at ``.`` and ``_``) held by at most
    ``RARE`` candidates.  Building is linear in the names, each query bounded."""

    SMALL = 200
    RARE = 64

    def __init__(self, names):
        self.by_layer: dict = {}
        for n in names:
            self.by_layer.setdefault(layer_of(n), []).append(n)
        self._inv: dict = {}

    def nearest(self, name: str, cutoff: float = 0.75) -> str | None:
        lay = layer_of(name)
        group = self.by_layer.get(lay, ())
        if len(group) > self.SMALL:
            group = self._shortlist(name, lay, group)
        m = difflib.get_close_matches(name, group, n=1, cutoff=cutoff)
        return m[0] if m else None

    def _shortlist(self, name, lay, group) -> list:
        inv = self._inv.get(lay)
        if inv is None:
            inv = {}
            for n in group:
                for t in set(_TOKENS.split(n)):
                    inv.setdefault(t, []).append(n)
            self._inv[lay] = inv
        hits = Counter()
        for t in set(_TOKENS.split(name)):
            ns = inv.get(t)
            if ns is not None and len(ns) <= self.RARE:
                hits.update(ns)
        return [n for n, _ in hits.most_common(self.SMALL)]
