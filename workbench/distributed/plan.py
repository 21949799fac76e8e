"""Which rank runs which ops, and which values cross each rank boundary.

A :class:`Plan` splits an op program by layers into contiguous ranges, one per rank:
rank 0 also runs the ops before the first layer (embeddings, Gemma 4's per-layer
inputs), the last rank the ops after the last layer (final norm, lm_head, logits).  What
rank ``r`` sends to rank ``r + 1`` is read off the program's dataflow: every value made by
ranks ``<= r`` that an op on a rank ``> r`` reads (the residual stream, and e.g. Gemma 4's
``per_layer_inputs`` read by every layer, or the ``k_cache``/``v_cache`` of a layer whose
keys/values a KV-shared layer further on attends to).  Program inputs (ids, RoPE offsets,
masks) never cross: every rank makes them from the token ids.

Pure data: no communication here (see :mod:`workbench.distributed.wire`).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from workbench.errors import UsageError
from workbench.program import Program

def layer_count(program: Program) -> int:
    layers = [op.layer for op in program.ops if op.layer is not None]
    if not layers:
        raise UsageError("the program has no layers to split across ranks")
    return max(layers) + 1


def parse_split(text: str, option: str = "--layers") -> list[int]:
    """``--layers 3,3`` -> [3, 3]; anything else is a UsageError naming the bad part."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    out = []
    for p in parts:
        try:
            out.append(int(p))
        except ValueError:
            raise UsageError(f"{option}: {p!r} is not an integer (expected comma-separated integers, e.g. 3,3)") from None
    if not out:
        raise UsageError(f"{option} is empty: give comma-separated integers, e.g. 3,3")
    return out


def balanced_split(costs: list[int], size: int, head: int = 0, tail: int = 0) -> list[int]:
    """Layer counts per rank (contiguous ranges, each >= 1) minimising the largest rank's
    cost; ``head`` is added to rank 0 (ops before the layers), ``tail`` to the last rank."""
    n = len(costs)
    if size > n:
        raise UsageError(f"{size} ranks but the model has {n} layers: at most one rank per layer")
    pre = [0]
    for c in costs:
        pre.append(pre[-1] + c)
    inf = float("inf")
    # best[k][j]: smallest max cost putting layers [0, j) on ranks 0..k-1
    best = [[inf] * (n + 1) for _ in range(size + 1)]
    cut = [[0] * (n + 1) for _ in range(size + 1)]
    best[0][0] = 0
    for k in range(1, size + 1):
        for j in range(k, n - (size - k) + 1):
            for i in range(k - 1, j):
                c = pre[j] - pre[i] + (head if k == 1 else 0) + (tail if k == size else 0)
                v = max(best[k - 1][i], c)
                if v < best[k][j]:
                    best[k][j], cut[k][j] = v, i
    counts, j = [], n
    for k in range(size, 0, -1):
        i = cut[k][j]
        counts.append(j - i)
        j = i
    return counts[::-1]


@dataclass
class Plan:
    """``ranks[r]``: the program indices rank r runs; ``layers[r]``: its (first, last) layer;
    ``sends[r]``: the value names rank r passes to rank r + 1 (in program order)."""

    program: Program
    layers: list[tuple[int, int]]
    ranks: list[list[int]]
    sends: list[list[str]]

    @property
    def size(self) -> int:
        return len(self.ranks)

    def names(self, rank: int) -> list[str]:
        return [self.program.ops[i].name for i in self.ranks[rank]]

    def received(self, rank: int) -> list[str]:
        return list(self.sends[rank - 1]) if rank > 0 else []

    def subprogram(self, rank: int) -> Program:
        """The rank's ops as a program of their own: its inputs are the program's inputs
        and the values received from the rank before."""
        return Program([self.program.ops[i] for i in self.ranks[rank]],
                       tuple(self.program.inputs) + tuple(self.received(rank)))

    def fingerprint(self) -> str:
        """Equal on every rank that loaded the same program and split (checked on receipt)."""
        h = hashlib.sha256()
        for op in self.program.ops:
            h.update(f"{op.name}|{op.kind}|{','.join(op.inputs)}|{','.join(op.params)}\n".encode())
        h.update(repr(self.layers).encode())
        return h.hexdigest()[:16]

    def describe(self) -> list[dict]:
        return [{"rank": r, "layers": list(self.layers[r]), "ops": len(self.ranks[r]),
                 "sends": list(self.sends[r]) if r < self.size - 1 else []} for r in range(self.size)]


def make_plan(program: Program, size: int, split: list[int] | None = None, tensor_bytes=None) -> Plan:
    """Split ``program`` over ``size`` ranks.

    split: layer counts per rank (summing to the model's layer count, each >= 1); None
    balances by the bytes of the checkpoint tensors each rank reads (``tensor_bytes``:
    name -> bytes), or by layer count when no sizes are given.
    """
    if size < 1:
        raise UsageError(f"cannot split over {size} ranks")
    n = layer_count(program)
    if split is not None:
        split = [int(c) for c in split]
        if len(split) != size:
            raise UsageError(f"--layers gives {len(split)} layer count{'s' if len(split) != 1 else ''} for "
                             f"{size} rank{'s' if size != 1 else ''} (one count per rank; mlx.launch -n sets the ranks)")
        if any(c < 1 for c in split):
            raise UsageError(f"--layers {','.join(map(str, split))}: every rank needs at least one layer")
        if sum(split) != n:
            raise UsageError(f"--layers {','.join(map(str, split))} covers {sum(split)} layers; the model has {n}")
    else:
        costs, head, tail = [0] * n, 0, 0
        if tensor_bytes is not None:
            names = set(tensor_bytes)
            first = next(i for i, op in enumerate(program.ops) if op.layer is not None)
            for i, op in enumerate(program.ops):
                b = sum(tensor_bytes[t] for t in op.tensor_names(names))
                if op.layer is not None:
                    costs[op.layer] += b
                elif i < first:
                    head += b
                else:
                    tail += b
        else:
            costs = [1] * n
        split = balanced_split(costs, size, head, tail)
    bounds, start = [], 0
    for c in split:
        bounds.append((start, start + c - 1))
        start += c
    rank_of_layer = {}
    for r, (a, b) in enumerate(bounds):
        for i in range(a, b + 1):
            rank_of_layer[i] = r

    ranks: list[list[int]] = [[] for _ in range(size)]
    where: dict[str, int] = {}
    r = 0  # ops outside the layers run where the last layer op ran (before any: rank 0)
    for i, op in enumerate(program.ops):
        if op.layer is not None:
            r = rank_of_layer[op.layer]
        for src in op.inputs:
            if where.get(src, -1) > r:
                raise UsageError(f"op {op.name!r} (rank {r}) reads {src!r}, made later on rank {where[src]}: "
                                 "this program cannot be split by layers")
        ranks[r].append(i)
        where[op.name] = r
    # rank r sends what ranks <= r made and ranks > r read
    last_reader: dict[str, int] = {}
    for r in range(size):
        for i in ranks[r]:
            for src in program.ops[i].inputs:
                if src in where:
                    last_reader[src] = max(last_reader.get(src, 0), r)
    sends = []
    for r in range(size - 1):
        sends.append([op.name for op in program.ops
                      if op.name in where and where[op.name] <= r < last_reader.get(op.name, -1)])
    return Plan(program, bounds, ranks, sends)
