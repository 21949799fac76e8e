"""Where an mlx-lm family computes something other than what its config and its original say.

mlx-lm is a reference, not ground truth: checked against transformers + torch
(tests/test_arch_refs.py), a few families hard-code a choice their checkpoints do not make.
:func:`correct` mends each one on the built model (before it is instrumented), so module
traces carry the original's numbers:

* **the MLP activation**: StarCoder 2 and GPTBigCode call the exact (erf) GELU where their
  checkpoints say ``gelu_pytorch_tanh``, GPT-NeoX the tanh approximation where Pythia says
  ``gelu``, Gemma the exact GELU where transformers' default is ``gelu_pytorch_tanh``: up to
  ~2e-4 of a logit.  Each such MLP gets the activation its config names; an activation this
  table does not know is refused by name.
* **Gemma 3's embedding scale**: mlx-lm multiplies by sqrt(hidden) rounded to bfloat16 in
  every dtype; transformers rounds it to the compute dtype (exact in float32: 5.8e-4 of a
  logit at hidden 80).  The embedding's output is multiplied by the ratio, so the product is
  the original's (the ``embed_tokens`` step then holds the embedding times that ratio,
  within 0.2% of one).

Families not listed read their activation from the config themselves, or were checked
against torch at transformers' default.
"""
from __future__ import annotations

from typing import Mapping

import mlx.core as mx
import mlx.nn as nn

from workbench.errors import ConfigError  # (what mlx-lm computes differently, and cannot be corrected)

#: config activation name -> MLX function (the tanh forms are one formula)
ACTIVATIONS = {"gelu": nn.gelu, "gelu_pytorch_tanh": nn.gelu_approx, "gelu_new": nn.gelu_approx,
               "gelu_fast": nn.gelu_approx, "silu": nn.silu, "swish": nn.silu}

#: family -> (MLP class name, its call with the activation as a parameter, what mlx-lm calls)
_PLAIN = lambda fc, out: (lambda m, x, act: getattr(m, out)(act(getattr(m, fc)(x))))  # noqa: E731
_GATED = lambda m, x, act: m.down_proj(act(m.gate_proj(x)) * m.up_proj(x))  # noqa: E731
FAMILIES = {
    "starcoder2": ("MLP", _PLAIN("c_fc", "c_proj"), "gelu"),
    "gpt_bigcode": ("MLP", _PLAIN("c_fc", "c_proj"), "gelu"),
    "gpt_neox": ("MLP", _PLAIN("dense_h_to_4h", "dense_4h_to_h"), "gelu_pytorch_tanh"),
    "gemma": ("MLP", _GATED, "gelu"),
}
_KEYS = ("hidden_activation", "hidden_act", "activation_function")


def configured(config: Mapping) -> str | None:
    for k in _KEYS:
        if isinstance(config.get(k), str):
            return config[k]
    return None


def correct(model: nn.Module, family: str, config: Mapping) -> None:
    """Apply this module's corrections to ``model`` (an mlx-lm ``family`` built from ``config``)."""
    _activation(model, family, config)
    if family == "gemma3_text" or (family == "gemma3" and isinstance(config.get("text_config"), Mapping)):
        tc = config.get("text_config") if family == "gemma3" else config
        _gemma3_embed_scale(model, tc.get("hidden_size"))


def _subclass(m: nn.Module, cache: dict, make_attrs) -> None:
    """Give module ``m`` a subclass of its class (same name, one per class) overriding the
    attributes ``make_attrs(base class)`` returns."""
    base = type(m)
    if base not in cache:
        cache[base] = type(base.__name__, (base,), {**make_attrs(base), "__module__": base.__module__,
                                                    "__qualname__": base.__qualname__})
    m.__class__ = cache[base]


def _gemma3_embed_scale(model: nn.Module, hidden) -> None:
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden <= 0:
        return
    s = hidden ** 0.5

    def attrs(base):
        def call(self, x):
            e = base.__call__(self, x)
            return e * (mx.array(s, e.dtype) / mx.array(s, mx.bfloat16).astype(e.dtype))
        return {"__call__": call}

    fixed: dict = {}
    for path, m in model.named_modules():
        if path.endswith("embed_tokens") and isinstance(m, (nn.Embedding, nn.QuantizedEmbedding)):
            _subclass(m, fixed, attrs)


def _activation(model: nn.Module, family: str, config: Mapping) -> str | None:
    """Give ``family``'s MLPs the activation ``config`` names when mlx-lm hard-codes another;
    the name applied (None: nothing to correct)."""
    spec = FAMILIES.get(family)
    name = configured(config)
    if spec is None or name is None:
        return None
    cls_name, call, builtin = spec
    if name not in ACTIVATIONS:
        raise ConfigError(f"config.json: activation {name!r} is not one workbench knows for mlx-lm's {family} "
                          f"(known: {', '.join(ACTIVATIONS)})")
    if ACTIVATIONS[name] is ACTIVATIONS[builtin]:
        return None
    act = ACTIVATIONS[name]
    fixed: dict = {}
    for _, m in model.named_modules():
        if type(m).__name__ == cls_name:
            _subclass(m, fixed, lambda base: {"__call__": lambda self, x: call(self, x, act)})
    return name
