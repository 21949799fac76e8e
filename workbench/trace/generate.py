"""Generation with the KV cache, one :class:`Trace` per forward; greedy or sampled.

    g = workbench.generate(model, "the cat", max_tokens=8, capture="stats")
    g = workbench.generate(model, "the cat", max_tokens=8, temperature=0.8, top_p=0.9, seed=1)
    g.tokens            # generated ids (list; a list per sequence for a batch)
    g.text              # decoded (when the checkpoint has a tokenizer)
    g.traces[0]         # the prompt's forward (prefill); g.traces[k] made token k+1
    g.stats("logits")   # the op's stats in every forward
    g.first_nonfinite() # (forward index, Finding) of the first non-finite op, or None

Generation stops at the end of text: after a token of :func:`eos_ids` (the checkpoint's
``eos_token_id``, a number or a list: config.json's text config, else its top level), the
``<eos>`` being the last token of ``g.tokens``; ``past_eos=True`` keeps going to
``max_tokens`` (``g.stopped`` says which: ``"eos"``, ``"stop"`` or ``"max_tokens"``).

Token ``k`` (0-based) is drawn from ``g.traces[k].logits[:, -1]`` (the last position);
``g.traces[k]`` for k >= 1 ran on token ``k-1`` alone, reading the cache.  Captured
values of every forward share one memory budget (and spill directory).

Sampling is mlx-lm's (``mlx_lm.sample_utils.make_sampler``), step for step: log
probabilities ``logits - logsumexp(logits)`` in the logits' dtype, then top-p, then
top-k, then ``mx.random.categorical(logprobs * (1 / temperature))``; temperature 0 is the
argmax.  The random keys are those of MLX's global generator after ``mx.random.seed(seed)``
(one split per token), drawn from a key of our own, so the same seed gives the same
tokens as ``mx.random.seed(seed)`` followed by mlx-lm's ``generate_step``, and the global
generator is left alone.  ``seed=None`` draws from (and advances) the global generator,
as mlx-lm does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from numbers import Integral, Real
from typing import Any

import mlx.core as mx
import numpy as np

from workbench.nogc import no_gc
from workbench.trace.store import ValueStore
from workbench.trace.entry import check_token_ids, prepare_ids, trace as _trace, vocab_size
from workbench.trace.options import Positions, Run, Storage
from workbench.trace.step import TraceError
from workbench.trace.batches import wait_for_stats


@dataclass
class Generation:
    model: Any = field(repr=False)
    prompt_ids: mx.array = field(repr=False)
    generated: list  # [B][n] ints
    traces: list = field(repr=False)
    batched: bool = False
    sampling: dict = field(default_factory=dict)  # temperature, top_p, top_k, seed
    #: why decoding ended: "eos" (an end-of-text token), "stop" (a ``stop`` id) or "max_tokens"
    stopped: str = "max_tokens"
    #: the end-of-text ids it stopped at (empty with past_eos=True or when the config names none)
    eos: tuple = ()

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


def eos_ids(model) -> tuple[int, ...]:
    """The checkpoint's end-of-text token ids: ``eos_token_id`` of config.json's text config,
    else of its top level (a number or a list of numbers; Gemma lists several); () when
    neither names one.  A value that is not an id (nor a list of ids) is one ValueError."""
    top = getattr(getattr(model, "checkpoint", None), "config", None)
    for cfg in (getattr(model, "config", None), top):
        v = cfg.get("eos_token_id") if isinstance(cfg, dict) else None
        if v is None:
            continue
        ids = list(v) if isinstance(v, (list, tuple)) else [v]
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise ValueError(f"config eos_token_id {v!r} is not a token id or a list of token ids")
        return tuple(i for i in ids if i < vocab_size(model))
    return ()


# --------------------------------------------------------------------------- sampling (mlx-lm's)

def check_sampling(temperature=0.0, top_p=1.0, top_k=0, seed=None) -> dict:
    """The sampling settings, checked: one ValueError naming the bad argument."""
    def real(name, v):
        if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(float(v)):
            raise ValueError(f"{name} must be a finite number, not {v!r}")
        return float(v)

    temperature = real("temperature", temperature)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), not {temperature!r}")
    top_p = real("top_p", top_p)
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 = off), not {top_p!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, Integral) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 = off), not {top_k!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, Integral) or not 0 <= seed < 2**64):
        raise ValueError(f"seed must be an integer in [0, 2**64) or None, not {seed!r}")
    return {"temperature": temperature, "top_p": top_p, "top_k": int(top_k),
            "seed": None if seed is None else int(seed)}


@mx.compile
def _top_p(logprobs: mx.array, top_p: float) -> mx.array:
    # mlx_lm.sample_utils.apply_top_p
    sorted_logprobs = mx.sort(logprobs, axis=-1)
    sorted_probs = mx.exp(sorted_logprobs.astype(mx.float32))
    mass_above = mx.cumsum(sorted_probs, axis=-1, reverse=True, inclusive=False)
    total_mass = mass_above[..., :1] + sorted_probs[..., :1]
    num_dropped = (mass_above >= top_p * total_mass).sum(axis=-1, keepdims=True)
    threshold = mx.take_along_axis(sorted_logprobs, num_dropped, axis=-1)
    return mx.where(logprobs < threshold, -float("inf"), logprobs)


@mx.compile
def _top_k(logprobs: mx.array, top_k: int) -> mx.array:
    # mlx_lm.sample_utils.apply_top_k
    mask_idx = mx.argpartition(-logprobs, kth=top_k - 1, axis=-1)[..., top_k:]
    return mx.put_along_axis(logprobs, mask_idx, mx.array(-float("inf"), logprobs.dtype), axis=-1)


@mx.compile
def _categorical(logprobs: mx.array, temp: float, key: mx.array) -> mx.array:
    # mlx_lm.sample_utils.categorical_sampling, with an explicit key
    return mx.random.categorical(logprobs * (1.0 / temp), key=key)


@partial(mx.compile, inputs=mx.random.state, outputs=mx.random.state)
def _categorical_global(logprobs: mx.array, temp: float) -> mx.array:
    return mx.random.categorical(logprobs * (1.0 / temp))


class Sampler:
    """Next tokens [B] (lazy) from last-position logits [B, vocab], mlx-lm's way."""

    def __init__(self, temperature=0.0, top_p=1.0, top_k=0, seed=None):
        s = check_sampling(temperature, top_p, top_k, seed)
        self.temperature, self.top_p, self.top_k, self.seed = s["temperature"], s["top_p"], s["top_k"], s["seed"]
        self._key = None if self.seed is None else mx.random.key(self.seed)

    def __call__(self, logits: mx.array) -> mx.array:
        # mlx-lm: logits - logsumexp(logits, keepdims=True) over its one sequence
        lse = mx.logsumexp(logits, keepdims=True) if logits.shape[0] == 1 else \
            mx.logsumexp(logits, axis=-1, keepdims=True)
        logprobs = logits - lse
        if self.temperature == 0:
            return mx.argmax(logprobs, axis=-1)
        if 0 < self.top_p < 1.0:
            logprobs = _top_p(logprobs, self.top_p)
        if 0 < self.top_k < logprobs.shape[-1]:
            logprobs = _top_k(logprobs, self.top_k)
        if self._key is None:
            return _categorical_global(logprobs, self.temperature)
        self._key, sub = mx.random.split(self._key)  # as MLX's global generator does per draw
        return _categorical(logprobs, self.temperature, sub)


# --------------------------------------------------------------------------- the decode loop

def _forward(t, sampler, n: int) -> mx.array:
    """Run forward ``n`` (queued, not waited for) and return its next tokens [B], lazy."""
    t.run(wait=False, block=False)
    if not t.done:
        raise TraceError(f"forward {n} stopped at {t.steps[-1].name!r} before the logits")
    nxt = sampler(t.logits[:, -1, :])
    mx.async_eval(nxt)
    return nxt


def generate(model, prompt, max_tokens: int = 16, capture="stats", dtype=None, *, interventions=None,
             stop: list[int] | None = None, memory_budget: int | None = None, spill_dir: str | None = None,
             pad_id: int | None = None, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
             seed: int | None = None, past_eos: bool = False) -> Generation:
    """Decode with the model's KV cache; every forward is a captured :class:`Trace`.

    ``prompt``: text, token ids, or a batch of either (left padded); every id is checked
    (an integer in the vocabulary).  ``stop``: token ids (or one id) ending a
    generation early, checked the same way; the end-of-text ids (:func:`eos_ids`) stop it too
    unless ``past_eos=True``.  A batch stops once every sequence has made a stop or end-of-text
    token (the rows that ended first keep the tokens drawn after theirs).  ``temperature`` 0 (the default) is greedy;
    above 0 tokens are sampled (``top_p`` in (0, 1], ``top_k`` >= 0, 0 = off; a ``top_k`` at
    or above the vocabulary keeps every token, where mlx-lm refuses it) with the random keys
    of ``seed`` (see the module docstring: the same tokens as mlx-lm's).
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, Integral) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an integer >= 1, not {max_tokens!r}")
    sampler = Sampler(temperature, top_p, top_k, seed)
    if stop is not None:  # ids the sampled tokens are compared with: checked as any token id
        stop = check_token_ids([stop] if isinstance(stop, (int, np.integer)) else stop, vocab_size(model),
                               "stop token id")
    ids, mask, batched = prepare_ids(model, prompt, pad_id)
    cache = model.make_cache()
    if memory_budget is None:  # a streamed model: what its budget leaves beside the weights
        memory_budget = getattr(model, "capture_budget", None)
    store = ValueStore(memory_budget, spill_dir)
    kw = dict(capture=capture, dtype=dtype, interventions=interventions)
    t = _trace(model, ids, positions=Positions(attention_mask=mask), run=Run(cache=cache),
               storage=Storage(store=store, key_prefix="0/"), **kw)
    traces = [t]
    B = ids.shape[0]
    out: list[list[int]] = [[] for _ in range(B)]
    eos = () if past_eos else eos_ids(model)
    stops = set(stop or []) | set(eos)
    ended = [False] * B
    why = "max_tokens"
    # every forward adds a few hundred Step records that live as long as the Generation:
    # Python's cyclic collector would rescan them all, again and again, while decoding (a few
    # percent of the tokens/s); it is paused for the loop and resumes after it
    with no_gc():
        nxt = _forward(t, sampler, 0)
        for n in range(max_tokens):
            # as mlx-lm does: forward n + 1 is built and queued on the sampled token, still
            # lazy, before token n is read back, so the device computes while Python builds
            # (on a GPU; the CPU computes where Python runs).  Statistics are read later.
            ahead = None
            if n < max_tokens - 1:
                ahead = _trace(model, nxt.astype(mx.int32)[:, None], run=Run(cache=cache, check_ids=False),
                               storage=Storage(store=store, key_prefix=f"{n + 1}/"), **kw)
                nxt_ahead = _forward(ahead, sampler, n + 1)
            t.start_stats()  # forward n's statistics (CPU), while forward n + 1 computes
            toks = nxt.tolist()
            for b in range(B):
                out[b].append(toks[b])
                if not ended[b] and toks[b] in stops:
                    ended[b] = True
                    why = "eos" if toks[b] in eos and toks[b] not in (stop or []) else "stop"
            if all(ended):  # the forward queued on the stop token makes no token: its captured
                if ahead is not None:  # values go, and the cache goes back to where it started
                    ahead.reset()
                break
            if ahead is None:
                why = "max_tokens"
                break
            t, nxt = ahead, nxt_ahead
            traces.append(t)
    wait_for_stats(traces)  # (run() left nothing pending: the statistics still computing)
    for tr in traces:
        tr.batched = batched
    return Generation(model, ids, out, traces, batched,
                      {"temperature": sampler.temperature, "top_p": sampler.top_p, "top_k": sampler.top_k,
                       "seed": sampler.seed}, why, tuple(eos))
