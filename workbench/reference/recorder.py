"""Recording a reference model's module calls: every module call becomes a named step.

mlx-lm and mlx-vlm models are trees of ``mlx.nn.Module``\\ s with no hook API.  We add
one without touching their code: :func:`instrument` gives every module of a model a
subclass of its own class whose ``__call__`` reports to the active :class:`Tape` (and
behaves exactly as before when no tape is recording).

A :class:`Tape` is what one forward did, in the order calls *finished* (children before
their parent):

* ``names[i]``: the module's path with the language-model prefix stripped
  (``layers.3.self_attn.q_proj``; towers keep theirs: ``vision_tower.encoder.layers.0``),
  the root model call is ``logits``, and a module called again in the same forward gets
  ``#2``, ``#3`` ... (``layers.0.altup#2``);
* ``outputs[i]``: the output array (a new handle on the same data, so a
  reference that updates an array in place, as ``h *= scale`` does, cannot rewrite it);
* ``args[i]``, ``kwargs[i]``: the array arguments, new handles too (for recomputation), and
  ``sources[i]``: for each positional argument, the step that produced it, or None when
  code between module calls did (a fused kernel such as
  ``mx.fast.scaled_dot_product_attention``, a residual add, a reshape).

Interventions (:mod:`workbench.trace.interventions`) are applied inside the forward, on
the module's output before the caller sees it, so everything downstream is changed.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Sequence

import mlx.core as mx
import mlx.nn as nn

#: language-model prefixes stripped from module paths (longest first), as the reader does
LM_PREFIXES = ("language_model.model.", "language_model.", "model.language_model.", "model.")

_ACTIVE = threading.local()
_WRAPPED: dict[type, type] = {}


def active_tape() -> "Tape | None":
    return getattr(_ACTIVE, "tape", None)


def _wrapped_class(cls: type) -> type:
    w = _WRAPPED.get(cls)
    if w is None:
        call = cls.__call__

        def __call__(self, *args, **kwargs):
            tape = getattr(_ACTIVE, "tape", None)
            if tape is None:
                return call(self, *args, **kwargs)
            return tape.call(self, call, args, kwargs)

        w = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__,
                                         "__qualname__": cls.__qualname__, "_workbench_original": cls})
        _WRAPPED[cls] = w
    return w


def original_class(module: nn.Module) -> type:
    return getattr(type(module), "_workbench_original", type(module))


class StepNames(dict):
    """``{id(module): step name}``; ``shared[id]``: every name of a module that sits in
    several places (mlx-lm's ``SwitchGLU(activation=SwiGLU())`` default is one module in
    every MoE layer): a call is named after the place its caller is in."""

    def __init__(self):
        super().__init__()
        self.shared: dict[int, list[str]] = {}


def instrument(model: nn.Module) -> StepNames:
    """Make every module of ``model`` report its calls; returns ``{id(module): step name}``."""
    paths = StepNames()
    for path, m in sorted(model.named_modules(), key=lambda pm: _path_key(pm[0])):
        if id(m) in paths:  # a module shared between places: its first name, and all of them
            paths.shared.setdefault(id(m), [paths[id(m)]]).append(step_name(path))
            continue
        if "_workbench_original" not in type(m).__dict__:
            m.__class__ = _wrapped_class(type(m))
        paths[id(m)] = step_name(path)
    return paths


def _path_key(path: str) -> tuple:
    """Sort key of a module path: numeric parts in numeric order (layers.2 before layers.10)."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.split(".")) if path else ()


def step_name(path: str) -> str:
    """Module path -> step name: the root is ``logits``, language-model prefixes go."""
    if path == "":
        return "logits"
    for pre in LM_PREFIXES:
        if path.startswith(pre):
            return path[len(pre):]
    return path


def primary_array(out) -> tuple[mx.array | None, Callable[[mx.array], Any]]:
    """The array a module call produced (the first one of a tuple or list, or an output
    object's ``logits`` / ``last_hidden_state``), and how to put a changed one back."""
    if isinstance(out, mx.array):
        return out, lambda v: v
    if isinstance(out, (tuple, list)):
        for k, e in enumerate(out):
            if isinstance(e, mx.array):
                def put(v, k=k, out=out):
                    items = list(out)
                    items[k] = v
                    return type(out)(items) if isinstance(out, tuple) and not hasattr(out, "_fields") else (
                        type(out)(*items) if hasattr(out, "_fields") else items)
                return e, put
        return None, lambda v: out
    for attr in ("logits", "last_hidden_state"):
        e = getattr(out, attr, None)
        if isinstance(e, mx.array):
            def put(v, attr=attr, out=out):
                setattr(out, attr, v)
                return out
            return e, put
    return None, lambda v: out


def copy_array(x):
    """A new handle on the same data (an in-place update of the original leaves it alone):
    ``copy.copy(x)``, not ``mx.array(x)``, which adds a copy op to the graph, run wherever the
    recorded value is read (a decoding step's statistics paid 93 extra ops a token, phi3 on
    the CPU, and a long prompt's capture held every output twice)."""
    return _handle(x) if isinstance(x, mx.array) else x


#: ``copy.copy`` of an array without the copy module's dispatch (every recorded call makes
#: two or three: a decoding step's trace of phi3 is built in ~1.9-2.5 ms against ~2.5-2.7)
_handle = mx.array.__copy__


class Tape:
    """What one forward did: see the module docstring.

    ``interventions``: ``[(Intervention, op-like)]`` applied by name; ``kv_cache``: the
    reference's cache object(s) this forward updated (kept for generation; a tape never
    replays a cache)."""

    def __init__(self, paths: dict[int, str], interventions: Sequence = (), dtype=None, kv_cache=None):
        self.paths = paths
        self.interventions = list(interventions)
        self.dtype = dtype
        self.kv_cache = kv_cache
        self.names: list[str] = []
        self.modules: list[nn.Module] = []
        self.outputs: list[mx.array] = []
        self.args: list[tuple] = []
        self.kwargs: list[dict] = []
        self.sources: list[tuple] = []
        self.applied: list[tuple] = []
        self._count: dict[str, int] = {}
        self._producer: dict[int, int] = {}
        self._returned: list = []  # keeps returned handles alive so their ids stay unique
        self._stack: list[str] = []  # names of the module calls in progress (innermost last)
        self._shared = getattr(paths, "shared", None) or {}
        self._rows = None  # logits for some positions only (:meth:`cut`)
        self._cut_at = None
        self._cut_done = False

    def cut(self, rows, body: nn.Module | None, exact: bool = False) -> None:
        """Logits for ``rows`` only (a :class:`workbench.trace.logits.LogitRows`): ``body``'s
        output (the hidden state the head reads) is recorded whole and handed on cut to those
        positions, so the head computes only them; ``exact`` (or no body): the root's output
        is cut instead, the head computing every position (bit-identical rows)."""
        self._rows = rows
        self._cut_at = None if exact else body

    def __len__(self) -> int:
        return len(self.names)

    def _name_of(self, module: nn.Module) -> str | None:
        names = self._shared.get(id(module)) if self._shared else None
        if names and self._stack:  # a shared module: its name under the innermost caller
            caller = self._stack[-1] + "."
            parents = {n: n.rsplit(".", 1)[0] + "." if "." in n else "" for n in names}
            under = [n for n in names if caller.startswith(parents[n])]
            if under:
                return max(under, key=lambda n: len(parents[n]))
        return self.paths.get(id(module))

    def call(self, module: nn.Module, call: Callable, args: tuple, kwargs: dict):
        base = self._name_of(module)
        if base is None:  # a module created during the forward: not part of the model
            return call(module, *args, **kwargs)
        self._stack.append(base)
        try:
            out = call(module, *args, **kwargs)
        finally:
            self._stack.pop()
        primary, put = primary_array(out)
        if primary is None:
            return out
        n = self._count.get(base, 0) + 1
        self._count[base] = n
        name = base if n == 1 else f"{base}#{n}"
        if self._rows is not None and self._cut_at is None and name == "logits":
            primary = self._rows.select(primary)  # the head ran on every position: its rows
            out = put(primary)
        labels = ()
        if self.interventions:
            for iv, op in self.interventions:
                if iv.matches(name):
                    primary = iv.apply(primary, op(name, module))
                    labels += (iv.label,)
            if labels:
                out = put(primary)
        i = len(self.names)
        self.names.append(name)
        self.modules.append(module)
        self.outputs.append(_handle(primary))
        self.args.append(tuple([copy_array(a) for a in args]))
        self.kwargs.append({k: copy_array(v) for k, v in kwargs.items()})
        producer = self._producer
        self.sources.append(tuple([producer.get(id(a)) if isinstance(a, mx.array) else None for a in args]))
        self.applied.append(labels)
        producer[id(primary)] = i
        self._returned.append(primary)
        if self._cut_at is not None and module is self._cut_at and not self._cut_done:
            self._cut_done = True
            T = self._rows.T
            if primary.ndim < 2 or primary.shape[-2] != T:
                raise ValueError(f"logits for some positions: {name}'s output {list(primary.shape)} is not "
                                 f"[B, {T}, hidden]; use logits='all' with this model")
            return put(self._rows.select(primary))
        return out

    def __enter__(self):
        if active_tape() is not None:
            raise RuntimeError("a recording is already running in this thread")
        _ACTIVE.tape = self
        return self

    def __exit__(self, *exc):
        _ACTIVE.tape = None
        self._returned.clear()
        return False


def module_at(model: nn.Module, path: str) -> nn.Module:
    """The submodule at a dotted path (list indices included)."""
    m: Any = model
    for part in path.split(".") if path else []:
        m = m[int(part)] if isinstance(m, (list, tuple)) else m[part] if isinstance(m, dict) else getattr(m, part)
    return m


def module_paths(model: nn.Module) -> dict[int, str]:
    """``{id(module): raw dotted path}`` (first path of a shared module)."""
    out: dict[int, str] = {}
    for path, m in model.named_modules():
        out.setdefault(id(m), path)
    return out


def flat_parameters(module: nn.Module, prefix: str) -> dict[str, mx.array]:
    """The module's parameters as ``{prefix.name: array}``."""
    from mlx.utils import tree_flatten

    return {f"{prefix}.{k}" if prefix else k: v for k, v in tree_flatten(module.parameters())
            if isinstance(v, mx.array)}


def is_leaf(module: nn.Module) -> bool:
    return not any(True for _ in _children(module))


def _children(module: nn.Module) -> Iterable:
    for v in module.values():
        if isinstance(v, nn.Module):
            yield v
        elif isinstance(v, (list, tuple)) and any(isinstance(e, nn.Module) for e in v):
            yield v
        elif isinstance(v, dict) and any(isinstance(e, nn.Module) for e in v.values()):
            yield v
