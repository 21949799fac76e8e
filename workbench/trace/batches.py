"""The statistics-batch ledger of a trace: which op outputs wait for evaluation, which
batches' statistics are computing, which rows arrived.

A trace's ops add their outputs to :attr:`Batches.pending` as they run (its hot loop holds
the list in a local); :meth:`Batches.flush` evaluates them with one ``mx.eval`` and hands them
to the statistics (:class:`workbench.trace.stats.Pending`: computed in the background on the
CPU, queued on a CUDA GPU), the batch then *in flight*; :func:`wait_for_stats` collects the
batches in flight of one or many traces (on a GPU one device-to-host copy and one fold for a
generation's forwards) and gives each trace its rows.
"""
from __future__ import annotations

from typing import Callable, Sequence

import mlx.core as mx

from workbench.trace import stats as _stats
from workbench.trace.step import TraceError


class Batches:
    """One trace's ledger.  ``pending``: the values evaluated at the next flush (with
    statistics every op's since op ``first``, otherwise the captured ops' only); ``keeps``:
    (op index, value) of the captured ones among them; ``nbytes``: their size; ``inflight``:
    (first, stop, :class:`~workbench.trace.stats.Pending`) of the batches whose statistics are
    computing; ``rows``: (first, stop, stats rows) of every batch that arrived (op indices
    first .. stop - 1).  ``on_rows(first, stop, rows)`` is told of each arrival."""

    __slots__ = ("pending", "first", "keeps", "nbytes", "inflight", "rows", "on_rows")

    def __init__(self, on_rows: Callable[[int, int, Sequence[dict]], None] | None = None):
        self.on_rows = on_rows
        self.reset()

    def reset(self) -> None:
        self.pending: list = []
        self.first = 0
        self.keeps: list = []
        self.nbytes = 0
        self.inflight: list = []
        self.rows: list[tuple] = []

    def flush(self, stats_on: bool, shapes: list, dtypes: list, also=(), block: bool = True) -> list:
        """Evaluate every pending value (and ``also``) with one ``mx.eval``; with statistics on
        (``stats_on``) their batch goes in flight (``shapes`` / ``dtypes``: every op run's,
        this batch the last of them).  ``block=False``: the evaluation is queued
        (``mx.async_eval``).  Returns the captured (op index, value) pairs to store."""
        pend = self.pending
        if not pend:
            if also:
                (mx.eval if block else mx.async_eval)(list(also))
            return []
        keeps = self.keeps
        kept = [v for _, v in keeps]
        kept.extend(also)
        # evaluated before the pending list is cleared: if mx.eval raises, the ops stay pending
        if stats_on:
            first = self.first
            stop = first + len(pend)
            if stop != len(shapes):  # pragma: no cover - every op run is pending while stats are on
                raise TraceError(f"internal: a statistics batch of {len(pend)} ops from op {first} does not "
                                 f"end at the last op run ({len(shapes) - 1})")
            self.inflight.append((first, stop, _stats.Pending(
                pend, kept, background=True, defer=not block, shapes=shapes[first:stop], dtypes=dtypes[first:stop])))
        elif block:
            mx.eval(kept)
        else:
            mx.async_eval(kept)
        self.pending = []
        self.keeps = []
        self.nbytes = 0
        return keeps

    def start(self) -> None:
        """Start reducing the batches left queued (``block=False``) on the CPU's statistics
        thread, without waiting for them; on a GPU they are already computing."""
        for _, _, p in self.inflight:
            p.start()

    def take(self, first: int, stop: int, rows) -> None:
        """Statistics rows for ops first .. stop - 1 arrived (rows[j] is op first + j's)."""
        self.rows.append((first, stop, rows))
        if self.on_rows is not None:
            self.on_rows(first, stop, rows)

    def row_of(self, i: int):
        """(rows, j): where op ``i``'s statistics are (the latest batch holding it), or None."""
        for a, b, rows in reversed(self.rows):
            if a <= i < b:
                return rows, i - a
        return None

    def truncate(self, n: int) -> None:
        """Forget the rows of ops n and later (they will run again)."""
        self.rows = [(a, min(b, n), r) for a, b, r in self.rows if a < n]


def wait_for_stats(traces) -> None:
    """Give the steps of every trace in ``traces`` their statistics still being computed,
    collected together: on a GPU one device-to-host copy and one fold for all of them (a
    generation's forwards), instead of one per trace."""
    ledgers = [t.batches for t in traces]
    flying = [(b, first, stop, p) for b in ledgers for first, stop, p in b.inflight]
    if flying:
        # (rows of folded columns: each dict made when first read)
        for (b, first, stop, _), res in zip(flying, _stats.results([p for _, _, _, p in flying])):
            b.take(first, stop, res)
    for b in ledgers:
        b.inflight.clear()
