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

DEFAULT_DTYPE = "float32"


# --------------------------------------------------------------------------- metrics

@dataclass(frozen=True)
class Metric:
    """A named metric: ``metric(logits [B, T, V]) -> np.ndarray [B]``."""

    label: str
    fn: Callable[[mx.array], Any] = field(repr=False, compare=False)

    def __call__(self, logits: mx.array) -> np.ndarray:
        out = self.fn(logits if logits.ndim == 3 else logits[None])
        return np.atleast_1d(np.asarray(out, dtype=np.float64))


def as_metric(metric) -> Metric:
    if isinstance(metric, Metric):
        return metric
    if not callable(metric):
        raise TypeError(f"a metric is a callable f(logits) -> float or [B], not {metric!r}")
    return Metric(getattr(metric, "__name__", "metric"), metric)


def _per_row(tokens, B: int) -> mx.array:
    t = mx.array(np.broadcast_to(np.asarray(tokens, dtype=np.int32), (B,)))
    return t[:, None]


def logit_diff(answer, wrong=None, position: int = -1) -> Metric:
    """``logit[answer] - logit[wrong]`` at ``position`` (just ``logit[answer]`` when ``wrong``
    is None).  ``answer`` / ``wrong``: a token id, or one per sequence of the batch."""
    def fn(logits):
        x = logits[:, position, :].astype(mx.float32)
        B = x.shape[0]
        v = mx.take_along_axis(x, _per_row(answer, B), axis=-1)[:, 0]
        if wrong is not None:
            v = v - mx.take_along_axis(x, _per_row(wrong, B), axis=-1)[:, 0]
        return np.array(v)
    return Metric(f"logit[{answer}]" + ("" if wrong is None else f" - logit[{wrong}]") + f" @ {position}", fn)


def token_prob(token, position: int = -1) -> Metric:
    """The probability of ``token`` (an id, or one per sequence) at ``position``."""
    def fn(logits):
        p = mx.softmax(logits[:, position, :].astype(mx.float32), axis=-1, precise=True)
        return np.array(mx.take_along_axis(p, _per_row(token, p.shape[0]), axis=-1)[:, 0])
    return Metric(f"p({token}) @ {position}", fn)


def next_token_prob(ids, positions: Sequence[int]) -> Metric:
    """Teacher forcing: the mean over ``positions`` of the probability the model gives to
    the token that actually comes next (``ids[:, p + 1]``).  ``ids``: [T] or [B, T]."""
    ids = np.atleast_2d(np.asarray(ids.tolist() if isinstance(ids, mx.array) else ids, dtype=np.int64))
    pos = [int(p) % ids.shape[1] for p in positions]
    if not pos or max(pos) + 1 >= ids.shape[1]:
        raise ValueError(f"next_token_prob: positions {list(positions)} need a next token within {ids.shape[1]}")
    targets = mx.array(ids[:, [p + 1 for p in pos]].astype(np.int32))  # [B, P]

    def fn(logits):
        p = mx.softmax(logits[:, pos, :].astype(mx.float32), axis=-1, precise=True)  # [B, P, V]
        return np.array(mx.take_along_axis(p, targets[..., None], axis=-1)[..., 0].mean(axis=-1))
    return Metric(f"p(next token) over {len(pos)} positions", fn)


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
                      attention_mask=p.mask, attention=attention)
    tr.run()
    return tr


def logits3(tr) -> mx.array:
    """The trace's logits as [B, T, V] whatever the batch."""
    x = tr.logits
    return x if x.ndim == 3 else x[None]


def decode_tokens(model, ids) -> list[str]:
    """One string per token id (the ids as text when the model has no tokenizer)."""
    ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
    try:
        return [model.decode([i]) for i in ids]
    except ValueError:
        return [str(i) for i in ids]


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
