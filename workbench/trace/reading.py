"""What a trace gives back once ops ran: values (:meth:`~Reading.value`), statistics,
step records, the token positions of each op's rows and of the logits, per-token views,
headroom, the first non-finite op (the NaN hunt's start) and the recomputation it needs.

A mixin of :class:`workbench.trace.tracer.Trace`, which holds the state read here (the
captured values' store, the live values, the step records, the replay).
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from workbench.trace import stats as _stats
from workbench.trace.replay import recompute_op
from workbench.trace.step import NONFINITE, Step, TraceError, headroom_rows


class Reading:
    """Values, statistics, positions and recomputation of a trace's executed ops (a
    :class:`~workbench.trace.tracer.Trace` is one)."""

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
        """The token positions ``.logits`` has rows for (``Positions(logits=)``): a ``range``
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
