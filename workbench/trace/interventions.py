"""Interventions: change an op's output as the trace runs (for experiments and teaching).

An :class:`Intervention` matches op names (glob patterns as in
:func:`workbench.program.name_matches`, or ``re:`` regexes) and maps the op's output
to a new array.  The trace applies it right after the op runs, before statistics and
capture, so everything downstream sees the changed value and the step records it.

    from workbench.trace import patch, replace, zero_head, inject
    workbench.trace(model, "hello", interventions=[
        zero_head("layers.1.self_attn.attn", head=0),
        inject("layers.2.mlp.down_proj", float("nan"), index=(0, 3, 7)),
    ])

A plain dict ``{pattern: fn}`` is accepted too (each entry is a :func:`patch`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import mlx.core as mx

from workbench.program import name_matches


@dataclass
class Intervention:
    pattern: str
    fn: Callable[[mx.array, Any], mx.array]  # fn(value, op) -> new value
    label: str

    def matches(self, name: str) -> bool:
        return name_matches(name, self.pattern)

    def apply(self, value: mx.array, op) -> mx.array:
        out = self.fn(value, op)
        if not isinstance(out, mx.array):
            out = mx.array(out, dtype=value.dtype)
        if tuple(out.shape) != tuple(value.shape):
            raise ValueError(f"intervention {self.label!r} on {op.name!r} changed the shape "
                             f"{tuple(value.shape)} -> {tuple(out.shape)}")
        return out


def patch(pattern: str, fn: Callable, label: str | None = None) -> Intervention:
    """Replace the output by ``fn(value)`` (or ``fn(value, op)`` if it takes two arguments)."""
    try:
        import inspect
        nparams = len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        nparams = 1
    f = (lambda v, op: fn(v, op)) if nparams >= 2 else (lambda v, op: fn(v))
    return Intervention(pattern, f, label or f"patch({pattern})")


def replace(pattern: str, value) -> Intervention:
    """Replace the output by a fixed array (same shape; cast to the output's dtype)."""
    arr = value if isinstance(value, mx.array) else mx.array(value)

    def fn(v, op):
        return mx.broadcast_to(arr, v.shape).astype(v.dtype)
    return Intervention(pattern, fn, f"replace({pattern})")


def zero_head(pattern: str, head: int, num_heads: int | None = None) -> Intervention:
    """Zero one attention head of the output.

    Works on heads-first tensors ``[B, H, T, ...]`` (axis 1: q/k/v after ``heads``,
    scores, softmax) and on heads-concatenated ones ``[B, T, H*D]`` (``attn``; head h is
    the slice ``h*D:(h+1)*D``), where the number of heads comes from ``num_heads`` or
    the op's ``num_heads`` / ``heads`` attribute.
    """
    def fn(v, op):
        if v.ndim == 4 and num_heads is None:
            H = v.shape[1]
            if not 0 <= head < H:
                raise ValueError(f"zero_head: head {head} out of range for {op.name!r} with {H} heads")
            keep = (mx.arange(H) != head).reshape(1, H, *([1] * (v.ndim - 2)))
            return v * keep.astype(v.dtype)
        H = num_heads or op.attrs.get("num_heads") or op.attrs.get("heads")
        if not H:
            raise ValueError(f"zero_head: cannot tell the heads of {op.name!r} (shape {tuple(v.shape)}); "
                             "pass num_heads=")
        D = v.shape[-1] // H
        if D * H != v.shape[-1] or not 0 <= head < H:
            raise ValueError(f"zero_head: head {head} of {H} does not fit {op.name!r}'s last axis {v.shape[-1]}")
        keep = ((mx.arange(v.shape[-1]) // D) != head).astype(v.dtype)
        return v * keep
    return Intervention(pattern, fn, f"zero_head({pattern}, {head})")


def inject(pattern: str, value: float = float("nan"), index=0) -> Intervention:
    """Write ``value`` (NaN, +Inf, -Inf or any number) into the output at ``index``:
    a flat int, a tuple of ints (one per axis), or ``None`` for every element."""
    def fn(v, op):
        if index is None:
            return mx.full(v.shape, value, dtype=v.dtype)
        flat = v.reshape(-1)
        if isinstance(index, (tuple, list)):
            if len(index) != v.ndim:
                raise ValueError(f"inject: index {tuple(index)} has {len(index)} axes, {op.name!r} has {v.ndim}")
            k = 0
            for i, n in zip(index, v.shape):
                if not -n <= i < n:
                    raise ValueError(f"inject: index {tuple(index)} out of range for shape {tuple(v.shape)}")
                k = k * n + (i % n)
        else:
            k = int(index)
            if not -flat.size <= k < flat.size:
                raise ValueError(f"inject: index {k} out of range for {op.name!r} with {flat.size} elements")
            k %= flat.size
        mask = mx.arange(flat.size) == k
        return mx.where(mask, mx.array(value, v.dtype), flat).reshape(v.shape)
    return Intervention(pattern, fn, f"inject({pattern}, {value}, {index})")


def normalize(interventions) -> list[Intervention]:
    if interventions is None:
        return []
    if isinstance(interventions, Intervention):
        return [interventions]
    if isinstance(interventions, Mapping):
        return [v if isinstance(v, Intervention) else patch(k, v) for k, v in interventions.items()]
    out = []
    for iv in interventions:
        if not isinstance(iv, Intervention):
            raise TypeError(f"not an intervention: {iv!r} (use patch / replace / zero_head / inject)")
        out.append(iv)
    return out
