"""Models larger than memory: ``workbench.load(path, memory_budget="8GB")``.

A streamed model holds no weights between runs.  Its program runs in *segments*, the
maximal runs of ops with the same ``op.layer`` (the embedding, each layer, the final norm
and head): an op reads its tensors from the checkpoint when it runs (lazily, through the
reader: :meth:`Checkpoint.load` with ``keep=False``); at the end of each segment the
trace evaluates every live value (and the KV cache) and calls
:meth:`StreamedModel.release_weights`, which drops every tensor read so far and returns
MLX's freed buffers to the system (``mx.clear_cache``).  Quantized weights stay packed
(only floating tensors are converted to the compute dtype, as always).  Embedding ops
(the token table, Gemma 4's per-layer table) read only the rows of their ids
(:meth:`StreamedModel.rows_program`, :meth:`Checkpoint.load_rows`).

Nothing stays resident: a table used in more than one place (a tied ``embed_tokens``,
read by rows for the lookup and whole as the head) is read again by each segment that
uses it.  So the weights in memory at any time are one segment's, and the peak is the largest segment (:attr:`StreamedModel.largest_segment`) plus the
activations; ``load`` refuses a budget below the largest segment, naming it.  What is
left of the budget holds captured values (``capture="full"``); the rest spills to disk
(:class:`workbench.trace.store.ValueStore`).

Everything that runs the program streams: ``model(ids)`` (evaluated, not lazy: it runs
a trace without capture), ``model.trace(...)``, stepping, going back, the hunt's
recomputation and ``workbench.generate`` (each forward re-reads the weights: streaming
trades time for memory).  Running ``workbench.program.execute`` on its program directly
does not stream (nothing evaluates at segment ends): the weights it reads stay until the
next release.  A progress bar (:mod:`workbench.progress`) follows the
segments when a run is slow, in a terminal or a notebook (``load(progress=...)``).
"""
from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass, replace
from typing import Iterable, Mapping

import mlx.core as mx
import numpy as np

from workbench.dtypes import dtype_name, parse_dtype
from workbench.models.model import LazyTensors, Model
from workbench.program import Op, Program
from workbench.sizes import fmt_bytes, parse_bytes


class StreamingTensors(LazyTensors):
    """Checkpoint tensors read on use and kept only until :meth:`release` (the reader keeps
    none), and tables read by rows (:meth:`rows`)."""

    def __init__(self, ck, names: Iterable[str]):
        super().__init__(ck, names, keep=False)

    def rows(self, name: str, ids: mx.array) -> mx.array:
        """``table[ids]`` reading only those rows from the file (an embedding lookup)."""
        flat = np.asarray(ids).reshape(-1)
        n = self.ck.info(name).shape[0]
        if flat.size and (flat.min() < 0 or flat.max() >= n):
            raise ValueError(f"{name}: token id {int(flat.max() if flat.max() >= n else flat.min())} is out of "
                             f"range for its {n} rows")
        uniq, inv = np.unique(flat, return_inverse=True)
        table = self.ck.load_rows(name, uniq)
        return table[mx.array(inv.astype(np.int32))].reshape(tuple(ids.shape) + tuple(table.shape[1:]))


class _Rows:
    """A table an embedding op indexes: ``rows[ids]`` reads those rows alone, converted as
    :class:`Weights` converts (a cast commutes with a gather: the values are the same)."""

    def __init__(self, stream: StreamingTensors, name: str, weights):
        self.stream, self.name, self.weights = stream, name, weights

    def __getitem__(self, ids):
        v = self.stream.rows(self.name, ids)
        if mx.issubdtype(v.dtype, mx.floating) and v.dtype != self.weights.dtype:
            v = v.astype(self.weights.dtype)
        return v


class _RowTables(Mapping):
    """An embedding op's view of the weights: its own tables as :class:`_Rows`."""

    def __init__(self, weights, stream: StreamingTensors, tables: frozenset):
        self.weights, self.stream, self.tables = weights, stream, tables

    def __getitem__(self, name):
        if name in self.tables:
            return _Rows(self.stream, name, self.weights)
        return self.weights[name]

    def get(self, name, default=None):
        return self[name] if name in self.weights else default

    def __contains__(self, name):
        return name in self.weights

    def __iter__(self):
        return iter(self.weights)

    def __len__(self):
        return len(self.weights)


def _by_rows(op: Op, stream: StreamingTensors, tables: frozenset) -> Op:
    """The embedding op reading only the rows of its ids (``attrs["rows"]``)."""
    inner = op.fn

    def fn(ctx, ids):
        return inner(replace(ctx, weights=_RowTables(ctx.weights, stream, tables)), ids)

    return replace(op, fn=fn, attrs={**op.attrs, "rows": True})


@dataclass(frozen=True)
class Segment:
    """A maximal run of ops of one layer (None: outside the layers) and the bytes of the
    checkpoint tensors they read, as held while it runs (stored and converted)."""

    layer: int | None
    first: str   # first op's name
    last: str    # last op's name
    nbytes: int

    @property
    def label(self) -> str:
        return f"layers.{self.layer}" if self.layer is not None else f"{self.first}..{self.last}"


def segments(model: Model, program=None, dtype=None) -> list[Segment]:
    """The program's segments with the weight bytes each holds in compute dtype ``dtype``
    (default the model's): a tensor read in the storage dtype and, when floating and of
    another dtype, its converted copy too; a half of a fused tensor reads the whole."""
    program = program or model.program
    dt = parse_dtype(dtype) or model.default_dtype
    ck = model.checkpoint
    out: list[Segment] = []
    ops = program.ops
    start = 0
    for i, op in enumerate(ops):
        if i + 1 < len(ops) and ops[i + 1].layer == op.layer:
            continue
        # (an embedding op reading rows holds [tokens, ...] of its tables: activations)
        names = {n for o in ops[start:i + 1] if not o.attrs.get("rows") for n in model.op_tensor_names(o)}
        total = 0
        for n in names:
            t = ck.info(n)
            total += ck.info(t.source_name).nbytes if t.part else t.nbytes
            stored = _FLOAT.get(t.dtype)
            if stored is not None and stored != dt:  # Weights keeps a converted copy beside it
                total += t.nbytes // stored.size * dt.size
        out.append(Segment(op.layer, ops[start].name, op.name, total))
        start = i + 1
    return out


_FLOAT = {"F16": mx.float16, "BF16": mx.bfloat16, "F32": mx.float32, "F64": mx.float64}


def held_bytes(model: Model, program=None, dtype=None) -> int:
    """The weight bytes a held (not streamed) model keeps once ``program`` has run in
    ``dtype``: every tensor it reads, once, as stored (a fused tensor whole, once however
    many of its halves are read) and, when floating and of another dtype, converted too."""
    program = program or model.program
    dt = parse_dtype(dtype) or model.default_dtype
    ck = model.checkpoint
    stored: dict[str, int] = {}
    converted = 0
    for n in {n for op in program.ops for n in model.op_tensor_names(op)}:
        t = ck.info(n)
        stored[t.source_name] = ck.info(t.source_name).nbytes if t.part else t.nbytes
        f = _FLOAT.get(t.dtype)
        if f is not None and f != dt:
            converted += t.nbytes // f.size * dt.size
    return sum(stored.values()) + converted


def preflight(model: Model, dtype=None, program=None, what: str | None = None, advice: str | None = None) -> int:
    """Refuse (:class:`workbench.device_memory.NotEnoughMemory`, one line) a held model whose
    weights are over the memory available, before anything is read; the advice names the
    ``memory_budget`` that would stream it, or why none would.  Returns the bytes needed."""
    from workbench.device_memory import available_memory, check_fits
    from workbench.sizes import round_size

    dt = parse_dtype(dtype) or model.default_dtype
    need = held_bytes(model, program, dt)
    avail, _ = available_memory()
    if avail is None or need <= avail:
        return need
    what = what or f"{model.path or 'the checkpoint'}: the weights ({dtype_name(dt)}) need"
    if advice is None:
        program = program or model.program  # (streamed, an embedding reads only its ids' rows)
        rows = Program([replace(op, attrs={**op.attrs, "rows": True}) if op.kind == "embedding" else op
                        for op in program.ops], program.inputs)
        seg = max(segments(model, rows, dt), key=lambda s: s.nbytes)
        if seg.nbytes > avail:
            advice = (f"streaming cannot help either: {seg.label} alone reads {seg.nbytes} bytes "
                      f"({fmt_bytes(seg.nbytes)}) at once")
        else:
            budget = round_size(avail * 3 // 4)
            if parse_bytes(budget) < seg.nbytes:
                budget = round_size(seg.nbytes, up=True)
                if parse_bytes(budget) > avail:
                    budget = str(seg.nbytes)
            advice = (f"stream them with --memory-budget {budget} (workbench.load(..., memory_budget={budget!r})); "
                      f"the largest segment, {seg.label}, reads {fmt_bytes(seg.nbytes)}")
    check_fits(need, what, advice)
    return need


def _libc():
    try:
        lib = ctypes.CDLL(None)
        return lib if hasattr(lib, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _libc() if sys.platform.startswith("linux") else None


def _trim_heap() -> None:
    """glibc keeps freed blocks below its (adaptive, up to 32 MiB) mmap threshold in the
    heap: a released layer's smaller matrices would stay in the process's memory.
    ``malloc_trim(0)`` hands the free pages back (a no-op elsewhere)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


class StreamedModel(Model):
    """A :class:`Model` whose weights are read per segment and released after (module
    docstring).  ``memory_budget``: bytes for weights and captured values together.  What a
    trace needs of it: :class:`workbench.traceable.OpTraceable`."""

    def __init__(self, family, config, text_config, checkpoint, program, tensor_names, *,
                 memory_budget: int, progress=None, **kw):
        self._stream = StreamingTensors(checkpoint, tensor_names)
        self._checked: set = set()  # compute dtypes whose weights were checked against the budget
        self._by_rows: dict[int, tuple] = {}  # id(program) -> (program, its rows program)
        super().__init__(family, config, text_config, checkpoint, program, tensor_names,
                         tensors=self._stream, **kw)
        self.program = self.rows_program(program)
        self._stream.release()  # (the storage dtype was read from a tensor's header: lazy, never evaluated)
        self.memory_budget = int(memory_budget)
        #: None: a progress bar when a run is slow and stderr is a terminal or in a notebook;
        #: True / False: always / never (workbench.progress)
        self.progress = progress
        self.check_budget()

    def __repr__(self):
        return super().__repr__()[:-1] + f", streamed within {fmt_bytes(self.memory_budget)}>"

    def rows_program(self, program: Program) -> Program:
        """``program`` with its embedding ops reading only the rows of their ids (kept)."""
        if any(op.attrs.get("rows") for op in program.ops):
            return program
        out = self._by_rows.get(id(program))
        if out is None or out[0] is not program:
            ops = [_by_rows(op, self._stream, frozenset(self.op_tensor_names(op))) if op.kind == "embedding" else op
                   for op in program.ops]
            out = self._by_rows[id(program)] = (program, Program(ops, program.inputs))
        return out[1]

    def program_for(self, attention=None, prune: bool = False) -> Program:
        return self.rows_program(super().program_for(attention, prune))

    def check_budget(self, program=None, dtype=None) -> Segment:
        """The largest segment; a ValueError naming it when it does not fit the budget."""
        seg = max(segments(self, program, dtype), key=lambda s: s.nbytes)
        if seg.nbytes > self.memory_budget:
            raise ValueError(f"memory_budget {self.memory_budget} bytes ({fmt_bytes(self.memory_budget)}) is "
                             f"below the weights of {seg.label} ({seg.nbytes} bytes, {fmt_bytes(seg.nbytes)}, read "
                             f"whole while it runs, in {dtype_name(parse_dtype(dtype) or self.default_dtype)}): "
                             "raise the budget or compute in the storage dtype")
        return seg

    def context(self, dtype=None, cache=None):
        """As :meth:`Model.context`; a compute dtype whose converted weights would not fit
        the budget is refused (ValueError naming the segment)."""
        dt = parse_dtype(dtype) or self.default_dtype
        if dt not in self._checked:
            self.check_budget(dtype=dt)
            self._checked.add(dt)
        return super().context(dtype, cache)

    @property
    def largest_segment(self) -> Segment:
        return self.check_budget()

    @property
    def capture_budget(self) -> int:
        """What the budget leaves for captured values beside the largest segment's weights."""
        return max(self.memory_budget - self.largest_segment.nbytes, 0)

    @property
    def loaded(self) -> list[str]:
        """The checkpoint tensors read since the last release (segment end)."""
        return self._stream.loaded

    def release_weights(self) -> None:
        """Drop every tensor read so far (the trace calls this at each segment's end, once
        the live values are evaluated) and give MLX's freed buffers back to the system."""
        for w in self._weights.values():  # (the converted copies, per compute dtype)
            w.release()
        self._stream.release()
        mx.clear_cache()
        _trim_heap()

    def __call__(self, ids, attention_mask=None, cache=None, dtype=None) -> mx.array:
        """Logits [B, T, vocab], evaluated (the program runs segment by segment)."""
        t = self.trace(ids, capture=None, dtype=dtype, run={"cache": cache}, positions={"attention_mask": attention_mask})
        t.run()
        return t.value(t.ops[-1])
