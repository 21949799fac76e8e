"""Logits where they are needed: ``trace(model, ids, positions=Positions(logits="all" | "last" | slice | ...))``.

The final projection (``lm_head``, or the tied embedding) is the largest output of a forward:
[B, T, vocab].  At 16,384 tokens Gemma 4 E2B's is [16384, 262144], 2^32 elements, and kills
MLX's CUDA backend (SIGFPE); no one reads every row of it.  So a trace computes the head for
the positions asked for only:

* ``"all"``: every position of the forward (``tr.logits`` is [B, T, vocab]);
* ``"last"``: the last one (what generation samples from);
* a ``slice`` (``slice(-4, None)``, ``slice(0, 100, 10)``) or a list of positions
  (``[0, 5, -1]``): those, in increasing order (duplicates refused);
* None (the default): ``"all"`` unless the [B, T, vocab] logits in the compute dtype would
  take more than the logits budget (:data:`DEFAULT_BUDGET`, 4 GiB; ``WORKBENCH_LOGITS_BUDGET``
  overrides it, a size such as ``"64MB"``) or hold more than 2^31 elements (past int32
  indexing), then ``"last"``, said in one line (``tr.logits_note``).

Positions index this forward's token axis (0 .. T-1, as the ids given; under a KV cache,
the new chunk's tokens); every sequence of a batch gets the same positions (left padding:
the last position is every sequence's last token).  ``tr.logit_positions`` is a ``range``
(all, last, a slice) or a tuple; ``tr.logits`` is [B, P, vocab].

Exactness: while the whole [B, T, vocab] logits hold at most :data:`EXACT_ELEMENTS` elements
(or ``WORKBENCH_LOGITS_EXACT``), the head still runs on every position and the rows are taken
from its output, so a selection equals those rows of ``"all"`` to the last bit (the head is
cheap there, and a BLAS picks its kernel by the matrix's shape: OpenBLAS computes a row of a
[1, 128] x [128, 522] product in other bits than the same row of a [9, 128] one).  Past it
only the selected rows go through the head: same values, to rounding.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from numbers import Integral

import mlx.core as mx
import numpy as np

from workbench.sizes import fmt_bytes, parse_bytes

#: the default logits budget: "all" while the [B, T, vocab] logits take at most this many bytes
DEFAULT_BUDGET = 4 * 2**30
#: and hold at most this many elements (kernels index with int32; 2^32 killed MLX's CUDA backend)
MAX_ELEMENTS = 2**31
#: below this many elements of [B, T, vocab] the head runs on every position and rows are taken
EXACT_ELEMENTS = 2**24

CHOICES = ("all", "last")


def budget() -> int:
    """The logits budget in bytes: ``WORKBENCH_LOGITS_BUDGET`` if set, else :data:`DEFAULT_BUDGET`."""
    env = os.environ.get("WORKBENCH_LOGITS_BUDGET")
    return parse_bytes(env, "WORKBENCH_LOGITS_BUDGET") if env else DEFAULT_BUDGET


def exact_elements() -> int:
    env = os.environ.get("WORKBENCH_LOGITS_EXACT")
    if env is None or env == "":
        return EXACT_ELEMENTS
    if not env.isascii() or not env.isdigit():
        raise ValueError(f"WORKBENCH_LOGITS_EXACT={env!r}: a number of elements (0 or more)")
    return int(env)


@dataclass(frozen=True)
class LogitRows:
    """Which positions of a T-token forward the head computes: ``positions`` (a ``range`` or
    a tuple of increasing ints in [0, T)), ``T``, how they were asked for (``asked``:
    "all", "last", "slice", "positions", or "default") and the one line saying why a default
    is not "all" (``note``)."""

    positions: range | tuple
    T: int
    asked: str = "all"
    note: str | None = None
    batch: int = 1
    vocab: int | None = None

    @property
    def all(self) -> bool:
        return len(self.positions) == self.T

    @property
    def first(self) -> int:
        """The first position asked for (0 for all): where ``prune=True`` starts its rows."""
        return 0 if self.all or not len(self.positions) else int(self.positions[0])

    def __len__(self) -> int:
        return len(self.positions)

    def describe(self) -> str:
        """``all 9 positions``, ``position 8 (the last) of 9``, ``positions 2..4 of 9``."""
        return describe(self.positions, self.T)

    def to_json(self):
        """``"all"`` or the list of positions (dump metadata, ``--json``)."""
        return "all" if self.all else [int(p) for p in self.positions]

    def select(self, x: mx.array) -> mx.array:
        """The rows of ``x`` [B, T, ...] (or [T, ...]) at these positions (axis -2 of the head's input)."""
        if self.all:
            return x
        axis = x.ndim - 2
        p = self.positions
        skip = self.T - x.shape[axis]  # rows a pruned program left out before (they come first)
        if skip:
            p = range(p.start - skip, p.stop - skip, p.step) if isinstance(p, range) else tuple(i - skip for i in p)
        if isinstance(p, range) and p.step == 1:
            idx = (slice(None),) * axis + (slice(p.start, p.stop),)
            return x[idx]
        return mx.take(x, mx.array(list(p), dtype=mx.int32), axis=axis)

    def head(self, fn, x: mx.array) -> mx.array:
        """``fn`` (the head) on the rows of ``x`` at these positions; on every row, then the
        rows taken, while the whole output is at most :func:`exact_elements` (module docstring)."""
        if self.all:
            return fn(x)
        full = self.batch * self.T * (self.vocab or 0)
        if self.vocab is not None and full <= exact_elements():
            return self.select(fn(x))
        return fn(self.select(x))


@dataclass(frozen=True)
class Pruned:
    """What ``trace(..., positions=Positions(prune=True))`` left out: from the op ``op`` (kind "rows",
    ``layers.{k}.live_rows``) on, the stream holds positions ``start .. T - 1`` only."""

    op: str
    start: int
    T: int

    @property
    def positions(self) -> range:
        return range(self.start, self.T)

    def describe(self) -> str:
        """``from layers.15.live_rows on: position 8 (the last) of 9``."""
        return f"from {self.op} on: {describe(self.positions, self.T)}"

    def to_json(self) -> dict:
        return {"op": self.op, "positions": "all" if self.start == 0 else [self.start, self.T], "of": self.T}


def describe(positions, T: int) -> str:
    n = len(positions)
    if n == T:
        return f"all {T} positions"
    if n == 1:
        p = positions[0]
        return f"position {p}{' (the last)' if p == T - 1 else ''} of {T}"
    if isinstance(positions, range) and positions.step == 1:
        return f"positions {positions.start}..{positions.stop - 1} of {T}"
    shown = ", ".join(str(p) for p in list(positions)[:8]) + (", ..." if n > 8 else "")
    return f"{n} positions ({shown}) of {T}"


def _compact(ps: list[int]) -> range | tuple:
    if len(ps) == 1:
        return range(ps[0], ps[0] + 1)
    step = ps[1] - ps[0]
    if step > 0 and all(b - a == step for a, b in zip(ps, ps[1:])):
        return range(ps[0], ps[-1] + 1, step)
    return tuple(ps)


def _spec(logits) -> str:
    s = repr(logits)
    return s if len(s) <= 40 else s[:37] + "..."


ALLOWED = "'all', 'last', a slice, or a list of positions"


def resolve(logits, T: int, batch: int = 1, vocab: int | None = None, dtype=None) -> LogitRows:
    """The positions ``logits=`` asks for in a T-token forward of ``batch`` sequences, or a
    one-line ValueError / TypeError naming the value (module docstring for the forms)."""
    if logits is None:
        return default(T, batch, vocab, dtype)
    if isinstance(logits, str):
        if logits == "all":
            return LogitRows(range(T), T, "all", batch=batch, vocab=vocab)
        if logits == "last":
            return LogitRows(range(T - 1, T), T, "last", batch=batch, vocab=vocab)
        raise ValueError(f"logits={_spec(logits)}: not one of {ALLOWED}")
    if isinstance(logits, slice):
        for part in (logits.start, logits.stop, logits.step):
            if part is not None and (isinstance(part, bool) or not isinstance(part, Integral)):
                raise TypeError(f"logits={_spec(logits)}: a slice of integer positions")
        if logits.step is not None and int(logits.step) == 0:
            raise ValueError(f"logits={_spec(logits)}: a slice step cannot be zero")
        ps = sorted(range(*slice(*(None if v is None else int(v) for v in
                                   (logits.start, logits.stop, logits.step))).indices(T)))
        if not ps:
            raise ValueError(f"logits={_spec(logits)}: selects no position of the {T}-token forward")
        return LogitRows(_compact(ps), T, "slice", batch=batch, vocab=vocab)
    if isinstance(logits, (mx.array, np.ndarray)):
        logits = np.array(logits).reshape(-1).tolist() if not isinstance(logits, mx.array) or \
            mx.issubdtype(logits.dtype, mx.integer) else logits.tolist()
    if isinstance(logits, (list, tuple, range)):
        if len(logits) == 0:
            raise ValueError(f"logits={_spec(logits)}: no positions (give at least one, or 'last')")
        ps = []
        for p in logits:
            if isinstance(p, (bool, np.bool_)) or not isinstance(p, (Integral, np.integer)):
                raise TypeError(f"logits={_spec(logits)}: position {_spec(p)} is not an integer")
            q = int(p)
            if not -T <= q < T:
                raise ValueError(f"logits={_spec(logits)}: position {q} out of range for a {T}-token forward "
                                 f"(0..{T - 1}, or -{T}..-1 from the end)")
            ps.append(q % T)
        dup = sorted({p for p in ps if ps.count(p) > 1})
        if dup:
            raise ValueError(f"logits={_spec(logits)}: position {dup[0]} given twice")
        return LogitRows(_compact(sorted(ps)), T, "positions", batch=batch, vocab=vocab)
    if isinstance(logits, (Integral, np.integer)) and not isinstance(logits, (bool, np.bool_)):
        raise TypeError(f"logits={_spec(logits)}: a list of positions ([{int(logits)}]), not a bare integer; "
                        f"or one of {ALLOWED}")
    raise TypeError(f"logits={_spec(logits)}: not one of {ALLOWED}")


def default(T: int, batch: int = 1, vocab: int | None = None, dtype=None) -> LogitRows:
    """``"all"`` while [batch, T, vocab] in ``dtype`` fits the budget and MAX_ELEMENTS, else
    ``"last"`` with a one-line note saying so."""
    if vocab is None:
        return LogitRows(range(T), T, "default", batch=batch, vocab=vocab)
    elements = batch * T * vocab
    itemsize = dtype.size if isinstance(dtype, mx.Dtype) else 4
    nbytes = elements * itemsize
    cap = budget()
    if nbytes <= cap and elements <= MAX_ELEMENTS:
        return LogitRows(range(T), T, "default", batch=batch, vocab=vocab)
    from workbench.dtypes import dtype_name
    why = (f"{fmt_bytes(nbytes)}, over the {fmt_bytes(cap)} logits budget"
           + (" (WORKBENCH_LOGITS_BUDGET)" if os.environ.get("WORKBENCH_LOGITS_BUDGET") else "")
           if nbytes > cap else f"{elements} elements, past 2^31")
    shape = f"[{batch}, {T}, {vocab}]" if batch > 1 else f"[{T}, {vocab}]"
    note = (f"logits at the last position only (of {T}): all of them, {shape} "
            f"{dtype_name(dtype) if isinstance(dtype, mx.Dtype) else ''}, would be {why}; "
            "logits='all' (or a slice) asks for more").replace("  ", " ")
    return LogitRows(range(T - 1, T), T, "default", note=note, batch=batch, vocab=vocab)


def positions_of(trace) -> tuple[range | tuple | None, int | None]:
    """(the trace's logit positions, its T) where it says, else (None, None)."""
    rows = getattr(trace, "logit_rows", None)
    if rows is None:
        return None, None
    return rows.positions, rows.T
