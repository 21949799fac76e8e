"""What every causal tool shares: metrics, running a prompt, the residual stream's writers.

Metrics are functions of the logits ``[B, T, vocab]`` (an ``mx.array``) returning one
number per sequence (a numpy array ``[B]``); the tools average them over the batch.

* :func:`logit_diff` -- ``logit[answer] - logit[wrong]`` at one position (the default of
  activation patching, with the clean and corrupted runs' own top tokens);
* :func:`token_prob` -- the probability of a token at one position;
* :func:`next_token_prob` -- teacher forcing: the mean probability of the actual next
  token over a set of positions (e.g. the second half of a copy prompt).

Any callable ``f(logits) -> float or [B]`` is a metric too.

:func:`residual_chain` reads the residual stream off a model's op program: the ops it
passes through from the embedding to the final norm, and at each ``add`` the writer
(attention, MLP, per-layer input) whose output is added.  Ablation, patching and direct
logit attribution name their sites through it, so they work on every family the same way.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import mlx.core as mx
import numpy as np

import workbench.trace as wtrace
from workbench.text import single_token
from workbench.trace.entry import show_value, check_token_id, check_token_ids, vocab_size

DEFAULT_DTYPE = "float32"


# --------------------------------------------------------------------------- metrics

@dataclass(frozen=True)
class Metric:
    """A named metric: ``metric(logits [B, T, V]) -> np.ndarray [B]``.

    ``bind(model)`` (when set) gives the metric for that model: the token ids it reads
    checked against the model's vocabulary and token texts encoded with its tokenizer;
    the causal tools bind every metric before running anything."""

    label: str
    fn: Callable[[mx.array], Any] = field(repr=False, compare=False)
    bind: Callable[[Any], "Metric"] | None = field(default=None, repr=False, compare=False)
    #: once bound: (text, id) of every token it reads, e.g. ((" blue", 3730), (" red", 2604))
    tokens: tuple = field(default=(), compare=False)

    @property
    def token_ids(self) -> str:
        """Which id each token became, in one line (``' blue' = 3730, ' red' = 2604``)."""
        return ", ".join(f"{t!r} = {i}" for t, i in self.tokens)

    def __call__(self, logits: mx.array) -> np.ndarray:
        out = self.fn(logits if logits.ndim == 3 else logits[None])
        return np.atleast_1d(np.asarray(out, dtype=np.float64))


def as_metric(metric, model=None) -> Metric:
    """``metric`` as a :class:`Metric`; bound to ``model`` (its token ids checked against the
    vocabulary, its token texts encoded) when given."""
    if not isinstance(metric, Metric):
        if not callable(metric):
            raise TypeError(f"a metric is a callable f(logits) -> float or [B], not {show_value(metric)}")
        metric = Metric(getattr(metric, "__name__", "metric"), metric)
    if model is not None and metric.bind is not None:
        return metric.bind(model)
    return metric


# a token as the metrics and tools take it: an id, the text of one token, or one per sequence

def _id_phrase(what: str) -> str:
    return f"{what} id" if what.endswith("token") else f"{what} token id"


def token_spec(value, what: str):
    """What can be checked of a token before the model is known: an int id (not a boolean:
    its range waits for the model), a str (one token's text, encoded when the model is
    known), or a tuple of either (one per sequence of the batch)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (mx.array, np.ndarray)):
        if value.ndim == 0:
            return token_spec(value.item(), what) if isinstance(value, mx.array) else token_spec(value[()], what)
        return tuple(check_token_ids(value, None, _id_phrase(what), check_range=False))
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{what}: an empty list of tokens")
        return tuple(v if isinstance(v, str) else check_token_id(v, None, _id_phrase(what), check_range=False)
                     for v in value)
    return check_token_id(value, None, _id_phrase(what), check_range=False)


def token_id(model, value, what: str = "token", first_token: bool = False) -> int:
    """One token as an id of ``model``: an integer id in its vocabulary, or a text that its
    tokenizer encodes to exactly one token (:func:`workbench.text.single_token`: a text of
    several is one ValueError naming its pieces, unless ``first_token=True``); else one
    ValueError / TypeError naming it."""
    if isinstance(value, str):
        tok = getattr(model, "tokenizer", None)
        if tok is None:
            raise ValueError(f"{what} {value!r} is text, but this checkpoint has no tokenizer.json: pass a token id")
        return check_token_id(single_token(tok, value, what, first_token), vocab_size(model),
                              f"{what} {value!r} -> token id")
    return check_token_id(value, vocab_size(model), _id_phrase(what))


def resolve_tokens(model, spec, what: str, first_token: bool = False):
    """A :func:`token_spec` for ``model``: an int, or a tuple of ints (one per sequence)."""
    if isinstance(spec, tuple):
        return tuple(token_id(model, v, what, first_token) for v in spec)
    return token_id(model, spec, what, first_token)


def token_text(model, tid: int) -> str:
    """The text of token ``tid`` (its id as text when the model has no tokenizer)."""
    try:
        return model.decode([int(tid)])
    except ValueError:
        return str(int(tid))


def _bound_label(model, ids) -> tuple[str, tuple]:
    """(label, ((text, id), ...)) of resolved ids: each token shown as its text."""
    if isinstance(ids, tuple):
        parts = [_bound_label(model, i) for i in ids]
        return "[" + ", ".join(p[0] for p in parts) + "]", tuple(t for p in parts for t in p[1])
    text = token_text(model, ids)
    return repr(text), ((text, int(ids)),)


def _spec_label(spec) -> str:
    if isinstance(spec, tuple):
        return "[" + ", ".join(_spec_label(v) for v in spec) + "]"
    return repr(spec) if isinstance(spec, str) else str(spec)


def _applied(spec, V: int, what: str):
    """The spec's ids, checked against logits of ``V`` entries, before any gather."""
    def one(v):
        if isinstance(v, str):
            raise TypeError(f"{what} {v!r} is text: a metric reads token ids; give it to a causal tool with the "
                            "model (which encodes it), or call metric.bind(model) first")
        return check_token_id(v, V, _id_phrase(what))
    return tuple(one(v) for v in spec) if isinstance(spec, tuple) else one(spec)


def _per_row(tokens, B: int, what: str = "token") -> mx.array:
    t = np.asarray(tokens, dtype=np.int32).reshape(-1)
    if t.size not in (1, B):
        raise ValueError(f"{what}: {t.size} token ids for a batch of {B} (one, or one per sequence)")
    return mx.array(np.broadcast_to(t, (B,)))[:, None]


def check_position(position, what: str = "position") -> int:
    if isinstance(position, (bool, np.bool_)) or not isinstance(position, (int, np.integer)):
        raise TypeError(f"{what} must be an integer (negative counts from the end), not {show_value(position)}")
    return int(position)


def _at(logits: mx.array, position: int, what: str = "position") -> mx.array:
    T = logits.shape[1]
    if not -T <= position < T:
        raise ValueError(f"{what} {position} out of range for {T} positions")
    return logits[:, position, :]


def logit_diff(answer, wrong=None, position: int = -1, first_token: bool = False) -> Metric:
    """``logit[answer] - logit[wrong]`` at ``position`` (just ``logit[answer]`` when ``wrong``
    is None).  ``answer`` / ``wrong``: a token id, the text of one token (``" blue"``: encoded
    with the model's tokenizer when a causal tool binds the metric; a text of several tokens
    is refused, naming its pieces, unless ``first_token=True``), or one per sequence of the
    batch.  Ids are checked against the vocabulary before anything reads the logits.  Bound,
    its label shows each token as text (``logit[' blue'] - logit[' red'] @ -1``, also for
    ids) and ``metric.token_ids`` says which id each became."""
    a = token_spec(answer, "answer")
    w = None if wrong is None else token_spec(wrong, "wrong")
    position = check_position(position)
    label = f"logit[{_spec_label(a)}]" + ("" if w is None else f" - logit[{_spec_label(w)}]") + f" @ {position}"

    def fn(logits):
        V = logits.shape[-1]
        ia = _applied(a, V, "answer")
        iw = None if w is None else _applied(w, V, "wrong")
        x = _at(logits, position).astype(mx.float32)
        B = x.shape[0]
        v = mx.take_along_axis(x, _per_row(ia, B, "answer"), axis=-1)[:, 0]
        if iw is not None:
            v = v - mx.take_along_axis(x, _per_row(iw, B, "wrong"), axis=-1)[:, 0]
        return np.array(v)

    def bind(model):
        ra = resolve_tokens(model, a, "answer", first_token)
        rw = None if w is None else resolve_tokens(model, w, "wrong", first_token)
        la, ta = _bound_label(model, ra)
        lw, tw = ("", ()) if rw is None else _bound_label(model, rw)
        text = f"logit[{la}]" + ("" if rw is None else f" - logit[{lw}]") + f" @ {position}"
        return Metric(text, logit_diff(ra, rw, position).fn, tokens=ta + tw)
    return Metric(label, fn, bind)


def token_prob(token, position: int = -1, first_token: bool = False) -> Metric:
    """The probability of ``token`` (an id, the text of one token, or one per sequence) at
    ``position``; bound, labelled with the token's text (as :func:`logit_diff`)."""
    t = token_spec(token, "token")
    position = check_position(position)
    label = f"p({_spec_label(t)}) @ {position}"

    def fn(logits):
        it = _applied(t, logits.shape[-1], "token")
        p = mx.softmax(_at(logits, position).astype(mx.float32), axis=-1, precise=True)
        return np.array(mx.take_along_axis(p, _per_row(it, p.shape[0], "token"), axis=-1)[:, 0])

    def bind(model):
        r = resolve_tokens(model, t, "token", first_token)
        text, toks = _bound_label(model, r)
        return Metric(f"p({text}) @ {position}", token_prob(r, position).fn, tokens=toks)
    return Metric(label, fn, bind)


def next_token_prob(ids, positions: Sequence[int]) -> Metric:
    """Teacher forcing: the mean over ``positions`` of the probability the model gives to
    the token that actually comes next (``ids[:, p + 1]``).  ``ids``: [T] or [B, T]."""
    what = "next_token_prob: token id"
    if isinstance(ids, mx.array):
        ids = np.array(ids.astype(mx.float32) if ids.dtype == mx.bfloat16 else ids)
    if isinstance(ids, np.ndarray):
        if ids.ndim not in (1, 2) or ids.size == 0:
            raise ValueError(f"next_token_prob: ids must be [T] or [B, T], got shape {tuple(ids.shape)}")
        arr = np.asarray(check_token_ids(ids, None, what), dtype=np.int64).reshape(ids.shape)
    else:  # a list: checked one id at a time (a huge int would not fit numpy)
        seqs = list(ids) if isinstance(ids, (list, tuple)) else None
        if not seqs:
            raise ValueError(f"next_token_prob: ids must be [T] or [B, T] token ids, not {show_value(ids)}")
        if all(isinstance(r, (list, tuple, np.ndarray, mx.array)) for r in seqs):
            rows = [check_token_ids(r, None, what) for r in seqs]
        else:
            rows = [check_token_ids(seqs, None, what)]
        if len({len(r) for r in rows}) != 1:
            raise ValueError("next_token_prob: the sequences of ids must have one length")
        arr = np.array(rows, dtype=np.int64)
    ids = np.atleast_2d(arr)
    pos = [check_position(p, "next_token_prob: position") % ids.shape[1] for p in positions]
    if not pos or max(pos) + 1 >= ids.shape[1]:
        raise ValueError(f"next_token_prob: positions {list(positions)} need a next token within {ids.shape[1]}")
    target_ids = ids[:, [p + 1 for p in pos]]  # [B, P]
    targets = mx.array(target_ids.astype(np.int32))
    label = f"p(next token) over {len(pos)} positions"

    def fn(logits):
        check_token_ids(target_ids, logits.shape[-1], what)
        if max(pos) >= logits.shape[1]:
            raise ValueError(f"next_token_prob: position {max(pos)} out of range for {logits.shape[1]} positions")
        p = mx.softmax(logits[:, pos, :].astype(mx.float32), axis=-1, precise=True)  # [B, P, V]
        return np.array(mx.take_along_axis(p, targets[..., None], axis=-1)[..., 0].mean(axis=-1))

    def bind(model):
        check_token_ids(target_ids, vocab_size(model), what)
        return Metric(label, fn)
    return Metric(label, fn, bind)


# --------------------------------------------------------------------------- running

@dataclass
class Prompt:
    """Token ids [B, T] and the attention mask (None without padding) of a prompt."""

    ids: mx.array
    mask: mx.array | None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.ids.shape)

    def valid(self) -> np.ndarray:
        """[B, T] bool: the real (not padded) positions."""
        if self.mask is None:
            return np.ones(self.shape, dtype=bool)
        return np.array(self.mask).astype(bool)

    def repeat(self, n: int) -> "Prompt":
        if self.shape[0] != 1:
            raise ValueError("only a single prompt can be repeated into a batch")
        return Prompt(mx.repeat(self.ids, n, axis=0), None if self.mask is None else mx.repeat(self.mask, n, axis=0))


def prompt(model, text_or_ids) -> Prompt:
    """Text, ids, or a batch of either (left padded) as a :class:`Prompt`."""
    if isinstance(text_or_ids, Prompt):
        return text_or_ids
    ids, mask, _ = wtrace.prepare_ids(model, text_or_ids)
    return Prompt(ids, mask)


def run(model, p: Prompt, capture=None, interventions=None, dtype=DEFAULT_DTYPE, attention=None):
    """A finished :class:`~workbench.trace.Trace` of ``model`` on ``p`` (``attention``: as
    ``model.trace`` takes it; "explicit" for the softmax steps)."""
    tr = wtrace.trace(model, p.ids, capture=capture, dtype=dtype, interventions=interventions or None,
                      positions=wtrace.Positions(attention_mask=p.mask), run=wtrace.Run(attention=attention))
    tr.run()
    return tr


def logits3(tr) -> mx.array:
    """The trace's logits [B, T, V] (``tr.logits`` keeps the batch axis; a 2-D array, from a
    bare program, gets one)."""
    x = tr.logits
    return x if x.ndim == 3 else x[None]


def decode_tokens(model, ids) -> list[str]:
    """One string per token id (the ids as text when the model has no tokenizer)."""
    return [token_text(model, i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]


def require_op(model, name: str):
    try:
        return model.program[name]
    except KeyError:
        raise ValueError(f"this model ({model.family}) has no op {name!r} (see docs/ops.md)") from None


# --------------------------------------------------------------------------- the residual stream

@dataclass(frozen=True)
class ChainStep:
    """One op on the residual stream: an ``add`` of a writer, or a linear map of the stream."""

    op: str
    kind: str  # "add" (op = residual + writer) or "linear" (op = f(residual), f linear: scale, identity)
    writer: str | None = None
    component: str | None = None  # "attn" | "mlp" | "ple" | the writer's name
    layer: int | None = None

    @property
    def label(self) -> str:
        name = self.component or self.op
        return f"L{self.layer} {name}" if self.layer is not None else name


@dataclass(frozen=True)
class ResidualChain:
    start: str                  # the first residual value (the token embedding)
    steps: tuple[ChainStep, ...]
    norm: str                   # the final norm, reading the last residual value
    unembed: str                # the op after it (lm_head)

    def writers(self, component: str | None = None) -> list[ChainStep]:
        return [s for s in self.steps if s.kind == "add" and (component is None or s.component == component)]

    def residuals(self) -> list[tuple[str, str]]:
        """(label, op) of the residual stream: the embedding, then after each layer."""
        out = [("embed", self.start)]
        out += [(f"L{s.layer}", s.op) for s in self.steps if s.layer is not None and s.op == f"layers.{s.layer}"]
        return out


def _component(add_op: str, writer: str) -> str:
    if add_op.endswith(".attn_residual") or ".self_attn." in writer:
        return "attn"
    if add_op.endswith(".per_layer_residual"):
        return "ple"
    return "mlp"


def residual_chain(program) -> ResidualChain:
    """Walk the residual stream back from the final norm (``norm``) to the embedding."""
    names = set(program.names)
    if "norm" not in names or "lm_head" not in names:
        raise ValueError("the program has no 'norm' / 'lm_head' op: cannot find its residual stream")
    steps = []
    name = program["norm"].inputs[0]
    while True:
        op = program[name]
        if op.kind == "add" and len(op.inputs) == 2:
            res, writer = op.inputs
            steps.append(ChainStep(name, "add", writer, _component(name, writer), op.layer))
        elif op.kind in ("scale", "output") and len(op.inputs) == 1:
            steps.append(ChainStep(name, "linear", layer=op.layer))
            res = op.inputs[0]
        else:
            break
        name = res
    return ResidualChain(name, tuple(reversed(steps)), "norm", "lm_head")
