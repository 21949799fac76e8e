"""Small array helpers shared across the library (diff, plots, widgets): no workbench imports."""
from __future__ import annotations

import math
from typing import Any

import numpy as np


def to_numpy(x: Any) -> np.ndarray:
    """numpy or MLX array -> float32 numpy (bfloat16 included)."""
    if isinstance(x, np.ndarray):
        return x.astype(np.float32, copy=False)
    if type(x).__module__.startswith("mlx"):
        import mlx.core as mx

        return np.array(x.astype(mx.float32))
    return np.asarray(x, dtype=np.float32)


def as_ndim(x: np.ndarray, ndim: int, what: str) -> np.ndarray:
    """``x`` with ``ndim`` axes: leading size-1 axes dropped, missing leading axes added;
    ValueError naming ``what`` (e.g. "[tokens, hidden] activation") when it cannot be."""
    shape = list(x.shape)
    while x.ndim > ndim and x.shape[0] == 1:
        x = x[0]
    while x.ndim < ndim:
        x = x[None]
    if x.ndim != ndim:
        raise ValueError(f"expected {what}, got shape {shape}")
    return x


def finite_or_none(x: float | None) -> float | None:
    """A float for JSON: NaN and infinities become None."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return float(x)


def weight_values(model: Any, name: str) -> np.ndarray:
    """A checkpoint weight as float32 numpy, dequantized when the checkpoint packs it.

    ``name``: a tensor (``layers.0.mlp.up_proj.weight``) or a module
    (``layers.0.mlp.up_proj``, meaning its ``.weight``); ``model``: a loaded model (or a
    checkpoint reader).
    """
    import mlx.core as mx

    ck = getattr(model, "checkpoint", model)
    tensor = name if name.endswith((".weight", ".bias", ".scales", ".biases")) or name in ck else name + ".weight"
    if tensor not in ck:
        raise KeyError(f"the checkpoint has no tensor {tensor!r}")
    arr = ck.load(tensor)
    if tensor.endswith(".weight") and not mx.issubdtype(arr.dtype, mx.floating):
        module = tensor[: -len(".weight")]
        spec = ck.quant_of(module) if hasattr(ck, "quant_of") else None
        if spec is None or f"{module}.scales" not in ck:
            raise ValueError(f"{tensor} is stored as {arr.dtype} without a quantization to undo")
        biases = ck.load(f"{module}.biases") if spec.has_biases and f"{module}.biases" in ck else None
        arr = mx.dequantize(arr, ck.load(f"{module}.scales"), biases, group_size=spec.group_size,
                            bits=spec.bits, mode=spec.mode)
    return np.array(arr.astype(mx.float32))
