"""The precision of float32 matrix products: TF32 or float32 (docs/trace.md, TF32).

MLX's CUDA backend (and Metal's neural accelerators on M5-class chips) runs float32 matmuls
as TF32 (10 mantissa bits in the products, about 1e-3 relative) unless ``MLX_ENABLE_TF32=0``.
MLX reads that variable once, at the process's first float32 GPU matmul, and keeps it:
measured on the H200 with MLX 0.32.4, setting it after that changes nothing, and setting it
any time before (after ``import mlx``, after bfloat16 or CPU matmuls) takes effect.

So :func:`exact_float32` (what every float32 reference computation runs in: the hunt's
float32 recompute, ``workbench dump``, diff's reference) sets ``MLX_ENABLE_TF32=0`` and puts
the user's own value back afterwards; when the process has not yet run a float32 GPU matmul
this makes it full float32 for good (the user's setting cannot be restored inside MLX, only
in the environment); when it already ran one under TF32 the computation runs in TF32 and
says so (:func:`matmul_precision` answers "tf32"): start Python with ``MLX_ENABLE_TF32=0``,
or do the float32 work first.

:func:`matmul_precision` does not trust the variable: on a GPU it multiplies two 64 x 64
float32 matrices whose exact product needs more than TF32's mantissa, once per process.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import mlx.core as mx

#: MLX's environment variable
ENV = "MLX_ENABLE_TF32"
#: the labels: float32 products in full float32, in TF32, or on the CPU (always float32)
FLOAT32, TF32, CPU = "float32", "tf32", "n/a (cpu)"

_probed: str | None = None  # what this process's float32 GPU matmuls run as (MLX keeps it)


def _probe() -> str:
    """Multiply (1 + 2^-12) by ones over 64 terms on the GPU: 64 + 2^-6 in float32, 64 in TF32
    (its 10-bit mantissa drops 2^-12).  64 x 64 goes to cuBLAS (one row would take gemv)."""
    global _probed
    if _probed is None:
        with mx.stream(mx.gpu):
            a = mx.full((64, 64), 1 + 2.0**-12, mx.float32)
            y = (a @ mx.ones((64, 64), mx.float32))[0, 0].item()
        _probed = FLOAT32 if y != 64.0 else TF32
    return _probed


def _on_cpu(device=None) -> bool:
    d = device if device is not None else mx.default_device()
    return getattr(d, "type", None) == mx.cpu or not mx.is_available(mx.gpu)


def matmul_precision(dtype=mx.float32, device=None) -> str:
    """What float32 matmuls run as here: ``"float32"``, ``"tf32"`` or ``"n/a (cpu)"``; for
    another compute ``dtype`` (TF32 concerns float32 only) ``"n/a (bfloat16)"`` and the like.
    On a GPU the first call for float32 runs the probe, which fixes MLX's choice for the
    process if nothing did before (inside :func:`exact_float32`: full float32)."""
    if _on_cpu(device):
        return CPU
    if dtype is not None and dtype != mx.float32:
        from workbench.dtypes import dtype_name

        return f"n/a ({dtype_name(dtype)})"
    return _probe()


@contextmanager
def tf32_setting(value: str | None) -> Iterator[None]:
    """``MLX_ENABLE_TF32`` set to ``value`` (None: unset) for the block, the previous value
    (or its absence) put back after it, also when the block raises."""
    had = ENV in os.environ
    old = os.environ.get(ENV)
    try:
        if value is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = value
        yield
    finally:
        if had:
            os.environ[ENV] = old
        else:
            os.environ.pop(ENV, None)


@contextmanager
def exact_float32(device=None) -> Iterator[str]:
    """Run the block's float32 matmuls in full float32 where MLX still lets us: yields the
    precision they run as (``"float32"``; ``"tf32"`` when this process already fixed TF32;
    ``"n/a (cpu)"`` on the CPU).  The user's ``MLX_ENABLE_TF32`` is restored after."""
    if _on_cpu(device):
        yield CPU
        return
    with tf32_setting("0"):
        yield _probe()


def differs(a: str | None, b: str | None) -> bool:
    """True when two recorded precisions disagree in a way that matters: one side's float32
    products ran as TF32 and the other's did not (unknown, None, never counts)."""
    return bool(a) and bool(b) and a != b and TF32 in (a, b)


def warning(a: str | None, b: str | None, what_a: str = "the reference", what_b: str = "the engine") -> str | None:
    """The one-line warning when :func:`differs`, else None."""
    if not differs(a, b):
        return None
    return (f"matmul precision differs: {what_a} ran under {a}, {what_b} under {b} "
            f"(TF32 alone moves float32 results by about 1e-3 relative; MLX_ENABLE_TF32=0, docs/trace.md)")
