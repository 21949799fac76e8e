"""Tensor layouts transformers writes that a reference's own ``sanitize`` does not read.

mlx-lm's ``sanitize`` converts the layouts it was written for (the original Hub
checkpoints, its own conversions).  transformers 5's ``save_pretrained`` writes a few
families differently; :func:`convert` turns those into a layout the reference's sanitize
does read, by name and shape only (a transpose or a rename: works on arrays and on
placeholders alike), before that sanitize runs:

* gpt2: names under ``transformer.`` (the original checkpoints have none);
* gemma3n: a text-only checkpoint's names (``model.layers...``) under the wrapper's
  ``model.language_model.``;
* gpt_oss: unquantized experts as transformers stores them (``experts.gate_up_proj``
  [E, hidden, 2 x inter], ``experts.down_proj`` [E, inter, hidden], input-major), which
  mlx-lm's sanitize reads only in the MXFP4 block layout: made ``.weight`` [E, out, in].

Both ``workbench.load`` (reference/model.py) and ``inspect`` (reference_arch.py) apply it,
so they agree on what a checkpoint holds.
"""
from __future__ import annotations

from typing import Callable, Mapping


def _gpt2(weights: Mapping) -> dict:
    return {(k[len("transformer."):] if k.startswith("transformer.") else k): v for k, v in weights.items()}


def _gpt_oss(weights: Mapping) -> dict:
    out = {}
    for k, v in weights.items():
        if k.endswith(("experts.gate_up_proj", "experts.down_proj")) and len(getattr(v, "shape", ())) == 3:
            out[k + ".weight"] = v.swapaxes(-1, -2)
        else:
            out[k] = v
    return out


def _gemma3n(weights: Mapping) -> dict:
    """A text-only Gemma 3n checkpoint (transformers' Gemma3nForCausalLM: ``model.layers...``)
    under the wrapper's ``model.language_model.``; a multimodal one is left as it is."""
    if any(k.startswith("model.language_model.") for k in weights):
        return dict(weights)
    return {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
            for k, v in weights.items()}


#: reference family -> conversion (weights by stored name -> weights the family's sanitize reads)
CONVERSIONS: dict[str, Callable[[Mapping], dict]] = {"gpt2": _gpt2, "gpt_oss": _gpt_oss, "gemma3n": _gemma3n}


def convert(family: str, weights: Mapping) -> dict:
    """``weights`` in a layout ``family``'s own sanitize reads (unchanged for most families)."""
    f = CONVERSIONS.get(family)
    return f(weights) if f is not None else dict(weights)


def with_conversion(model_cls, family: str):
    """``model_cls`` whose ``sanitize`` first applies :func:`convert` (same name, so module
    kinds read as before); ``model_cls`` itself when the family needs none."""
    if family not in CONVERSIONS:
        return model_cls

    def sanitize(self, weights):
        weights = convert(family, weights)
        parent = getattr(super(cls, self), "sanitize", None)
        return parent(weights) if parent is not None else weights

    cls = type(model_cls.__name__, (model_cls,), {"sanitize": sanitize, "__module__": model_cls.__module__,
                                                  "__qualname__": model_cls.__qualname__})
    return cls
