"""The model-level entry: :func:`trace` (what ``model.trace(...)`` and ``workbench.trace(model,
...)`` call) and :func:`prepare_ids` (text, ids, or a batch of either -> padded ids and mask)."""
from __future__ import annotations

from typing import Mapping

import mlx.core as mx
import numpy as np

from workbench.dtypes import dtype_name, parse_dtype
from workbench.trace.step import TraceError
from workbench.trace.store import ValueStore
from workbench.trace.tracer import Trace


def _parse_dtype(dtype):
    if dtype is None or isinstance(dtype, mx.Dtype):
        return dtype
    return parse_dtype(dtype)


def prepare_ids(model, ids_or_text, pad_id: int | None = None):
    """(ids [B, T] int32, attention_mask [B, T] or None, batched) from text, token ids, or
    lists of either (left padded with ``pad_id``, default the config's pad_token_id or 0)."""
    x = ids_or_text
    if isinstance(x, np.ndarray):
        x = mx.array(x)
    if isinstance(x, str):
        seqs, batched = [model.encode(x)], False
    elif isinstance(x, mx.array):
        if x.ndim in (1, 2) and x.size and mx.issubdtype(x.dtype, mx.integer):
            # as given: no round trip through the host (the feeds check the id range)
            return (x[None] if x.ndim == 1 else x).astype(mx.int32), None, x.ndim == 2
        if x.ndim == 1:
            seqs, batched = [x.tolist()], False
        elif x.ndim == 2:
            seqs, batched = x.tolist(), True
        else:
            raise ValueError(f"token ids must be [T] or [B, T], got shape {tuple(x.shape)}")
    elif isinstance(x, (list, tuple)):
        if len(x) == 0:
            raise ValueError("no tokens to run")
        if all(isinstance(e, str) for e in x):
            seqs, batched = [model.encode(s) for s in x], True
        elif all(isinstance(e, (int, np.integer)) for e in x):
            seqs, batched = [list(x)], False
        elif all(isinstance(e, (list, tuple, mx.array, np.ndarray)) for e in x):
            seqs = [list(e.tolist() if hasattr(e, "tolist") else e) for e in x]
            batched = True
        else:
            raise ValueError("pass a string, a list of token ids, or a list of strings / id lists")
    else:
        raise ValueError(f"cannot run {type(x).__name__}: pass text or token ids")
    for s in seqs:
        if len(s) == 0:
            raise ValueError("an empty sequence (the text encodes to no tokens)")
    T = max(len(s) for s in seqs)
    if pad_id is None:
        config = getattr(model, "config", None) or {}
        pad_id = config.get("pad_token_id") if isinstance(config, Mapping) else None
        pad_id = 0 if pad_id is None else int(pad_id)
    if all(len(s) == T for s in seqs):
        return mx.array(seqs, dtype=mx.int32), None, batched
    ids = [[pad_id] * (T - len(s)) + list(s) for s in seqs]
    mask = [[0] * (T - len(s)) + [1] * len(s) for s in seqs]
    return mx.array(ids, dtype=mx.int32), mx.array(mask, dtype=mx.bool_), batched


def trace(model, ids_or_text, capture="stats", dtype=None, breakpoints=None, interventions=None, *,
          cache=None, attention_mask=None, pad_id: int | None = None, memory_budget: int | None = None,
          spill_dir: str | None = None, flush_bytes: int = 512 * 2**20, store: ValueStore | None = None,
          key_prefix: str = "", attention=None, check_ids: bool = True, **extra) -> Trace:
    """A :class:`Trace` of ``model`` on text, token ids, or a batch of either.

    capture: ``"stats"`` (default) | ``"full"`` | [name patterns] | None.
    dtype: compute dtype (``"float32"``, ``"bfloat16"``, ``"float16"``) whatever the
    storage dtype; None uses the model's default.
    Batches are left padded and masked; ``.logits`` is then [B, T, vocab].
    attention: None (the model's program, fused unless ``load`` said otherwise) |
    ``"fused"`` | ``"explicit"`` | layers (``3``, ``"layers.3"`` or a list) whose attention
    runs as explicit scores -> softmax -> context steps (docs/trace.md, Attention).
    check_ids: False skips reading the ids back to check their range: for ids a sampler drew
    from this model's logits (a decoding step then queues without waiting for the device).
    """
    if attention is not None and getattr(model, "granularity", "op") == "module":
        raise TraceError("attention=: a module-level model runs its own attention modules (no scores step)")
    if getattr(model, "granularity", "op") == "module":  # a reference model: its module calls are the steps
        return model.module_trace(ids_or_text, capture=capture, dtype=dtype, breakpoints=breakpoints,
                                  interventions=interventions, cache=cache, attention_mask=attention_mask,
                                  pad_id=pad_id, memory_budget=memory_budget, spill_dir=spill_dir,
                                  flush_bytes=flush_bytes, store=store, key_prefix=key_prefix,
                                  check_ids=check_ids, **extra)
    if extra:
        raise TraceError(f"{', '.join(extra)}: only a module-level model (workbench.load(..., "
                         "granularity='module')) takes images or audio")
    ids, mask, batched = prepare_ids(model, ids_or_text, pad_id)
    if attention_mask is not None:
        mask = attention_mask if isinstance(attention_mask, mx.array) else mx.array(attention_mask)
    dt = _parse_dtype(dtype)
    program = model.program_for(attention) if attention is not None else model.program
    feeds = model.feeds(ids, attention_mask=mask, cache=cache, check_ids=check_ids)
    ctx = model.context(dt, cache=cache)
    check_attention_memory(program, ids.shape[0], ids.shape[1],
                           (cache.offset if cache is not None else 0) + ids.shape[1], ctx.dtype)

    def context(dtype, cache):
        return model.context(dtype, cache=cache)

    def tensors(name):  # the ops only one attention choice has (scores, softmax ...) read no weights
        return model.op_tensors(name) if name in model.program else {}

    return Trace(program, ctx, feeds, capture=capture, breakpoints=breakpoints,
                 interventions=interventions, context=context, tensors=tensors,
                 memory_budget=memory_budget, spill_dir=spill_dir, flush_bytes=flush_bytes,
                 store=store, key_prefix=key_prefix, model=model, batched=batched, ids=ids,
                 attention_mask=mask)


def available_memory() -> int | None:
    """Bytes this process may still allocate: MemAvailable (Linux), else None (unknown)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f.read(65536).splitlines():
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_attention_memory(program, batch: int, tokens: int, keys: int, dtype, available: int | None = None) -> None:
    """Refuse, before anything runs, a prompt whose explicit attention scores cannot fit:
    one layer's scores and softmax ([B, H, T, S] each, alive together) must take at most
    half of the memory available.  Fused attention (the default) materialises no scores:
    a program without explicit layers is never refused."""
    explicit = [op for op in program.ops if op.kind == "scores"]
    heads = max((int(op.attrs.get("num_heads") or 0) for op in explicit), default=0)
    if not heads:
        return
    q = explicit[0].attrs.get("queries")
    if q is not None:  # explicit for a range of query positions only: that many rows at most
        tokens = min(tokens, q[1] - q[0])
    itemsize = dtype.size if dtype is not None else 4
    need = 2 * batch * heads * tokens * keys * itemsize
    avail = available_memory() if available is None else available
    if avail is not None and need > avail // 2:
        raise TraceError(f"a {tokens}-token prompt needs {need / 2**30:.1f} GiB for one layer's attention scores "
                         f"and softmax ([{batch}, {heads}, {tokens}, {keys}] x 2, {dtype_name(dtype)}); "
                         f"{avail / 2**30:.1f} GiB is available: use fused attention (attention='fused', the default; "
                         f"--attention fused) or a shorter prompt (at most about "
                         f"{int((avail // 2 / (2 * batch * heads * itemsize)) ** 0.5)} tokens here)")
