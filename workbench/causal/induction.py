"""Induction-head detection on repeated random tokens.

Feed ``<bos> r_1 .. r_n r_1 .. r_n`` (``r`` random tokens, distinct within a sequence;
optionally a separator token between the halves).
In the second half the next token is predictable only by induction: find where the
current token occurred before and copy the token that followed it.  An induction head
attends from the second occurrence of ``r_i`` to the first occurrence of ``r_{i+1}``,
i.e. ``n - 1`` positions back (``n`` with a separator).  Its score is the mean attention weight (from
``layers.{i}.self_attn.softmax``, run with explicit attention) at that offset over the second half of every sequence,
0..1.  The previous-token score (weight on the position just before) comes with it: the
two-layer induction circuit needs a previous-token head in an earlier layer.

Mind the sliding window: a layer whose window is shorter than ``n`` cannot see the
first occurrence (the demo's layers 0-2 see 16 tokens, so ``seq_len`` <= 16 there).
"""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from workbench.causal.common import DEFAULT_DTYPE, Prompt, require_op, run
from workbench.trace.entry import check_token_id, check_token_ids, vocab_size


@dataclass
class InductionResult:
    scores: np.ndarray          # [L, H] mean attention to the token after the earlier occurrence
    previous_token: np.ndarray  # [L, H] mean attention to the position just before
    seq_len: int                # n: random tokens per half
    batch: int
    seed: int
    sep: int | None
    ids: np.ndarray             # [batch, (1) + 2n] the sequences used

    def top(self, k: int = 5, which: str = "induction") -> list[tuple[int, int, float]]:
        """(layer, head, score), best first."""
        a = self.scores if which == "induction" else self.previous_token
        flat = [(l, h, float(a[l, h])) for l in range(a.shape[0]) for h in range(a.shape[1]) if np.isfinite(a[l, h])]
        return sorted(flat, key=lambda r: -r[2])[:k]

    def to_dict(self) -> dict:
        def clean(a):
            return np.where(np.isnan(a), None, a).tolist()
        return {"scores": clean(self.scores), "previous_token": clean(self.previous_token), "seq_len": self.seq_len,
                "batch": self.batch, "seed": self.seed, "sep": self.sep, "ids": self.ids.tolist(),
                "top": [list(r) for r in self.top()]}


def special_ids(model) -> set[int]:
    """Token ids that are not text: the config's bos / eos / pad and the tokenizer's special tokens."""
    out = set()
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = model.config.get(key)
        out |= set(v) if isinstance(v, (list, tuple)) else ({v} if v is not None else set())
    tok = getattr(model, "tokenizer", None)
    if tok is not None and hasattr(tok, "get_added_tokens_decoder"):
        out |= {int(i) for i, t in tok.get_added_tokens_decoder().items() if t.special}
    return out


def repeated_tokens(model, seq_len: int = 8, batch: int = 8, seed: int = 0, pool=None,
                    sep: int | None = None) -> np.ndarray:
    """[batch, (1) + 2 * seq_len (+ 1)] int ids: ``<bos>`` (when the config has one), ``seq_len``
    distinct random tokens from ``pool`` (default: every non-special id), the token ``sep``
    if given, the same tokens again."""
    if seq_len < 2:
        raise ValueError("seq_len must be at least 2")
    vocab = vocab_size(model)
    if sep is not None:
        sep = check_token_id(sep, vocab, "sep token id")
    pool = np.array(sorted(set(range(model.vocab_size)) - special_ids(model)) if pool is None
                    else check_token_ids(list(pool) if not isinstance(pool, (np.ndarray, mx.array)) else pool,
                                         vocab, "pool token id"))
    if len(pool) < seq_len:
        raise ValueError(f"a pool of {len(pool)} tokens cannot give {seq_len} distinct ones")
    rng = np.random.default_rng(seed)
    r = np.stack([rng.choice(pool, size=seq_len, replace=False) for _ in range(batch)])
    bos = model.config.get("bos_token_id")
    head = np.full((batch, 1), bos) if isinstance(bos, int) else np.zeros((batch, 0), dtype=int)
    mid = np.full((batch, 1 if sep is not None else 0), -1 if sep is None else sep)
    return np.concatenate([head, r, mid, r], axis=1).astype(np.int32)


def induction_scores(model, seq_len: int = 8, batch: int = 8, seed: int = 0, pool=None, sep: int | None = None,
                     dtype=DEFAULT_DTYPE) -> InductionResult:
    """Induction and previous-token scores of every head (see the module docstring).

    ``pool``: the tokens to draw from (default: every non-special id); ``sep``: a token
    between the two halves (the offset is then ``seq_len``), for a model trained on a
    format like the demo's ``w1 .. wn | w1 .. wn``."""
    ids = repeated_tokens(model, seq_len, batch, seed, pool, sep)
    names = [f"layers.{i}.self_attn.softmax" for i in range(model.num_layers)]
    for i in range(model.num_layers):
        require_op(model, f"layers.{i}.self_attn.context")
    # the probabilities are the softmax steps: explicit attention for this run
    tr = run(model, Prompt(mx.array(ids), None), capture=names, dtype=dtype, attention="explicit")
    T, n = ids.shape[1], seq_len
    q2 = np.arange(T - n, T)               # the second half's positions
    back = n - 1 if sep is None else n     # from r_i's second occurrence to r_{i+1}'s first
    prev_q = np.arange(1, T)
    Hmax = max(require_op(model, f"layers.{i}.self_attn.context").attrs["num_heads"] for i in range(model.num_layers))
    ind = np.full((model.num_layers, Hmax), np.nan)
    prev = np.full((model.num_layers, Hmax), np.nan)
    for i, name in enumerate(names):
        a = np.array(tr.value(name).astype(mx.float32))  # [B, H, T, S]
        H = a.shape[1]
        ind[i, :H] = a[:, :, q2, q2 - back].mean(axis=(0, 2))
        prev[i, :H] = a[:, :, prev_q, prev_q - 1].mean(axis=(0, 2))
    return InductionResult(ind, prev, n, batch, seed, sep, ids)
