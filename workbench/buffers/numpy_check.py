"""Aliasing checks for Python kernels written with numpy ``out=``.

numpy itself is safe when an output overlaps an input (it copies first), so a prototype
kernel that writes ``np.matmul(x, w, out=x)`` gives the right numbers in Python and
garbage once ported to a Metal/CUDA kernel that works tile by tile.  These checks flag
such calls the way the schedule analyzer flags dispatches:

``alias-in-dispatch``
    the output is exactly an input (same memory, shape and strides) and the function is
    not element-wise (``matmul``, ``dot``, ``einsum``, reductions, scans ...);
``partial-overlap``
    the output shares memory with an input without being exactly it (a shifted view, a
    broadcast, a transposed view), whatever the function.

Exactly aliasing an element-wise ufunc (``np.add(a, b, out=a)``) is in-place and safe,
on a GPU too, and is not flagged.  Memory sharing is decided with ``np.shares_memory``
(bounded work; an undecidable case counts as sharing).

Use :func:`check_out` directly, the :func:`no_alias` decorator on your own kernels, or
:class:`watch_numpy` around code that calls numpy functions with ``out=``::

    with watch_numpy() as found:
        my_attention(q, k, v, out=q)
    for f in found: print(f.message)

:class:`watch_numpy` replaces the module-level numpy functions while it is active
(``np.matmul``, every ufunc, ``np.dot``, ``np.einsum`` ...); calls made through names
bound before it started (``from numpy import matmul``) and in-place operators
(``a += b``) are not seen.  It is not thread-safe.
"""
from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

#: non-ufunc numpy functions taking ``out=`` that watch_numpy checks; True = element-wise
_FUNCS = {"dot": False, "einsum": False, "take": False, "cumsum": False, "cumprod": False,
          "sum": False, "prod": False, "mean": False, "std": False, "var": False, "max": False,
          "min": False, "amax": False, "amin": False, "argmax": False, "argmin": False,
          "concatenate": False, "outer": False, "cross": False, "clip": True, "around": True,
          "round": True}


_TooHard = getattr(getattr(np, "exceptions", np), "TooHardError", RuntimeError)


@dataclass(frozen=True)
class OutAlias:
    kind: str           # "alias-in-dispatch" | "partial-overlap"
    function: str
    input: str          # which input: "x0", "x1" ... or the parameter name
    where: str          # "file.py:42" of the call, when known
    message: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.message}"


class AliasError(ValueError):
    """Raised by :func:`no_alias` (and strict :class:`watch_numpy`) on an aliasing call."""

    def __init__(self, finding: OutAlias):
        self.finding = finding
        super().__init__(finding.message)


def _share(a: np.ndarray, b: np.ndarray) -> bool:
    if not np.may_share_memory(a, b):
        return False
    try:
        return bool(np.shares_memory(a, b, max_work=100_000))
    except _TooHard:  # undecidable within the work bound: count it as sharing
        return True


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and a.shape == b.shape
            and a.strides == b.strides and a.dtype.itemsize == b.dtype.itemsize)


def _arrays(x: Any) -> list[np.ndarray]:
    if isinstance(x, np.ndarray):
        return [x]
    if isinstance(x, (tuple, list)):
        return [a for a in x if isinstance(a, np.ndarray)]
    return []


def check_out(function: str, inputs: Sequence[Any] | dict, out: Any, *, elementwise: bool = False,
              where: str = "") -> list[OutAlias]:
    """Findings for one call: ``inputs`` (a sequence, or a dict name -> value) against ``out``
    (an array or a tuple of arrays)."""
    named = inputs.items() if isinstance(inputs, dict) else ((f"x{i}", v) for i, v in enumerate(inputs))
    outs = _arrays(out)
    found: list[OutAlias] = []
    at = f" at {where}" if where else ""
    for iname, val in named:
        for a in _arrays(val):
            for o in outs:
                if a is o and elementwise:
                    continue
                if not _share(a, o):
                    continue
                if _same(a, o):
                    if elementwise:
                        continue
                    found.append(OutAlias(
                        "alias-in-dispatch", function, iname, where,
                        f"{function}(){at} writes out= over its input {iname} (the same {o.nbytes} bytes): numpy "
                        f"copies first so this works here, but a GPU kernel computing tile by tile would read "
                        f"input its own output already overwrote. Give the output its own buffer."))
                else:
                    found.append(OutAlias(
                        "partial-overlap", function, iname, where,
                        f"{function}(){at} writes out= (shape {o.shape}, strides {o.strides}) over memory it also "
                        f"reads as {iname} (shape {a.shape}, strides {a.strides}, starting "
                        f"{a.__array_interface__['data'][0] - o.__array_interface__['data'][0]:+d} bytes from "
                        f"out) without being the same view: "
                        f"some threads would read bytes others already wrote. Give the output its own buffer."))
    return found


def _caller(depth: int = 2) -> str:
    try:
        f = sys._getframe(depth)
        return f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno}"
    except ValueError:  # pragma: no cover
        return ""


def no_alias(fn: Callable | None = None, *, out: str = "out") -> Callable:
    """Decorator for a Python kernel with an output parameter (``out`` by default): raise
    :class:`AliasError` when a call passes an output that shares memory with any input."""
    def deco(f: Callable) -> Callable:
        sig = inspect.signature(f)

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            bound = sig.bind_partial(*args, **kwargs)
            o = bound.arguments.get(out)
            if o is not None:
                ins = {k: v for k, v in bound.arguments.items() if k != out}
                found = check_out(f.__name__, ins, o, where=_caller())
                if found:
                    raise AliasError(found[0])
            return f(*args, **kwargs)
        return wrapper
    return deco(fn) if fn is not None else deco


class _UfuncProxy:
    """Stands in for a numpy ufunc while watch_numpy is active; forwards everything else."""

    def __init__(self, uf: np.ufunc, watcher: "watch_numpy"):
        self._uf, self._w = uf, watcher
        self.__name__ = uf.__name__
        self.__doc__ = uf.__doc__

    def __call__(self, *args, **kwargs):
        uf = self._uf
        ins = args[: uf.nin]
        out = kwargs.get("out")
        if out is None and len(args) > uf.nin:
            out = tuple(args[uf.nin:])
        if out is not None:
            self._w._report(check_out(uf.__name__, ins, out, elementwise=uf.signature is None, where=_caller()))
        return uf(*args, **kwargs)

    def __getattr__(self, k):
        return getattr(self._uf, k)


class watch_numpy:
    """Context manager recording (or, with ``strict=True``, raising on) numpy calls whose
    ``out=`` shares memory with an input.  ``as found`` gives the list of findings."""

    def __init__(self, strict: bool = False, functions: Iterable[str] | None = None):
        self.strict = strict
        self.found: list[OutAlias] = []
        self._names = functions
        self._saved: dict[str, Any] = {}

    def _report(self, found: list[OutAlias]) -> None:
        if found:
            self.found.extend(found)
            if self.strict:
                raise AliasError(found[0])

    def _wrap_func(self, name: str, f: Callable, elementwise: bool) -> Callable:
        sig_pos = None
        try:
            params = list(inspect.signature(f).parameters)
            sig_pos = params.index("out") if "out" in params else None
        except (TypeError, ValueError):
            pass

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            out = kwargs.get("out")
            ins = list(args)
            if out is None and sig_pos is not None and len(args) > sig_pos:
                out = args[sig_pos]
                ins = list(args[:sig_pos]) + list(args[sig_pos + 1:])
            if out is not None:
                if name == "einsum" and ins and isinstance(ins[0], str):
                    ins = ins[1:]
                self._report(check_out(name, ins, out, elementwise=elementwise, where=_caller()))
            return f(*args, **kwargs)
        return wrapper

    def __enter__(self) -> list[OutAlias]:
        names = list(self._names) if self._names is not None else None
        for name in dir(np):
            if names is not None and name not in names:
                continue
            obj = getattr(np, name, None)
            if isinstance(obj, np.ufunc):
                self._saved[name] = obj
                setattr(np, name, _UfuncProxy(obj, self))
            elif name in _FUNCS and callable(obj):
                self._saved[name] = obj
                setattr(np, name, self._wrap_func(name, obj, _FUNCS[name]))
        return self.found

    def __exit__(self, *exc) -> None:
        for name, obj in self._saved.items():
            setattr(np, name, obj)
        self._saved.clear()
