"""The CUDA path: one custom kernel (``stats_kernel.cu``, package data, loaded as text) per
chunk of outputs of one dtype, each output read once where it lies, exact NaN / Inf / fill
counts in the same pass, queued with ``mx.async_eval`` so the trace synchronises once, when
it reads the statistics (:meth:`.pending.Pending.result`, :func:`.pending.results`).

A kernel reduces at least :data:`K` outputs of one dtype (or the rest), and up to
:data:`K_MAX` while their elements stay within :data:`CHUNK_ELEMS` (small outputs: there the
launches, not the reads, are the cost; benchmarks/README.md, CUDA statistics); sums go to
float64 every 8 elements (a float32 sum of 8, or float64 element by element where a value
passes the threshold or is not finite).  The host gets 48 bytes an output (:data:`SLOT`
words) and folds them (:func:`fold_slots`) into the common partials.

The real kernel runs only on MLX's CUDA backend: ``benchmarks/check_cuda_stats.py`` checks
it there against float64 numpy.
"""
from __future__ import annotations

import functools
import math
import operator
import os
from importlib import resources
from typing import Sequence

import mlx.core as mx
import numpy as np

from workbench.trace.stats.common import Meta, Rows, as_meta, dmax_of, dtype_max, finish

K = 32
K_MAX = 128
CHUNK_ELEMS = 1 << 27
THREADS = 256
#: words of an output's slot: float64 sum and sum of squares (4), the max and the negated
#: min as order-preserving uint32 keys (2), zeros, fill, NaN, +Inf, -Inf (5), padding (1)
SLOT = 12
#: the template's FK: which lowest finite value is mask fill
FILL_KIND = {mx.float32: 0, mx.float16: 1, mx.bfloat16: 2}
#: below the fast path's threshold every value is finite, not fill, and safe to sum in float32
#: over 8 elements: this, or the dtype's largest finite value where that is lower (float16:
#: its fill, the negation, takes the element path; float32's and bfloat16's fill lie past it)
SUM_SAFE = 1e18


def threshold(dtype) -> float:
    """The fast path's threshold of a float dtype: :data:`SUM_SAFE`, or the dtype's largest
    finite value where that is lower (float16's)."""
    return min(SUM_SAFE, dtype_max(dtype))
_DEFINE = {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16"}
_KERNELS: dict = {}


def kernel_constants() -> dict:
    """Per float dtype the kernel reads: (its mask fill, its fast path's threshold), the values
    written into the kernel's source (:func:`kernel_source`) from the host's dtype facts."""
    return {dt: (-dtype_max(dt), threshold(dt)) for dt in FILL_KIND}


def _c_float(v: float) -> str:
    """``v`` as a C float literal that parses to the same float32."""
    return f"{float(np.float32(v))!r}f"


@functools.lru_cache(maxsize=1)
def kernel_source() -> tuple[str, str]:
    """(header, body) of the kernel: ``stats_kernel.cu`` split at its body marker, the header
    after the constants' ``#define``\\ s (:func:`kernel_constants`)."""
    text = resources.files("workbench.trace.stats").joinpath("stats_kernel.cu").read_text()
    header, body = text.split("// ---- body ----\n")
    consts = kernel_constants()
    defines = [f"#define WB_FILL_{_DEFINE[dt]} ({_c_float(fill)})" for dt, (fill, _) in consts.items()]
    defines += [f"#define WB_TH_F16 ({_c_float(consts[mx.float16][1])})",
                f"#define WB_TH_WIDE ({_c_float(consts[mx.float32][1])})"]
    return "\n".join(defines) + "\n" + header, body


def on_cuda() -> bool:
    """Whether MLX computes on a CUDA GPU (then statistics use :func:`cuda_parts`);
    ``WORKBENCH_STATS_CUDA=0`` turns the kernel off (``1`` or unset: on where CUDA is)."""
    env = os.environ.get("WORKBENCH_STATS_CUDA", "1").strip()
    if env not in ("0", "1"):
        raise ValueError(f"WORKBENCH_STATS_CUDA={env!r}: expected 0 (no CUDA statistics kernel) or 1 (the default)")
    return env == "1" and mx.default_device().type == mx.DeviceType.gpu and _cuda_available()


@functools.lru_cache(maxsize=1)
def _cuda_available() -> bool:
    """Whether this MLX has a CUDA backend with a device (asked once per process)."""
    cuda = getattr(mx, "cuda", None)
    return cuda is not None and bool(cuda.is_available())


def kernel(k: int):
    """The compiled kernel for ``k`` inputs (made once per ``k``)."""
    fn = _KERNELS.get(k)
    if fn is None:
        header, body = kernel_source()
        cases = "\n".join(f"    case {j}: x = in{j}; shp = in{j}_shape.data(); str = in{j}_strides.data(); "
                          f"nd = in{j}_ndim; break;" for j in range(1, k))
        fn = _KERNELS[k] = mx.fast.cuda_kernel(
            name=f"workbench_stats4_{k}", input_names=[f"in{j}" for j in range(k)], output_names=["out"],
            source=body.replace("@CASES@", cases), header=header, ensure_row_contiguous=False)
    return fn


def _blocks(n: int) -> int:
    """Blocks per input: enough to fill the GPU for large outputs, one for small ones."""
    return max(1, min(256, -(-n // (THREADS * 32))))


def chunk_bounds(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """The kernels' chunks of outputs of ``sizes`` (elements, ascending): ``(start, stop)``
    ranges of at least :data:`K` outputs (or the rest), and more, up to :data:`K_MAX`, while
    the chunk's elements stay within :data:`CHUNK_ELEMS`."""
    out, c, n = [], 0, len(sizes)
    while c < n:
        e, total = c, 0
        while e < n and e - c < K_MAX and (e - c < K or total + sizes[e] <= CHUNK_ELEMS):
            total += sizes[e]
            e += 1
        out.append((c, e))
        c = e
    return out


class CudaPlan:
    """How :func:`cuda_parts` groups a batch of outputs into kernels: ``kernels`` holds, per
    kernel, its dtype, its outputs' indices (ascending sizes) and its blocks per output;
    ``order`` the indices in slot order; ``cast`` the outputs read as float32 copies (not a
    float dtype) and ``flat`` the scalars (read as [1]); ``dmax`` each output's dtype's
    largest finite value (:class:`~workbench.trace.stats.common.Meta`)."""

    __slots__ = ("kernels", "order", "cast", "flat", "dmax")

    def __init__(self, dtypes: Sequence, ndims: Sequence[int], sizes: Sequence[int]):
        self.dmax = dmax_of(dtypes)
        by_dtype: dict = {}
        self.cast, self.flat = [], []
        for i, (dt, nd, n) in enumerate(zip(dtypes, ndims, sizes)):
            if not n:
                continue
            if dt not in FILL_KIND:
                self.cast.append(i)
                dt = mx.float32
            if nd == 0:  # (the kernel reads every input's shape; MLX passes none for a scalar)
                self.flat.append(i)
            by_dtype.setdefault(dt, []).append((n, i))
        self.kernels, self.order = [], []
        for dt, items in by_dtype.items():
            items.sort(key=lambda t: t[0])  # similar sizes share a kernel (and its block count)
            for lo, hi in chunk_bounds([n for n, _ in items]):
                idx = tuple(i for _, i in items[lo:hi])
                self.kernels.append((dt, idx, _blocks(items[hi - 1][0])))
                self.order += idx


#: plans by the outputs' dtypes, ranks and sizes rounded up to a power of two, so a decoding
#: loop's forwards, whose KV-cache ops grow by a token each, share one plan (any grouping of
#: one dtype's outputs gives the same statistics; the sizes only steer speed); bounded: the
#: table is emptied when it passes PLANS_MAX
PLANS: dict = {}
PLANS_MAX = 64
_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")


def cuda_plan(values: Sequence[mx.array], shapes: Sequence[tuple] | None = None,
              dtypes: Sequence | None = None) -> tuple[CudaPlan, Meta]:
    """The :class:`CudaPlan` of ``values`` (made once per signature, see :data:`PLANS`) and
    their :class:`~workbench.trace.stats.common.Meta`; ``shapes`` and ``dtypes``: theirs, where
    the caller has them already (a trace records them).  The per-output work is C loops
    (``map``), no Python."""
    shapes = list(map(_SHAPE, values)) if shapes is None else shapes
    dtypes = list(map(_DTYPE, values)) if dtypes is None else dtypes
    sizes = list(map(math.prod, shapes))
    ndims = tuple(map(len, shapes))
    key = (tuple(dtypes), ndims, tuple(map(int.bit_length, sizes)))
    plan = PLANS.get(key)
    if plan is None:
        if len(PLANS) >= PLANS_MAX:
            PLANS.clear()
        plan = PLANS[key] = CudaPlan(dtypes, ndims, sizes)
    return plan, Meta(np.fromiter(sizes, np.int64, len(sizes)), plan.dmax)


def cuda_parts(values: Sequence[mx.array], plan: CudaPlan | None = None):
    """Lazy statistics slots of ``values`` (empty ones skipped): one kernel per chunk
    (:func:`chunk_bounds`) of outputs of one float dtype (other dtypes are reduced as float32
    copies), each read where it lies.  Returns ``(parts, order)``: per chunk a lazy uint32
    [k * SLOT] array, and the indices of the outputs in slot order."""
    if plan is None:
        plan = cuda_plan(values)[0]
    if plan.cast or plan.flat:
        values = list(values)
        for i in plan.cast:
            values[i] = values[i].astype(mx.float32)
        for i in plan.flat:
            values[i] = values[i].reshape(1)
    parts = []
    for dt, idx, nb in plan.kernels:
        k = len(idx)
        parts.append(kernel(k)(
            inputs=[values[i] for i in idx], template=[("T", dt), ("FK", FILL_KIND[dt])],
            grid=(nb * THREADS, k, 1), threadgroup=(THREADS, 1, 1),
            output_shapes=[(k * SLOT,)], output_dtypes=[mx.uint32], init_value=0)[0])
    return parts, plan.order


def cuda_finish(meta, parts, order) -> Rows:
    """The statistics from :func:`cuda_parts`' (evaluated) slots; ``meta``: (size, dtype) of
    every output, or their Meta (the outputs themselves need not be alive any more)."""
    words = np.array(mx.concatenate(parts) if len(parts) > 1 else parts[0]) if parts else None
    return fold_slots(meta, words, order)


def fold_slots(meta, words: np.ndarray | None, order) -> Rows:
    """:func:`cuda_finish` on the slots already copied to the host (``words``, uint32
    [len(order) * SLOT]; slot r holds output ``order[r]``)."""
    meta = as_meta(meta)
    N = len(meta.sizes)
    hi = np.full(N, -np.inf)
    lo = np.full(N, np.inf)
    sums = np.zeros((N, 2))
    cnt = np.zeros((N, 5), np.int64)
    if len(order):
        w = words.reshape(len(order), SLOT)
        idx = np.asarray(order, np.int64)
        sums[idx] = np.ascontiguousarray(w[:, 0:4]).view(np.float64)
        hi[idx] = unkey(w[:, 4])
        lo[idx] = -unkey(w[:, 5])
        cnt[idx] = w[:, 6:11]
    return finish(meta, hi, lo, sums, cnt)


def unkey(k: np.ndarray) -> np.ndarray:
    """Floats (float64) from the kernel's order-preserving uint32 keys (0: no value, -> -inf)."""
    k = k.astype(np.uint32)
    bits = np.where(k & np.uint32(0x80000000), k & np.uint32(0x7FFFFFFF), ~k).astype(np.uint32)
    return np.where(k == 0, -np.inf, bits.view(np.float32).astype(np.float64))
