"""Where the two granularities meet, declared once: what a trace needs of a model.

:class:`Traceable` is what every model ``workbench.load`` returns offers, whichever way its
steps are made; :class:`OpTraceable` adds what the tracer (workbench/trace/tracer.py)
steps an op program with (workbench.models: ``Model``, ``StreamedModel``), and
:class:`ModuleTraceable` what a module-level trace records a reference's module calls
with (workbench.reference: ``ReferenceModel``).  tests/test_traceable.py checks that each
of the three satisfies its protocol, members and call shapes.

A model sits a floor below the tracer and the reference, and never imports them: what it
reaches of them -- ``model.trace(...)`` and ``load(granularity="module")`` -- it reaches
through :func:`provide` / :func:`provided`, which the top package (workbench/__init__.py,
the one module that may import every floor) fills when it is imported, i.e. before any
module of the package runs.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, runtime_checkable


@runtime_checkable
class Traceable(Protocol):
    """What every traced model offers (op or module granularity)."""

    granularity: str      # "op": every op of our program is a step; "module": every module call
    family: str           # our family, or the reference's module name
    num_layers: int
    vocab_size: int
    config: Mapping       # config.json's (text) dict, as written
    default_dtype: Any    # the compute dtype a trace uses when given none
    tokenizer: Any        # None when the checkpoint has none (``checkpoint.tokenizer_error`` says why)

    @property
    def step_names(self) -> list[str]: ...            # the names a trace's steps carry

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids) -> str: ...
    def make_cache(self): ...                         # an empty KV cache for generation
    def op_tensors(self, name: str) -> dict: ...      # the checkpoint tensors step ``name`` reads
    def trace(self, ids_or_text, capture="stats", dtype=None, **kw): ...


@runtime_checkable
class OpTraceable(Traceable, Protocol):
    """An op program the tracer steps: ``execute(program, context(dtype), feeds(ids))``."""

    program: Any          # workbench.program.Program (load's attention choice)

    def program_for(self, attention=None, prune: bool = False): ...
    def context(self, dtype=None, cache=None): ...
    def feeds(self, ids, attention_mask=None, cache=None, check_ids: bool = True) -> dict: ...


@runtime_checkable
class ModuleTraceable(Traceable, Protocol):
    """A reference model whose module calls a trace records."""

    def module_trace(self, ids_or_text, capture="stats", dtype=None, breakpoints=None, interventions=None,
                     **kw): ...


# ------------------------------------------------------------------ the floors above, provided

#: what a lower floor reaches of a higher one, by name: "trace" (workbench.trace.entry.trace:
#: what ``model.trace(...)`` calls), "module_level" (workbench.reference.open_reference: what
#: ``load`` opens a module-level model with)
PROVIDED: dict[str, Callable] = {}


def provide(**functions: Callable) -> None:
    """Register what the floors above offer (called by the top package)."""
    PROVIDED.update(functions)


def provided(name: str) -> Callable:
    """The function registered as ``name`` (a RuntimeError naming it when none is)."""
    try:
        return PROVIDED[name]
    except KeyError:
        raise RuntimeError(f"nothing provides {name!r}: the top package (workbench/__init__.py) registers it "
                           "when imported") from None
