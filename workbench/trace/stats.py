"""Cheap per-op statistics, evaluated in batches (never one synchronisation per op).

The trace hands a batch of lazy op outputs to :class:`Pending`, which evaluates them
with one ``mx.eval`` and reduces each to min, max, sum, sum of squares (in float32) and
its number of exact zeros:

* on a CUDA GPU, by one custom kernel per chunk of up to 32 outputs of a dtype (128 small
  ones; :func:`cuda_parts`): each output read once, exact NaN / Inf / fill counts in the same
  pass, queued with ``mx.async_eval`` so the trace synchronises once, when it reads them;
* on other GPUs (Metal), as lazy MLX reductions added to the same graph
  (:func:`device_stats`: one compiled partial reduction per group of same-shape outputs,
  read back as one array and finished on the host in float64);
* on the CPU, through zero-copy numpy views of the evaluated outputs
  (:func:`host_packed`: vectorised passes over memory that is still in cache, BLAS dot
  products for the sums), in a background thread; MLX's CPU reductions take a slower
  pass per statistic.  ``tests/test_trace_program.py`` checks that both paths agree.

Threads: an MLX stream belongs to the thread that created it (MLX >= 0.31.2), and a lazy
array can only be evaluated on the thread whose stream it was built on.  So every MLX call
(``mx.eval``, the views, the dtype facts) happens on the calling thread, when the
:class:`Pending` is made; the background thread gets numpy views and floats only.  A trace
called from another thread than the one that built its model and feeds fails in
``mx.eval``; :func:`eval_here` says so in words (the widgets hand their callbacks to the
thread that built them, see ``workbench.widgets._actions``).

Non-finite elements are counted per element (``isnan``, ``isposinf``, ``isneginf``),
never inferred from a sum.  The float32 sum only decides *which* ops need counting: a
NaN or an infinity anywhere in a tensor makes its sum NaN or infinite, so an op whose
sum is finite holds no non-finite element and its counts are exactly zero.  The ops
whose sum is not finite (in a healthy forward: none) get a second, exact pass that
counts NaN, +Inf and -Inf separately and recomputes min / max / mean / std over the
finite elements only.

Mask fill: attention scores hold the dtype's lowest finite value at masked positions
(so they vanish in the softmax without an infinity).  Such elements are counted under
``masked`` and left out of min / max / mean / std / absmax / headroom, which would
otherwise all say "at the edge of the range".  (An op whose min is exactly that value
gets the exact pass; a genuine activation saturating at exactly -max is counted as
mask fill, the only approximation here.)
"""
from __future__ import annotations

import functools
import math
import operator
import threading
from typing import NamedTuple, Sequence

import mlx.core as mx
import numpy as np

from workbench.stats_schema import NONFINITE, TRACE_KEYS

#: keys of every stats dict, in display order (the one schema: workbench/stats_schema.py)
KEYS = TRACE_KEYS

_FMAX = {mx.float16: float(mx.finfo(mx.float16).max), mx.bfloat16: float(mx.finfo(mx.bfloat16).max),
         mx.float32: float(mx.finfo(mx.float32).max)}


def dtype_max(dtype) -> float | None:
    """Largest finite value of a floating dtype (None for integer / bool dtypes)."""
    if dtype in _FMAX:
        return _FMAX[dtype]
    if mx.issubdtype(dtype, mx.floating):
        return float(mx.finfo(dtype).max)
    return None


def _rows(x: mx.array) -> mx.array:
    """x as a 2-D float32 array whose column reductions are fast on every backend."""
    n = x.size
    r = 32 if n % 32 == 0 and n >= 1024 else (8 if n % 8 == 0 and n >= 256 else 1)
    if x.dtype != mx.float32:
        x = x.astype(mx.float32)
    return x.reshape(r, n // r)


def packed(x: mx.array) -> mx.array | None:
    """Lazy float32 [5]: min, max, sum, sum of squares, number of zeros (None if empty)."""
    if x.size == 0:
        return None
    f = _rows(x)
    return mx.stack([f.min(axis=0).min(), f.max(axis=0).max(), f.sum(axis=0).sum(),
                     mx.square(f).sum(axis=0).sum(), (f == 0).sum(axis=0).sum().astype(mx.float32)])


def exact(x: mx.array) -> mx.array:
    """Lazy float32 [8]: #NaN, #+Inf, #-Inf, min, max, sum, sum of squares over the finite
    elements that are not mask fill, and #mask fill (elements equal to the dtype's lowest
    finite value).  The second pass, for the few ops :func:`needs_exact` picks."""
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


def needs_exact(p: np.ndarray, dtype=None) -> bool:
    """Whether a packed row needs the exact pass: its min, max or sum is not finite (so
    it may hold NaN / Inf), or its min is the dtype's lowest finite value (mask fill,
    as in attention scores, which must not count as "close to overflow")."""
    return _needs_exact(p, dtype_max(dtype) if dtype is not None else None)


def _needs_exact(p: np.ndarray, dmax: float | None) -> bool:
    if not (math.isfinite(p[0]) and math.isfinite(p[1]) and math.isfinite(p[2])):
        return True
    return dmax is not None and p[0] == -dmax


def finish(p: np.ndarray | None, n: int, dtype, e: np.ndarray | None = None) -> dict:
    """The stats dict from a packed row (and the exact row when one was needed)."""
    return _finish(p, n, dtype_max(dtype), e)


def _finish(p: np.ndarray | None, n: int, dmax: float | None, e: np.ndarray | None = None) -> dict:
    """:func:`finish` given the dtype's largest finite value (None: not a float dtype)."""
    if p is None or n == 0:
        return {k: (0 if k in NONFINITE + ("masked",) else None) for k in KEYS}
    zeros = float(p[4])
    masked = 0
    if e is None:
        nan = pinf = ninf = 0
        mn, mxv, s, ss, cnt = float(p[0]), float(p[1]), float(p[2]), float(p[3]), n
    else:
        nan, pinf, ninf, masked = int(e[0]), int(e[1]), int(e[2]), int(e[7])
        cnt = n - nan - pinf - ninf - masked
        mn, mxv, s, ss = float(e[3]), float(e[4]), float(e[5]), float(e[6])
    if cnt > 0:
        mean = s / cnt
        var = max(ss / cnt - mean * mean, 0.0)
        std = math.sqrt(var)
        absmax = max(abs(mn), abs(mxv))
    else:
        mean = std = absmax = float("nan")
        mn = mxv = float("nan")
    if pinf or ninf:
        headroom = float("inf")
    elif dmax is None or not math.isfinite(absmax):
        headroom = None
    else:
        headroom = absmax / dmax
    return {"min": mn, "max": mxv, "mean": mean, "std": std, "absmax": absmax,
            "nan": nan, "posinf": pinf, "neginf": ninf, "zero_frac": zeros / n, "headroom": headroom,
            "masked": masked}


def on_cpu() -> bool:
    """Whether MLX computes on the CPU (then statistics use zero-copy host views)."""
    return mx.default_device().type == mx.DeviceType.cpu


def use_host() -> bool:
    """Whether statistics are computed through host views (:func:`host_stats`) rather than
    on the device (:func:`device_stats`): on the CPU by default; ``WORKBENCH_STATS=device``
    or ``=host`` forces a path (to exercise the GPU path on a CPU-only machine)."""
    import os

    force = os.environ.get("WORKBENCH_STATS", "").strip().lower()
    if force == "device":
        return False
    if force == "host":
        return True
    return on_cpu()


_local = threading.local()


def host_view(v: mx.array) -> np.ndarray:
    """A flat zero-copy numpy view of an evaluated array (bfloat16 as its uint16 bits)."""
    if v.dtype == mx.bfloat16:
        return np.asarray(mx.view(v, mx.uint16)).reshape(-1)
    return np.asarray(v).reshape(-1)


def _as_f32(h: np.ndarray, bf16: bool) -> np.ndarray:
    """The float32 values of host view ``h``: ``h`` itself when it holds float32."""
    return h if h.dtype == np.float32 else _f32_into(h, bf16, np.empty(h.size, np.float32))


def _buffer(name: str, n: int, dtype, fill=None) -> np.ndarray:
    """A per-thread reusable buffer of its own name (grown, never shrunk; ``fill``: its value
    when made): the float32 copies and float64 temporaries of a statistics batch land in
    pages already mapped.  (Fresh arrays of a few hundred MB are fresh pages every batch:
    E2B's 916 outputs of a 16-token prompt took 0.7-1.1 s to reduce on this CPU the first
    time, 0.2 s when warm.)"""
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
    if bf16:  # the bits, shifted into the high half of each float32
        np.left_shift(h, 16, out=out.view(np.uint32), dtype=np.uint32)
    else:
        np.copyto(out, h, casting="unsafe")
    return out


#: outputs are converted to float32 and reduced in runs of at most this many elements (one
#: output of more goes in pieces of this size), so every temporary is a reused buffer
_RUN = 1 << 20


def host_packed(a: np.ndarray) -> np.ndarray:
    """:func:`packed` on a flat float32 host array: each statistic is one vectorised pass
    over memory still in cache from the previous one (BLAS dot products for the sums)."""
    n = a.size
    with np.errstate(all="ignore"):
        zeros = np.count_nonzero(np.equal(a, 0, out=_buffer("is0", n, np.bool_)))
        ones = _buffer("ones", n, np.float32, fill=1.0)  # filled once, never written again
        return np.array([a.min(), a.max(), np.dot(a, ones), np.dot(a, a), zeros], dtype=np.float64)


def host_exact(a: np.ndarray, dmax: float | None) -> np.ndarray:
    """:func:`exact` on a flat float32 host array (``dmax``: the dtype's largest finite value)."""
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


def host_stats(h: np.ndarray, bf16: bool, dmax: float | None, n: int) -> dict:
    """The stats dict of a host view (see :func:`host_view`) of ``n`` elements; ``bf16``:
    the view holds bfloat16 bits, ``dmax``: the dtype's largest finite value.  Numpy only
    (it runs on the statistics thread, which has no MLX stream)."""
    if n == 0:
        return _finish(None, 0, dmax)
    # in pieces (each converted into a reused buffer): their min, max, sums and zeros combine
    f32 = h.dtype == np.float32
    p = np.array([host_packed(h[k:k + _RUN] if f32 else
                              _f32_into(h[k:k + _RUN], bf16, _buffer("piece", min(_RUN, n - k), np.float32)))
                  for k in range(0, n, _RUN)])
    row = np.array([p[:, 0].min(), p[:, 1].max(), p[:, 2].sum(), p[:, 3].sum(), p[:, 4].sum()])
    e = host_exact(_as_f32(h, bf16), dmax) if _needs_exact(row, dmax) else None
    return _finish(row, n, dmax, e)


#: outputs of at most this many elements are reduced together (:func:`host_stats_many`)
_SMALL = 1 << 16


def host_stats_many(jobs: Sequence[tuple]) -> list[dict]:
    """:func:`host_stats` of many host views (``jobs``: its arguments), the small ones (a
    decoding step's outputs: one token each) reduced together: per dtype, in runs of up to
    :data:`_RUN` elements converted into one reused buffer, each output reduced with
    ``ufunc.reduceat`` -- a handful of numpy calls for hundreds of outputs instead of a
    handful each.  Sums in float64; an output that may hold NaN / Inf or mask fill gets
    :func:`host_exact`, as in :func:`host_stats`."""
    out: list = [None] * len(jobs)
    groups: dict = {}
    for i, (h, bf16, dmax, n) in enumerate(jobs):
        if 0 < n <= _SMALL:
            groups.setdefault(dmax, []).append((i, h, bf16))
        else:
            out[i] = host_stats(h, bf16, dmax, n)
    for dmax, items in groups.items():
        start = 0
        while start < len(items):
            stop, total = start, 0
            while stop < len(items) and (stop == start or total + items[stop][1].size <= _RUN):
                total += items[stop][1].size
                stop += 1
            _reduce_run(items[start:stop], dmax, out)
            start = stop
    return out


def _reduce_run(items: list, dmax, out: list) -> None:
    """:func:`host_stats_many` on one run of small outputs of one dtype (``items``:
    (index, host view, bfloat16 bits?)); the dicts go to ``out[index]``."""
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
    # pass one by one; the others (every row of a healthy step) are finished together
    exact = ~np.isfinite(rows[:, :3]).all(axis=1)
    if dmax is not None:
        exact |= rows[:, 0] == -dmax
    clean = np.flatnonzero(~exact)
    if clean.size:
        cnt = np.zeros((clean.size, 5), np.int64)
        cnt[:, 0] = rows[clean, 4]
        dicts = _finish_rows(lens[clean], np.full(clean.size, np.nan if dmax is None else dmax),
                             rows[clean, 1], rows[clean, 0], rows[clean, 2:4], cnt)
        for j, d in zip(clean.tolist(), dicts):
            out[items[j][0]] = d
    for j in np.flatnonzero(exact).tolist():
        at, n = int(starts[j]), int(lens[j])
        out[items[j][0]] = _finish(rows[j], n, dmax, host_exact(a[at:at + n], dmax))


def eval_here(arrays: Sequence[mx.array], queue: bool = False) -> None:
    """``mx.eval(arrays)`` (``queue=True``: ``mx.async_eval``); when they were built on another
    thread's stream, a RuntimeError that says so (MLX's own message names only the stream)."""
    try:
        (mx.async_eval if queue else mx.eval)(arrays)
    except RuntimeError as e:
        if "in current thread" not in str(e):
            raise
        raise RuntimeError(
            f"{e} MLX streams belong to threads: these arrays (a model's lazily loaded weights, a trace's "
            f"feeds or values) were built on another thread than {threading.current_thread().name!r}; "
            "call the trace from the thread that loaded the model and made the trace") from e


_POOL = None


def pool():
    """One background thread for host statistics: it runs while MLX (which releases the
    GIL in ``mx.eval``) computes the next batch of ops."""
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor
        _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="workbench-stats")
    return _POOL


class Pending:
    """Statistics of a batch of evaluated arrays, being computed in the background (CPU)
    or already computed (GPU); :meth:`result` returns the stats dicts in order.

    ``defer=True`` (host path): the batch is only queued (``mx.async_eval``) and its
    reduction starts at :meth:`start` (or :meth:`result`), on the calling thread, so a
    decoding loop can queue the next forward first and reduce this one while it computes.
    ``shapes`` and ``dtypes``: the values' own, where the caller has them (the CUDA path
    groups the outputs by them, :func:`cuda_plan`)."""

    def __init__(self, values: Sequence[mx.array], also: Sequence[mx.array] = (), background: bool = True,
                 host: bool | None = None, defer: bool = False, shapes: Sequence[tuple] | None = None,
                 dtypes: Sequence | None = None):
        self._dicts = None
        self._future = None
        self._cuda = None
        self._deferred = None
        if not values:
            if also:
                eval_here(list(also), queue=defer)
            self._dicts = []
            return
        if use_host() if host is None else host:
            # every MLX call on this thread; the background job sees numpy arrays and floats only
            views = [mx.view(v, mx.uint16) if v.dtype == mx.bfloat16 else v for v in values]
            if defer:
                eval_here(views + list(also), queue=True)
                self._deferred = (values, views, background)
                return
            eval_here(views + list(also))
            self._reduce(values, views, background)
            return
        if on_cuda():
            # queued, not waited for: the one synchronisation comes when the stats are read
            plan, meta = cuda_plan(values, shapes, dtypes)
            parts, order = cuda_parts(values, plan)
            self._cuda = (meta, parts, order)  # (meta: a Meta, as every _cuda holds)
            mx.async_eval(parts + list(also))
            return
        self._dicts = device_stats(values, also)

    @classmethod
    def slots(cls, meta: Sequence[tuple], parts, order) -> "Pending":
        """The statistics of outputs ``meta`` ((size, dtype) each, or a :class:`Meta`) whose slots
        :func:`cuda_parts` made (``parts``, lazy or evaluated; ``order``)."""
        p = cls([])
        p._dicts, p._cuda = None, (as_meta(meta), list(parts), list(order))
        return p

    def _reduce(self, values, views, background: bool) -> None:
        jobs = [(np.asarray(w).reshape(-1), v.dtype == mx.bfloat16, dtype_max(v.dtype), v.size)
                for v, w in zip(values, views)]
        run = lambda: host_stats_many(jobs)  # noqa: E731
        if background:
            self._future = pool().submit(run)
        else:
            self._dicts = run()

    def start(self) -> None:
        """Start reducing a deferred batch (waiting for its evaluation first); otherwise nothing."""
        if self._deferred is not None:
            values, views, background = self._deferred
            self._deferred = None
            eval_here(views)
            self._reduce(values, views, background)

    def result(self) -> Sequence[dict]:
        self.start()
        if self._dicts is None:
            if self._cuda is not None:
                self._dicts = cuda_finish(*self._cuda)
                self._cuda = None
            else:
                self._dicts = self._future.result()
                self._future = None
        return self._dicts



def results(pendings: Sequence[Pending]) -> list[Sequence[dict]]:
    """:meth:`Pending.result` of each; those queued on CUDA are copied back together (one
    device-to-host copy) and folded in one pass (:func:`fold_slots`)."""
    todo = [p for p in pendings if p._dicts is None and p._cuda is not None]
    if len(todo) > 1:
        parts = [a for p in todo for a in p._cuda[1]]
        words = np.array(mx.concatenate(parts) if len(parts) > 1 else parts[0]) if parts else None
        metas = [p._cuda[0] for p in todo]
        starts = np.cumsum([0] + [len(m.sizes) for m in metas]).tolist()
        meta = Meta(np.concatenate([m.sizes for m in metas]), np.concatenate([m.dmax for m in metas]))
        order = np.concatenate([np.asarray(p._cuda[2], np.int64) + at for p, at in zip(todo, starts)])
        dicts = fold_slots(meta, words, order)
        for p, at, stop in zip(todo, starts, starts[1:]):
            p._dicts, p._cuda = dicts.view(at, stop - at), None
    return [p.result() for p in pendings]


# --------------------------------------------------------------------------- device path
#: partial reductions: each op's output (as float32) is viewed as [r, n / r] rows and reduced
#: along them to [6, r] (r = gcd(n, _R), padded to _R); the host finishes in float64.
_R = 128
#: outputs of the same shape and dtype are stacked and reduced together, up to this many
#: bytes per group (the fused pass writes a transient float32 [6, ...] copy of its group)
_GROUP_BYTES = 64 * 2**20
#: outputs with more elements than this are reduced in pieces of at most this many
_CHUNK = 2**23
_PART_FNS: dict = {}


def _part_fn(dtype, n: int):
    """A compiled function x [k, ...] (k outputs of n elements each) -> float32 [6, k, _R] of
    row partials: max over the non-fill elements, max of their negation (-> min), sum, sum
    of squares (fill excluded), number of zeros, number of fill elements (the dtype's lowest
    finite value).  Four kernels per group: one fused elementwise pass writing a
    [6, k, r, c] float32 temporary, one max over its first two rows, one sum over the other
    four, one concatenation."""
    r = math.gcd(n, _R)
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
    if r != _R:
        pad = mx.concatenate([mx.full((2, 1, _R - r), -mx.inf), mx.zeros((4, 1, _R - r))])
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
            out = mx.concatenate([out, mx.broadcast_to(pad, (6, k, _R - r))], axis=2)
        return out

    import os

    fn = _PART_FNS[key] = part if os.environ.get("WORKBENCH_STATS_COMPILE", "1") == "0" else mx.compile(part)
    return fn


def device_parts(xs: Sequence[mx.array]) -> mx.array:
    """Lazy float32 [6, k, _R] row partials of k arrays of one shape and dtype (concatenated
    along their first axis; one array is reduced in place)."""
    x = xs[0] if len(xs) == 1 else (mx.concatenate(list(xs)) if xs[0].ndim else mx.stack(list(xs)))
    return _part_fn(x.dtype, xs[0].size)(x)


def device_stats(values: Sequence[mx.array], also: Sequence[mx.array] = ()) -> list[dict]:
    """Stats dicts of a batch of (lazy) arrays on the device.  Outputs of the same shape and
    dtype are stacked and reduced together by one compiled partial reduction (a handful of
    graph nodes per group, not per op: MLX's per-node cost dominates small ops on a GPU); the
    partials of every group are evaluated with ``also`` in one ``mx.eval`` and read back at
    once; the host finishes them in float64 (exact counts).  Ops whose sums are not finite
    (NaN / Inf somewhere) get the exact pass (:func:`exact`, one more ``mx.eval`` for all)."""
    out: list = [None if v.size else finish(None, 0, v.dtype) for v in values]
    groups: dict = {}
    for i, v in enumerate(values):
        if not v.size:
            continue
        n = v.size
        k0 = -(-n // _CHUNK)
        k = next((d for d in range(k0, 64 * k0) if n % d == 0), 1) if k0 > 1 else 1
        if k > 1:
            # a large output (logits) is reduced in pieces, each its own group, so the fused
            # pass's float32 temporary stays bounded (pieces of equal size dividing n)
            flat = v.reshape(k, n // k)
            for j in range(k):
                groups[("piece", i, j)] = [[(i, flat[j])]]
            continue
        g = groups.setdefault((tuple(v.shape), v.dtype), [[]])
        if g[-1] and (len(g[-1]) + 1) * v.nbytes > _GROUP_BYTES:
            g.append([])
        g[-1].append((i, v))
    if not groups:
        if also:
            eval_here(list(also))
        return out
    parts, order = [], []
    for chunks in groups.values():
        for members in chunks:
            p = device_parts([a for _, a in members])
            parts.append(p.reshape(-1))
            order.append([i for i, _ in members])
    flat = mx.concatenate(parts) if len(parts) > 1 else parts[0]
    eval_here([flat, *also])
    F = np.array(flat)
    blocks, at = [], 0
    for members in order:
        k = len(members)
        blocks.append(F[at: at + 6 * k * _R].reshape(6, k, _R).transpose(1, 0, 2))
        at += 6 * k * _R
    P = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
    owner = np.array([i for members in order for i in members])
    rank = np.argsort(owner, kind="stable")
    owner = owner[rank]
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    idx = owner[starts].tolist()
    P = P[rank]
    with np.errstate(all="ignore"):
        hi = np.maximum.reduceat(P[:, 0].max(axis=-1), starts).astype(np.float64)
        lo = -np.maximum.reduceat(P[:, 1].max(axis=-1), starts).astype(np.float64)
        sums = np.add.reduceat(P[:, 2:].sum(axis=-1, dtype=np.float64), starts, axis=0)
    s, ss, zeros, fill = sums[:, 0], sums[:, 1], sums[:, 2], sums[:, 3]
    ok = np.isfinite(hi) & np.isfinite(lo) & np.isfinite(s) & np.isfinite(ss)
    ns = np.array([values[i].size for i in idx], dtype=np.float64)
    cnt = ns - fill
    with np.errstate(all="ignore"):
        mean = s / cnt
        std = np.sqrt(np.maximum(ss / cnt - mean * mean, 0.0))
    absmax = np.maximum(np.abs(lo), np.abs(hi))
    zf = zeros / ns
    rows = zip(lo.tolist(), hi.tolist(), mean.tolist(), std.tolist(), absmax.tolist(), zf.tolist(),
               fill.tolist(), ok.tolist())
    need = []
    for k, (i, (a, b, m, sd, am, z, fl, good)) in enumerate(zip(idx, rows)):
        if not good:
            need.append((i, k))
            continue
        dmax = dtype_max(values[i].dtype)
        out[i] = {"min": a, "max": b, "mean": m, "std": sd, "absmax": am, "nan": 0, "posinf": 0, "neginf": 0,
                  "zero_frac": z, "headroom": None if dmax is None else am / dmax, "masked": int(fl)}
    if need:
        arrs = [exact(values[i]) for i, _ in need]
        eval_here(arrs)
        for (i, k), a in zip(need, arrs):
            p = np.array([0, 0, 0, 0, zeros[k]], dtype=np.float64)
            out[i] = finish(p, values[i].size, values[i].dtype, np.array(a))
    return out


def evaluate(values: Sequence[mx.array], also: Sequence[mx.array] = (), host: bool | None = None) -> list[dict]:
    """Stats dicts of several (lazy) arrays, evaluated together with ``also`` in one
    ``mx.eval`` (plus one more for the rare ops that need the exact pass on the GPU).

    On the GPU the statistics are lazy reductions in the graph (:func:`device_stats`).  On the
    CPU the outputs themselves are evaluated and reduced through zero-copy numpy views
    (:func:`host_packed`): MLX's CPU reductions take one slower pass per statistic.
    """
    return list(Pending(values, also, background=False, host=host).result())


def nonfinite_counts(x: mx.array) -> tuple[int, int, int]:
    """(#NaN, #+Inf, #-Inf) of one array, counted per element (0s for integer arrays)."""
    if not mx.issubdtype(x.dtype, mx.floating) or x.size == 0:
        return 0, 0, 0
    c = mx.stack([mx.isnan(x).sum(), mx.isposinf(x).sum(), mx.isneginf(x).sum()])
    a, b, d = (int(v) for v in np.array(c))
    return a, b, d


def jsonable(v):
    """Stats values for JSON: non-finite floats become None (the counts tell the story)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return v


# --------------------------------------------------------------------------- CUDA path
#: On MLX's CUDA backend one custom kernel reduces at least _K op outputs of one dtype (or the
#: rest), and up to _K_MAX while their elements stay within _CHUNK_ELEMS, reading each output
#: once, where it lies (no copy: a transposed or broadcast view is read through its strides;
#: row-contiguous ones 16 bytes per load).  Each thread folds its
#: elements into max / min over the finite non-fill elements, their sum and sum of squares,
#: and the counts of zeros, mask fill, NaN, +Inf and -Inf; sums go to float64 every 8
#: elements (a float32 sum of 8, or float64 element by element where a value passes 1e18 or
#: is not finite); the blocks fold into each output's 12-word slot with atomics.  So every op
#: gets its exact counts in one pass and the host gets 48 bytes an output.  The kernels are
#: queued with ``mx.async_eval``; the trace synchronises with the device once, when it reads
#: the statistics (:meth:`Pending.result`, :func:`results`), not per batch.
_K = 32
#: small outputs (a decoding step's, a short prompt's) go up to _K_MAX a kernel: there the
#: launches, not the reads, are the cost (E2B, H200: greedy decoding with statistics 0.56 of
#: mlx-lm's tokens/s against 0.41 at 32 a kernel; a 256-token forward's 916 outputs in 9
#: kernels, 4.26 ms to queue, run and fold against 4.67 ms in 26); at 4096 tokens
#: (about 6M elements an output) a kernel keeps its 32 (64 was slower there)
_K_MAX = 128
_CHUNK_ELEMS = 1 << 27
_THREADS = 256
#: words of an output's slot: float64 sum and sum of squares (4), the max and the negated
#: min as order-preserving uint32 keys (2), zeros, fill, NaN, +Inf, -Inf (5), padding (1)
_SLOT = 12
_CUDA_KERNELS: dict = {}
#: the template's FK: which lowest finite value is mask fill
_FILL_KIND = {mx.float32: 0, mx.float16: 1, mx.bfloat16: 2}

_CUDA_HEADER = r"""
#define WB_INF __int_as_float(0x7f800000)
#define WB_FMAX 3.402823466e+38f

struct WbAcc {
  float hi, lo;
  double s, ss;
  unsigned int zeros, fill, nans, pinf, ninf;
};

__device__ __forceinline__ void wb_add(WbAcc& a, const float v, const float fv) {
  a.zeros += (v == 0.0f);
  if (fabsf(v) <= WB_FMAX && v != fv) {
    a.hi = fmaxf(a.hi, v); a.lo = fminf(a.lo, v);
    const double d = (double)v;
    a.s += d; a.ss += d * d;
  } else if (v != v) { a.nans++; }
  else if (v == WB_INF) { a.pinf++; }
  else if (v == -WB_INF) { a.ninf++; }
  else { a.fill++; }
}

// th: below it every value is finite, not fill, and safe to sum in float32 over 8 elements
// (1e18 where the fill is float32's or bfloat16's lowest value, past it; 65504 for float16,
// whose fill is -65504: its largest finite values take the element path, counted there)
template <typename T, int V>
__device__ __forceinline__ void wb_vec(WbAcc& a, const uint4 w, const float fv, const float th) {
  const T* e = reinterpret_cast<const T*>(&w);
  float f[V];
  float s = 0.0f, ss = 0.0f;
  bool odd = false;
#pragma unroll
  for (int q = 0; q < V; ++q) {
    f[q] = static_cast<float>(e[q]);
    odd |= !(fabsf(f[q]) < th);
  }
  if (odd) {
#pragma unroll
    for (int q = 0; q < V; ++q) { wb_add(a, f[q], fv); }
    return;
  }
#pragma unroll
  for (int q = 0; q < V; ++q) {
    a.zeros += (f[q] == 0.0f);
    a.hi = fmaxf(a.hi, f[q]); a.lo = fminf(a.lo, f[q]);
    s += f[q]; ss += f[q] * f[q];
  }
  a.s += (double)s; a.ss += (double)ss;
}

__device__ __forceinline__ unsigned int wb_key(const float v) {
  const unsigned int b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
"""

_CUDA_BODY = r"""
  const int j = blockIdx.y;
  const T* x = in0;
  const int32_t* shp = in0_shape.data();
  const int64_t* str = in0_strides.data();
  int nd = in0_ndim;
  switch (j) {
@CASES@
  }
  const float fv = FK == 0 ? -3.4028234663852886e38f : (FK == 1 ? -65504.0f : -3.3895313892515355e38f);
  const float th = FK == 1 ? 65504.0f : 1e18f;
  WbAcc a;
  a.hi = -WB_INF; a.lo = WB_INF; a.s = 0.0; a.ss = 0.0;
  a.zeros = 0; a.fill = 0; a.nans = 0; a.pinf = 0; a.ninf = 0;
  bool rc = true;
  long long n = 1, expect = 1;
  for (int d = nd - 1; d >= 0; --d) {
    if (shp[d] != 1 && str[d] != expect) { rc = false; }
    expect *= shp[d];
    n *= shp[d];
  }
  const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long step = (long long)gridDim.x * blockDim.x;
  if (!rc) {
    for (long long i = tid; i < n; i += step) {
      long long loc = 0, r = i;
      for (int d = nd - 1; d >= 0; --d) { loc += (r % shp[d]) * str[d]; r /= shp[d]; }
      wb_add(a, static_cast<float>(x[loc]), fv);
    }
  } else {
    long long head = 0;
    if ((reinterpret_cast<unsigned long long>(x) & 15ull) == 0) {
      constexpr int V = 16 / sizeof(T);
      const uint4* xv = reinterpret_cast<const uint4*>(x);
      const long long nv = n / V;
      long long t = tid;
      for (; t + 3 * step < nv; t += 4 * step) {  // four 16-byte loads in flight
        const uint4 w0 = __ldg(xv + t);
        const uint4 w1 = __ldg(xv + t + step);
        const uint4 w2 = __ldg(xv + t + 2 * step);
        const uint4 w3 = __ldg(xv + t + 3 * step);
        wb_vec<T, V>(a, w0, fv, th); wb_vec<T, V>(a, w1, fv, th);
        wb_vec<T, V>(a, w2, fv, th); wb_vec<T, V>(a, w3, fv, th);
      }
      for (; t < nv; t += step) { wb_vec<T, V>(a, __ldg(xv + t), fv, th); }
      head = nv * V;
    }
    for (long long i = head + tid; i < n; i += step) { wb_add(a, static_cast<float>(x[i]), fv); }
  }
  for (int off = 16; off > 0; off >>= 1) {
    a.hi = fmaxf(a.hi, __shfl_down_sync(0xffffffffu, a.hi, off));
    a.lo = fminf(a.lo, __shfl_down_sync(0xffffffffu, a.lo, off));
    a.s += __shfl_down_sync(0xffffffffu, a.s, off);
    a.ss += __shfl_down_sync(0xffffffffu, a.ss, off);
    a.zeros += __shfl_down_sync(0xffffffffu, a.zeros, off);
    a.fill += __shfl_down_sync(0xffffffffu, a.fill, off);
    a.nans += __shfl_down_sync(0xffffffffu, a.nans, off);
    a.pinf += __shfl_down_sync(0xffffffffu, a.pinf, off);
    a.ninf += __shfl_down_sync(0xffffffffu, a.ninf, off);
  }
  __shared__ WbAcc sh[32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) { sh[w] = a; }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int nw = (blockDim.x + 31) >> 5;
    for (int k = 1; k < nw; ++k) {
      const WbAcc& b = sh[k];
      a.hi = fmaxf(a.hi, b.hi); a.lo = fminf(a.lo, b.lo); a.s += b.s; a.ss += b.ss;
      a.zeros += b.zeros; a.fill += b.fill; a.nans += b.nans; a.pinf += b.pinf; a.ninf += b.ninf;
    }
    unsigned int* o = out + (long long)j * 12;
    atomicAdd(reinterpret_cast<double*>(o), a.s);
    atomicAdd(reinterpret_cast<double*>(o) + 1, a.ss);
    if (a.hi >= a.lo) {
      atomicMax(o + 4, wb_key(a.hi));
      atomicMax(o + 5, wb_key(-a.lo));
    }
    if (a.zeros) { atomicAdd(o + 6, a.zeros); }
    if (a.fill) { atomicAdd(o + 7, a.fill); }
    if (a.nans) { atomicAdd(o + 8, a.nans); }
    if (a.pinf) { atomicAdd(o + 9, a.pinf); }
    if (a.ninf) { atomicAdd(o + 10, a.ninf); }
  }
"""


def on_cuda() -> bool:
    """Whether MLX computes on a CUDA GPU (then statistics use :func:`cuda_parts`);
    ``WORKBENCH_STATS_CUDA=0`` turns the kernel off (``1`` or unset: on where CUDA is)."""
    import os

    env = os.environ.get("WORKBENCH_STATS_CUDA", "1").strip()
    if env not in ("0", "1"):
        raise ValueError(f"WORKBENCH_STATS_CUDA={env!r}: expected 0 (no CUDA statistics kernel) or 1 (the default)")
    return env == "1" and mx.default_device().type == mx.DeviceType.gpu and _cuda_available()


@functools.lru_cache(maxsize=1)
def _cuda_available() -> bool:
    """Whether this MLX has a CUDA backend with a device (asked once per process)."""
    cuda = getattr(mx, "cuda", None)
    return cuda is not None and bool(cuda.is_available())


def _cuda_kernel(k: int):
    fn = _CUDA_KERNELS.get(k)
    if fn is None:
        cases = "\n".join(f"    case {j}: x = in{j}; shp = in{j}_shape.data(); str = in{j}_strides.data(); "
                          f"nd = in{j}_ndim; break;" for j in range(1, k))
        fn = _CUDA_KERNELS[k] = mx.fast.cuda_kernel(
            name=f"workbench_stats4_{k}", input_names=[f"in{j}" for j in range(k)], output_names=["out"],
            source=_CUDA_BODY.replace("@CASES@", cases), header=_CUDA_HEADER, ensure_row_contiguous=False)
    return fn


def _blocks(n: int) -> int:
    """Blocks per input: enough to fill the GPU for large outputs, one for small ones."""
    return max(1, min(256, -(-n // (_THREADS * 32))))


def chunk_bounds(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """The kernels' chunks of outputs of ``sizes`` (elements, ascending): ``(start, stop)``
    ranges of at least :data:`_K` outputs (or the rest), and more, up to :data:`_K_MAX`, while
    the chunk's elements stay within :data:`_CHUNK_ELEMS`."""
    out, c, n = [], 0, len(sizes)
    while c < n:
        e, total = c, 0
        while e < n and e - c < _K_MAX and (e - c < _K or total + sizes[e] <= _CHUNK_ELEMS):
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
    largest finite value (:class:`Meta`)."""

    __slots__ = ("kernels", "order", "cast", "flat", "dmax")

    def __init__(self, dtypes: Sequence, ndims: Sequence[int], sizes: Sequence[int]):
        self.dmax = _dmax_of(dtypes)
        by_dtype: dict = {}
        self.cast, self.flat = [], []
        for i, (dt, nd, n) in enumerate(zip(dtypes, ndims, sizes)):
            if not n:
                continue
            if dt not in _FILL_KIND:
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
#: table is emptied when it passes _PLANS_MAX
_PLANS: dict = {}
_PLANS_MAX = 64
_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")


def cuda_plan(values: Sequence[mx.array], shapes: Sequence[tuple] | None = None,
              dtypes: Sequence | None = None) -> tuple[CudaPlan, "Meta"]:
    """The :class:`CudaPlan` of ``values`` (made once per signature, see :data:`_PLANS`) and
    their :class:`Meta`; ``shapes`` and ``dtypes``: theirs, where the caller has them already
    (a trace records them).  The per-output work is C loops (``map``), no Python."""
    shapes = list(map(_SHAPE, values)) if shapes is None else shapes
    dtypes = list(map(_DTYPE, values)) if dtypes is None else dtypes
    sizes = list(map(math.prod, shapes))
    ndims = tuple(map(len, shapes))
    key = (tuple(dtypes), ndims, tuple(map(int.bit_length, sizes)))
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        plan = _PLANS[key] = CudaPlan(dtypes, ndims, sizes)
    return plan, Meta(np.fromiter(sizes, np.int64, len(sizes)), plan.dmax)


def cuda_parts(values: Sequence[mx.array], plan: CudaPlan | None = None):
    """Lazy statistics slots of ``values`` (empty ones skipped): one custom kernel per chunk
    (:func:`chunk_bounds`) of outputs of one float dtype (other dtypes are reduced as float32 copies),
    each read where it lies.  Returns ``(parts, order)``: per chunk a lazy uint32
    [k * _SLOT] array, and the indices of the outputs in slot order."""
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
        parts.append(_cuda_kernel(k)(
            inputs=[values[i] for i in idx], template=[("T", dt), ("FK", _FILL_KIND[dt])],
            grid=(nb * _THREADS, k, 1), threadgroup=(_THREADS, 1, 1),
            output_shapes=[(k * _SLOT,)], output_dtypes=[mx.uint32], init_value=0)[0])
    return parts, plan.order


def cuda_finish(meta, parts, order) -> Sequence[dict]:
    """The stats dicts from :func:`cuda_parts`' (evaluated) slots; ``meta``: (size, dtype)
    of every output, or their :class:`Meta` (the outputs themselves need not be alive any more)."""
    words = np.array(mx.concatenate(parts) if len(parts) > 1 else parts[0]) if parts else None
    return fold_slots(meta, words, order)


def fold_slots(meta, words: np.ndarray | None, order) -> "Rows":
    """:func:`cuda_finish` on the slots already copied to the host (``words``, uint32
    [len(order) * _SLOT]; slot r holds output ``order[r]``)."""
    meta = as_meta(meta)
    N = len(meta.sizes)
    hi = np.full(N, -np.inf)
    lo = np.full(N, np.inf)
    sums = np.zeros((N, 2))
    cnt = np.zeros((N, 5), np.int64)
    if len(order):
        w = words.reshape(len(order), _SLOT)
        idx = np.asarray(order, np.int64)
        sums[idx] = np.ascontiguousarray(w[:, 0:4]).view(np.float64)
        hi[idx] = _unkey(w[:, 4])
        lo[idx] = -_unkey(w[:, 5])
        cnt[idx] = w[:, 6:11]
    return finish_many(meta, hi, lo, sums, cnt)


def _unkey(k: np.ndarray) -> np.ndarray:
    """Floats (float64) from the kernel's order-preserving uint32 keys (0: no value, -> -inf)."""
    k = k.astype(np.uint32)
    bits = np.where(k & np.uint32(0x80000000), k & np.uint32(0x7FFFFFFF), ~k).astype(np.uint32)
    return np.where(k == 0, -np.inf, bits.view(np.float32).astype(np.float64))


class Meta(NamedTuple):
    """What folding needs of N outputs: ``sizes`` (int64) and ``dmax``, each one's dtype's
    largest finite value (float64; NaN: not a float dtype)."""
    sizes: np.ndarray
    dmax: np.ndarray


def as_meta(meta) -> Meta:
    """``meta`` as a :class:`Meta`: one already, or (size, dtype) pairs."""
    if isinstance(meta, Meta):
        return meta
    sizes, dts = zip(*meta) if len(meta) else ((), ())
    return Meta(np.fromiter(sizes, np.int64, len(sizes)), _dmax_of(dts))


def _dmax_of(dtypes: Sequence) -> np.ndarray:
    table = {}  # each dtype looked up once (MLX dtypes hash slowly)
    for dt in set(dtypes):
        d = dtype_max(dt)
        table[dt] = np.nan if d is None else d
    return np.fromiter(map(table.__getitem__, dtypes), np.float64, len(dtypes))


def finish_many(meta, hi, lo, sums, cnt) -> "Rows":
    """The stats dicts of N outputs (``meta``: (size, dtype) each, or a :class:`Meta`) from
    their folded partials -- max ``hi`` and min ``lo`` of the finite non-fill elements,
    ``sums`` [N, 2] (sum, sum of squares) and ``cnt`` [N, 5] (zeros, fill, NaN, +Inf, -Inf):
    :func:`finish` on every row, the arithmetic done on whole columns."""
    m = as_meta(meta)
    return _finish_rows(m.sizes, m.dmax, hi, lo, sums, cnt)


def _finish_rows(n: np.ndarray, dmax: np.ndarray, hi, lo, sums, cnt) -> "Rows":
    """:func:`finish_many` given each row's size ``n`` and its dtype's largest finite value
    ``dmax`` (NaN: not a float dtype)."""
    zeros, fill, nan, pinf, ninf = cnt.T
    c = n - nan - pinf - ninf - fill
    ok = c > 0
    with np.errstate(all="ignore"):
        cc = np.where(ok, c, 1).astype(np.float64)
        mean = np.where(ok, sums[:, 0] / cc, np.nan)
        std = np.where(ok, np.sqrt(np.maximum(sums[:, 1] / cc - mean * mean, 0.0)), np.nan)
        mn = np.where(ok, lo, np.nan)
        mxv = np.where(ok, hi, np.nan)
        absmax = np.where(ok, np.maximum(np.abs(mn), np.abs(mxv)), np.nan)
        zf = np.where(n > 0, zeros / np.where(n > 0, n, 1), np.nan)
        head = absmax / dmax
    inf_any = (pinf > 0) | (ninf > 0)
    none_head = ~inf_any & ~np.isfinite(head)  # no dtype max, or no finite absmax
    head = np.where(inf_any, np.inf, head)
    return Rows((mn, mxv, mean, std, absmax, nan, pinf, ninf, zf, head, fill, none_head, n))


class Rows(Sequence):
    """The stats dicts of many outputs, folded into columns: each dict is made when it is
    first read (a forward's hundreds of steps, a generation's thousands, are folded at once;
    most are never looked at one by one).  ``rows[j]`` is a dict, ``rows.view(at, k)`` the
    rows ``at .. at + k - 1`` sharing the columns (numpy arrays; a view turns its own part
    of them into Python numbers when it is first read, so a generation's forwards that are
    never read cost nothing more)."""

    __slots__ = ("_cols", "_at", "_n", "_made", "_lists")

    def __init__(self, cols: tuple, at: int = 0, n: int | None = None, made: dict | None = None):
        self._cols = cols
        self._at = at
        self._n = len(cols[0]) - at if n is None else n
        self._made = {} if made is None else made
        self._lists = None

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(self._n))]
        if j < 0:
            j += self._n
        if not 0 <= j < self._n:
            raise IndexError(f"row {j} of {self._n}")
        r = self._at + j
        d = self._made.get(r)
        if d is None:
            lists = self._lists
            if lists is None:
                lists = self._lists = tuple(c[self._at:self._at + self._n].tolist() for c in self._cols)
            a, b, m, s, am, na, pi, ni, z, h, fl, nh, size = (c[j] for c in lists)
            d = self._made[r] = _finish(None, 0, None) if size == 0 else {
                "min": a, "max": b, "mean": m, "std": s, "absmax": am, "nan": na, "posinf": pi, "neginf": ni,
                "zero_frac": z, "headroom": None if nh else h, "masked": fl}
        return d

    def view(self, at: int, k: int) -> "Rows":
        return Rows(self._cols, self._at + at, k, self._made)
