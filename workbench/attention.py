"""Attention math shared by the model programs (:mod:`workbench.models.builder`) and the
views that read attention (:mod:`workbench.trace.heads`, the widgets, the hunt): the fused
kernel call, the explicit scores, the probabilities; and the command lines' ``--attention``
option (:func:`parse_option`).  Depends on MLX (and workbench.device_memory) only."""
from __future__ import annotations

import functools
import io

import mlx.core as mx

from workbench.device_memory import device_memory


#: the attention choices by name (workbench.models.attention: layers may be named too)
CHOICES = ("fused", "explicit")

#: the most bytes of [B, H, rows, S] float32 scores one kernel call may imply where MLX has
#: no fused kernel (its CPU backend, some head sizes on a GPU) and computes them inside the
#: call (peak about 5x this): past it a long prompt runs in query chunks, one after the
#: other.  Chunks change the values in their last bits (each sums over fewer keys; mlx-lm
#: never chunks), so on a GPU they start only where memory needs them: None there means a
#: 32nd of the device's memory, at least 1 GiB (H200: 4.7 GB, so a 4096-token 31B prompt
#: runs in one call, as mlx-lm's does).  A call MLX fuses never runs in chunks.
CHUNK_BYTES = {"cpu": 64 * 2**20, "gpu": None}

#: a sliding-window layer attends in blocks of this many queries from :data:`WINDOW_FROM`
#: keys on: each block over the keys its window reaches, at most ``window + WINDOW_ROWS - 1``,
#: instead of one call over all S keys under a [T, S] mask -- as mlx-lm's generate path does
#: when it prefills in chunks through its rotating cache.  At 32,768 tokens through a window
#: of 512 one call does 32x the work the blocks do (and makes a 1 GiB mask); the block size
#: is the fastest of 512 / 1024 / 2048 on an H200 (benchmarks/README.md).  Blocks change the
#: values in their last bits only (the same keys, summed in another order).  None: never.
WINDOW_ROWS: int | None = 512

#: the key count from which :data:`WINDOW_ROWS` applies.  Below it a sliding layer attends in
#: one call, so the logits equal mlx-lm's one-call forward bit for bit; from it on mlx-lm's
#: one call is out of reach anyway ([T, vocab] logits past 2^32 elements on Gemma's 262,144
#: vocabulary) and the prompt is compared with its chunked prefill, itself not bit-equal to
#: its one call.
WINDOW_FROM = 16384


def attention_mask(first: int, rows: int, lo: int, hi: int, window: int | None = None, valid=None):
    """Which keys each query may attend, True = may: queries at positions ``first .. first +
    rows - 1`` against keys ``lo .. hi - 1``; causal, within ``window`` when set, and, with
    ``valid`` ([B, S] bool: the key position holds a real token, left padding), never a
    padding key (a query always sees itself).  [rows, keys], or [B, 1, rows, keys] with
    ``valid``.  The feeds' masks (:func:`workbench.models.feeds.make_feeds`) are this."""
    qi = mx.arange(first, first + rows)[:, None]
    ki = mx.arange(lo, hi)[None]
    m = ki <= qi
    if window is not None:
        m = m & (qi - ki < window)
    if valid is not None:
        m = ((m[None] & valid[:, None, lo:hi]) | (ki == qi)[None])[:, None]
    return m


def real_keys(valid):
    """The feed ``key_valid`` as :func:`attention_mask` takes it: None when it is empty
    ([1, 0]: no padding, every key real), else the [B, S] array."""
    return None if valid is None or valid.shape[-1] == 0 else valid


def kernel_mask(first: int, rows: int, lo: int, hi: int, window: int | None = None, valid=None):
    """The mask the kernel is given for queries ``first ..`` against keys ``lo .. hi - 1``:
    mlx-lm's own where the mask is plain (no padding, no window cut, the queries the last
    keys) -- None for one query, ``"causal"`` for more -- else :func:`attention_mask`."""
    if valid is None and lo == 0 and first + rows == hi and (window is None or hi <= window):
        return None if rows == 1 else "causal"
    return attention_mask(first, rows, lo, hi, window, valid)


def fused_attention(q, k, v, valid, scale: float, window: int | None = None):
    """[B, H, T, D] through ``mx.fast.scaled_dot_product_attention`` (GQA by the kernel) --
    what mlx-lm runs -- under :func:`attention_mask` (``valid``: the feed ``key_valid``,
    [B, S] real keys, or empty: no padding).

    The queries are the last T of the S key positions.  When one call's scores would pass
    :data:`CHUNK_BYTES`, the queries run in chunks, one after the other, each over the keys
    it may see (causal: none after its last query; ``window``: none before its first
    query's window) with its own slice of the mask: no [T, S] value is ever made.  A long
    prompt through a sliding ``window`` runs in blocks of :data:`WINDOW_ROWS` the same way."""
    B, H, T, _ = q.shape
    S = k.shape[2]
    first = S - T  # query t is at key position first + t
    valid = real_keys(valid)
    rows = max(1, chunk_bytes() // (B * H * S * 4))
    whole = kernel_mask(first, T, 0, S, window, valid)  # (lazy: never evaluated when chunked)
    if window_blocks(T, S, window):
        rows = min(rows, WINDOW_ROWS)
    elif T <= rows or fused_kernel(q, k, v, whole):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=whole)
    out = []
    for t in range(0, T, rows):
        end = min(t + rows, T)
        lo, hi = (max(0, first + t - window + 1) if window else 0), first + end
        qc = q[:, :, t:end]
        if out:  # one chunk after the other: the scheduler would otherwise start them all at once
            qc = mx.depends(qc, out[-1])
        mask = kernel_mask(first + t, end - t, lo, hi, window, valid)
        out.append(mx.fast.scaled_dot_product_attention(qc, k[:, :, lo:hi], v[:, :, lo:hi], scale=scale, mask=mask))
    return mx.concatenate(out, axis=2)


def window_blocks(T: int, S: int, window: int | None) -> bool:
    """Whether :func:`fused_attention` runs ``T`` queries over ``S`` keys in blocks of
    :data:`WINDOW_ROWS` for the sliding ``window`` (see there)."""
    return (bool(window) and WINDOW_ROWS is not None and S >= WINDOW_FROM and T > WINDOW_ROWS
            and S > WINDOW_ROWS + window)


def chunk_bytes() -> int:
    """:data:`CHUNK_BYTES` on the default device (a GPU's None: a 32nd of its memory)."""
    dev = mx.default_device().type.name
    limit = CHUNK_BYTES[dev]
    if limit is None:
        limit = max(2**30, device_memory(mx.default_device()) // 32)
    return limit


def fused_kernel(q, k, v, mask) -> bool:
    """Whether MLX runs ``scaled_dot_product_attention`` on these shapes, dtype and mask
    kind in one kernel on the default device (no [T, S] scores inside the call), rather than
    its composed fallback: asked once per combination, of a small graph of zeros (nothing
    is computed)."""
    m = mask if mask is None or isinstance(mask, str) else (mask.dtype, tuple(mask.shape))
    return _fused(mx.default_device().type.name, q.dtype, tuple(q.shape), tuple(k.shape), tuple(v.shape), m)


@functools.lru_cache(maxsize=256)
def _fused(device: str, dtype, qs: tuple, ks: tuple, vs: tuple, mask) -> bool:
    if not (mask is None or isinstance(mask, str)):
        mask = mx.zeros(mask[1], mask[0])
    out = mx.fast.scaled_dot_product_attention(mx.zeros(qs, dtype), mx.zeros(ks, dtype), mx.zeros(vs, dtype),
                                               scale=1.0, mask=mask)
    dot = io.StringIO()
    mx.export_to_dot(dot, out)
    return '"ScaledDotProductAttention"' in dot.getvalue()


def attention_scores(q, k, mask, scale: float):
    """The explicit scores [B, H, T, S] of queries [B, H, T, D] against keys [B, Hkv, S, D]:
    ``scale * q k^T`` where the mask allows, the dtype's lowest finite value elsewhere."""
    B, H, T, D = q.shape
    rep = H // k.shape[1]
    if scale != 1.0:
        q = q * mx.array(scale, q.dtype)
    if rep > 1:
        q = q.reshape(B, k.shape[1], rep, T, D)
        k = mx.expand_dims(k, 2)
    s = q @ k.swapaxes(-1, -2)
    if rep > 1:
        s = s.reshape(B, H, T, -1)
    return mx.where(mask, s, mx.array(mx.finfo(s.dtype).min, s.dtype))


def heads_concat(o):
    """[B, H, T, D] -> [B, T, H*D]."""
    B, H, T, D = o.shape
    return o.transpose(0, 2, 1, 3).reshape(B, T, H * D)


def probabilities(q, k, mask, scale: float):
    """softmax(scores) [B, H, T, S] in the compute dtype -- what an explicit ``softmax`` op holds
    (for a fused layer, recomputed from its queries and keys)."""
    return mx.softmax(attention_scores(q, k, mask, scale), axis=-1, precise=True)


def parse_option(text: str, option: str = "--attention"):
    """A command line's ``--attention`` value as load / trace take it: "fused", "explicit", or
    comma-separated layers (``3,5`` or ``layers.3``) -> [3, 5]; a ValueError naming ``option``
    and the bad part otherwise (the layer numbers are checked against the model later)."""
    text = text.strip()
    if text in CHOICES:
        return text
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError(f"{option} is empty: give fused, explicit or layers such as 3,5")
    for p in parts:
        if not (p.isdigit() or (p.startswith("layers.") and p[len("layers."):].isdigit())):
            raise ValueError(f"{option}: {p!r} is not an integer or a layer name like layers.3 "
                             "(fused, explicit or comma-separated layers, e.g. 3,5)")
    return [int(p) if p.isdigit() else p for p in parts]
