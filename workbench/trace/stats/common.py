"""What every statistics backend shares: the dtype facts, the one finishing arithmetic and
the rows it makes.

A backend reduces each output to partials -- max ``hi`` and min ``lo`` of its finite
elements that are not mask fill, their sum and sum of squares (float64), and its counts of
zeros, mask fill, NaN, +Inf and -Inf -- and :func:`finish` turns the partials of N outputs
into their statistics, the arithmetic done on whole columns.  :class:`Rows` holds the result
and makes each output's dict (:func:`workbench.stats_schema.row`) when it is first read.

Mask fill: attention scores hold the dtype's lowest finite value at masked positions (so
they vanish in the softmax without an infinity).  Such elements are counted under
``masked`` and left out of min / max / mean / std / absmax / headroom, which would otherwise
all say "at the edge of the range".  (A genuine activation saturating at exactly -max is
counted as mask fill, the only approximation here.)  An output with no finite element that
is not fill has None for every summary (the schema's one convention).
"""
from __future__ import annotations

import math
import threading
from typing import NamedTuple, Sequence

import mlx.core as mx
import numpy as np

from workbench.dtypes import FLOAT_MAX
from workbench.stats_schema import TRACE_KEYS, row

#: keys of every stats dict, in display order (the one schema: workbench/stats_schema.py)
KEYS = TRACE_KEYS

#: :data:`workbench.dtypes.FLOAT_MAX` keyed by the MLX dtype (read once per op)
_FMAX = {getattr(mx, name): v for name, v in FLOAT_MAX.items()}


def dtype_max(dtype) -> float | None:
    """Largest finite value of a floating dtype (None for integer / bool dtypes)."""
    if dtype in _FMAX:
        return _FMAX[dtype]
    if mx.issubdtype(dtype, mx.floating):
        return float(mx.finfo(dtype).max)
    return None


class Meta(NamedTuple):
    """What finishing needs of N outputs: ``sizes`` (int64) and ``dmax``, each one's dtype's
    largest finite value (float64; NaN: not a float dtype)."""
    sizes: np.ndarray
    dmax: np.ndarray


def as_meta(meta) -> Meta:
    """``meta`` as a :class:`Meta`: one already, or (size, dtype) pairs."""
    if isinstance(meta, Meta):
        return meta
    sizes, dts = zip(*meta) if len(meta) else ((), ())
    return Meta(np.fromiter(sizes, np.int64, len(sizes)), dmax_of(dts))


def dmax_of(dtypes: Sequence) -> np.ndarray:
    """:func:`dtype_max` of each dtype as a float64 column (NaN: not a float dtype)."""
    table = {}  # each dtype looked up once (MLX dtypes hash slowly)
    for dt in set(dtypes):
        d = dtype_max(dt)
        table[dt] = np.nan if d is None else d
    return np.fromiter(map(table.__getitem__, dtypes), np.float64, len(dtypes))


def finish(meta, hi, lo, sums, cnt) -> "Rows":
    """The statistics of N outputs (``meta``: a :class:`Meta`, or (size, dtype) each) from their
    partials: max ``hi`` and min ``lo`` of the finite non-fill elements, ``sums`` [N, 2] (sum,
    sum of squares) and ``cnt`` [N, 5] (zeros, fill, NaN, +Inf, -Inf).  The one finishing
    arithmetic of every backend, done on whole columns."""
    m = as_meta(meta)
    n, dmax = m.sizes, m.dmax
    zeros, fill, nan, pinf, ninf = np.asarray(cnt).T
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
    return Rows((ok, mn, mxv, mean, std, absmax, nan, pinf, ninf, zf, head, fill, none_head, n))


def empty_row() -> dict:
    """The statistics of an output with no element."""
    return row(False, None, None, None, None, None, 0, 0, 0, None, headroom=None, masked=0)


class Rows(Sequence):
    """The stats dicts of many outputs, folded into columns (:func:`finish`): each dict is made
    when it is first read (a forward's hundreds of steps, a generation's thousands, are
    finished at once; most are never looked at one by one).  ``rows[j]`` is a dict,
    ``rows.view(at, k)`` the rows ``at .. at + k - 1`` sharing the columns (numpy arrays; a
    view turns its own part of them into Python numbers when it is first read, so a
    generation's forwards that are never read cost nothing more)."""

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
            ok, a, b, m, s, am, na, pi, ni, z, h, fl, nh, size = (c[j] for c in lists)
            d = self._made[r] = empty_row() if size == 0 else \
                row(ok, a, b, m, s, am, na, pi, ni, z, headroom=None if nh else h, masked=fl)
        return d

    def view(self, at: int, k: int) -> "Rows":
        return Rows(self._cols, self._at + at, k, self._made)


def eval_here(arrays: Sequence[mx.array], queue: bool = False) -> None:
    """``mx.eval(arrays)`` (``queue=True``: ``mx.async_eval``); when they were built on another
    thread's stream, a RuntimeError that says so (MLX's own message names only the stream).

    An MLX stream belongs to the thread that created it (MLX >= 0.31.2), and a lazy array
    can only be evaluated on the thread whose stream it was built on: a trace called from
    another thread than the one that built its model and feeds fails here (the widgets hand
    their callbacks to the thread that built them, see ``workbench.widgets._actions``)."""
    try:
        (mx.async_eval if queue else mx.eval)(arrays)
    except RuntimeError as e:
        if "in current thread" not in str(e):
            raise
        raise RuntimeError(
            f"{e} MLX streams belong to threads: these arrays (a model's lazily loaded weights, a trace's "
            f"feeds or values) were built on another thread than {threading.current_thread().name!r}; "
            "call the trace from the thread that loaded the model and made the trace") from e


def nonfinite_counts(x: mx.array) -> tuple[int, int, int]:
    """(#NaN, #+Inf, #-Inf) of one array, counted per element (0s for integer arrays)."""
    if not mx.issubdtype(x.dtype, mx.floating) or x.size == 0:
        return 0, 0, 0
    c = mx.stack([mx.isnan(x).sum(), mx.isposinf(x).sum(), mx.isneginf(x).sum()])
    a, b, d = (int(v) for v in np.array(c))
    return a, b, d


def jsonable(v):
    """Stats values for JSON: a non-finite float (an infinite headroom) becomes None (the
    counts tell the story); a summary with no finite value is None already."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return v
