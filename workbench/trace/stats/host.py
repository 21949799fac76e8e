"""The host path (the CPU): statistics of evaluated outputs through zero-copy numpy views.

Vectorised passes over memory that is still in cache, BLAS dot products for the sums; the
small outputs of a decoding step are reduced together (:func:`host_stats_many`).  MLX's
CPU reductions take a slower pass per statistic.

Numpy only, no MLX: this runs on the statistics thread (:mod:`.pending`), and an MLX
stream belongs to the thread that created it.

The float32 sum decides which outputs need the exact pass: a NaN or an infinity anywhere
makes it NaN or infinite, so an output whose min, max and sum are finite holds no
non-finite element; one whose min is the dtype's lowest finite value holds mask fill.  The
few others (in a healthy forward: the attention scores) get :func:`host_exact`, which
counts NaN, +Inf, -Inf and fill per element and sums the rest.
"""
from __future__ import annotations

import math
import threading
from typing import Sequence

import numpy as np

from workbench.dtypes import bf16_to_f32
from workbench.trace.stats.common import Meta, Rows, finish

#: outputs are converted to float32 and reduced in runs of at most this many elements (one
#: output of more goes in pieces of this size), so every temporary is a reused buffer
RUN = 1 << 20
#: outputs of at most this many elements are reduced together (:func:`host_stats_many`)
SMALL = 1 << 16

_local = threading.local()


def _buffer(name: str, n: int, dtype, fill=None) -> np.ndarray:
    """A per-thread reusable buffer of its own name (grown, never shrunk; ``fill``: its value
    when made): the float32 copies and float64 temporaries of a statistics batch land in
    pages already mapped (fresh arrays of a few hundred MB are fresh pages every batch;
    benchmarks/README.md, host statistics)."""
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    b = bufs.get(name)
    if b is None or b.size < n or b.dtype != np.dtype(dtype):
        b = bufs[name] = np.empty(max(n, 1 << 16), dtype)
        if fill is not None:
            b.fill(fill)
    return b[:n]


def _f32_into(h: np.ndarray, bf16: bool, out: np.ndarray) -> np.ndarray:
    """The float32 values of host view ``h`` written into ``out`` (float32, ``h.size``)."""
    if bf16:
        return bf16_to_f32(h, out)
    np.copyto(out, h, casting="unsafe")
    return out


def _as_f32(h: np.ndarray, bf16: bool) -> np.ndarray:
    """The float32 values of host view ``h``: ``h`` itself when it holds float32."""
    return h if h.dtype == np.float32 else _f32_into(h, bf16, np.empty(h.size, np.float32))


def host_packed(a: np.ndarray) -> np.ndarray:
    """min, max, sum, sum of squares and the number of zeros (float64 [5]) of a flat float32
    array: each one vectorised pass over memory still in cache from the previous one."""
    n = a.size
    with np.errstate(all="ignore"):
        zeros = np.count_nonzero(np.equal(a, 0, out=_buffer("is0", n, np.bool_)))
        ones = _buffer("ones", n, np.float32, fill=1.0)  # filled once, never written again
        return np.array([a.min(), a.max(), np.dot(a, ones), np.dot(a, a), zeros], dtype=np.float64)


def host_exact(a: np.ndarray, dmax: float | None) -> np.ndarray:
    """#NaN, #+Inf, #-Inf, then min, max, sum and sum of squares over the finite elements
    that are not mask fill, and #mask fill (float64 [8]) of a flat float32 array (``dmax``:
    the dtype's largest finite value, None: no fill)."""
    with np.errstate(all="ignore"):
        nan = np.isnan(a)
        pinf = np.isposinf(a)
        ninf = np.isneginf(a)
        fill = (a == -dmax) if dmax is not None else np.zeros(a.shape, bool)
        ok = ~(nan | pinf | ninf | fill)
        f = a[ok].astype(np.float64)
        if f.size:
            mn, mxv, sm, ss = f.min(), f.max(), f.sum(), np.dot(f, f)
        else:
            mn = mxv = sm = ss = float("nan")
        return np.array([nan.sum(), pinf.sum(), ninf.sum(), mn, mxv, sm, ss, fill.sum()], dtype=np.float64)


def _needs_exact(p: np.ndarray, dmax: float | None) -> bool:
    """Whether packed row ``p`` may hold NaN / Inf (a non-finite min, max or sum) or mask
    fill (its min is the dtype's lowest finite value)."""
    if not (math.isfinite(p[0]) and math.isfinite(p[1]) and math.isfinite(p[2])):
        return True
    return dmax is not None and p[0] == -dmax


class _Cols:
    """The partials of N outputs, as :func:`~workbench.trace.stats.common.finish` takes them."""

    __slots__ = ("hi", "lo", "sums", "cnt")

    def __init__(self, n: int):
        self.hi = np.full(n, -np.inf)
        self.lo = np.full(n, np.inf)
        self.sums = np.zeros((n, 2))
        self.cnt = np.zeros((n, 5), np.int64)

    def put(self, i: int, p: np.ndarray, e: np.ndarray | None) -> None:
        """Output ``i``'s packed row ``p`` (:func:`host_packed`) and exact row ``e``
        (:func:`host_exact`, None when not needed)."""
        if e is None:
            self.lo[i], self.hi[i], self.sums[i], self.cnt[i, 0] = p[0], p[1], p[2:4], p[4]
        else:
            self.lo[i], self.hi[i], self.sums[i] = e[3], e[4], e[5:7]
            self.cnt[i] = (p[4], e[7], e[0], e[1], e[2])


def host_stats_many(jobs: Sequence[tuple]) -> Rows:
    """The statistics of many host views, ``jobs``: (flat numpy view, whether it holds
    bfloat16 bits, the dtype's largest finite value or None, elements) each.

    An output of more than :data:`SMALL` elements is converted in pieces of :data:`RUN` into
    a reused buffer (min, max, sums and zeros combine); the small ones (a decoding step's: one
    token each) are reduced together, per dtype, in runs of up to :data:`RUN` elements
    converted into one reused buffer, each output reduced with ``ufunc.reduceat`` -- a
    handful of numpy calls for hundreds of outputs instead of a handful each.  An output that
    may hold NaN / Inf or mask fill gets :func:`host_exact`."""
    n_jobs = len(jobs)
    cols = _Cols(n_jobs)
    sizes = np.fromiter((j[3] for j in jobs), np.int64, n_jobs)
    dmaxs = np.fromiter((np.nan if j[2] is None else j[2] for j in jobs), np.float64, n_jobs)
    groups: dict = {}
    for i, (h, bf16, dmax, n) in enumerate(jobs):
        if 0 < n <= SMALL:
            groups.setdefault(dmax, []).append((i, h, bf16))
        elif n:
            _reduce_one(h, bf16, dmax, n, i, cols)
    for dmax, items in groups.items():
        start = 0
        while start < len(items):
            stop, total = start, 0
            while stop < len(items) and (stop == start or total + items[stop][1].size <= RUN):
                total += items[stop][1].size
                stop += 1
            _reduce_run(items[start:stop], dmax, cols)
            start = stop
    return finish(Meta(sizes, dmaxs), cols.hi, cols.lo, cols.sums, cols.cnt)


def _reduce_one(h: np.ndarray, bf16: bool, dmax, n: int, i: int, cols: _Cols) -> None:
    """One output of ``n`` elements, in pieces of :data:`RUN` (each converted into a reused
    buffer): their min, max, sums and zeros combine."""
    f32 = h.dtype == np.float32
    p = np.array([host_packed(h[k:k + RUN] if f32 else
                              _f32_into(h[k:k + RUN], bf16, _buffer("piece", min(RUN, n - k), np.float32)))
                  for k in range(0, n, RUN)])
    row = np.array([p[:, 0].min(), p[:, 1].max(), p[:, 2].sum(), p[:, 3].sum(), p[:, 4].sum()])
    cols.put(i, row, host_exact(_as_f32(h, bf16), dmax) if _needs_exact(row, dmax) else None)


def _reduce_run(items: list, dmax, cols: _Cols) -> None:
    """:func:`host_stats_many` on one run of small outputs of one dtype (``items``:
    (index, host view, bfloat16 bits?))."""
    lens = np.fromiter((h.size for _, h, _ in items), np.int64, len(items))
    starts = np.zeros(len(items), np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    total = int(lens.sum())
    a = _buffer("run", total, np.float32)
    for (_, h, bf16), at, n in zip(items, starts.tolist(), lens.tolist()):
        _f32_into(h, bf16, a[at:at + n])
    with np.errstate(all="ignore"):
        a64 = _buffer("run64", total, np.float64)
        np.copyto(a64, a)
        sq = np.multiply(a64, a64, out=_buffer("sq64", total, np.float64))
        rows = np.stack([np.minimum.reduceat(a, starts).astype(np.float64),
                         np.maximum.reduceat(a, starts).astype(np.float64),
                         np.add.reduceat(a64, starts), np.add.reduceat(sq, starts),
                         np.add.reduceat(np.equal(a, 0, out=_buffer("is0", total, np.bool_)), starts,
                                         dtype=np.int64).astype(np.float64)], axis=1)
    # rows with a non-finite min, max or sum, or mask fill at the min, get the exact
    # pass one by one; the others (every row of a healthy step) are put in together
    exact = ~np.isfinite(rows[:, :3]).all(axis=1)
    if dmax is not None:
        exact |= rows[:, 0] == -dmax
    clean = np.flatnonzero(~exact)
    if clean.size:
        idx = np.fromiter((items[j][0] for j in clean.tolist()), np.int64, clean.size)
        cols.lo[idx], cols.hi[idx] = rows[clean, 0], rows[clean, 1]
        cols.sums[idx] = rows[clean, 2:4]
        cols.cnt[idx, 0] = rows[clean, 4]
    for j in np.flatnonzero(exact).tolist():
        at, n = int(starts[j]), int(lens[j])
        cols.put(items[j][0], rows[j], host_exact(a[at:at + n], dmax))
