"""The op program: the one representation every tool is a view over.

A model's forward pass is a flat, ordered list of named :class:`Op` records.  Each op
is a pure function of the values of earlier ops (or of the program's inputs) and of
checkpoint weights, so the program is data: it can be printed, stepped, captured,
hunted for NaN, laid out on a buffer plan, diffed against an engine, drawn in a widget.

Conventions (relied on by the CLI, the diff and external checks):

* an op that applies a checkpoint weight is named by that weight's module path with
  the model prefix stripped: ``embed_tokens``, ``layers.3.input_layernorm``,
  ``layers.3.self_attn.q_proj``, ``layers.3.mlp.down_proj``, ``norm``, ``lm_head``;
* ``layers.{i}`` is the residual stream after layer ``i``;
* ``logits`` is the last op;
* every other op sits under its module (``layers.3.self_attn.softmax``); the names
  are listed, per family, in docs/ops.md.

Invariants the executor relies on:

1. op names are unique within a program;
2. ``op.inputs`` only name program inputs or ops that come earlier in the list;
3. ``op.fn(ctx, *input_values)`` returns one ``mx.array`` and has no side effect other
   than reading/writing ``ctx.cache`` (KV-cache ops only);
4. ``op.params`` lists every checkpoint tensor/module the op reads, by canonical
   (prefix-stripped) module path, e.g. ``layers.3.self_attn.q_proj``.
"""
from __future__ import annotations

import fnmatch
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Container, Iterable, Mapping, Sequence

import mlx.core as mx


#: what follows a param's module path in the names of the tensors it stands for
TENSOR_SUFFIXES = ("weight", "scales", "biases", "bias", "global_scale")


@dataclass(frozen=True)
class Op:
    """One named step of a forward pass."""

    name: str
    kind: str  # "embedding", "rmsnorm", "linear", "rope", "scores", "softmax", "add", ...
    fn: Callable[..., mx.array] = field(repr=False, compare=False)
    inputs: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    layer: int | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def tensor_names(self, names: Container[str]) -> list[str]:
        """The checkpoint tensors of ``names`` this op reads: each param itself, or its
        weight, scales, biases ... (no tensor is opened)."""
        out = []
        for p in self.params:
            if p in names:
                out.append(p)
                continue
            out.extend(f"{p}.{s}" for s in TENSOR_SUFFIXES if f"{p}.{s}" in names)
        return out

    def describe(self) -> str:
        ins = ", ".join(self.inputs)
        ps = f" | {', '.join(self.params)}" if self.params else ""
        return f"{self.name} = {self.kind}({ins}{ps})"


@dataclass
class Program:
    """An ordered list of ops plus the names of the values fed in from outside."""

    ops: list[Op]
    inputs: tuple[str, ...] = ("input_ids",)

    def __post_init__(self):
        self._index = {}
        known = set(self.inputs)
        for i, op in enumerate(self.ops):
            if op.name in self._index or op.name in self.inputs:
                raise ValueError(f"duplicate op name {op.name!r} at position {i}")
            for src in op.inputs:
                if src not in known:
                    raise ValueError(f"op {op.name!r} reads {src!r}, which is neither a program input nor an earlier op")
            self._index[op.name] = i
            known.add(op.name)
        self._last_use = None
        self._frees = None
        self._layer_ends = None
        self._plan = None

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self):
        return iter(self.ops)

    def __contains__(self, name) -> bool:
        """``"layers.0.mlp" in program``: an op of that name."""
        return name in self._index

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.ops[self._index[key]]
        return self.ops[key]

    @property
    def names(self) -> list[str]:
        return [op.name for op in self.ops]

    def index(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(f"no op named {name!r} in this program") from None

    def last_use(self) -> dict[str, int]:
        """For every value, the index of the last op that reads it (for freeing)."""
        if self._last_use is None:
            lu: dict[str, int] = {}
            for i, op in enumerate(self.ops):
                for src in op.inputs:
                    lu[src] = i
            self._last_use = lu
        return self._last_use

    def frees(self) -> list[tuple[str, ...]]:
        """Per op, the op outputs it reads for the last time (free them once it ran;
        program inputs are never freed)."""
        if self._frees is None:
            lu = self.last_use()
            ins = set(self.inputs)
            self._frees = [tuple(s for s in dict.fromkeys(op.inputs) if lu.get(s) == i and s not in ins)
                           for i, op in enumerate(self.ops)]
        return self._frees

    def exec_plan(self) -> list[tuple]:
        """Per op, what running it needs: ``(name, fn, inputs, frees)`` (``frees``: :meth:`frees`),
        made once (a trace's hot loop reads a tuple per op instead of four attributes)."""
        if self._plan is None:
            self._plan = [(op.name, op.fn, op.inputs, f) for op, f in zip(self.ops, self.frees())]
        return self._plan

    def layer_ends(self) -> frozenset[int]:
        """Indices of the ops after which ``op.layer`` changes (the last op of each run of
        one layer's ops; the program's last op is not among them)."""
        if self._layer_ends is None:
            ops = self.ops
            self._layer_ends = frozenset(i for i in range(len(ops) - 1) if ops[i].layer != ops[i + 1].layer)
        return self._layer_ends

    def match(self, patterns: str | Iterable[str]) -> list[str]:
        """Op names matching glob patterns (``layers.*.self_attn.q_proj``) or ``re:`` regexes."""
        if isinstance(patterns, str):
            patterns = [patterns]
        out = []
        pats = list(patterns)
        for op in self.ops:
            if any(name_matches(op.name, p) for p in pats):
                out.append(op.name)
        return out

    def __str__(self) -> str:
        return "\n".join(op.describe() for op in self.ops)


def layer_of(name: str) -> int | None:
    """The layer an op name belongs to: ``layers.3.mlp`` -> 3 (``layers.3#2``, a module's
    second call, too); None for ops outside the layers (``embed_tokens``, ``logits``)."""
    if name.startswith("layers."):
        part = name.split(".")[1].split("#")[0]
        if part.isdigit():
            return int(part)
    return None


def name_matches(name: str, pattern: str) -> bool:
    """Glob match (``*`` does not stop at dots); ``re:...`` for a regular expression (run
    under a time limit: :mod:`workbench.patterns`)."""
    if pattern.startswith("re:"):
        from workbench.patterns import compiled

        return compiled(pattern[3:], f"pattern {pattern!r}").fullmatch(name) is not None
    return fnmatch.fnmatchcase(name, pattern)


def run_ops(program: Program, ctx: Any, env: dict, start: int = 0, stop: int | None = None, *,
            apply: Callable[[Op, mx.array], mx.array] | None = None, freed: dict | None = None,
            freed_from: int = 0, failed: Callable[[int, Exception], Exception] | None = None):
    """The one executor loop, as a generator: run ops ``start .. stop - 1`` (``stop`` None: to the
    end) lazily (no evaluation) on ``env``, the live values by name (the program's inputs and
    the outputs not yet read for the last time), updated in place; yield ``(i, out)`` once op
    ``i`` ran, its output is in ``env`` and the values it read for the last time are gone.

    :func:`execute` runs a whole program through it; the trace steps through it
    (:meth:`workbench.trace.tracer.Trace.run`, ``step``, going back), and so do the ranks of a
    distributed trace and the replay of :mod:`workbench.trace.replay`.  The caller stops where
    it likes by leaving the loop.

    ``apply``: ``f(op, out) -> out`` on every op's output (interventions).  ``freed``: a dict
    that takes, for each op ``i >= freed_from``, the values it freed (``{name: value}``: for
    going back without running again).  ``failed``: ``f(i, e) -> exception`` raised (from
    ``e``) in place of what op ``i``'s function raised (e.g. naming the op); None: as it is.
    """
    plan = program.exec_plan()
    ops = program.ops
    n = len(plan) if stop is None else stop
    for i in range(start, n):
        name, fn, inputs, frees = plan[i]
        try:
            out = fn(ctx, *[env[s] for s in inputs])
        except Exception as e:
            if failed is None:
                raise
            raise failed(i, e) from e
        if apply is not None:
            out = apply(ops[i], out)
        env[name] = out
        if freed is None or i < freed_from:
            for s in frees:
                env.pop(s, None)
        else:
            gone = {}
            for s in frees:
                v = env.pop(s, None)
                if v is not None:
                    gone[s] = v
            freed[i] = gone
        yield i, out


def execute(program: Program, ctx: Any, feeds: Mapping[str, mx.array],
            keep: Callable[[str], bool] | None = None, *, stop: int | None = None,
            apply: Callable[[Op, mx.array], mx.array] | None = None,
            after: Callable[[int, dict], None] | None = None) -> dict[str, mx.array]:
    """Run a program lazily (no evaluation), freeing values after their last use, through the
    one executor loop (:func:`run_ops`): the uncaptured fast path; replay and recomputation run
    through it too (:mod:`workbench.trace.replay`).

    Returns the values of ops for which ``keep(name)`` is true, plus the last op run's
    (``logits`` for a whole program).  ``stop``: run ops ``0 .. stop - 1`` only; ``apply``:
    ``f(op, out) -> out`` on every op's output (interventions); ``after``: ``f(i, env)``
    once op ``i`` ran and its inputs read for the last time were freed (``env``: the live
    values by name; a streamed model evaluates them at its segment ends).
    """
    env: dict[str, mx.array] = dict(feeds)
    kept: dict[str, mx.array] = {}
    steps = run_ops(program, ctx, env, 0, stop, apply=apply)
    if keep is None and after is None:
        deque(steps, maxlen=0)  # (run through at C speed: nothing to do between ops)
    else:
        ops = program.ops
        for i, out in steps:
            if keep is not None and keep(ops[i].name):
                kept[ops[i].name] = out
            if after is not None:
                after(i, env)
    n = len(program) if stop is None else stop
    if n:
        last = program.ops[n - 1].name
        kept[last] = env[last]
    return kept
