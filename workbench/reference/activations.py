"""The MLP activation a config names, where mlx-lm's family hard-codes another.

Some mlx-lm families call one GELU whatever the config says: StarCoder 2 and GPTBigCode
the exact (erf) GELU where their checkpoints say ``gelu_pytorch_tanh``, GPT-NeoX the tanh
approximation where Pythia says ``gelu``, Gemma the exact GELU where transformers' default
is ``gelu_pytorch_tanh``.  The two differ by up to ~2e-4 of a logit: small, and wrong.
:func:`correct` gives each such MLP (before it is instrumented) the activation its config
names; an activation this table does not know is refused by name.  Families not listed
read their activation from the config themselves, or were checked against torch at
transformers' default (tests/test_arch_refs.py).
"""
from __future__ import annotations

from typing import Mapping

import mlx.nn as nn

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


class ConfigError(ValueError):
    pass


def configured(config: Mapping) -> str | None:
    for k in _KEYS:
        if isinstance(config.get(k), str):
            return config[k]
    return None


def correct(model: nn.Module, family: str, config: Mapping) -> str | None:
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
    fixed = {}
    for _, m in model.named_modules():
        base = type(m)
        if base.__name__ != cls_name:
            continue
        if base not in fixed:
            fixed[base] = type(base.__name__, (base,), {"__call__": lambda self, x: call(self, x, act),
                                                        "__module__": base.__module__,
                                                        "__qualname__": base.__qualname__})
        m.__class__ = fixed[base]
    return name
