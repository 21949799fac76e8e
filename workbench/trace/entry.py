"""The model-level entry: :func:`trace` (what ``model.trace(...)`` and ``workbench.trace(model,
...)`` call) and :func:`prepare_ids` (text, ids, or a batch of either -> padded ids and mask)."""
from __future__ import annotations

from typing import Mapping

import mlx.core as mx
import numpy as np

from workbench import device_memory
from workbench.dtypes import dtype_name, parse_dtype
from workbench.trace.logits import Pruned
from workbench.trace.logits import resolve as resolve_logits
from workbench.trace.options import Positions, Run, Storage, flat, resolve
from workbench.trace.step import TraceError
from workbench.trace.tracer import Trace


# --------------------------------------------------------------------------- token ids

def show_value(v) -> str:
    """A value for a one-line message: its repr, on one line, at most about 40 characters."""
    s = repr(v) if not isinstance(v, int) or len(str(abs(v))) <= 40 else f"{str(v)[:12]}...({len(str(abs(v)))} digits)"
    s = " ".join(s.split())
    return s if len(s) <= 48 else s[:40] + "..."


def vocab_size(model) -> int | None:
    """The model's vocabulary size (what a token id must stay below), None where unknown."""
    v = getattr(model, "vocab_size", None)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _domain(vocab: int | None) -> str:
    return (f"token ids are integers in [0, {vocab}) (a vocabulary of {vocab})" if vocab is not None
            else "token ids are integers in [0, the vocabulary size)")


def _range_error(what: str, i: int, vocab: int | None) -> ValueError:
    if vocab is None:  # a model that does not say its vocabulary: int32 ids at least
        return ValueError(f"{what} {show_value(i)} out of range: token ids are integers in [0, 2**31)")
    return ValueError(f"{what} {show_value(i)} out of range for a vocabulary of {vocab}")


def check_token_id(value, vocab: int | None = None, what: str = "token id", *, check_range: bool = True) -> int:
    """``value`` as a token id: a Python or numpy integer (not a boolean) in ``[0, vocab)``
    (``[0, 2**31)`` when ``vocab`` is None); else one TypeError / ValueError naming it and
    the vocabulary size.  Checked here, before any gather: MLX gathers do not check bounds.
    ``check_range=False`` checks the type only (the range waits for the model)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} {value!r} is a boolean, not a token id: {_domain(vocab)}")
    if not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} {show_value(value)} is a {type(value).__name__}, not an integer: {_domain(vocab)}")
    i = int(value)
    if check_range and (i < 0 or i >= (vocab if vocab is not None else 2**31)):
        raise _range_error(what, i, vocab)
    return i


def check_token_ids(values, vocab: int | None = None, what: str = "token id", *, check_range: bool = True) -> list[int]:
    """A sequence of token ids (flattened), each checked as :func:`check_token_id` does; of
    a numpy or MLX array, the dtype first, then its smallest and largest id."""
    if isinstance(values, mx.array):
        if values.dtype == mx.bfloat16:
            values = values.astype(mx.float32)
        values = np.array(values)
    if isinstance(values, np.ndarray):
        flat = values.reshape(-1)
        if flat.dtype.kind in "iu":
            if flat.size and check_range:
                lo, hi = int(flat.min()), int(flat.max())
                if lo < 0:
                    raise _range_error(what, lo, vocab)
                if hi >= (vocab if vocab is not None else 2**31):
                    raise _range_error(what, hi, vocab)
            return flat.astype(np.int64).tolist()
        if flat.dtype.kind != "O":
            first = show_value(flat[0].item()) if flat.size else "(none)"
            kind = "a boolean" if flat.dtype.kind == "b" else f"a {flat.dtype}"
            raise TypeError(f"{what} {first} is {kind} (an array of dtype {flat.dtype}), not an integer: "
                            f"{_domain(vocab)}")
        values = flat.tolist()
    return [check_token_id(v, vocab, what, check_range=check_range) for v in values]


def _parse_dtype(dtype):
    if dtype is None or isinstance(dtype, mx.Dtype):
        return dtype
    return parse_dtype(dtype)


def prepare_ids(model, ids_or_text, pad_id: int | None = None):
    """(ids [B, T] int32, attention_mask [B, T] or None, batched) from text, token ids, or
    lists of either (left padded with ``pad_id``, default the config's pad_token_id or 0).

    Every id is checked before anything reads it (MLX gathers do not check bounds): an
    integer (Python, numpy or an integer array; never a boolean or a float) in
    ``[0, vocab_size)``, else one TypeError / ValueError naming the id and the vocabulary.
    An int32 (or narrower) ``mx.array`` is taken as given, without a read back: the model's
    feeds check its range (``check_ids``)."""
    vocab = vocab_size(model)
    if pad_id is not None:
        pad_id = check_token_id(pad_id, vocab, "pad_id")
    x = ids_or_text
    if isinstance(x, np.ndarray):
        if x.ndim not in (1, 2):
            raise ValueError(f"token ids must be [T] or [B, T], got shape {tuple(x.shape)}")
        if x.size == 0:
            raise ValueError("no tokens to run")
        flat = check_token_ids(x, vocab)
        x = mx.array(np.asarray(flat, dtype=np.int32).reshape(x.shape))
    if isinstance(x, str):
        seqs, batched = [model.encode(x)], False
    elif isinstance(x, mx.array):
        if x.ndim not in (1, 2):
            raise ValueError(f"token ids must be [T] or [B, T], got shape {tuple(x.shape)}")
        if x.size == 0:
            raise ValueError("no tokens to run")
        if x.dtype == mx.bool_ or not mx.issubdtype(x.dtype, mx.integer):
            check_token_ids(x.reshape(-1)[:1], vocab)  # raises, naming the dtype and the first id
        if x.dtype in (mx.int64, mx.uint32, mx.uint64):  # the cast to int32 would wrap: check first
            lo, hi = mx.stack([mx.min(x), mx.max(x)]).tolist()  # (one read back)
            check_token_ids([lo, hi], vocab)
        # as given: no round trip through the host (the feeds check the id range)
        return (x[None] if x.ndim == 1 else x).astype(mx.int32), None, x.ndim == 2
    elif isinstance(x, (list, tuple)):
        if len(x) == 0:
            raise ValueError("no tokens to run")
        if all(isinstance(e, str) for e in x):
            seqs, batched = [model.encode(s) for s in x], True
        elif all(isinstance(e, (list, tuple, mx.array, np.ndarray)) for e in x):
            for e in x:
                if isinstance(e, (mx.array, np.ndarray)) and e.ndim != 1:
                    raise ValueError(f"a sequence of a batch must be [T] token ids, got shape {tuple(e.shape)}")
            seqs, batched = [check_token_ids(e, vocab) for e in x], True
        elif not any(isinstance(e, (str, list, tuple, mx.array, np.ndarray)) for e in x):
            seqs, batched = [check_token_ids(x, vocab)], False
        else:
            raise ValueError("pass a string, a list of token ids, or a list of strings / id lists")
    else:
        raise TypeError(f"cannot run {type(x).__name__}: pass text or token ids")
    for s in seqs:
        if len(s) == 0:
            raise ValueError("an empty sequence (the text encodes to no tokens)")
    T = max(len(s) for s in seqs)
    if all(len(s) == T for s in seqs):
        return mx.array(seqs, dtype=mx.int32), None, batched
    if pad_id is None:
        config = getattr(model, "config", None) or {}
        pad_id = config.get("pad_token_id") if isinstance(config, Mapping) else None
        pad_id = check_token_id(0 if pad_id is None else pad_id, vocab, "the config's pad_token_id")
    ids = [[pad_id] * (T - len(s)) + list(s) for s in seqs]
    mask = [[0] * (T - len(s)) + [1] * len(s) for s in seqs]
    return mx.array(ids, dtype=mx.int32), mx.array(mask, dtype=mx.bool_), batched


def trace(model, ids_or_text, capture="stats", dtype=None, breakpoints=None, interventions=None, *,
          positions: Positions | None = None, run: Run | None = None, storage: Storage | None = None,
          images=None, audio=None, **deprecated) -> Trace:
    """A :class:`Trace` of ``model`` on text, token ids, or a batch of either.

    capture: ``"stats"`` (default) | ``"full"`` | [name patterns] | None.
    dtype: compute dtype (``"float32"``, ``"bfloat16"``, ``"float16"``) whatever the
    storage dtype; None uses the model's default.
    breakpoints, interventions: where :meth:`Trace.run` stops; what changes op outputs.
    Batches are left padded and masked.  ``.logits`` is [B, T, vocab] (B = 1 for one sequence).
    positions: :class:`~workbench.trace.options.Positions` -- the positions the head
    computes (``logits``), ``prune``, a batch's ``pad_id`` / ``attention_mask``.
    run: :class:`~workbench.trace.options.Run` -- ``attention`` (fused / explicit / which
    layers), the KV ``cache``, ``check_ids``.
    storage: :class:`~workbench.trace.options.Storage` -- where captured values are kept
    (``memory_budget``, ``spill_dir``, ``flush_bytes``, ``store``, ``key_prefix``).
    Each group may be a dict of its fields.  images, audio: what a multimodal module-level
    model reads beside the text (:mod:`workbench.reference.media`).

    ``deprecated``: the old flat keywords (``attention=``, ``logits=``, ``cache=`` ...), for
    one release: one DeprecationWarning per call names the new spelling; any other keyword
    is a TypeError naming it and the groups (:func:`workbench.trace.options.resolve`).
    """
    groups = resolve({"positions": positions, "run": run, "storage": storage}, deprecated)
    pos, how, keep = groups["positions"], groups["run"], groups["storage"]
    module = model.granularity == "module"
    if how.attention is not None and module:
        raise TraceError("attention=: a module-level model runs its own attention modules (no scores step)")
    if pos.prune and module:
        raise TraceError("prune=True: a module-level model runs its own modules on every row; "
                         "load it with granularity='op' to prune")
    if module:  # a reference model: its module calls are the steps
        kw = flat(pos, how, keep)
        del kw["attention"], kw["prune"]
        media = {k: v for k, v in (("images", images), ("audio", audio)) if v is not None}
        return model.module_trace(ids_or_text, capture=capture, dtype=dtype, breakpoints=breakpoints,
                                  interventions=interventions, **kw, **media)
    if images is not None or audio is not None:
        given = ", ".join(k for k, v in (("images", images), ("audio", audio)) if v is not None)
        raise TraceError(f"{given}: only a module-level model (workbench.load(..., "
                         "granularity='module')) takes images or audio")
    cache = how.cache
    ids, mask, batched = prepare_ids(model, ids_or_text, pos.pad_id)
    if pos.attention_mask is not None:
        mask = pos.attention_mask if isinstance(pos.attention_mask, mx.array) else mx.array(pos.attention_mask)
    dt = _parse_dtype(dtype)
    program = model.program_for(how.attention, prune=True) if pos.prune else \
        model.program_for(how.attention) if how.attention is not None else model.program
    ctx = model.context(dt, cache=cache)
    rows = resolve_logits(pos.logits, ids.shape[1], ids.shape[0], vocab_size(model), ctx.dtype)
    pruned = pruned_rows(program, rows, model) if pos.prune else None
    feeds = model.feeds(ids, attention_mask=mask, cache=cache, check_ids=how.check_ids)
    ctx.logit_rows = rows
    check_attention_memory(program, ids.shape[0], ids.shape[1],
                           (cache.offset if cache is not None else 0) + ids.shape[1], ctx.dtype)

    def context(dtype, cache):
        c = model.context(dtype, cache=cache)
        c.logit_rows = rows
        return c

    def tensors(name):  # the ops only one attention choice has (scores, softmax ...) read no weights
        return model.op_tensors(name) if name in model.program else {}

    tr = Trace(program, ctx, feeds, capture=capture, breakpoints=breakpoints,
               interventions=interventions, context=context, tensors=tensors,
               memory_budget=keep.memory_budget, spill_dir=keep.spill_dir, flush_bytes=keep.flush_bytes,
               store=keep.store, key_prefix=keep.key_prefix, model=model, batched=batched, ids=ids,
               attention_mask=mask)
    tr.logit_rows = rows
    tr.pruned = pruned
    return tr


def pruned_rows(program, rows, model) -> Pruned:
    """What ``prune=True`` leaves out of ``program`` (built with its ``live_rows`` op) for
    the logit positions ``rows``; a TraceError when the family has no such op."""
    op = next((o.name for o in program.ops if o.kind == "rows"), None)
    if op is None:
        family = getattr(model, "family", None)
        raise TraceError(f"prune=True: nothing to prune in this {family + ' ' if family else ''}model: only layers "
                         "that write no KV cache (Gemma 4's KV-shared layers, num_kv_shared_layers) reach no other "
                         "position")
    return Pruned(op, rows.first, rows.T)


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
    avail = device_memory.available_memory()[0] if available is None else available
    if avail is not None and need > avail // 2:
        raise TraceError(f"a {tokens}-token prompt needs {need / 2**30:.1f} GiB for one layer's attention scores "
                         f"and softmax ([{batch}, {heads}, {tokens}, {keys}] x 2, {dtype_name(dtype)}); "
                         f"{avail / 2**30:.1f} GiB is available: use fused attention (attention='fused', the default; "
                         f"--attention fused) or a shorter prompt (at most about "
                         f"{int((avail // 2 / (2 * batch * heads * itemsize)) ** 0.5)} tokens here)")
