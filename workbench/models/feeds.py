"""What one forward is fed: the token ids, per-sequence RoPE offsets, the attention masks,
and the KV cache that carries keys and values from one chunk to the next.

Program inputs (made by :meth:`Model.feeds`):

* ``input_ids``         [B, T] int32
* ``rope_offset``       [B] int32, position of each sequence's first token in this chunk
                        (negative under left padding: the first real token is position 0)
* ``attn_mask``         [B|1, 1, T, S] bool, True = may attend (causal, padding-aware)
* ``attn_mask_sliding`` the same with the sliding window (families that use one)
* ``key_valid``         [B, S] bool, True = the key position holds a real token (or [1, 0],
                        empty: no padding, every key real): what fused attention reads (it
                        makes its own mask slices, so the [T, S] masks above are computed
                        only where explicit attention reads them)
"""
from __future__ import annotations

from typing import Mapping

import mlx.core as mx

from workbench.attention import attention_mask as mask_of


class KVCache:
    """Keys and values of every layer that computes them, plus the padding history.

    ``layers.{i}.self_attn.k_cache`` / ``v_cache`` ops write the keys/values of this
    chunk after the first ``start`` cached positions (so re-running an op is harmless)
    and return the full [B, n_kv_heads, S, head_dim] arrays.  KV-shared layers (Gemma 4)
    read the ``k_cache``/``v_cache`` op of the layer they share with.  :meth:`Model.feeds`
    sets ``start`` and the key-validity history before each forward.
    """

    def __init__(self, num_layers: int):
        self.keys: list[mx.array | None] = [None] * num_layers
        self.values: list[mx.array | None] = [None] * num_layers
        self.valid: mx.array | None = None  # [B, S] bool: key position holds a real token
        self.start = 0
        self.epoch = 0  # trim() changes it: positions below a snapshot's may be rewritten after

    # -- snapshots (workbench.trace.snapshots): lengths, not arrays.  Updates write only at or
    # past ``start`` (the cached length when a forward begins), so the cache as it was when a
    # forward began is the current arrays cut to the lengths of then: a decoding loop's traces
    # each keep a few integers, not a copy of the cache as it was (quadratic memory).
    def snapshot(self) -> tuple:
        return (self.epoch, self.start, [None if a is None else a.shape[2] for a in self.keys],
                [None if a is None else a.shape[2] for a in self.values],
                None if self.valid is None else self.valid.shape[1])

    def _cut(self, snap) -> tuple:
        epoch, start, kl, vl, nv = snap
        if epoch != self.epoch:
            raise ValueError("the KV cache was trimmed after this forward ran: its state then is gone "
                             "(going back over its cache ops needs a new trace)")
        now = [None if a is None else a.shape[2] for a in self.keys + self.values]
        now.append(None if self.valid is None else self.valid.shape[1])
        if any(n is not None and (m is None or m < n) for n, m in zip(kl + vl + [nv], now)):
            raise ValueError("the KV cache holds fewer positions than when this forward began (it was "
                             "replaced or cut since): its state then is gone")
        cut = lambda arrs, lens: [None if n is None else a[:, :, :n] for a, n in zip(arrs, lens)]  # noqa: E731
        return start, cut(self.keys, kl), cut(self.values, vl), None if nv is None else self.valid[:, :nv]

    def restore(self, snap) -> None:
        """Back to the state :meth:`snapshot` recorded."""
        self.start, self.keys, self.values, self.valid = self._cut(snap)

    def clone_at(self, snap) -> "KVCache":
        """A new cache in the state :meth:`snapshot` recorded (this one untouched)."""
        c = KVCache(len(self.keys))
        c.start, c.keys, c.values, c.valid = self._cut(snap)
        c.epoch = self.epoch
        return c

    @property
    def offset(self) -> int:
        """Number of positions already cached (the longest layer)."""
        return max((k.shape[2] for k in self.keys if k is not None), default=0)

    def update(self, kind: str, layer: int, x: mx.array) -> mx.array:
        store = self.keys if kind == "k" else self.values
        old = store[layer]
        if old is None or self.start == 0:
            new = x
        else:
            new = mx.concatenate([old[:, :, : self.start], x], axis=2)
        store[layer] = new
        return new

    def trim(self, n: int) -> None:
        """Forget the last ``n`` cached positions."""
        keep = max(self.offset - n, 0)
        self.epoch += 1
        for store in (self.keys, self.values):
            for i, a in enumerate(store):
                if a is not None:
                    store[i] = a[:, :, :keep] if keep else None
        if self.valid is not None:
            self.valid = self.valid[:, :keep] if keep else None

    @property
    def state(self) -> list[mx.array]:
        return [a for a in self.keys + self.values if a is not None]



# --------------------------------------------------------------------------- feeds

def _as_ids(ids) -> mx.array:
    if not isinstance(ids, mx.array):
        ids = mx.array(ids)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2:
        raise ValueError(f"token ids must be [T] or [B, T], got shape {tuple(ids.shape)}")
    if not mx.issubdtype(ids.dtype, mx.integer):
        raise ValueError(f"token ids must be integers, got {ids.dtype}")
    return ids.astype(mx.int32)


def make_feeds(ids, attention_mask=None, cache: KVCache | None = None,
               windows: Mapping[str, int | None] | None = None, vocab_size: int | None = None,
               check_ids: bool = True) -> dict:
    """Program inputs for one forward: ids, per-sequence RoPE offsets and attention masks.

    ``check_ids=False`` skips reading the ids back to check they are in the vocabulary
    (ids a sampler drew from this model's logits are, by construction; a decoding step
    would otherwise wait for the device before it could queue the next forward).

    ``attention_mask`` (1 = real token) supports left padding only.  With a cache, the
    chunk continues the cached positions and the mask covers cached + new keys.
    """
    ids = _as_ids(ids)
    B, T = ids.shape
    if check_ids and vocab_size is not None and ids.size:
        lo, hi = mx.stack([mx.min(ids), mx.max(ids)]).tolist()  # (one read back)
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"token id {hi if hi >= vocab_size else lo} out of range for a vocabulary of {vocab_size}")
    offset = cache.offset if cache is not None else 0
    valid = None
    if attention_mask is not None:
        am = attention_mask if isinstance(attention_mask, mx.array) else mx.array(attention_mask)
        if am.ndim == 1:
            am = am[None]
        if tuple(am.shape) != (B, T):
            raise ValueError(f"attention_mask shape {tuple(am.shape)} does not match ids {(B, T)}")
        am = am.astype(mx.bool_)
        valid = am
    if cache is not None:
        prev = cache.valid[:, :offset] if (cache.valid is not None and offset) else None
        if prev is not None and prev.shape[0] != B:
            raise ValueError(f"batch size {B} does not match the cache's {prev.shape[0]}")
        if valid is not None or prev is not None:
            prev = prev if prev is not None else mx.ones((B, offset), mx.bool_)
            new = valid if valid is not None else mx.ones((B, T), mx.bool_)
            valid = mx.concatenate([prev, new], axis=1)
        cache.valid = valid
        cache.start = offset
    S = offset + T
    if valid is not None:
        v = valid.astype(mx.int32)
        # left padding only: once a sequence starts, every later position is real (checked
        # where a mask comes in: unmasked new positions after a checked cache keep it so)
        started = mx.cumsum(v, axis=1) > 0
        if attention_mask is not None and bool(mx.any(started & ~valid).item()):
            raise ValueError("attention_mask must be left padding (0s before the first 1 of each row, 1s after)")
        npad = S - mx.sum(v, axis=1)
        rope_offset = (offset - npad).astype(mx.int32)
    else:
        rope_offset = mx.full((B,), offset, mx.int32)

    feeds = {"input_ids": ids, "rope_offset": rope_offset,
             "key_valid": valid if valid is not None else mx.zeros((1, 0), mx.bool_)}
    for name, window in (windows or {"attn_mask": None}).items():
        feeds[name] = mask_of(offset, T, 0, S, window, valid)
    return feeds
