"""Snapshots of a KV cache, so a trace can go back over the ops that wrote it.

A cache is any object the ops mutate through ctx.cache (attributes rebound, lists
updated). A snapshot copies its attribute dict one level deep; arrays are immutable
values and are shared, so snapshots are cheap.
"""
from __future__ import annotations

import copy


def snapshot(cache):
    """The cache's state now (None for no cache): objects with their attribute dicts."""
    if cache is None:
        return None
    if isinstance(cache, (list, tuple)):
        return [(c, _state_of(c)) for c in cache]
    return [(cache, _state_of(cache))]


def _state_of(obj) -> dict:
    return _copy_state(vars(obj))


def restore(snap) -> None:
    if snap is None:
        return
    for obj, d in snap:
        vars(obj).clear()
        vars(obj).update(_copy_state(d))


def _copy_state(d: dict) -> dict:
    return {k: (copy.copy(v) if isinstance(v, (list, dict)) else v) for k, v in d.items()}


def clone(snap):
    """A new cache object (or list) in the snapshot's state; the live cache is untouched."""
    if snap is None:
        return None
    out = []
    for obj, d in snap:
        c = copy.copy(obj)
        vars(c).clear()
        vars(c).update(_copy_state(d))
        out.append(c)
    return out if len(out) != 1 else out[0]
