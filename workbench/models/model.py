"""A loaded model: its config, its weights in a compute dtype, the run context, and
:class:`Model` (the checkpoint, its op program, tokenizer, feeds, and ``.trace``).

A family's config is checked against the checkpoint before anything is built
(:func:`check_checkpoint`: inspect's first error, in one line)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import mlx.core as mx

from workbench.dtypes import dtype_name, parse_dtype
from workbench.models.feeds import KVCache, make_feeds
from workbench.program import Program
from workbench.text import TextCodec
from workbench.traceable import provided


# --------------------------------------------------------------------------- config

class CheckpointMismatch(ValueError):
    """The checkpoint's tensors do not match its config.json (the message is inspect's first
    error, in one line)."""


def check_checkpoint(ck) -> None:
    """Refuse a checkpoint before anything is built or run: a config that cannot be read
    (ConfigError naming the key) or tensors that do not match it (CheckpointMismatch with
    inspect's first error; ``workbench inspect`` lists them all)."""
    from workbench.checkpoint.arch import ConfigError
    from workbench.checkpoint.inspect import inspect

    if ck.arch is None:
        raise ConfigError(ck.arch_error or "no usable config.json")
    errors = inspect(ck).errors
    if errors:
        more = f" (and {len(errors) - 1} more: `workbench inspect {ck.path}` lists them)" if len(errors) > 1 else ""
        raise CheckpointMismatch(f"checkpoint does not match its config: {errors[0].code}: "
                                 f"{errors[0].message}{more}")


# --------------------------------------------------------------------------- weights

class Weights(Mapping):
    """Checkpoint tensors by canonical name, floating ones converted to one compute dtype.

    Packed quantized weights and integer/uint8 scales are left as they are; float
    tensors (norm weights, affine scales and biases, unquantized matrices) are cast
    once, on first use, and kept.
    """

    def __init__(self, raw: Mapping[str, mx.array], dtype: mx.Dtype):
        self.raw = raw
        self.dtype = dtype
        self._memo: dict[str, mx.array] = {}

    def __getitem__(self, name: str) -> mx.array:
        v = self._memo.get(name)
        if v is None:
            try:
                v = self.raw[name]
            except KeyError:
                raise KeyError(f"checkpoint has no tensor {name!r}") from None
            if mx.issubdtype(v.dtype, mx.floating) and v.dtype != self.dtype:
                v = v.astype(self.dtype)
            self._memo[name] = v
        return v

    def get(self, name, default=None):
        return self[name] if name in self.raw else default

    def release(self) -> None:
        """Forget the converted tensors (streamed weights: :mod:`workbench.models.streaming`)."""
        self._memo.clear()

    def __contains__(self, name) -> bool:
        return name in self.raw

    def __iter__(self):
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


class LazyTensors(Mapping):
    """Tensors read from the checkpoint on first access (the reader memory-maps) and kept
    until :meth:`release`.  ``keep=False``: the reader keeps no reference of its own
    (:meth:`Checkpoint.load`), so a released tensor's memory is freed (streamed weights)."""

    def __init__(self, ck, names: Iterable[str], keep: bool = True):
        self.ck = ck
        self.names = list(names)
        self.keep = keep
        self._set = set(self.names)
        self._memo: dict[str, mx.array] = {}

    def __getitem__(self, name):
        v = self._memo.get(name)
        if v is None:
            if name not in self._set:
                raise KeyError(name)
            v = self._memo[name] = self.ck.load(name) if self.keep else self.ck.load(name, keep=False)
        return v

    def release(self) -> None:
        self._memo.clear()

    @property
    def loaded(self) -> list[str]:
        """The tensors read since the last release."""
        return list(self._memo)

    def __contains__(self, name):
        return name in self._set

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)


# --------------------------------------------------------------------------- context

@dataclass
class Context:
    """What op functions see: the compute dtype, the weights in it, the KV cache.

    ``uniform``: True when a compute dtype was asked for (every op computes in it);
    False for the storage dtype(s), where a quantized embedding dequantizes to MLX's
    default dtype as mlx-lm does (bfloat16 for mxfp4/mxfp8/nvfp4 next to float32
    tensors), so results equal mlx-lm's even on such mixed checkpoints."""

    dtype: mx.Dtype
    weights: Weights
    cache: KVCache | None = None
    model: Any = field(default=None, repr=False)
    uniform: bool = True
    #: the positions the head computes (workbench.trace.logits.LogitRows; None: every one)
    logit_rows: Any = None


# --------------------------------------------------------------------------- model

class Model(TextCodec):
    """A checkpoint, its op program and what is needed to run it.

    ``execute(model.program, model.context(...), model.feeds(ids))["logits"]``; what a trace
    needs of it: :class:`workbench.traceable.OpTraceable`.
    """

    #: the programs per attention choice (workbench.models.attention.Programs; set by load)
    programs = None
    #: load's attention choice (what ``self.program`` was built with)
    attention = None
    #: each step of a trace is one op of the program (a ReferenceModel's: "module")
    granularity = "op"

    def __init__(self, family: str, config, text_config: dict, checkpoint, program: Program,
                 tensor_names: Sequence[str], tokenizer=None, windows=None, path=None,
                 tensors: Mapping[str, mx.array] | None = None):
        """``tensors``: the checkpoint tensors by canonical name (default: read from the
        checkpoint on first use and kept; a streamed model passes its own)."""
        self.family = family
        self.family_config = config  # the family's Config dataclass (typed values)
        self.config = text_config  # config.json's (text) dict, as written
        self.checkpoint = checkpoint
        self.program = program
        self.tokenizer = tokenizer
        self.path = path
        self.num_layers = int(config.num_hidden_layers)
        self.vocab_size = int(config.vocab_size)
        self._windows = windows or {"attn_mask": None}
        self._raw = LazyTensors(checkpoint, tensor_names) if tensors is None else tensors
        self._weights: dict[mx.Dtype, Weights] = {}
        self.dtype = self._storage_dtype()
        self.default_dtype = self.dtype

    def __repr__(self):
        return (f"<workbench model {self.family}: {self.num_layers} layers, {len(self.program)} ops, "
                f"{dtype_name(self.default_dtype)}>")

    def _storage_dtype(self) -> mx.Dtype:
        for name in ("norm.weight", "embed_tokens.scales", "embed_tokens.weight"):
            if name in self._raw:
                dt = self._raw[name].dtype
                if mx.issubdtype(dt, mx.floating):
                    return dt
        for name in self._raw:
            dt = self._raw[name].dtype
            if mx.issubdtype(dt, mx.floating):
                return dt
        return mx.float32

    # -- running
    def weights(self, dtype=None) -> Weights:
        dt = parse_dtype(dtype) or self.default_dtype
        w = self._weights.get(dt)
        if w is None:
            w = self._weights[dt] = Weights(self._raw, dt)
        return w

    def context(self, dtype=None, cache: KVCache | None = None) -> Context:
        """dtype None: the storage dtype (``load(dtype=...)`` may have set another default)."""
        dt = parse_dtype(dtype) or self.default_dtype
        uniform = dtype is not None or self.default_dtype != self.dtype
        return Context(dtype=dt, weights=self.weights(dt), cache=cache, model=self, uniform=uniform)

    def program_for(self, attention=None, prune: bool = False) -> Program:
        """The op program with attention as asked ("fused", "explicit" or layers; None:
        ``self.program``, load's choice), built once per choice and kept.  ``prune``: the
        program with the family's ``live_rows`` op (``trace(..., prune=True)``)."""
        if attention is None and not prune:
            return self.program
        if self.programs is None:
            raise ValueError("this model was not built by workbench.load: no attention choice")
        if attention is None:  # load's choice, pruned
            attention = getattr(self, "attention", None) or "fused"
        return self.programs.get(attention, prune)

    def make_cache(self) -> KVCache:
        return KVCache(self.num_layers)

    def feeds(self, ids, attention_mask=None, cache: KVCache | None = None, check_ids: bool = True) -> dict:
        return make_feeds(ids, attention_mask, cache, self._windows, self.vocab_size, check_ids)

    def trace(self, ids_or_text, capture="stats", dtype=None, **kw):
        """A :class:`~workbench.trace.tracer.Trace` of this model (``workbench.trace(model, ...)``:
        the tracer, a floor above, as the top package provides it: workbench/traceable.py)."""
        return provided("trace")(self, ids_or_text, capture=capture, dtype=dtype, **kw)

    def __call__(self, ids, attention_mask=None, cache=None, dtype=None) -> mx.array:
        """Logits [B, T, vocab] (uncaptured, lazy)."""
        from workbench.program import execute
        return execute(self.program, self.context(dtype, cache), self.feeds(ids, attention_mask, cache))["logits"]

    # -- introspection
    def op_tensors(self, name: str) -> dict[str, mx.array]:
        """Every checkpoint tensor the op reads (weight, scales, biases, bias ...), as stored
        (:class:`workbench.traceable.Traceable`)."""
        return {n: self._raw[n] for n in self.op_tensor_names(self.program[name])}

    def op_tensor_names(self, op) -> list[str]:
        """The checkpoint tensors an op reads: its params, or their weight, scales, biases ..."""
        return op.tensor_names(self._raw)

    @property
    def step_names(self) -> list[str]:
        """The names a trace's steps carry: the program's ops."""
        return [op.name for op in self.program.ops]

    @property
    def tensor_names(self) -> list[str]:
        return list(self._raw.names)
