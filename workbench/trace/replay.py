"""Replay and recomputation: a trace's program run again from its feeds, in a scratch
context, through the one executor (:func:`workbench.program.execute`).

The NaN hunt recomputes an op in float32 on the inputs the trace gave it; when those inputs
are gone (not captured, freed) they are rebuilt by running the ops before it again, with the
trace's interventions, and -- for a streamed model -- evaluated and released segment by
segment as the trace ran.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import mlx.core as mx

from workbench.program import Op, Program, execute
from workbench.trace.snapshots import clone
from workbench.trace.step import TraceError


class Replay:
    """What replaying a trace's program needs: the ``program`` and its ``feeds``, the KV cache
    as it was at the start (``cache0``, a snapshot; cloned per replay), ``context``
    (``f(dtype, cache) -> ctx``; None: no replay), the interventions by op name, and for a
    streamed model ``ends`` (the op indices that end a segment) and ``release`` (drop the
    weights read so far)."""

    def __init__(self, program: Program, feeds: Mapping[str, mx.array], cache0: Any, context: Callable | None,
                 interventions: Mapping[str, list], ends=(), release: Callable | None = None):
        self.program = program
        self.feeds = feeds
        self.cache0 = cache0
        self.context = context
        self.interventions = interventions
        self.ends = ends
        self.release = release

    def inputs_before(self, i: int, dtype) -> tuple[list[mx.array], Any]:
        """The values of op ``i``'s inputs, rebuilt lazily from the feeds in a fresh context of
        ``dtype``, and the cache in its state just before op ``i`` (None without one)."""
        if self.context is None:
            raise TraceError("cannot recompute this op: the trace was made without a context factory")
        cache = clone(self.cache0)
        ctx = self.context(dtype, cache)
        op = self.program.ops[i]
        ivs = self.interventions

        def apply(o: Op, out: mx.array) -> mx.array:
            for iv in ivs.get(o.name, ()):
                out = iv.apply(out, o)
            return out

        after = None
        if self.ends:
            ends, feeds, release = self.ends, self.feeds, self.release

            def after(j: int, env: dict) -> None:  # streaming: evaluated segment by segment, as the trace ran
                if j in ends:
                    mx.eval([v for k, v in env.items() if k not in feeds] + list(getattr(cache, "state", ())))
                    release()

        kept = execute(self.program, ctx, self.feeds, keep=frozenset(op.inputs).__contains__, stop=i,
                       apply=apply if ivs else None, after=after)
        return [self.feeds[s] if s in self.feeds else kept[s] for s in op.inputs], cache


def recompute_op(op: Op, vals: list, ctx: Any, dtype, interventions=()) -> mx.array:
    """Op ``op`` run again on ``vals`` in ``ctx``: floating inputs cast to ``dtype`` (None: as
    they are), then ``interventions`` applied to its output."""
    vals = [v.astype(dtype) if (dtype is not None and mx.issubdtype(v.dtype, mx.floating)) else v for v in vals]
    out = op.fn(ctx, *vals)
    for iv in interventions:
        out = iv.apply(out, op)
    return out
