"""Where a step-by-step walk through a trace goes: op names and layer boundaries.

The StepDebugger's buttons (:mod:`workbench.widgets.debugger`) call these; so can a script.

* :func:`find_op` -- the index of an op named exactly; a name that is not one raises
  :class:`NoSuchOp` carrying the closest names (``layers.2.self_atn.softmax`` ->
  ``layers.2.self_attn.softmax``), never a prefix or a guess that runs somewhere;
* :func:`closest_ops` -- those suggestions alone;
* :func:`next_boundary` -- the next layer boundary from any position: the last op of the
  current run of ops of one ``op.layer`` (the embedding ops count as one run, each layer
  ends with its residual stream ``layers.{i}``), else the program's last op.
"""
from __future__ import annotations

import difflib
from typing import Sequence


class NoSuchOp(LookupError):
    """A name that is no op of the program; ``suggestions`` holds the closest op names."""

    def __init__(self, name: str, suggestions: Sequence[str]):
        self.name, self.suggestions = name, list(suggestions)
        hint = f"; did you mean {', '.join(self.suggestions)}?" if self.suggestions else " (see trace.ops)"
        super().__init__(f"no op named {name!r}{hint}")


def closest_ops(ops: Sequence[str], name: str, n: int = 3) -> list[str]:
    """Up to ``n`` op names close to ``name``: by similarity of the whole name (difflib),
    else those containing it."""
    near = difflib.get_close_matches(name, list(ops), n=n, cutoff=0.6)
    if not near and name:
        near = [o for o in ops if name in o][:n]
    return near


def find_op(ops: Sequence[str], name) -> int:
    """The index of the op named ``name`` (surrounding spaces ignored), exactly; else
    :class:`NoSuchOp` with the closest names; a non-string a TypeError."""
    if not isinstance(name, str):
        raise TypeError(f"an op name is a string, not {type(name).__name__}")
    key = name.strip()
    if not key:
        raise NoSuchOp(name, [])
    for i, o in enumerate(ops):
        if o == key:
            return i
    raise NoSuchOp(key, closest_ops(ops, key))


def next_boundary(program, position: int) -> int | None:
    """The index of the op closing the run of one layer's ops that op ``position`` is in
    (from the start: the last embedding op; inside layer ``i``: ``layers.{i}``); the
    program's last op when no boundary is left; None when ``position`` is past the end."""
    n = len(program.ops)
    if position >= n:
        return None
    ends = program.layer_ends()
    return next((j for j in range(position, n - 1) if j in ends), n - 1)
