"""The device path on GPUs other than CUDA (Metal): statistics as lazy MLX reductions added to
the same graph as the outputs, evaluated with them in one ``mx.eval``.

Outputs of one shape and dtype are stacked and reduced together by one compiled partial
reduction (a handful of graph nodes per group, not per op: MLX's per-node cost dominates
small ops on a GPU); the partials of every group are read back as one array and finished on
the host in float64 (exact counts).  Outputs whose partials are not finite (NaN / Inf
somewhere) get the exact pass (:func:`exact`, one more ``mx.eval`` for all of them).
"""
from __future__ import annotations

import math
import os
from typing import Sequence

import mlx.core as mx
import numpy as np

from workbench.trace.stats.common import Meta, Rows, dmax_of, dtype_max, eval_here, finish

#: partial reductions: each output (as float32) is viewed as [r, n / r] rows and reduced along
#: them to [6, r] (r = gcd(n, R), padded to R); the host finishes in float64
R = 128
#: outputs of the same shape and dtype are stacked and reduced together, up to this many
#: bytes per group (the fused pass writes a transient float32 [6, ...] copy of its group)
GROUP_BYTES = 64 * 2**20
#: outputs with more elements than this are reduced in pieces of at most this many
CHUNK = 2**23
_PART_FNS: dict = {}


def _rows(x: mx.array) -> mx.array:
    """x as a 2-D float32 array whose column reductions are fast on every backend."""
    n = x.size
    r = 32 if n % 32 == 0 and n >= 1024 else (8 if n % 8 == 0 and n >= 256 else 1)
    if x.dtype != mx.float32:
        x = x.astype(mx.float32)
    return x.reshape(r, n // r)


def exact(x: mx.array) -> mx.array:
    """Lazy float32 [8]: #NaN, #+Inf, #-Inf, min, max, sum, sum of squares over the finite
    elements that are not mask fill, and #mask fill (elements equal to the dtype's lowest
    finite value).  The second pass, for the few outputs whose partials are not finite."""
    f = _rows(x)
    nan = mx.isnan(f)
    pinf = mx.isposinf(f)
    ninf = mx.isneginf(f)
    fin = mx.isfinite(f)
    dmax = dtype_max(x.dtype)
    fill = (f == -dmax) if dmax is not None else mx.zeros(f.shape, mx.bool_)
    ok = fin & ~fill
    z = mx.zeros_like(f)
    c = lambda b: b.sum(axis=0).sum().astype(mx.float32)  # noqa: E731
    return mx.stack([c(nan), c(pinf), c(ninf),
                     mx.where(ok, f, mx.inf).min(), mx.where(ok, f, -mx.inf).max(),
                     mx.where(ok, f, z).sum(), mx.where(ok, mx.square(f), z).sum(), c(fill)])


def _part_fn(dtype, n: int):
    """A compiled function x [k, ...] (k outputs of n elements each) -> float32 [6, k, R] of
    row partials: max over the non-fill elements, max of their negation (-> min), sum, sum
    of squares (fill excluded), number of zeros, number of fill elements (the dtype's lowest
    finite value).  Four kernels per group: one fused elementwise pass writing a
    [6, k, r, c] float32 temporary, one max over its first two rows, one sum over the other
    four, one concatenation."""
    r = math.gcd(n, R)
    key = (dtype, n)
    fn = _PART_FNS.get(key)
    if fn is not None:
        return fn
    dmax = dtype_max(dtype)
    col = lambda v, dt=mx.float32: mx.array(v, dt).reshape(6, 1, 1, 1)  # noqa: E731
    sgn = col([1, -1, 1, 0, 0, 0])
    is_sq = col([0, 0, 0, 1, 0, 0], mx.bool_)
    excl = col([1, 1, 1, 1, 0, 0], mx.bool_)
    excl_to = col([-math.inf, -math.inf, 0, 0, 0, 0])
    is_zero = col([0, 0, 0, 0, 1, 0], mx.bool_)
    is_fill = col([0, 0, 0, 0, 0, 1], mx.bool_)
    pad = None
    if r != R:
        pad = mx.concatenate([mx.full((2, 1, R - r), -mx.inf), mx.zeros((4, 1, R - r))])
    consts = [sgn, is_sq, excl, excl_to, is_zero, is_fill] + ([pad] if pad is not None else [])
    mx.eval(consts)

    def part(x):
        f = x.reshape(-1, r, n // r)
        k = f.shape[0]
        if f.dtype != mx.float32:
            f = f.astype(mx.float32)
        fill = (f == -dmax) if dmax is not None else mx.zeros(f.shape, mx.bool_)
        v = mx.where(is_sq, f * f, f * sgn)
        v = mx.where(excl & fill, excl_to, v)
        v = mx.where(is_zero, (f == 0).astype(mx.float32), v)
        v = mx.where(is_fill, fill.astype(mx.float32), v)
        out = mx.concatenate([v[:2].max(axis=-1), v[2:].sum(axis=-1)])
        if pad is not None:
            out = mx.concatenate([out, mx.broadcast_to(pad, (6, k, R - r))], axis=2)
        return out

    fn = _PART_FNS[key] = part if os.environ.get("WORKBENCH_STATS_COMPILE", "1") == "0" else mx.compile(part)
    return fn


def _device_parts(xs: Sequence[mx.array]) -> mx.array:
    """Lazy float32 [6, k, R] row partials of k arrays of one shape and dtype (concatenated
    along their first axis; one array is reduced in place)."""
    x = xs[0] if len(xs) == 1 else (mx.concatenate(list(xs)) if xs[0].ndim else mx.stack(list(xs)))
    return _part_fn(x.dtype, xs[0].size)(x)


def _groups(values: Sequence[mx.array]) -> dict:
    """The outputs' reduction groups: same shape and dtype together within :data:`GROUP_BYTES`;
    an output of more than :data:`CHUNK` elements (logits) in equal pieces, each its own group,
    so the fused pass's float32 temporary stays bounded."""
    groups: dict = {}
    for i, v in enumerate(values):
        if not v.size:
            continue
        n = v.size
        k0 = -(-n // CHUNK)
        k = next((d for d in range(k0, 64 * k0) if n % d == 0), 1) if k0 > 1 else 1
        if k > 1:
            flat = v.reshape(k, n // k)
            for j in range(k):
                groups[("piece", i, j)] = [[(i, flat[j])]]
            continue
        g = groups.setdefault((tuple(v.shape), v.dtype), [[]])
        if g[-1] and (len(g[-1]) + 1) * v.nbytes > GROUP_BYTES:
            g.append([])
        g[-1].append((i, v))
    return groups


def device_stats(values: Sequence[mx.array], also: Sequence[mx.array] = ()) -> Rows:
    """The statistics of a batch of (lazy) arrays, reduced on the device and evaluated with
    ``also`` in one ``mx.eval`` (plus one more for the rare outputs that need the exact pass)."""
    meta = Meta(np.fromiter((v.size for v in values), np.int64, len(values)), dmax_of([v.dtype for v in values]))
    hi = np.full(len(values), -np.inf)
    lo = np.full(len(values), np.inf)
    sums = np.zeros((len(values), 2))
    cnt = np.zeros((len(values), 5), np.int64)
    groups = _groups(values)
    if not groups:
        if also:
            eval_here(list(also))
        return finish(meta, hi, lo, sums, cnt)
    parts, order = [], []
    for chunks in groups.values():
        for members in chunks:
            parts.append(_device_parts([a for _, a in members]).reshape(-1))
            order.append([i for i, _ in members])
    flat = mx.concatenate(parts) if len(parts) > 1 else parts[0]
    eval_here([flat, *also])
    F = np.array(flat)
    blocks, at = [], 0
    for members in order:
        k = len(members)
        blocks.append(F[at: at + 6 * k * R].reshape(6, k, R).transpose(1, 0, 2))
        at += 6 * k * R
    P = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
    owner = np.array([i for members in order for i in members])
    rank = np.argsort(owner, kind="stable")
    owner = owner[rank]
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    idx = owner[starts]
    P = P[rank]
    with np.errstate(all="ignore"):
        g_hi = np.maximum.reduceat(P[:, 0].max(axis=-1), starts).astype(np.float64)
        g_lo = -np.maximum.reduceat(P[:, 1].max(axis=-1), starts).astype(np.float64)
        g_sums = np.add.reduceat(P[:, 2:].sum(axis=-1, dtype=np.float64), starts, axis=0)
    hi[idx], lo[idx], sums[idx] = g_hi, g_lo, g_sums[:, :2]
    cnt[idx, 0], cnt[idx, 1] = g_sums[:, 2], g_sums[:, 3]
    bad = ~(np.isfinite(g_hi) & np.isfinite(g_lo) & np.isfinite(g_sums[:, 0]) & np.isfinite(g_sums[:, 1]))
    need = idx[bad].tolist()
    if need:
        arrs = [exact(values[i]) for i in need]
        eval_here(arrs)
        for i, a in zip(need, arrs):
            e = np.array(a).astype(np.float64)
            lo[i], hi[i], sums[i] = e[3], e[4], e[5:7]
            cnt[i, 1:] = (e[7], e[0], e[1], e[2])
    return finish(meta, hi, lo, sums, cnt)
