"""The Trace: run an op program one step at a time, see every value, stop where it matters.

A :class:`Trace` is a generic stepper over ``(Program, ctx, feeds)``: it does not know
how its steps were produced (our model programs today; mlx-lm module calls later), only
that op ``i`` is ``op.fn(ctx, *values of op.inputs)``.  On top of the plain executor it
adds:

* stepping (``step``, ``run(until=)``, ``back``) with a record (:class:`Step`) per op;
* capture: ``"stats"`` (cheap statistics of every op), ``"full"`` (every value, kept
  within a memory budget, spilled to safetensors beyond it), a list of name patterns
  (statistics of every op, values of the matching ones) or ``None`` (nothing: the
  uncaptured fast path);
* breakpoints by name pattern, by predicate on the :class:`Step`, and on non-finite;
* interventions (:mod:`workbench.trace.interventions`);
* the NaN hunt (:meth:`Trace.first_nonfinite`, see :mod:`workbench.trace.hunt`).

This module holds the trace's state (the position, the live values, the step records,
capture, breakpoints, interventions) and runs its ops through the one executor loop
(:func:`workbench.program.run_ops`).  Beside it: stepping.py (the navigation: ``step``,
``run``, ``back``, ``reset``, breakpoints hit), reading.py (what it gives back: values,
statistics, positions, logits, the first non-finite op, recomputation), step.py (the
:class:`Step` record), snapshots.py (cache snapshots for going back), batches.py (the
statistics-batch ledger: pending, in flight, arrived), replay.py (the program run again for
recomputation), options.py and entry.py (``trace(model, ...)``: text or ids to a Trace of
the model).

Statistics are lazy: each op adds a tiny lazy reduction to the graph and the trace
evaluates many of them with one ``mx.eval`` (at the end of ``run()``, or whenever the
values waiting for evaluation pass ``flush_bytes``).  Breakpoints that need statistics
are found after such an evaluation; the trace then rewinds to the op that hit
(re-executing lazily from the start of the batch, which costs no evaluation).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Mapping

import mlx.core as mx

from workbench.program import Program, run_ops
from workbench.trace.batches import Batches, wait_for_stats
from workbench.trace.interventions import Intervention, normalize as _norm_iv
from workbench.trace.options import FLUSH_BYTES
from workbench.trace.reading import Reading
from workbench.trace.replay import Replay
from workbench.trace.snapshots import snapshot
from workbench.trace.step import NONFINITE, Step, TraceError, dtype_str, headroom_rows  # noqa: F401  (re-exported)
from workbench.trace.stepping import Stepping
from workbench.trace.store import ValueStore

_UNDO_DEPTH = 32
#: a run without capture on a GPU queues its graph (``mx.async_eval``) at the first layer end
#: after this many bytes of op outputs, so the device computes while Python builds the next
#: layers (why this size: benchmarks/README.md, queueing the graph at layer ends)
QUEUE_BYTES = 1 << 30


class Trace(Stepping, Reading):
    """Step through ``program`` in ``ctx`` on ``feeds``.

    Parameters
    ----------
    capture: ``"stats"`` | ``"full"`` | list of name patterns | ``None``.
    breakpoints: name patterns, predicates ``f(step) -> bool``, or ``NONFINITE``.
    interventions: :class:`Intervention`\\ s, or a dict ``{pattern: fn}``.
    context: ``f(dtype, cache) -> ctx`` making a fresh context (needed to recompute an
        op in float32 for the NaN hunt, and to replay when going back over a cache op).
    tensors: ``f(op_name) -> {name: array}``, the checkpoint tensors an op reads (the
        hunt checks them for non-finite values).
    memory_budget: bytes of captured values kept in memory before spilling to disk (an int
        or a size like ``"2GB"``; None: a streamed model's ``capture_budget``, else the default).
    flush_bytes: evaluate pending statistics once the waiting values pass this size.
    batched, ids, attention_mask: what the model-level entry ran (see :func:`workbench.trace.entry.trace`).
    progress: a progress bar over the segments (:mod:`workbench.progress`): None takes the
        model's ``progress`` for a streamed model (automatic: slow runs, in a terminal or a
        notebook) and shows none otherwise; True / False: always / never.

    Streaming: a ``model`` with a ``release_weights`` method (a streamed model,
    :mod:`workbench.models.streaming`) has its program run in segments, the maximal runs
    of ops of one ``op.layer``: at the end of each, every live value and the KV cache are
    evaluated and ``model.release_weights()`` drops the weights read so far, whatever runs
    the ops (``run``, ``step``, going back, recomputation).
    """

    def __init__(self, program: Program, ctx: Any, feeds: Mapping[str, mx.array], *,
                 capture="stats", breakpoints=None, interventions=None,
                 context: Callable | None = None, tensors: Callable | None = None,
                 memory_budget: int | None = None, spill_dir: str | None = None,
                 flush_bytes: int = FLUSH_BYTES, store: ValueStore | None = None,
                 key_prefix: str = "", model: Any = None, batched: bool = True,
                 ids: mx.array | None = None, attention_mask: mx.array | None = None, progress=None):
        missing = [n for n in program.inputs if n not in feeds]
        if missing:
            raise TraceError(f"feeds lack program input(s) {', '.join(missing)}")
        self.program = program
        self.ctx = ctx
        self.model = model
        #: False: one sequence given unbatched (text or one list of ids); every value, ``.logits``
        #: included, keeps its batch axis of 1 whatever this says
        self.batched = bool(batched)
        #: the token ids [B, T] and the padding mask [B, T] (None: no padding) it runs on
        self.ids = ids
        self.attention_mask = attention_mask
        self._feeds = dict(feeds)
        self._context = context
        self._tensors = tensors
        self.flush_bytes = int(flush_bytes)
        self._ops = program.ops
        self._last_name = program.ops[-1].name
        self._program_layer_ends = program.layer_ends()
        self._release = getattr(model, "release_weights", None)
        if memory_budget is None and store is None:
            memory_budget = getattr(model, "capture_budget", None)
        self._store = store if store is not None else ValueStore(memory_budget, spill_dir)
        #: op index that ends a segment (the last op's too) -> segments done once it ran (streamed models only)
        n = len(self._ops)
        ends = [i for i in range(n) if i == n - 1 or self._ops[i].layer != self._ops[i + 1].layer] \
            if self._release else []
        self._ends = {i: k for k, i in enumerate(ends, 1)}
        if progress is not None and not isinstance(progress, bool):
            raise TraceError(f"progress must be None, True or False, not {progress!r}")
        if progress is None and self._release is not None:
            progress = getattr(model, "progress", None)
        elif progress is None:
            progress = False
        self.progress = progress
        self._bar = None
        self._prefix = key_prefix
        self._set_capture(capture)
        self.breakpoints: list = []
        for b in ([breakpoints] if (isinstance(breakpoints, str) or callable(breakpoints)) else (breakpoints or [])):
            self.add_breakpoint(b)
        self._interventions: list[Intervention] = []
        self._iv_by_op: dict[str, list[Intervention]] = {}
        for iv in _norm_iv(interventions):
            self.add_intervention(iv)
        self._cache0 = snapshot(getattr(ctx, "cache", None))
        self._replay = Replay(program, self._feeds, self._cache0, context, self._iv_by_op, self._ends, self._release)
        #: the statistics-batch ledger (:mod:`workbench.trace.batches`)
        self.batches = Batches(self._take_rows)
        #: the values an op freed, kept for stepping back without replaying; with a KV cache,
        #: going back replays from the snapshot anyway, so nothing is kept (a decoding loop's
        #: traces would each hold their last ops' inputs, the full keys and values among them)
        self._undoable = getattr(ctx, "cache", None) is None
        self._reset_state()

    # ------------------------------------------------------------------ setup
    def _set_capture(self, capture):
        if capture is None or capture == "none":
            self.capture, self._stats_on, self._keep = None, False, frozenset()
        elif capture == "stats":
            self.capture, self._stats_on, self._keep = "stats", True, frozenset()
        elif capture == "full":
            self.capture, self._stats_on, self._keep = "full", True, frozenset(self.program.names)
        else:
            pats = [capture] if isinstance(capture, str) else list(capture)
            names = self.program.match(pats)
            if not names:
                raise TraceError(f"capture patterns {pats} match no op of this program")
            self.capture, self._stats_on, self._keep = pats, True, frozenset(names)

    def _reset_state(self):
        self._env: dict[str, mx.array] = dict(self._feeds)
        # what ran, per op index (ops 0 .. position - 1): output shape and dtype, recorded on
        # the hot path; the Step records are made from them when first read (:meth:`_step_at`)
        self._shapes: list[tuple] = []
        self._dtypes: list = []
        self._labels: dict[int, tuple] = {}  # (ops intervened on only)
        self._made: dict[int, Step] = {}
        self._undo: OrderedDict[int, dict] = OrderedDict()
        self.batches.reset()
        self._queued = 0  # output bytes built since the graph was last queued (run() at layer ends)
        self.position = 0

    def add_breakpoint(self, bp) -> None:
        """A name pattern (glob / ``re:``), a predicate ``f(step) -> bool``, or ``NONFINITE``."""
        if isinstance(bp, str):
            if bp != NONFINITE and not self.program.match(bp):
                raise TraceError(f"breakpoint {bp!r} matches no op of this program")
        elif not callable(bp):
            raise TypeError(f"a breakpoint is a name pattern, a predicate or NONFINITE, not {bp!r}")
        self.breakpoints.append(bp)

    def clear_breakpoints(self) -> None:
        self.breakpoints.clear()

    def add_intervention(self, intervention: Intervention) -> None:
        """Applies to ops executed from now on (use a new trace to change past ones)."""
        names = self.program.match(intervention.pattern)
        if not names:
            raise TraceError(f"intervention {intervention.label!r} matches no op of this program")
        self._interventions.append(intervention)
        for n in names:
            self._iv_by_op.setdefault(n, []).append(intervention)

    # ------------------------------------------------------------------ properties
    @property
    def ops(self) -> list[str]:
        return self.program.names

    @property
    def done(self) -> bool:
        return self.position >= len(self._ops)

    @property
    def steps(self) -> list[Step]:
        """The executed steps, in order."""
        self._flush(wait=True)
        return self._steps

    # ------------------------------------------------------------------ step records
    # A forward records an op's output shape and dtype as it runs; its Step is made when
    # something reads it (a decoding loop's hundreds of steps per token are mostly never read,
    # and on a GPU the host's Python per op is what the device waits for).
    @property
    def _steps(self) -> list[Step]:
        """Every executed step, in order (made now where not made yet)."""
        return [self._step_at(i) for i in range(len(self._shapes))]

    def _step_at(self, i: int) -> Step:
        s = self._made.get(i)
        if s is None:
            op = self._ops[i]
            s = self._made[i] = Step(op.name, op.kind, op.layer, i, self._input_shapes(i), self._shapes[i],
                                     dtype_str(self._dtypes[i]), None, self._labels.get(i, ()))
            at = self.batches.row_of(i)
            if at is not None:
                s.stats_from(*at)
        return s

    def _last_step(self) -> Step | None:
        return self._step_at(len(self._shapes) - 1) if self._shapes else None

    def _truncate(self, n: int) -> None:
        """Forget the records of ops n and later (they will run again)."""
        for i in range(n, len(self._shapes)):
            self._made.pop(i, None)
            self._labels.pop(i, None)
        del self._shapes[n:]
        del self._dtypes[n:]
        self.batches.truncate(n)

    def _take_rows(self, first: int, stop: int, rows) -> None:
        """Statistics rows for ops first..stop-1 arrived (rows[j] is op first + j's)."""
        made = self._made
        if made:  # steps already read (run()'s last one, stepping) take theirs now
            for i in range(first, stop):
                s = made.get(i)
                if s is not None:
                    s.stats_from(rows, i - first)

    @property
    def dtype(self):
        return getattr(self.ctx, "dtype", None)

    @property
    def matmul_precision(self) -> str:
        """What its float32 matmuls run as: "float32", "tf32" (MLX's CUDA default; TF32 on
        the GPU), "n/a (cpu)", or "n/a (bfloat16)" for another compute dtype
        (workbench.precision, docs/trace.md: TF32)."""
        from workbench.precision import matmul_precision

        return matmul_precision(self.dtype)

    @property
    def store(self) -> ValueStore:
        return self._store

    def __len__(self) -> int:
        return len(self._ops)

    def __repr__(self) -> str:
        cap = self.capture if not isinstance(self.capture, list) else f"patterns {self.capture}"
        return (f"<Trace {self.position}/{len(self._ops)} ops, capture={cap}, "
                f"dtype={dtype_str(self.dtype) if self.dtype is not None else '?'}>")

    # ------------------------------------------------------------------ execution core
    #: what a step is: one op of the program (a ModuleTrace's: one module call, "module")
    granularity = "op"

    #: the trace applies interventions to op outputs itself; a subclass whose ops return
    #: values already intervened on (module recording) turns this off
    applies_interventions = True

    def _input_shapes(self, i: int) -> tuple:
        """The shapes op ``i`` read (its inputs: feeds, or earlier ops' recorded outputs)."""
        feeds, shapes, index = self._feeds, self._shapes, self.program.index
        return tuple([feeds[s].shape if s in feeds else shapes[index(s)] for s in self._ops[i].inputs])

    def _exec(self, i: int, record: bool = True) -> None:
        """Run op ``i`` (and end its streaming segment, if it ends one)."""
        self._exec_span(i, i + 1, record)

    def _exec_span(self, i: int, end: int, record: bool = True, stop_at=frozenset(), queue_at=frozenset()):
        """Run ops ``i`` .. ``end - 1``, and return ``(next op, why)``: why it stopped early
        after an op (``"stop"``: the op is in ``stop_at``, a name breakpoint's; ``"flush"``: the
        values waiting for evaluation passed ``flush_bytes``; ``"queue"``: the op is in
        ``queue_at``, a layer end, and :data:`QUEUE_BYTES` of outputs were built since the graph
        was last queued), or None at ``end``.  ``record=False`` re-executes without recording
        (going back, rewinding) and never stops early.

        The ops run in the one executor loop (:func:`workbench.program.run_ops`); what the trace
        adds per op (the record, the statistics batch, where to stop) is the loop's body here.
        The hot path of every forward: the per-op Python is locals and one call to the op's
        function (a decoding step runs hundreds of ops per token, and on a GPU the device waits
        for this Python; benchmarks/README.md, building a decoding step's graph)."""
        ivs_by, ops = self._iv_by_op, self._ops
        # the values an op freed are kept for going back (without a KV cache) for the last
        # _UNDO_DEPTH ops of the span only: the depth kept anyway (going back further replays)
        undo = self._undo if self._undoable else None
        ends = self._ends
        keep, stats_on = self._keep, self._stats_on
        shapes, dtypes = self._shapes, self._dtypes
        batches = self.batches
        pend, flush = batches.pending, self.flush_bytes
        nbytes = batches.nbytes
        queued = self._queued
        why = None
        steps = run_ops(self.program, self.ctx, self._env, i, end, freed=undo, freed_from=end - _UNDO_DEPTH,
                        apply=self._intervene if ivs_by and self.applies_interventions else None,
                        failed=self._failed)
        try:
            for j, out in steps:
                i = j + 1
                if undo is not None and len(undo) > _UNDO_DEPTH:
                    undo.popitem(last=False)
                if record:
                    shapes.append(out.shape)
                    dtypes.append(out.dtype)
                    if ivs_by:
                        ivs = ivs_by.get(ops[j].name)
                        if ivs:
                            self._labels[j] = tuple(iv.label for iv in ivs)
                    kept = ops[j].name in keep
                    if stats_on or kept:
                        if not pend:
                            batches.first = j
                        pend.append(out)
                        if kept:
                            batches.keeps.append((j, out))
                        nbytes += out.nbytes
                if j in ends:  # (streaming) the segment's values evaluated, its weights released
                    self.position, batches.nbytes = i, nbytes
                    self._segment_end(j)
                    pend, nbytes = batches.pending, batches.nbytes
                if not record:
                    continue
                if j in stop_at:
                    why = "stop"
                    break
                if nbytes >= flush:
                    why = "flush"
                    break
                if queue_at:
                    queued += out.nbytes
                    if queued >= QUEUE_BYTES and j in queue_at:
                        queued = 0
                        why = "queue"
                        break
        finally:
            self.position, batches.nbytes, self._queued = i, nbytes, queued
        return i, why

    def _intervene(self, op, out):
        """The interventions on op ``op`` applied to its output (those added so far)."""
        for iv in self._iv_by_op.get(op.name, ()):
            out = iv.apply(out, op)
        return out

    def _failed(self, i: int, e: Exception) -> TraceError:
        """The error naming op ``i``, the shapes it was given and the weights it reads."""
        op = self._ops[i]
        missing = [s for s in op.inputs if s not in self._env]
        if missing:  # (guarded by the Program's invariants)
            return TraceError(f"op {op.name!r} needs {missing[0]!r}, which is not available")
        args = [self._env[s] for s in op.inputs]
        shapes = ", ".join(f"{s} {list(a.shape)} {dtype_str(a.dtype)}" for s, a in zip(op.inputs, args))
        return TraceError(f"op {op.name!r} ({op.kind}, op {i}) failed on {shapes or 'no inputs'}"
                          f"{' reading ' + ', '.join(op.params) if op.params else ''}: {e}")

    def _segment_end(self, i: int) -> None:
        """Streaming: evaluate what is live (pending statistics and captures with it), then
        let the model drop the weights read so far."""
        self._flush(also=self._live_values(self._env, getattr(self.ctx, "cache", None)))
        self._release()
        if self._bar is not None:  # (the segment now running, named by its first op)
            self._bar.update(self._ends[i], self._ops[i + 1].name if i + 1 < len(self._ops) else "done")

    def _live_values(self, env, cache) -> list:
        """The computed values of ``env`` and the KV cache's arrays (evaluated at a segment end)."""
        return [v for k, v in env.items() if k not in self._feeds] + list(getattr(cache, "state", ()))

    def _flush(self, wait: bool = False, also=(), block: bool = True) -> None:
        """Evaluate every pending op (and captured value, and ``also``) with one ``mx.eval``;
        their statistics are computed in the background (CPU) or queued on the device (CUDA)
        and collected by :meth:`_sync`.  ``block=False``: the evaluation is queued
        (``mx.async_eval``) and this returns at once."""
        keeps = self.batches.flush(self._stats_on, self._shapes, self._dtypes, also, block)
        if keeps:
            ops = self._ops
            for i, v in keeps:
                self._store.put(self._prefix + ops[i].name, v)
        if wait:
            self._sync()

    def _sync(self) -> None:
        wait_for_stats([self])

    def start_stats(self) -> None:
        """Start reducing the statistics of batches :meth:`run` left queued (``block=False``)
        on the CPU's statistics thread, without waiting for them (a decoding loop calls it
        once the next forward is queued); on a GPU they are already computing."""
        self.batches.start()
