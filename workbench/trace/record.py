"""The Record: what every view reads, whichever way the steps were made.

A forward pass is recorded as an ordered list of named steps.  Two producers exist:

* an **op program** stepped by :class:`~workbench.trace.tracer.Trace` (our families:
  every matmul, norm, RoPE, score and softmax a step);
* a **reference model's module calls**, recorded by
  :class:`~workbench.trace.modules.ModuleTrace` (any architecture mlx-lm or mlx-vlm
  builds, towers included).

hunt, dump / diff, plots and the widgets use only the members below, so each works at
both granularities (tests/test_module_views.py, tests/test_reference_archs.py).
"""
from __future__ import annotations

import inspect
from typing import Any, Protocol

import mlx.core as mx


class Record(Protocol):
    """The members every view may use (see docs/trace.md)."""

    program: Any          # the steps as data: ``.ops`` (name, kind, layer, params, attrs), ``.index(name)``
    granularity: str      # "op" (an op program's steps) | "module" (a reference model's module calls)
    position: int         # steps run so far
    batched: bool

    # what ran
    @property
    def ops(self) -> list[str]: ...
    @property
    def steps(self) -> list: ...          # one Step per step run (name, kind, layer, index, shapes, dtype, stats)
    @property
    def done(self) -> bool: ...
    @property
    def dtype(self): ...
    @property
    def matmul_precision(self) -> str: ...   # "float32" | "tf32" | "n/a (cpu)" | "n/a (<dtype>)"
    @property
    def logits(self) -> mx.array: ...
    def value(self, name: str) -> mx.array: ...
    def stats(self, name: str) -> dict: ...
    def step_info(self, name: str): ...
    def inputs(self, name: str) -> list[tuple[str, mx.array]]: ...
    def recompute(self, name: str, dtype=None, interventions: bool = False) -> mx.array: ...
    def op_tensors(self, name: str) -> dict: ...
    def records(self) -> list[dict]: ...
    def headroom(self, top: int | None = None) -> list[tuple[str, float]]: ...
    def per_token(self, name: str, axis: int | None = None) -> dict: ...
    def first_nonfinite(self): ...

    # how it runs
    def step(self): ...
    def run(self, until: str | None = None): ...
    def back(self): ...
    def reset(self) -> None: ...
    def add_breakpoint(self, bp) -> None: ...
    def add_intervention(self, intervention) -> None: ...


#: the members of :class:`Record`
MEMBERS = tuple(sorted({n for n in vars(Record) if not n.startswith("_")} | set(Record.__annotations__)))


def is_record(obj) -> bool:
    """True when ``obj`` has every member of :class:`Record` (looked up without running
    properties such as ``logits``, which refuse before the last step has run)."""
    for name in MEMBERS:
        try:
            inspect.getattr_static(obj, name)
        except AttributeError:
            return False
    return True
