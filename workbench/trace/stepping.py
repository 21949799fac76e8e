"""The trace's navigation: :meth:`~Stepping.step`, :meth:`~Stepping.run` (to the end, through
an op, or to a breakpoint), :meth:`~Stepping.back` and :meth:`~Stepping.reset`, and what a
breakpoint hits.

A mixin of :class:`workbench.trace.tracer.Trace`, which holds the state it moves (the position,
the live values, the step records, the statistics batches) and runs the ops
(``_exec_span``: the one executor loop, :func:`workbench.program.run_ops`); here is only where
to run to and how to come back.
"""
from __future__ import annotations

import mlx.core as mx

from workbench.nogc import no_gc
from workbench.program import name_matches
from workbench.progress import start as start_progress
from workbench.trace.snapshots import restore, snapshot
from workbench.trace.step import NONFINITE, Step, TraceError


class Stepping:
    """Step, run, go back (a :class:`~workbench.trace.tracer.Trace` is one)."""

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
        :data:`~workbench.trace.tracer.QUEUE_BYTES` of outputs): on a GPU, without statistics,
        for a forward over more than one position.  Never on the CPU (MLX's CPU stream and the host statistics share
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
