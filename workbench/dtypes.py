"""Compute dtypes by name: one parser and one printer for every module."""
from __future__ import annotations

import mlx.core as mx

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}
_ALIASES = {"fp32": "float32", "f32": "float32", "bf16": "bfloat16", "fp16": "float16", "f16": "float16",
            "half": "float16"}


def parse_dtype(dtype) -> mx.Dtype | None:
    """None, an ``mx.Dtype``, or a name (``"float16"``, ``"bf16"``, ``"mlx.core.float32"``)."""
    if dtype is None or isinstance(dtype, mx.Dtype):
        return dtype
    key = dtype_name(dtype)
    key = _ALIASES.get(key, key)
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[key]


def dtype_name(dtype) -> str:
    """``mx.float16`` -> ``"float16"``."""
    return str(dtype).replace("mlx.core.", "")
