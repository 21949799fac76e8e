"""Module-level tracing: a :class:`~workbench.trace.tracer.Trace` over recorded module calls.

A reference model (mlx-lm / mlx-vlm, see :mod:`workbench.reference`) is run once with
every module call recorded on a :class:`~workbench.reference.recorder.Tape`.  The tape
becomes an op program whose op ``i`` returns the recorded (lazy) output of call ``i``,
so everything the Trace does — stepping, ``run(until=)``, ``back``, breakpoints,
statistics, capture, the NaN hunt — works unchanged at this granularity.  What differs:

* interventions are applied inside the reference forward (so the caller of the module
  sees the changed value); adding one mid-trace records the forward again and re-runs
  the steps already taken with it;
* ``recompute(name, dtype)`` calls the module again on copies of its recorded inputs
  (cast to ``dtype``) with its parameters in ``dtype``; a module that updates a KV cache
  is not recomputed (it would update the cache twice);
* ``inputs(name)`` are the module's array arguments, labelled by the step that produced
  them, or ``arg{k} (computed between steps)`` when code outside any module did: a
  fused kernel (``mx.fast.scaled_dot_product_attention``, ``mx.fast.rope`` called as a
  function), a residual add, a reshape.  That code is not opened at this granularity:
  its result is seen only as the next module's input or the enclosing module's output.
"""
from __future__ import annotations

import mlx.core as mx

from workbench.program import Op, Program, layer_of
from workbench.trace.interventions import Intervention, normalize as _norm_iv
from workbench.trace.step import TraceError
from workbench.trace.tracer import Trace

#: the note every module-level trace carries (docs/trace.md repeats it)
UNOPENED = ("module granularity: each step is one module call (children before their parent); code "
            "between module calls — fused attention (mx.fast.scaled_dot_product_attention), residual "
            "adds, reshapes — is not a step: its result shows as the next module's input")


def _out(i: int):
    def fn(tape):
        return tape.outputs[i]
    fn.__name__ = f"recorded_{i}"
    return fn


def tape_program(tape, describe) -> Program:
    """The op program of a recorded forward: op ``i`` returns call ``i``'s output.
    ``describe(i) -> (kind, params, attrs)`` names what the module is and reads."""
    ops = []
    for i, name in enumerate(tape.names):
        kind, params, attrs = describe(i)
        ops.append(Op(name, kind, _out(i), (), tuple(params), layer_of(name), attrs))
    return Program(ops, ("input_ids",))


class ModuleTrace(Trace):
    """A Trace whose steps are a reference model's recorded module calls.

    ``session`` records and recomputes (see :class:`workbench.reference.model.Session`):
    ``record(interventions) -> Tape``, ``program(tape) -> Program`` (:func:`tape_program`),
    ``describe(tape, i)``, ``recompute(tape, i, dtype)``, ``op_tensors(tape, name)``, ``feeds``."""

    applies_interventions = False
    granularity = "module"
    note = UNOPENED

    def __init__(self, session, *, interventions=None, **kw):
        self._session = session
        ivs = _norm_iv(interventions)
        tape = session.record(ivs)
        program = session.program(tape)
        self._ready = False
        super().__init__(program, tape, session.feeds, interventions=ivs,
                         tensors=lambda name: session.op_tensors(self.ctx, name), **kw)
        self._ready = True

    # -- interventions live in the recording
    def add_intervention(self, intervention: Intervention) -> None:
        super().add_intervention(intervention)
        if self._ready:
            self._rerecord()

    def _rerecord(self) -> None:
        pos = self.position
        tape = self._session.record(self._interventions)
        if tape.names != self.program.names:
            raise TraceError("the model called different modules when recorded again "
                             "(data-dependent control flow): make a new trace")
        self.reset()
        self.ctx = tape
        if pos:
            self.run(until=self.program.ops[pos - 1].name)

    # -- what a step read
    def _input_shapes(self, i: int) -> tuple:
        return tuple(a.shape for a in self.ctx.args[i] if isinstance(a, mx.array))

    def inputs(self, name: str) -> list[tuple[str, mx.array]]:
        i = self._check_name(name)
        tape = self.ctx
        out = []
        for k, (a, src) in enumerate(zip(tape.args[i], tape.sources[i])):
            if isinstance(a, mx.array):
                out.append((tape.names[src] if src is not None else f"arg{k} (computed between steps)", a))
        for key, a in tape.kwargs[i].items():
            if isinstance(a, mx.array):
                out.append((key, a))
        return out

    def recompute(self, name: str, dtype=None, interventions: bool = False) -> mx.array:
        i = self._check_name(name)
        out = self._session.recompute(self.ctx, i, dtype if dtype is not None else self.dtype)
        if interventions:
            op = self._ops[i]
            for iv in self._iv_by_op.get(name, ()):
                out = iv.apply(out, op)
        return out

    def _input_values(self, i: int):  # the op program's form, for code that asks for it
        return [v for _, v in self.inputs(self._ops[i].name)], None

    def __repr__(self) -> str:
        return super().__repr__().replace("<Trace", "<ModuleTrace", 1)

