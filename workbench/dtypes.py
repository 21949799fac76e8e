"""Compute dtypes by name (one parser and one printer for every module), and the float facts
written once: each compute dtype's largest finite value (:data:`FLOAT_MAX`), float16's
lowest (the mask fill) and the bfloat16 -> float32 conversion on the host.

MLX is imported only when a dtype is parsed, so the checkpoint reader (numpy only) can take
the float facts without pulling in MLX.
"""
from __future__ import annotations

import numpy as np

#: float16's largest finite value (its lowest is -FP16_MAX: attention's mask fill in float16)
FP16_MAX = 65504.0
#: float16's lowest finite value: attention's mask fill in float16 (below it: masked positions)
FP16_LOWEST = -FP16_MAX
#: bfloat16's largest finite value (float32's exponent range, 8 bits of mantissa)
BF16_MAX = 3.3895313892515355e38
#: float32's largest finite value
F32_MAX = float(np.finfo(np.float32).max)
#: the largest finite value of each compute dtype, by name (the one per-dtype limits table)
FLOAT_MAX = {"float32": F32_MAX, "bfloat16": BF16_MAX, "float16": FP16_MAX}

_NAMES = ("float32", "bfloat16", "float16")
_ALIASES = {"fp32": "float32", "f32": "float32", "bf16": "bfloat16", "fp16": "float16", "f16": "float16",
            "half": "float16"}


def bf16_to_f32(bits: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The float32 values of bfloat16 ``bits`` (a uint16 array, or 2-byte void: raw bytes):
    each shifted into the high half of a float32, bit-exactly.  ``out``: a float32 (or uint32) array of ``bits.size``
    elements to write them into (else a new one); returns the float32 values, flat when
    ``out`` is given, else of ``bits``' shape."""
    if getattr(bits, "dtype", None) is not None and bits.dtype.kind == "V":
        bits = np.ascontiguousarray(bits).view(np.uint16)
    if out is None:
        return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)
    np.left_shift(bits, 16, out=out.view(np.uint32), dtype=np.uint32)
    return out.view(np.float32)


def parse_dtype(dtype):
    """None, an ``mx.Dtype``, or a name (``"float16"``, ``"bf16"``, ``"mlx.core.float32"``)."""
    import mlx.core as mx

    if dtype is None or isinstance(dtype, mx.Dtype):
        return dtype
    key = dtype_name(dtype)
    key = _ALIASES.get(key, key)
    if key not in _NAMES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(_NAMES)}")
    return getattr(mx, key)


def dtype_name(dtype) -> str:
    """``mx.float16`` -> ``"float16"``."""
    return str(dtype).replace("mlx.core.", "")
