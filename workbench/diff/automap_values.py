"""Value agreement for names matched by value (workbench/diff/automap.py): our ops as targets, and
the scores of an engine tensor against each.

Each op is a target as it is and, where it has a token axis, at its last position alone (an engine
that computed it for the token it samples from).  An engine tensor is compared with a target of
the same number of elements after the layout steps the diff takes (workbench/diff/layout.py: a
batch axis, heads split or merged, transposed), in float64: the relative RMS error
``|e - r| / |r|`` and the cosine.  Mask fill (non-finite, or at or below the tolerance's
``mask_below``) must sit at the same positions on both sides and is left out.

Bounded: :meth:`Scorer.sweep` compares every pair of equal size on a fixed sample of positions (at
most :data:`SAMPLE`, fewer when pairs are many: :data:`PAIR_BUDGET`) as matrix products, keeps each
engine tensor's :data:`KEEP` best by error and by cosine, and confirms the best two on the whole
tensor where they may match by value; :meth:`Scorer.pair` scores any other pair on demand.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from workbench.arrays import to_numpy
from workbench.diff.budget import PRECISIONS
from workbench.diff.engine_glue import HEADS_FIRST
from workbench.diff.layout import LayoutError, reconcile, split_merge_compatible
from workbench.program import layer_of

#: the most positions of a pair compared before confirmation; fewer when pairs are many
SAMPLE = 2048
MIN_SAMPLE = 64
#: sampled element comparisons over all pairs (bounds the time on a dump of many tensors)
PAIR_BUDGET = 2 ** 27
#: the candidates kept per engine tensor from the sweep, by error and by cosine (others on demand)
KEEP = 8
#: beyond this many elements, only layouts keeping the element order are tried (a transposed
#: layout's index map would be as large as the tensor)
BIG = 2 ** 24


def template(op: str, layer: int | None) -> str:
    """An op's name with its layer number as ``{}`` (``layers.{}.mlp.act``); itself outside the layers."""
    return op if layer is None else "layers.{}" + op[len(f"layers.{layer}"):]


@dataclass
class Target:
    """One of our ops as an engine tensor may hold it: whole, or (``last``) at the last position."""

    op: str
    index: int
    layer: int | None
    template: str
    last: bool  # our op's last position only (the engine holds that one)
    array: np.ndarray
    precision: str


def targets(reference: Mapping[str, Any], order: Sequence[str], tokens: int | None,
             dtypes: Mapping[str, str]) -> list[Target]:
    """Our ops of ``order`` that ``reference`` holds, each whole and, where it has a token axis of
    ``tokens`` positions (the caches aside: they hold every position), at its last position."""
    out = []
    for i, op in enumerate(order):
        if op not in reference:
            continue
        a = to_numpy(reference[op])
        if a.size == 0:
            continue
        layer = layer_of(op)
        prec = dtypes.get(op) if dtypes.get(op) in PRECISIONS else "float32"
        out.append(Target(op, i, layer, template(op, layer), False, a, prec))
        leaf = op.rsplit(".", 1)[-1]
        axis = 2 if leaf in HEADS_FIRST else 1
        if tokens and tokens > 1 and not leaf.endswith("_cache") and a.ndim > axis and a.shape[axis] == tokens:
            cut = a[(slice(None),) * axis + (slice(tokens - 1, tokens),)]
            out.append(Target(op, i, layer, template(op, layer), True, cut, prec))
    return out


def _squeeze(shape) -> tuple:
    return tuple(int(s) for s in shape if s != 1)


def _index_map(es: tuple, ts: tuple, pos: np.ndarray) -> tuple[np.ndarray, int]:
    """The engine's flat positions holding our ``pos`` in shape ``ts``, and the layout's cost
    (0 same shape, 1 size-1 dims, 2 split/merged, 3 transposed); LayoutError when none fits."""
    if es == ts:
        return pos, 0
    if _squeeze(es) == _squeeze(ts):
        return pos, 1
    if split_merge_compatible(_squeeze(es), _squeeze(ts)):
        return pos, 2
    size = math.prod(es)
    if size > BIG:
        raise LayoutError("too large for a transposed layout", "shape")
    idx, _ = reconcile(np.arange(size, dtype=np.int64).reshape(es), ts)
    return np.asarray(idx).reshape(-1)[pos], 3


def metrics(E: np.ndarray, R: np.ndarray, mask_below: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Relative RMS error ``|e - r| / |r|`` and cosine of every row of E against every row of R
    (float64).  Mask fill (non-finite, or at or below ``mask_below``) must sit at the same
    positions on both sides (else the error is infinite) and is left out."""
    with np.errstate(invalid="ignore", over="ignore"):
        mE = ~np.isfinite(E) | ((E <= mask_below) if mask_below is not None else False)
        mR = ~np.isfinite(R) | ((R <= mask_below) if mask_below is not None else False)
    E0, R0 = np.where(mE, 0.0, E), np.where(mR, 0.0, R)
    ee, rr, er = (E0 * E0).sum(1), (R0 * R0).sum(1), E0 @ R0.T
    mism = mE.sum(1)[:, None] + mR.sum(1)[None, :] - 2.0 * (mE.astype(np.float64) @ mR.T.astype(np.float64))
    d2 = np.maximum(ee[:, None] + rr[None, :] - 2.0 * er, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.sqrt(d2 / rr[None, :])
        cos = er / np.sqrt(ee[:, None] * rr[None, :])
    both0 = (ee[:, None] == 0) & (rr[None, :] == 0)
    rel = np.where(both0, 0.0, np.where(rr[None, :] == 0, np.inf, rel))
    cos = np.where(both0, 1.0, np.nan_to_num(cos, nan=0.0))
    rel = np.where(mism > 0.5, np.inf, rel)
    return rel, cos


class Scorer:
    """Scores of (engine tensor, target) pairs: ``rel`` (relative RMS error), ``cos`` and the layout's
    cost.  :meth:`sweep` scores every pair of equal size on a sample, as matrix products, and keeps
    each tensor's :data:`KEEP` best by error and by cosine (its best two confirmed on the whole
    tensor); :meth:`pair` scores any other pair on demand, on the same sample."""

    def __init__(self, E: list[np.ndarray], targets: list[Target], mask_below: float | None, confirm: float):
        self.E, self.targets, self.mask_below, self.confirm = E, targets, mask_below, confirm
        self.kept: dict[int, dict[int, list]] = defaultdict(dict)
        self._maps: dict = {}  # (engine shape, target shape) -> (positions, engine's positions, cost) or None
        self._k = SAMPLE

    def _map(self, es: tuple, ts: tuple):
        if (es, ts) not in self._maps:
            size = math.prod(ts)
            pos = (np.arange(size) if size <= self._k
                   else np.unique(np.random.default_rng(size).integers(0, size, self._k)))  # fixed per size
            try:
                idx, cost = _index_map(es, ts, pos)
                self._maps[(es, ts)] = (pos, idx, cost)
            except LayoutError:
                self._maps[(es, ts)] = None
        return self._maps[(es, ts)]

    def sweep(self) -> "Scorer":
        by_es: dict[tuple, list[int]] = defaultdict(list)
        by_ts: dict[tuple, list[int]] = defaultdict(list)
        for i, e in enumerate(self.E):
            if e.size:
                by_es[tuple(e.shape)].append(i)
        for j, t in enumerate(self.targets):
            by_ts[tuple(t.array.shape)].append(j)
        work = [(es, ts) for es in by_es for ts in by_ts if math.prod(es) == math.prod(ts)]
        n_pairs = sum(len(by_es[es]) * len(by_ts[ts]) for es, ts in work)
        self._k = int(min(SAMPLE, max(MIN_SAMPLE, PAIR_BUDGET // max(n_pairs, 1))))
        for es, ts in work:
            m = self._map(es, ts)
            if m is None:
                continue
            pos, idx, cost = m
            I, J = by_es[es], by_ts[ts]
            rel, cos = metrics(np.stack([self.E[i].reshape(-1)[idx] for i in I]).astype(np.float64),
                                np.stack([self.targets[j].array.reshape(-1)[pos] for j in J]).astype(np.float64),
                                self.mask_below)
            keep = min(KEEP, len(J))
            by_rel = np.argsort(rel, axis=1, kind="stable")[:, :keep]
            by_cos = np.argsort(-cos, axis=1, kind="stable")[:, :keep]
            for a, i in enumerate(I):
                for b in set(by_rel[a].tolist()) | set(by_cos[a].tolist()):
                    self.kept[i][J[b]] = [float(rel[a, b]), float(cos[a, b]), cost]
        for i, row in self.kept.items():  # the best two of each, confirmed on the whole tensor where
            for j in sorted(row, key=lambda j: (row[j][0], -row[j][1]))[:2]:  # it may match by value
                if not row[j][0] <= self.confirm:
                    continue
                full, _ = reconcile(self.E[i], self.targets[j].array.shape)
                rel, cos = metrics(full.reshape(1, -1).astype(np.float64),
                                    self.targets[j].array.reshape(1, -1).astype(np.float64), self.mask_below)
                row[j][:2] = [float(rel[0, 0]), float(cos[0, 0])]
        return self

    def pair(self, i: int, j: int) -> list | None:
        """[rel, cos, cost] of engine tensor i against target j; None where no layout fits."""
        row = self.kept[i]
        if j not in row:
            e, t = self.E[i], self.targets[j]
            m = self._map(tuple(e.shape), tuple(t.array.shape)) if e.size == t.array.size else None
            if m is None:
                row[j] = None
            else:
                pos, idx, cost = m
                rel, cos = metrics(e.reshape(1, -1)[:, idx].astype(np.float64),
                                    t.array.reshape(1, -1)[:, pos].astype(np.float64), self.mask_below)
                row[j] = [float(rel[0, 0]), float(cos[0, 0]), cost]
        return row[j]


def same_values(a: Target, b: Target, noise: float) -> bool:
    if a.array.shape != b.array.shape:
        try:
            x, _ = reconcile(b.array, a.array.shape)
        except LayoutError:
            return False
    else:
        x = b.array
    rel, _ = metrics(x.reshape(1, -1).astype(np.float64), a.array.reshape(1, -1).astype(np.float64), None)
    return bool(rel[0, 0] <= noise)
