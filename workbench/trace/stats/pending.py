"""The dispatch: a batch of lazy op outputs to the backend that reduces them.

The trace hands a batch of lazy outputs to :class:`Pending`, which evaluates them with one
``mx.eval`` and has each reduced to its statistics:

* on a CUDA GPU by the kernel (:mod:`.cuda`), queued with ``mx.async_eval``: the trace
  synchronises once, when it reads them (:func:`results` folds many batches at once);
* on other GPUs (Metal) as lazy MLX reductions in the same graph (:mod:`.device`);
* on the CPU through zero-copy numpy views of the evaluated outputs (:mod:`.host`), in a
  background thread.

Threads: every MLX call (``mx.eval``, the views, the dtype facts) happens on the calling
thread, when the :class:`Pending` is made; the background thread gets numpy views and
floats only (:func:`~workbench.trace.stats.common.eval_here` says in words when arrays come
from another thread's stream).
"""
from __future__ import annotations

import os
from typing import Sequence

import mlx.core as mx
import numpy as np

from workbench.trace.stats import cuda, device, host
from workbench.trace.stats.common import Meta, as_meta, dtype_max, eval_here


def use_host() -> bool:
    """Whether statistics are computed through host views (:mod:`.host`) rather than on the
    device: on the CPU by default; ``WORKBENCH_STATS=device`` or ``=host`` forces a path (to
    exercise the GPU path on a CPU-only machine)."""
    force = os.environ.get("WORKBENCH_STATS", "").strip().lower()
    if force == "device":
        return False
    if force == "host":
        return True
    return mx.default_device().type == mx.DeviceType.cpu


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
    or already computed (GPU); :meth:`result` returns them in order (a sequence of dicts).

    ``defer=True`` (host path): the batch is only queued (``mx.async_eval``) and its
    reduction starts at :meth:`start` (or :meth:`result`), on the calling thread, so a
    decoding loop can queue the next forward first and reduce this one while it computes.
    ``shapes`` and ``dtypes``: the values' own, where the caller has them (the CUDA path
    groups the outputs by them, :func:`~workbench.trace.stats.cuda.cuda_plan`)."""

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
        if cuda.on_cuda():
            # queued, not waited for: the one synchronisation comes when the stats are read
            plan, meta = cuda.cuda_plan(values, shapes, dtypes)
            parts, order = cuda.cuda_parts(values, plan)
            self._cuda = (meta, parts, order)  # (meta: a Meta, as every _cuda holds)
            mx.async_eval(parts + list(also))
            return
        self._dicts = device.device_stats(values, also)

    @classmethod
    def slots(cls, meta: Sequence[tuple], parts, order) -> "Pending":
        """The statistics of outputs ``meta`` ((size, dtype) each, or a Meta) whose slots
        :func:`~workbench.trace.stats.cuda.cuda_parts` made (``parts``, lazy or evaluated; ``order``)."""
        p = cls([])
        p._dicts, p._cuda = None, (as_meta(meta), list(parts), list(order))
        return p

    def _reduce(self, values, views, background: bool) -> None:
        jobs = [(np.asarray(w).reshape(-1), v.dtype == mx.bfloat16, dtype_max(v.dtype), v.size)
                for v, w in zip(values, views)]
        run = lambda: host.host_stats_many(jobs)  # noqa: E731
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
                self._dicts = cuda.cuda_finish(*self._cuda)
                self._cuda = None
            else:
                self._dicts = self._future.result()
                self._future = None
        return self._dicts


def results(pendings: Sequence[Pending]) -> list[Sequence[dict]]:
    """:meth:`Pending.result` of each; those queued on CUDA are copied back together (one
    device-to-host copy) and folded in one pass (:func:`~workbench.trace.stats.cuda.fold_slots`)."""
    todo = [p for p in pendings if p._dicts is None and p._cuda is not None]
    if len(todo) > 1:
        parts = [a for p in todo for a in p._cuda[1]]
        words = np.array(mx.concatenate(parts) if len(parts) > 1 else parts[0]) if parts else None
        metas = [p._cuda[0] for p in todo]
        starts = np.cumsum([0] + [len(m.sizes) for m in metas]).tolist()
        meta = Meta(np.concatenate([m.sizes for m in metas]), np.concatenate([m.dmax for m in metas]))
        order = np.concatenate([np.asarray(p._cuda[2], np.int64) + at for p, at in zip(todo, starts)])
        dicts = cuda.fold_slots(meta, words, order)
        for p, at, stop in zip(todo, starts, starts[1:]):
            p._dicts, p._cuda = dicts.view(at, stop - at), None
    return [p.result() for p in pendings]


def evaluate(values: Sequence[mx.array], also: Sequence[mx.array] = (), host: bool | None = None) -> list[dict]:
    """Stats dicts of several (lazy) arrays, evaluated together with ``also`` in one
    ``mx.eval`` (plus one more for the rare outputs that need the exact pass on a Metal GPU);
    ``host``: force the host path (True) or the device's (False)."""
    return list(Pending(values, also, background=False, host=host).result())
