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

Beside it: step.py (the :class:`Step` record), snapshots.py (cache snapshots for going
back), batches.py (the statistics-batch ledger: pending, in flight, arrived), replay.py
(the program run again for recomputation), entry.py (``trace(model, ...)``: text or ids to a
Trace of the model).

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
import numpy as np

from workbench.nogc import no_gc
from workbench.progress import start as start_progress
from workbench.program import Program, name_matches
from workbench.trace import stats as _stats
from workbench.trace.batches import Batches, wait_for_stats
from workbench.trace.interventions import Intervention, normalize as _norm_iv
from workbench.trace.replay import Replay, recompute_op
from workbench.trace.snapshots import restore, snapshot
from workbench.trace.step import NONFINITE, Step, TraceError, dtype_str, headroom_rows  # noqa: F401  (re-exported)
from workbench.trace.store import ValueStore

_UNDO_DEPTH = 32
#: a run without capture on a GPU queues its graph (``mx.async_eval``) at the first layer end
#: after this many bytes of op outputs, so the device computes while Python builds the next
#: layers (why this size: benchmarks/README.md, queueing the graph at layer ends)
QUEUE_BYTES = 1 << 30


class Trace:
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
                 flush_bytes: int = 512 * 2**20, store: ValueStore | None = None,
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

        The hot path of every forward: the per-op Python is locals and one call to the op's
        function (a decoding step runs hundreds of ops per token, and on a GPU the device waits
        for this Python; benchmarks/README.md, building a decoding step's graph)."""
        plan = self.program.exec_plan()
        env, ctx = self._env, self.ctx
        ivs_by = self._iv_by_op
        # the values an op freed are kept for going back (without a KV cache) for the last
        # _UNDO_DEPTH ops of the span only: the depth kept anyway (going back further replays)
        undo = self._undo if self._undoable else None
        undo_from = end - _UNDO_DEPTH
        ends = self._ends
        keep, stats_on = self._keep, self._stats_on
        shapes, dtypes = self._shapes, self._dtypes
        batches = self.batches
        pend, flush = batches.pending, self.flush_bytes
        nbytes = batches.nbytes
        queued = self._queued
        why = None
        try:
            while i < end:
                name, fn, inputs, frees = plan[i]
                try:
                    args = [env[s] for s in inputs]
                except KeyError as e:  # pragma: no cover - guarded by Program invariants
                    raise TraceError(f"op {name!r} needs {e.args[0]!r}, which is not available") from None
                try:
                    out = fn(ctx, *args)
                except Exception as e:  # name the op (MLX raises shape errors while building the graph)
                    raise self._failed(i, args, e) from e
                labels = ()
                if ivs_by:
                    ivs = ivs_by.get(name)
                    if ivs:
                        if self.applies_interventions:
                            op = self._ops[i]
                            for iv in ivs:
                                out = iv.apply(out, op)
                        labels = tuple(iv.label for iv in ivs)
                env[name] = out
                if undo is None or i < undo_from:
                    for s in frees:
                        env.pop(s, None)
                else:
                    freed = {}
                    for s in frees:
                        v = env.pop(s, None)
                        if v is not None:
                            freed[s] = v
                    undo[i] = freed
                    if len(undo) > _UNDO_DEPTH:
                        undo.popitem(last=False)
                j = i
                i += 1
                if record:
                    shapes.append(out.shape)
                    dtypes.append(out.dtype)
                    if labels:
                        self._labels[j] = labels
                    kept = name in keep
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

    def _failed(self, i: int, args, e: Exception) -> TraceError:
        """The error naming op ``i``, the shapes it was given and the weights it reads."""
        op = self._ops[i]
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

    def _hit(self, step: Step) -> bool:
        for bp in self.breakpoints:
            if isinstance(bp, str):
                if bp == NONFINITE:
                    if step.nonfinite:
                        return True
                elif name_matches(step.name, bp):
                    return True
            elif bp(step):
                return True
        return False

    def _queue_layers(self) -> bool:
        """Whether :meth:`run` queues the graph on the device at layer ends (every
        :data:`QUEUE_BYTES` of outputs): on a GPU, without statistics, for a forward over more
        than one position.  Never on the CPU (MLX's CPU stream and the host statistics share
        its cores); never for a one-token decoding step (launch-bound: nothing to hide Python
        behind); not with statistics: their batches are queued every ``flush_bytes`` already
        (benchmarks/README.md, queueing the graph at layer ends)."""
        if mx.default_device().type != mx.DeviceType.gpu or self._stats_on:
            return False
        return self.ids is None or self.ids.shape[-1] != 1

    def _needs_stats_for_breaks(self) -> bool:
        return any(not isinstance(b, str) or b == NONFINITE for b in self.breakpoints)

    # ------------------------------------------------------------------ stepping API
    def step(self) -> Step:
        """Run the next op, evaluate it, and return its :class:`Step`."""
        if self.done:
            raise TraceError("the trace is done (every op ran); use back() or a new trace")
        i = self.position
        self._exec(i)
        self._flush(wait=True)
        name = self._ops[i].name
        if not self._stats_on and name not in self._keep:
            mx.eval(self._env[name])
        return self._step_at(i)

    def run(self, until: str | None = None, *, wait: bool = True, block: bool = True) -> Step | None:
        """Run to the end, or through the op named ``until``, stopping early at a breakpoint.

        Returns the :class:`Step` it stopped at (the last one run), or None if nothing ran.
        ``wait=False``: the values are evaluated, but the last batch's statistics may still be
        computing in the background (the steps get them when next read through the trace).
        ``block=False`` (with ``wait=False``): the last evaluation is only queued
        (``mx.async_eval``), so the call returns once the graph is submitted, and reading a
        value or a statistic waits for it (a decoding loop builds the next forward meanwhile).
        Statistics reduced on the host (the CPU) start at :meth:`start_stats` or when read.
        """
        if wait and not block:
            raise TraceError("run(block=False) needs wait=False (waiting for the statistics blocks)")
        self._bar = start_progress(len(self._ends), "segments", self.progress) if self.progress is not False \
            else None
        try:
            # a forward makes graph nodes per op: the cyclic collector's passes over them cost
            # more than the op's own Python (benchmarks/README.md, the cyclic collector);
            # nothing here makes cycles, so it waits until the run is done
            with no_gc():
                return self._run(until, wait, block)
        finally:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def _run(self, until, wait, block=True):
        n = len(self._ops)
        end = n
        if until is not None:
            idx = self.program.index(until)
            if idx < self.position:
                raise TraceError(f"op {until!r} already ran (it is op {idx}; the trace is at {self.position}); "
                                 "use back() or a new trace")
            end = idx + 1
        spec = self._needs_stats_for_breaks()
        if spec and not self._stats_on:
            self._stats_on = True  # predicates and NONFINITE need statistics
        name_bps = [b for b in self.breakpoints if isinstance(b, str) and b != NONFINITE]
        # without statistics on a GPU the graph is queued at layer ends, every QUEUE_BYTES of
        # outputs (mx.async_eval): the device computes while Python builds the next layers;
        # with statistics, their batches go by size (flush_bytes), queued on a GPU as well
        layer_ends = self._program_layer_ends if self._queue_layers() else frozenset()
        self._queued = 0  # output bytes since the graph was last queued
        stop_at = frozenset(map(self.program.index, self.program.match(name_bps))) if name_bps else frozenset()
        ran = False
        evaluated = False
        ops = self._ops
        while self.position < end:
            start = self.position
            snap = (dict(self._env), snapshot(getattr(self.ctx, "cache", None))) if spec else None
            i, why = self._exec_span(start, end, stop_at=stop_at, queue_at=layer_ends)
            ran = True
            name_stop = i - 1 if why == "stop" else None
            at_layer_end = why == "queue"
            # the logits are evaluated with the last batch's statistics (one mx.eval)
            also = [self._env[self._last_name]] if self.done else []
            queue = at_layer_end and self.position < end and not spec and name_stop is None
            if queue and not self._stats_on:
                also = [self._env[ops[self.position - 1].name]]
            queue = queue or (not block and self.position >= end and not spec and name_stop is None)
            self._flush(wait=spec, also=also, block=not queue)
            evaluated = bool(also) and self.done
            if spec:
                for j in range(start, self.position):
                    s = self._step_at(j)
                    if self._hit(s):
                        if j < self.position - 1:
                            self._rewind(snap, start, j)
                        return s
            if name_stop is not None:
                self._sync()
                return self._step_at(name_stop)
        if self.done and not evaluated:
            self._flush(also=[self._env[self._last_name]])
        self._flush(wait=wait)
        return self._last_step() if ran else None

    def _rewind(self, snap, start: int, hit: int) -> None:
        """Back to just after op ``hit`` (ops start..hit re-executed lazily, stats kept)."""
        for j in range(hit + 1, len(self._shapes)):
            self._store.remove(self._prefix + self._ops[j].name)
        self._truncate(hit + 1)
        env, cache = snap
        self._env = dict(env)
        restore(cache)
        for j in [k for k in self._undo if k >= start]:
            del self._undo[j]
        self._exec_span(start, hit + 1, record=False)

    def back(self) -> Step | None:
        """Undo the last step; returns the step now last run (None at the start)."""
        if self.position == 0:
            return None
        self._flush(wait=True)
        i = self.position - 1
        op = self._ops[i]
        has_cache = getattr(self.ctx, "cache", None) is not None
        if i in self._undo and not has_cache:
            self._env.pop(op.name, None)
            self._env.update(self._undo.pop(i))
            self.position = i
        else:
            self._replay_to(i)
        last = len(self._shapes) - 1
        self._store.remove(self._prefix + self._ops[last].name)
        self._truncate(last)
        return self._last_step()

    def _replay_to(self, i: int) -> None:
        """Rebuild the live values as they were before op ``i`` (lazily, from the feeds)."""
        restore(self._cache0)
        self._env = dict(self._feeds)
        self._undo.clear()
        self._exec_span(0, i, record=False)  # (leaves position at i)

    def reset(self) -> None:
        """Back to the start (captured values dropped)."""
        for j in range(len(self._shapes)):
            self._store.remove(self._prefix + self._ops[j].name)
        restore(self._cache0)
        self._reset_state()

    # ------------------------------------------------------------------ values
    def _check_name(self, name: str) -> int:
        try:
            return self.program.index(name)
        except KeyError:
            raise KeyError(f"no op named {name!r} in this program (see trace.ops)") from None

    def value(self, name: str) -> mx.array:
        """The output of op ``name`` (captured, or still live in the running program)."""
        if name in self._feeds:
            return self._feeds[name]
        idx = self._check_name(name)
        if idx >= self.position:
            raise KeyError(f"op {name!r} has not run yet (it is op {idx}; the trace is at {self.position})")
        self._flush()  # evaluated and stored; statistics still computing need no wait
        key = self._prefix + name
        if key in self._store:
            return self._store.get(key)
        v = self._env.get(name)
        if v is not None:  # not captured, but still live (read by an op yet to run)
            return v
        raise KeyError(f"the value of {name!r} was not captured (capture={self.capture!r}); "
                       f"trace with capture='full' or a pattern matching it")

    def stats(self, name: str) -> dict:
        """min, max, mean, std, absmax, nan, posinf, neginf, zero_frac, headroom of an op's output."""
        idx = self._check_name(name)
        if idx >= self.position:
            raise KeyError(f"op {name!r} has not run yet (it is op {idx}; the trace is at {self.position})")
        self._flush(wait=True)
        st = self._step_at(idx)
        if st.stats is None:
            st.stats = _stats.evaluate([self.value(name)])[0]
        return dict(st.stats)

    def step_info(self, name: str) -> Step:
        idx = self._check_name(name)
        if idx >= self.position:
            raise KeyError(f"op {name!r} has not run yet")
        self._flush(wait=True)
        return self._step_at(idx)

    #: the positions the head computed (workbench.trace.logits.LogitRows; None: a program
    #: run without a model entry, whose last op gives what it gives)
    logit_rows = None

    #: what ``prune=True`` left out (workbench.trace.logits.Pruned; None: nothing)
    pruned = None

    def positions(self, name: str) -> range | tuple:
        """The token positions of this forward that op ``name``'s rows are (its token axis):
        ``range(T)`` but for the head's ops (:attr:`logit_positions`) and, under
        ``prune=True``, the ops from :attr:`pruned`'s on (its ``positions``)."""
        idx = self._check_name(name)
        rows, pruned = self.logit_rows, self.pruned
        T = self.ids.shape[1] if self.ids is not None else (rows.T if rows is not None else None)
        if rows is not None and "lm_head" in self.program and idx >= self.program.index("lm_head"):
            return rows.positions
        if pruned is not None and idx >= self.program.index(pruned.op):
            return pruned.positions
        if T is None:
            raise ValueError(f"op {name!r}: this trace does not know its token count (a bare program)")
        return range(T)

    def pruned_at(self, name: str) -> bool:
        """Whether op ``name``'s rows are fewer than every position because of ``prune=True``
        (its :meth:`positions` are :attr:`pruned`'s, which start past 0)."""
        p = self.pruned
        return p is not None and p.start > 0 and self.positions(name) == p.positions

    @property
    def logit_positions(self) -> range | tuple | None:
        """The token positions ``.logits`` has rows for (``trace(..., logits=)``): a ``range``
        (``range(T)`` for all) or a tuple; None where the trace does not know (a bare program)."""
        return None if self.logit_rows is None else self.logit_rows.positions

    @property
    def logits_note(self) -> str | None:
        """One line when the default computed fewer than every position (why), else None."""
        return None if self.logit_rows is None else self.logit_rows.note

    @property
    def logits(self) -> mx.array:
        """Logits [B, P, vocab], as ``value()`` gives every op's output: the batch axis is kept
        for one sequence too (B = 1: ``tr.logits[0, -1]`` is the next-token logits); P the
        positions :attr:`logit_positions` names (every one of the T tokens unless ``logits=``
        or the logits budget said otherwise)."""
        if not self.done:
            raise TraceError(f"the trace has not reached {self._last_name!r} yet (op {self.position} of "
                             f"{len(self._ops)}); call run()")
        return self.value(self._last_name)

    def per_token(self, name: str, axis: int | None = None) -> dict:
        """Per-position view of an op's output: ``{"absmax": [B, T], "nonfinite": [B, T]}``
        (numpy; absmax over finite elements), to see which token goes out of range.

        The token axis defaults to 2 for 4-D outputs under ``self_attn`` (heads-first
        ``[B, H, T, ...]``: q/k/v heads, scores, softmax) and to 1 otherwise (``[B, T, ...]``,
        MoE ``[B, T, k, D]``); pass ``axis`` to override.  Uses the captured value, else
        recomputes the op."""
        idx = self._check_name(name)
        if idx >= self.position:
            raise KeyError(f"op {name!r} has not run yet (it is op {idx}; the trace is at {self.position})")
        try:
            v = self.value(name)
        except KeyError:
            v = self.recompute(name, interventions=True)
        if v.ndim < 2:
            raise ValueError(f"op {name!r} has shape {tuple(v.shape)}: no token axis")
        if axis is None:
            axis = 2 if (v.ndim == 4 and ".self_attn." in name) else 1
        x = mx.moveaxis(v.astype(mx.float32), axis, 1)
        x = x.reshape(x.shape[0], x.shape[1], -1)
        fin = mx.isfinite(x)
        absmax = mx.where(fin, mx.abs(x), 0).max(axis=-1)
        bad = mx.logical_not(fin).sum(axis=-1)
        return {"absmax": np.array(absmax), "nonfinite": np.array(bad)}

    def records(self) -> list[dict]:
        """One JSON-able dict per executed step (for tables, plots and widgets)."""
        self._flush(wait=True)
        return [s.to_dict() for s in self._steps]

    def headroom(self, top: int | None = None) -> list[tuple[str, float]]:
        """(op, absmax / dtype max) of executed float ops, closest to overflow first."""
        self._flush(wait=True)
        return headroom_rows(self._steps, top)

    # ------------------------------------------------------------------ NaN hunt
    def first_nonfinite(self):
        """The first op whose output holds a NaN or an infinity, with its cause
        (a :class:`~workbench.trace.hunt.Finding`), or None when the forward is clean.

        Looks at the ops run so far; if none is non-finite and the trace is not done, runs
        on (statistics on) until the first non-finite op or the end.
        """
        from workbench.trace.hunt import diagnose

        self._flush(wait=True)
        for s in self._steps:
            if s.stats is None:
                s.stats = _stats.evaluate([self.value(s.name)])[0] if self._has_value(s.name) else None
            if s.stats is None:
                # ran without statistics and the value is gone: check again from the start
                self.reset()
                break
            if s.nonfinite:
                return diagnose(self, s)
        if self.done:
            return None
        saved_bps, saved_stats = list(self.breakpoints), self._stats_on
        self.breakpoints = [NONFINITE]
        self._stats_on = True
        try:
            s = self.run()
        finally:
            self.breakpoints = saved_bps
            self._stats_on = saved_stats
        if s is not None and s.nonfinite:
            return diagnose(self, s)
        return None

    def _has_value(self, name: str) -> bool:
        try:
            self.value(name)
            return True
        except KeyError:
            return False

    # ------------------------------------------------------------------ recomputation (hunt)
    def _input_values(self, i: int) -> tuple[list[mx.array], Any]:
        """Values of op ``i``'s inputs as the trace saw them, and a cache in its state just
        before op ``i`` (a clone; None without a cache).  Uses live / captured values when
        it can, else replays the program from the feeds in a scratch context."""
        op = self._ops[i]
        has_cache = getattr(self.ctx, "cache", None) is not None
        vals = []
        if not has_cache and i < self.position:
            for s in op.inputs:
                v = self._feeds.get(s)
                if v is None:
                    v = next((r[s] for r in self._undo.values() if s in r), None)
                if v is None:
                    try:
                        v = self.value(s)
                    except KeyError:
                        vals = None
                        break
                vals.append(v)
            if vals is not None:
                return vals, None
        return self._replay.inputs_before(i, self.dtype)

    def inputs(self, name: str) -> list[tuple[str, mx.array]]:
        """(label, value) of each input op ``name`` read, as the trace gave it: the label is
        the program input or op that produced it."""
        i = self._check_name(name)
        vals, _ = self._input_values(i)
        return list(zip(self._ops[i].inputs, vals))

    def recompute(self, name: str, dtype=None, interventions: bool = False) -> mx.array:
        """Run op ``name`` again on the inputs the trace gave it, optionally in another
        dtype (floating inputs are cast to it) and without its interventions."""
        i = self._check_name(name)
        op = self._ops[i]
        vals, cache = self._input_values(i)
        if dtype is None:
            dtype = self.dtype
        if self._context is not None:
            ctx = self._context(dtype, cache)
        elif dtype == self.dtype:
            ctx = self.ctx
        else:
            raise TraceError("cannot recompute in another dtype: the trace was made without a context factory")
        return recompute_op(op, vals, ctx, dtype, self._iv_by_op.get(op.name, ()) if interventions else ())

    def op_tensors(self, name: str) -> dict:
        """Checkpoint tensors op ``name`` reads (empty when the trace has no tensors source)."""
        if self._tensors is None:
            return {}
        return dict(self._tensors(name))

