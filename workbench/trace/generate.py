"""Greedy generation with the KV cache, one :class:`Trace` per forward.

    g = workbench.generate(model, "the cat", max_tokens=8, capture="stats")
    g.tokens            # generated ids (list; a list per sequence for a batch)
    g.text              # decoded (when the checkpoint has a tokenizer)
    g.traces[0]         # the prompt's forward (prefill); g.traces[k] made token k+1
    g.stats("logits")   # the op's stats in every forward
    g.first_nonfinite() # (forward index, Finding) of the first non-finite op, or None

Token ``k`` (0-based) is the argmax of ``g.traces[k].logits`` at the last position;
``g.traces[k]`` for k >= 1 ran on token ``k-1`` alone, reading the cache.  Captured
values of every forward share one memory budget (and spill directory).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from workbench.trace.store import ValueStore
from workbench.trace.tracer import TraceError, prepare_ids, trace as _trace


@dataclass
class Generation:
    model: Any = field(repr=False)
    prompt_ids: mx.array = field(repr=False)
    generated: list  # [B][n] ints
    traces: list = field(repr=False)
    batched: bool = False

    @property
    def tokens(self):
        """Generated token ids: a list (one prompt) or a list of lists (a batch)."""
        return [list(g) for g in self.generated] if self.batched else list(self.generated[0])

    @property
    def text(self):
        if getattr(self.model, "tokenizer", None) is None:
            raise TraceError("this checkpoint has no tokenizer: use .tokens")
        out = [self.model.decode(g) for g in self.generated]
        return out if self.batched else out[0]

    def stats(self, name: str) -> list[dict]:
        """Stats of op ``name`` in every forward (prefill first)."""
        return [t.stats(name) for t in self.traces]

    def values(self, name: str) -> list[mx.array]:
        return [t.value(name) for t in self.traces]

    def first_nonfinite(self):
        for k, t in enumerate(self.traces):
            f = t.first_nonfinite()
            if f is not None:
                return k, f
        return None

    def __repr__(self) -> str:
        return f"<Generation {len(self.generated[0])} tokens x {len(self.generated)} sequence(s), {len(self.traces)} forwards>"


def generate(model, prompt, max_tokens: int = 16, capture="stats", dtype=None, *, interventions=None,
             stop: list[int] | None = None, memory_budget: int | None = None, spill_dir: str | None = None,
             pad_id: int | None = None) -> Generation:
    """Greedy decoding with the model's KV cache; every forward is a captured :class:`Trace`.

    ``prompt``: text, token ids, or a batch of either (left padded).  ``stop``: token ids
    ending a (single-sequence) generation early.
    """
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    ids, mask, batched = prepare_ids(model, prompt, pad_id)
    cache = model.make_cache()
    store = ValueStore(memory_budget, spill_dir)
    kw = dict(capture=capture, dtype=dtype, interventions=interventions, store=store)
    t = _trace(model, ids, cache=cache, attention_mask=mask, key_prefix="0/", **kw)
    t.batched = True
    traces = [t]
    B = ids.shape[0]
    out: list[list[int]] = [[] for _ in range(B)]
    stops = set(stop or [])
    for n in range(max_tokens):
        t.run()
        if not t.done:
            raise TraceError(f"forward {n} stopped at {t.steps[-1].name!r} before the logits")
        nxt = mx.argmax(t.logits[:, -1, :], axis=-1)
        toks = [int(v) for v in nxt.tolist()]
        for b in range(B):
            out[b].append(toks[b])
        if n == max_tokens - 1 or (B == 1 and toks[0] in stops):
            break
        t = _trace(model, mx.array([[v] for v in toks], dtype=mx.int32), cache=cache,
                   key_prefix=f"{n + 1}/", **kw)
        t.batched = True
        traces.append(t)
    for tr in traces:
        tr.batched = batched
    return Generation(model, ids, out, traces, batched)
