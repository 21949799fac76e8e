"""Small computations behind the plots, kept apart from the figures.

* :func:`residual_norms`: the L2 norm of the residual stream per layer and token;
* :func:`logit_lens`: each layer's residual stream projected through the model's own
  tail (the ops after the last layer: final norm, lm_head, soft-capping...), i.e. "what
  would the model predict if it stopped here".  The tail is re-run from the program, so
  whatever the family does after its last layer is done exactly as in the forward pass.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from workbench.arrays import as_ndim, to_numpy, weight_values  # noqa: F401  (weight_values re-exported: plots.weight_values)
from workbench.text import single_token

_RESID = re.compile(r"^layers\.(\d+)$")




def _tokens_dim(x: np.ndarray) -> np.ndarray:
    """[..., T, D] with leading size-1 dims dropped -> [T, D]."""
    return as_ndim(x, 2, "a [tokens, hidden] activation")


def residual_values(source: Any) -> dict[int, np.ndarray]:
    """``{layer: [T, D]}`` from a mapping of op values, a Trace, or a list of per-layer arrays."""
    if isinstance(source, Mapping):
        items = {int(m.group(1)): v for k, v in source.items() if (m := _RESID.match(k))}
    elif isinstance(source, (list, tuple)):
        items = dict(enumerate(source))
    elif hasattr(source, "ops") and hasattr(source, "value"):  # a Trace
        items = {}
        for k in source.ops:
            m = _RESID.match(k)
            if m:
                try:
                    items[int(m.group(1))] = source.value(k)
                except (KeyError, LookupError, ValueError):
                    continue
    else:
        raise TypeError(f"expected a mapping of op values, a list of arrays or a Trace, not {type(source).__name__}")
    if not items:
        raise ValueError("no residual-stream values (ops named layers.{i}) found; capture them "
                         "(capture='full', or a pattern such as 're:layers\\.\\d+')")
    return {k: _tokens_dim(to_numpy(v)) for k, v in sorted(items.items())}


@dataclass
class ResidualNorms:
    layers: list[int]
    norms: np.ndarray  # [L, T] L2 norm per layer and token
    embed: np.ndarray | None = None  # [T] norm of the embedding output (before layer 0), if given


def stream_input(values: Mapping[str, Any]) -> Any:
    """The residual stream entering layer 0: the last value before the first ``layers.*`` op
    (in the mapping's order, which is execution order) with the same shape as ``layers.0``."""
    first = next((k for k in values if k.startswith("layers.")), None)
    if first is None or "layers.0" not in values:
        return None
    shape = tuple(values["layers.0"].shape)
    before = list(values)[: list(values).index(first)]
    for k in reversed(before):
        if tuple(values[k].shape) == shape:
            return values[k]
    return None


def residual_norms(source: Any, embed: Any = None) -> ResidualNorms:
    """L2 norms per layer and token; ``embed`` (default: found in a mapping) is the stream entering layer 0."""
    vals = residual_values(source)
    layers = list(vals)
    norms = np.stack([np.sqrt(np.sum(vals[i].astype(np.float64) ** 2, axis=-1)) for i in layers])
    if embed is None and isinstance(source, Mapping):
        embed = stream_input(source)
    elif embed is None and hasattr(source, "program") and hasattr(source, "value"):  # a Trace
        first = next((op for op in source.program.ops if op.name.startswith("layers.0.")), None)
        if first is not None and first.inputs:
            try:
                embed = source.value(first.inputs[0])
            except (KeyError, LookupError, ValueError):
                embed = None
    e = None if embed is None else np.sqrt(np.sum(_tokens_dim(to_numpy(embed)).astype(np.float64) ** 2, axis=-1))
    return ResidualNorms(layers=layers, norms=norms, embed=e)


@dataclass
class LogitLens:
    """Per layer and position: the top predictions of the residual stream read through the tail."""

    layers: list[int]
    positions: list[int]
    top_ids: np.ndarray  # [L, P, k]
    top_probs: np.ndarray  # [L, P, k]
    entropy: np.ndarray  # [L, P] in nats
    final_ids: np.ndarray  # [P] the model's own top-1 prediction (last layer)
    final_rank: np.ndarray  # [L, P] rank of final_ids under each layer's distribution (0 = top)
    tokens: list[str] = field(default_factory=list)  # input tokens at `positions`, if decoded
    decode: Callable[[int], str] | None = field(default=None, repr=False)
    #: with ``track=``: {"token": its text, "id": the id it became, "prob": [L, P], "rank": [L, P]}
    tracked: dict = field(default_factory=dict)

    def label(self, tid: int) -> str:
        if self.decode is None:
            return str(int(tid))
        try:
            return self.decode(int(tid))
        except Exception:
            return str(int(tid))


def lens_tail(program) -> tuple[str, list]:
    """(name of the last residual op, the ops after it up to ``logits``) of a program."""
    names = program.names
    last = None
    for i, n in enumerate(names):
        if _RESID.match(n):
            last = i
    if last is None:
        raise ValueError("the program has no residual-stream ops (layers.{i})")
    return names[last], list(program.ops[last + 1:])


def project(program, ctx: Any, resid, tail=None):
    """Run the program's tail (final norm, lm_head, ...) on a residual value; returns logits (MLX)."""
    start, ops = tail if tail is not None else lens_tail(program)
    env = {start: resid}
    for op in ops:
        missing = [s for s in op.inputs if s not in env]
        if missing:
            raise ValueError(f"the tail op {op.name!r} reads {missing[0]!r}, which is not on the residual path; "
                             "the logit lens cannot replay it")
        env[op.name] = op.fn(ctx, *[env[s] for s in op.inputs])
    return env[ops[-1].name] if ops else resid


def _track_id(model: Any, track) -> int:
    """The lens's ``track=``: an integer id (range checked against the logits), or the text
    of one token (:func:`workbench.text.single_token`)."""
    if isinstance(track, str):
        tok = getattr(model, "tokenizer", None)
        if tok is None:
            raise ValueError(f"track {track!r} is text, but this model has no tokenizer: pass a token id")
        return single_token(tok, track, "track")
    if isinstance(track, (bool, np.bool_)) or not isinstance(track, (int, np.integer)) or track < 0:
        raise TypeError(f"track is a token id (an integer >= 0) or the text of one token, not {track!r}")
    return int(track)


def logit_lens(model: Any, source: Any = None, positions: Sequence[int] | None = None, k: int = 5,
               ids: Sequence[int] | None = None, decode: Callable[[int], str] | None = None,
               ctx: Any = None, track: int | str | None = None) -> LogitLens:
    """Project every ``layers.{i}`` value of ``source`` (a Trace or mapping) through the model's tail.

    ``logit_lens(trace)`` takes everything from a Trace (program, context, values, ids);
    otherwise ``model`` supplies ``program`` (and ``ctx`` unless given).  ``positions``
    default to the last 8 tokens; ``decode`` maps a token id to text (default: the
    model's tokenizer, if it has one).  Only ``positions`` go through the tail, with every
    row computed whatever ``logits=`` the trace ran with (``LogitLens.positions`` says which
    it has; the trace's own logits may hold fewer: ``trace.logit_positions``).
    ``track``: a token (an id, or the text of one token such as ``" blue"``: a text of several
    tokens is one error naming its pieces) whose probability and rank every layer gives at
    every position: ``LogitLens.tracked`` (its text, the id it became, ``prob``, ``rank``).
    """
    import mlx.core as mx

    if model.granularity == "module":
        # the reference's tail (final norm, head, soft-capping, scaling) is code we do not
        # re-run piecewise; projecting through part of it would give plausible wrong numbers
        raise ValueError("the logit lens projects through an op program's tail (norm, lm_head, soft-capping); "
                         "this is a module-level trace: load the checkpoint with granularity='op' where an op "
                         "program exists")
    if source is None and hasattr(model, "value") and hasattr(model, "program"):  # a Trace
        trace = model
        source, ctx = trace, ctx if ctx is not None else getattr(trace, "ctx", None)
        if ids is None:
            try:
                ids = np.array(trace.value("input_ids")).ravel().tolist()
            except (KeyError, LookupError, ValueError):
                ids = None
        model = getattr(trace, "model", None) or trace
    if source is None:
        raise TypeError("logit_lens(model, source): give the values (a Trace or a mapping of op values)")
    program = model.program
    if ctx is None:
        ctx = getattr(model, "ctx", None)
        if ctx is None and hasattr(model, "context"):
            ctx = model.context()
    tail = lens_tail(program)
    track_id = None if track is None else _track_id(model, track)
    if isinstance(source, Mapping):
        raw = {int(m.group(1)): v for kk, v in source.items() if (m := _RESID.match(kk))}
    else:
        raw = {}
        for kk in source.ops:
            m = _RESID.match(kk)
            if m:
                try:
                    raw[int(m.group(1))] = source.value(kk)
                except (KeyError, LookupError, ValueError):
                    continue
    if not raw:
        raise ValueError("no residual-stream values (layers.{i}) to project; capture them first")
    layers = sorted(raw)
    first = raw[layers[0]]
    T = first.shape[-2] if first.ndim >= 2 else 1
    if positions is None:
        positions = list(range(max(0, T - 8), T))
    positions = [p % T for p in positions]
    if getattr(ctx, "logit_rows", None) is not None:  # the lens projects its own positions, whatever the trace's
        import dataclasses
        ctx = dataclasses.replace(ctx, logit_rows=None)
    rows = mx.array(positions, dtype=mx.int32)
    top_ids, top_p, ent, logps = [], [], [], []
    for li in layers:
        v = raw[li]
        if not isinstance(v, mx.array):
            v = mx.array(to_numpy(v))
        # only the lens's positions go through the tail (a long prompt's [T, vocab] is never made)
        v = mx.take(v, rows, axis=v.ndim - 2) if v.ndim >= 2 else v
        logits = project(program, ctx, v, tail).astype(mx.float32)
        lg = np.array(logits).reshape(-1, logits.shape[-1])[:len(positions)]  # [P, V] (the first sequence)
        lg = lg - lg.max(-1, keepdims=True)
        lp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
        p = np.exp(lp)
        order = np.argsort(-lp, axis=-1)[:, :k]
        top_ids.append(order)
        top_p.append(np.take_along_axis(p, order, -1))
        ent.append(-(p * np.where(p > 0, lp, 0)).sum(-1))
        logps.append(lp)
    tracked = {}
    if track_id is not None:
        if not track_id < logps[0].shape[-1]:
            raise ValueError(f"track token id {track_id} is outside the vocabulary of {logps[0].shape[-1]}")
        tp = np.stack([lp[:, track_id] for lp in logps])  # [L, P] log-probabilities
        tracked = {"token": model.decode([track_id]) if getattr(model, "tokenizer", None) is not None
                   else str(track_id), "id": int(track_id), "prob": np.exp(tp),
                   "rank": np.stack([(lp > lp[:, track_id][:, None]).sum(-1) for lp in logps])}
    final = top_ids[-1][:, 0]
    ranks = np.stack([(lp > lp[np.arange(len(final)), final][:, None]).sum(-1) for lp in logps])
    if decode is None and getattr(model, "tokenizer", None) is not None and hasattr(model, "decode"):
        decode = lambda t, _m=model: _m.decode([t])
    tokens = []
    if ids is not None and decode is not None:
        ids = [int(i) for i in np.asarray(ids).ravel()]
        tokens = [decode(ids[p]) if p < len(ids) else "" for p in positions]
    return LogitLens(layers=layers, positions=positions, top_ids=np.stack(top_ids), top_probs=np.stack(top_p),
                     entropy=np.stack(ent), final_ids=final, final_rank=ranks, tokens=tokens, decode=decode,
                     tracked=tracked)
