"""Held-out evaluation of the demo model: exact-match greedy completions.

For every held-out example the model is given ``<bos> prompt`` and decodes greedily for
as many tokens as the expected answer has (plus ``<eos>``); the example counts as correct
when the generated tokens equal the answer's tokens exactly, ``<eos>`` included.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import mlx.core as mx

from workbench.demo import corpus
from workbench.demo.tokenizer import EOS_ID

#: the accuracy the demo model must reach on every task
THRESHOLD = 0.90

Forward = Callable[[mx.array], mx.array]  # ids [B, L] -> logits [B, L, V]


@dataclass
class EvalResult:
    n: dict[str, int] = field(default_factory=dict)
    correct: dict[str, int] = field(default_factory=dict)
    failures: list[dict] = field(default_factory=list)

    @property
    def accuracy(self) -> dict[str, float]:
        return {t: self.correct[t] / self.n[t] for t in self.n}

    @property
    def overall(self) -> float:
        return sum(self.correct.values()) / max(1, sum(self.n.values()))

    @property
    def passed(self) -> bool:
        return all(a >= THRESHOLD for a in self.accuracy.values())

    def to_dict(self) -> dict:
        return {"threshold": THRESHOLD, "passed": self.passed, "overall": round(self.overall, 4),
                "accuracy": {t: round(a, 4) for t, a in self.accuracy.items()},
                "n": dict(self.n), "failures": self.failures[:10]}


def greedy(forward: Forward, prompts: list[list[int]], n_new: int) -> list[list[int]]:
    """Greedy-decode ``n_new`` tokens for prompts of equal length (no cache: tiny model)."""
    if len({len(p) for p in prompts}) != 1:
        raise ValueError("greedy() takes prompts of one length")
    ids = mx.array(prompts)
    out = []
    for _ in range(n_new):
        nxt = mx.argmax(forward(ids)[:, -1, :], axis=-1)
        out.append(nxt)
        ids = mx.concatenate([ids, nxt[:, None].astype(ids.dtype)], axis=1)
    return mx.stack(out, axis=1).tolist() if out else [[] for _ in prompts]


def evaluate(forward: Forward, tok, examples: list[corpus.Example] | None = None) -> EvalResult:
    examples = corpus.heldout() if examples is None else examples
    groups: dict[tuple[int, int], list[tuple[corpus.Example, list[int], list[int]]]] = defaultdict(list)
    for e in examples:
        p = tok.encode(e.prompt).ids
        a = tok.encode(e.answer, add_special_tokens=False).ids + [EOS_ID]
        groups[(len(p), len(a))].append((e, p, a))
    res = EvalResult()
    for (_, la), items in sorted(groups.items()):
        gen = greedy(forward, [p for _, p, _ in items], la)
        for (e, p, a), g in zip(items, gen):
            res.n[e.task] = res.n.get(e.task, 0) + 1
            ok = g == a
            res.correct[e.task] = res.correct.get(e.task, 0) + int(ok)
            if not ok:
                res.failures.append({"task": e.task, "prompt": e.prompt, "expected": e.answer,
                                     "got": tok.decode([t for t in g if t != EOS_ID])})
    return res
