"""Snapshots of a KV cache, so a trace can go back over the ops that wrote it.

A cache is any object the ops mutate through ctx.cache (attributes rebound, lists
updated). A snapshot copies its attribute dict one level deep; arrays are immutable
values and are shared, so snapshots are cheap.  A cache with ``snapshot`` / ``restore`` /
``clone_at`` methods keeps its own (the model programs' KVCache: lengths only, so the
traces of a long generation do not each hold the cache as it was).
"""
from __future__ import annotations

import copy


class _Own:
    """The state of a cache that snapshots itself (``snapshot()`` / ``restore(s)`` /
    ``clone_at(s)``: :class:`workbench.models.feeds.KVCache` records lengths, not arrays)."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data


def _owns(obj) -> bool:
    return all(callable(getattr(obj, m, None)) for m in ("snapshot", "restore", "clone_at"))


def snapshot(cache):
    """The cache's state now (None for no cache): objects with their attribute dicts (or
    their own snapshots)."""
    if cache is None:
        return None
    if isinstance(cache, (list, tuple)):
        return [(c, _state_of(c)) for c in cache]
    return [(cache, _state_of(cache))]


def _state_of(obj):
    return _Own(obj.snapshot()) if _owns(obj) else _copy_state(vars(obj))


def restore(snap) -> None:
    if snap is None:
        return
    for obj, d in snap:
        if isinstance(d, _Own):
            obj.restore(d.data)
            continue
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
        if isinstance(d, _Own):
            out.append(obj.clone_at(d.data))
            continue
        c = copy.copy(obj)
        vars(c).clear()
        vars(c).update(_copy_state(d))
        out.append(c)
    return out if len(out) != 1 else out[0]
