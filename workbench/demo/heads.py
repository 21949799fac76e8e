"""Measure the demo model's attention heads: previous-token, induction and recall scores.

The attention probabilities are computed by hand, ``softmax(q k^T * scale + mask)`` per
head, from mlx-lm's own gemma4_text attention (its fused SDPA call is swapped for an
explicit one while a forward pass runs), so the scores do not depend on the
workbench's tracer and can be used to check it.

Scores (each is a mean attention probability, 0..1):

* previous-token: weight from position t to t-1, over every position t >= 1 of the
  held-out texts;
* induction: on copy examples (``w1 .. wn | w1 .. wn``, or from a cue ``| wk ..``), weight
  from the second occurrence of ``w_i`` to the first occurrence of ``w_{i+1}`` -- the
  token that came *after* the current token last time;
* recall: on recall examples, weight from the asked name (the last prompt token,
  ``... . tom``) to the colour that followed that name in the list.
"""
from __future__ import annotations

from contextlib import contextmanager

import mlx.core as mx
import numpy as np

from workbench.demo import corpus


@contextmanager
def recording_attention(record: list):
    """Within the block, mlx-lm's gemma4_text attention appends its probabilities
    ([B, heads, Lq, Lk], float32) to ``record``, one entry per layer call."""
    from mlx_lm.models import gemma4_text

    original = gemma4_text.scaled_dot_product_attention

    def explicit_sdpa(queries, keys, values, cache=None, scale=1.0, mask=None, sinks=None):
        h, kvh = queries.shape[1], keys.shape[1]
        if kvh != h:
            keys = mx.repeat(keys, h // kvh, axis=1)
            values = mx.repeat(values, h // kvh, axis=1)
        q32, k32 = queries.astype(mx.float32), keys.astype(mx.float32)
        scores = (q32 @ k32.swapaxes(-1, -2)) * scale
        lq, lk = scores.shape[-2:]
        if isinstance(mask, str):
            if mask != "causal":
                raise ValueError(f"unexpected attention mask {mask!r}")
            mask = mx.arange(lk)[None] <= (mx.arange(lq) + (lk - lq))[:, None]
        if mask is not None:
            if mask.dtype == mx.bool_:
                scores = mx.where(mask, scores, -mx.inf)
            else:
                scores = scores + mask
        probs = mx.softmax(scores, axis=-1, precise=True)
        record.append(probs)
        return (probs @ values.astype(mx.float32)).astype(queries.dtype)

    gemma4_text.scaled_dot_product_attention = explicit_sdpa
    try:
        yield record
    finally:
        gemma4_text.scaled_dot_product_attention = original


def attention_patterns(model, ids: list[int]) -> np.ndarray:
    """[layers, heads, L, L] attention probabilities of an mlx-lm gemma4_text model."""
    rec: list = []
    with recording_attention(rec):
        logits = model(mx.array([ids]))
        mx.eval(logits, rec)
    return np.stack([np.array(p[0]) for p in rec])


def head_scores(model, tok, n: int = 60) -> dict[str, np.ndarray]:
    """Mean previous-token / induction / recall scores, each [layers, heads]."""
    exs = corpus.heldout(n)
    prev, ind, rec = [], [], []
    for e in exs:
        ids = tok.encode(e.text).ids
        a = attention_patterns(model, ids)  # [Ly, H, L, L]
        L = len(ids)
        t = np.arange(1, L)
        prev.append(a[:, :, t, t - 1].mean(-1))
        words = e.prompt.split()
        if e.task == "copy":
            bar = words.index("|")
            seq = words[:bar]
            k = seq.index(words[bar + 1]) if len(words) > bar + 1 else 0  # cue, or a full copy
            n_second = len(seq) - k                       # words after the bar: seq[k:]
            j = np.arange(k, k + n_second - 1)            # second occurrence of seq[j] ...
            q = bar + 2 + (j - k)                         # (+1 for <bos>, +1 past the bar)
            ind.append(a[:, :, q, j + 2].mean(-1))        # ... attends to seq[j+1], first occurrence
        else:
            name = words[-1]
            i = next(i for i in range(0, len(words) - 1, 4) if words[i] == name)
            rec.append(a[:, :, len(words), 1 + i + 1])    # from the asked name to its colour
    return {"previous_token": np.mean(prev, 0), "induction": np.mean(ind, 0), "recall": np.mean(rec, 0)}


def best_heads(scores: dict[str, np.ndarray]) -> dict[str, dict]:
    out = {}
    for name, s in scores.items():
        layer, head = np.unravel_index(int(np.argmax(s)), s.shape)
        out[name] = {"layer": int(layer), "head": int(head), "score": round(float(s[layer, head]), 3),
                     "all": np.round(s, 3).tolist()}
    return out
