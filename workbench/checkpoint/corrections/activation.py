"""The MLP activation a family hard-codes where its config names another (see the package doc)."""
from __future__ import annotations

from typing import Mapping

import mlx.nn as nn

from workbench.checkpoint import reference_config
from workbench.errors import ConfigError
from workbench.checkpoint.corrections.common import subclass, subclass_all

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
    """The activation the original runs: as its config class reads ``config`` (transformers'
    GemmaConfig reads Gemma 1's published ``hidden_act: "gelu"`` as ``gelu_pytorch_tanh``),
    else as the config writes it."""
    original = reference_config.original_config(config) if isinstance(config.get("model_type"), str) else None
    for read in ([(lambda k: getattr(original, k, None))] if original is not None else []) + [config.get]:
        for k in _KEYS:
            if isinstance(read(k), str):
                return read(k)
    return None


def apply(model: nn.Module, family: str, config: Mapping) -> str | None:
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
    subclass_all(model, cls_name, lambda base: {"__call__": lambda self, x: call(self, x, act)})
    return name


def gemma3_embed_scale(model: nn.Module, hidden) -> None:
    """Gemma 3's embedding scale rounded to the compute dtype, not to bfloat16."""
    import mlx.core as mx

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
            subclass(m, fixed, attrs)
