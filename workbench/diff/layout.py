"""Reconciling an engine tensor's layout with ours, where that is unambiguous.

Engines store the same activation in different layouts: with or without a leading batch
dimension, with attention heads split (``[T, H, D]``) or merged (``[T, H*D]``), heads
first (``[H, T, D]``) or tokens first, matrices transposed (``[D, T]``).  We bring the
engine tensor to our shape using, in this order of preference:

0. nothing (same shape: taken as it is, even when some sizes coincide);
1. dropping / adding size-1 dimensions (a batch of one);
2. splitting or merging adjacent dimensions, in place (``[T, H*D]`` <-> ``[T, H, D]``);
3. a transpose of the axes, combined with 1 and 2 (``[H, T, D]`` -> ``[T, H*D]``), the
   one that moves the fewest pairs of axes past each other (``[H, T, D]`` -> ``[T, H, D]``
   rather than ``[T, D, H]``).

"Split or merge" means every group of adjacent dimensions whose sizes multiply to the
same number on both sides is a single dimension on at least one side; arbitrary
reshapes of the same element count are never used.  When two different arrangements
fit equally well (``[2, 3, 3]`` to ``[3, 6]``: swap the first two axes, or move the last
one forward), the layout is ambiguous and the op is reported as such rather than guessed.  When sizes
coincide (``T == H``) the cheaper arrangement wins; the applied steps are reported with
every op so a surprising choice is visible.
"""
from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np


class LayoutError(ValueError):
    """The engine tensor cannot be brought to our shape (``kind`` = "shape" or "ambiguous")."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def _squeeze(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(s) for s in shape if s != 1)


def split_merge_compatible(a: Sequence[int], b: Sequence[int]) -> bool:
    """True when ``a`` becomes ``b`` by splitting/merging adjacent dims (no size-1 dims given)."""
    a, b = list(a), list(b)
    if math.prod(map(int, a)) != math.prod(map(int, b)):  # (exact: Python ints)
        return False
    i = j = 0
    while i < len(a) and j < len(b):
        pa, pb, na, nb = a[i], b[j], 1, 1
        while pa != pb:
            if pa < pb:
                i += 1
                if i >= len(a):
                    return False
                pa *= a[i]
                na += 1
            else:
                j += 1
                if j >= len(b):
                    return False
                pb *= b[j]
                nb += 1
        if na > 1 and nb > 1:
            return False
        i += 1
        j += 1
    return i == len(a) and j == len(b)


def _perms(n: int):
    if n <= 5:
        return itertools.permutations(range(n))
    return iter([tuple(range(n)), tuple(reversed(range(n)))])


def _inversions(p: Sequence[int]) -> int:
    return sum(1 for i in range(len(p)) for j in range(i + 1, len(p)) if p[i] > p[j])


def reconcile(engine: np.ndarray, ref_shape: Sequence[int]) -> tuple[np.ndarray, str]:
    """Bring ``engine`` to ``ref_shape``; returns (array, description of the steps taken)."""
    ref_shape = tuple(int(s) for s in ref_shape)
    eshape = tuple(engine.shape)
    if eshape == ref_shape:
        return engine, ""
    e, r = _squeeze(eshape), _squeeze(ref_shape)
    if engine.size != math.prod(ref_shape):
        raise LayoutError(f"engine shape {list(eshape)} ({engine.size} elements) cannot match ours "
                          f"{list(ref_shape)} ({math.prod(ref_shape)} elements)", "shape")
    if e == r:
        return engine.reshape(ref_shape), f"{list(eshape)} -> {list(ref_shape)}: size-1 dims"
    flat = engine.reshape(e)
    if split_merge_compatible(e, r):
        return flat.reshape(ref_shape), f"{list(eshape)} -> {list(ref_shape)}: split/merged dims"
    cands: list[tuple[int, np.ndarray, str]] = []
    # (a) transpose the engine's axes, then split/merge to ours
    for q in _perms(len(e)):
        if q == tuple(range(len(e))):
            continue
        eq = tuple(e[k] for k in q)
        if split_merge_compatible(eq, r):
            cands.append((_inversions(q), np.transpose(flat, q).reshape(ref_shape), f"engine axes transposed {q}"))
    # (b) split/merge the engine to a permutation of ours, then transpose to ours
    for p in _perms(len(r)):
        if p == tuple(range(len(r))):
            continue
        rp = tuple(r[k] for k in p)
        if split_merge_compatible(e, rp):
            inv = tuple(int(x) for x in np.argsort(p))
            cands.append((_inversions(p), np.transpose(flat.reshape(rp), inv).reshape(ref_shape),
                          f"as {list(rp)}, axes transposed {inv}"))
    fewest = min((c[0] for c in cands), default=0)
    distinct: list[tuple[np.ndarray, str]] = []
    for _, arr, how in (c for c in cands if c[0] == fewest):
        if not any(arr.shape == d.shape and np.array_equal(arr, d, equal_nan=True) for d, _ in distinct):
            distinct.append((arr, how))
    if not distinct:
        raise LayoutError(f"engine shape {list(eshape)} cannot be brought to ours {list(ref_shape)} "
                          "by dropping batch dims, splitting/merging heads or transposing", "shape")
    if len(distinct) > 1:
        raise LayoutError(f"engine shape {list(eshape)} fits ours {list(ref_shape)} in {len(distinct)} different "
                          f"ways ({'; '.join(h for _, h in distinct)}); dump it in our layout", "ambiguous")
    arr, how = distinct[0]
    return arr, f"{list(eshape)} -> {list(ref_shape)}: {how}"
