"""What every model family shares: the op builder, the run context, the KV cache, feeds.

A family file (llama.py, qwen3.py, gemma3_text.py, gemma4_text.py) reads top to bottom
like its paper: a config dataclass, then ``build(cfg, b)`` that emits named ops through
the :class:`Builder` helpers below (``b.linear``, ``b.rmsnorm``, ``b.rope`` ...).  Every
helper appends one :class:`~workbench.program.Op` and returns its name, so the family
code is plain dataflow over names::

    h = b.rmsnorm(f"layers.{i}.input_layernorm", x, eps)
    q = b.linear(f"layers.{i}.self_attn.q_proj", h)

Op functions are real MLX computations over the checkpoint's tensors, read at call time
from ``ctx.weights`` (converted once per compute dtype; quantized weights stay packed
and go through ``mx.quantized_matmul`` / ``mx.gather_qmm`` with the checkpoint's mode).

Program inputs (made by :meth:`Model.feeds`):

* ``input_ids``         [B, T] int32
* ``rope_offset``       [B] int32, position of each sequence's first token in this chunk
                        (negative under left padding: the first real token is position 0)
* ``attn_mask``         [B|1, 1, T, S] bool, True = may attend (causal, padding-aware)
* ``attn_mask_sliding`` the same with the sliding window (families that use one)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable, Mapping, Sequence

import mlx.core as mx
import mlx.nn as nn

from workbench.program import Op, Program

from workbench.dtypes import DTYPES, dtype_name, parse_dtype  # noqa: F401  (re-exported)


# --------------------------------------------------------------------------- config

class CheckpointMismatch(ValueError):
    """The checkpoint's tensors do not match its config.json (the message is inspect's first
    error, in one line)."""


@dataclass
class BaseConfig:
    """A family's config: the values :func:`workbench.checkpoint.arch.build_arch` read from
    config.json (``Arch.spec``).  Which keys a family reads, ignores or refuses is declared
    there, in ``arch.KEYS[FAMILY]``, so that ``inspect`` and ``load`` read a config alike."""

    @classmethod
    def from_checkpoint(cls, ck):
        """The checkpoint's config, after every tensor's shape was checked against it."""
        check_checkpoint(ck)
        return cls(**ck.arch.spec)


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

    def __contains__(self, name) -> bool:
        return name in self.raw

    def __iter__(self):
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


class _LazyTensors(Mapping):
    """Tensors read from the checkpoint on first access (the reader memory-maps)."""

    def __init__(self, ck, names: Iterable[str]):
        self.ck = ck
        self.names = list(names)
        self._set = set(self.names)
        self._memo: dict[str, mx.array] = {}

    def __getitem__(self, name):
        v = self._memo.get(name)
        if v is None:
            if name not in self._set:
                raise KeyError(name)
            v = self._memo[name] = self.ck.load(name)
        return v

    def __contains__(self, name):
        return name in self._set

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)


# --------------------------------------------------------------------------- KV cache

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
        for store in (self.keys, self.values):
            for i, a in enumerate(store):
                if a is not None:
                    store[i] = a[:, :, :keep] if keep else None
        if self.valid is not None:
            self.valid = self.valid[:, :keep] if keep else None

    @property
    def state(self) -> list[mx.array]:
        return [a for a in self.keys + self.values if a is not None]


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


# --------------------------------------------------------------------------- RoPE

def rope_params(head_dim: int, rope: Mapping, traditional: bool = False) -> dict:
    """Arguments for ``mx.fast.rope`` from one normalised rope dict (``Arch.spec["rope"][type]``,
    see :func:`workbench.checkpoint.arch.read_rope`): rope types default, linear, llama3,
    yarn and proportional (Gemma 4's partial rotation over the full head dimension), with
    transformers' formulas."""
    rp = _rope_params(head_dim, rope)
    rp["traditional"] = bool(traditional)
    return rp


def _rope_params(head_dim, r):
    rope_type, base = r["rope_type"], r["rope_theta"]
    if rope_type in ("default", "linear"):
        scale = 1.0 / r["factor"] if rope_type == "linear" else 1.0
        return dict(dims=head_dim, base=base, scale=scale, freqs=None, type=rope_type)
    if rope_type == "llama3":
        factor, low, high = r["factor"], r["low_freq_factor"], r["high_freq_factor"]
        old = r["original_max_position_embeddings"]
        low_wl, high_wl = old / low, old / high
        freqs = base ** (mx.arange(0, head_dim, 2) / head_dim)
        wl = 2 * mx.pi * freqs
        freqs = mx.where(wl > low_wl, freqs * factor, freqs)
        medium = (wl > high_wl) & (wl < low_wl)
        smooth = (old / wl - low) / (high - low)
        smooth_freqs = freqs / ((1 - smooth) / factor + smooth)
        freqs = mx.where(medium, smooth_freqs, freqs)
        return dict(dims=head_dim, base=None, scale=1.0, freqs=freqs, type=rope_type)
    if rope_type == "proportional":
        # transformers: the first int(prf * head_dim // 2) frequencies rotate (exponents over the
        # full head_dim), the rest do not (infinite wavelength); all divided by factor
        angles = int(r["partial_rotary_factor"] * head_dim // 2)
        exps = mx.arange(0, 2 * angles, 2, dtype=mx.float32) / head_dim
        freqs = mx.concatenate([r["factor"] * (base ** exps), mx.full((head_dim // 2 - angles,), mx.inf)])
        return dict(dims=head_dim, base=None, scale=1.0, freqs=freqs, type=rope_type, rotated_dims=2 * angles)
    if rope_type == "yarn":
        return _yarn(head_dim, base, r)
    raise ValueError(f"unsupported rope type {rope_type!r} (supported: default, linear, llama3, yarn, proportional)")


def _yarn(dims, base, r):
    """YaRN as transformers computes it: blended frequencies, and the attention factor
    applied to queries and keys (``mscale``)."""
    factor, orig = r["factor"], r["original_max_position_embeddings"]

    def correction_dim(rot):
        return dims * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    low, high = correction_dim(r["beta_fast"]), correction_dim(r["beta_slow"])
    if r["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001
    ramp = mx.clip((mx.arange(dims // 2, dtype=mx.float32) - low) / (high - low), 0, 1)
    mask = 1.0 - ramp
    extra = base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
    inter = factor * extra
    freqs = (inter * extra) / (inter * mask + extra * (1 - mask))
    ms = r["attention_factor"]
    if ms is None:
        m, mad = r["mscale"], r["mscale_all_dim"]
        ms = get_mscale(factor, m) / get_mscale(factor, mad) if (m and mad) else get_mscale(factor)
    return dict(dims=dims, base=None, scale=1.0, freqs=freqs, type="yarn", mscale=ms)


# --------------------------------------------------------------------------- small fused math
# The same compiled element-wise kernels mlx-lm uses, so results and speed match.

@partial(mx.compile, shapeless=True)
def swiglu(gate, x):
    return nn.silu(gate) * x


@partial(mx.compile, shapeless=True)
def geglu(gate, x):
    return nn.gelu_approx(gate) * x


@partial(mx.compile, shapeless=True)
def softcap(x, cap):
    return mx.tanh(x / cap) * cap


# --------------------------------------------------------------------------- builder

class Builder:
    """Appends named ops; every helper returns the name of the op it emitted."""

    def __init__(self, ck, tensor_names: Iterable[str]):
        self.ck = ck
        self.names = set(tensor_names)
        self.ops: list[Op] = []

    # -- generic
    def op(self, name: str, kind: str, fn: Callable, inputs: Sequence[str] = (),
           params: Sequence[str] = (), layer: int | None = None, **attrs) -> str:
        if layer is None:
            layer = layer_of(name)
        self.ops.append(Op(name, kind, fn, tuple(inputs), tuple(params), layer, dict(attrs)))
        return name

    def has(self, tensor: str) -> bool:
        return tensor in self.names

    def quant(self, module: str):
        q = self.ck.quant_of(module) if hasattr(self.ck, "quant_of") else None
        if q is not None and f"{module}.scales" not in self.names:
            raise ValueError(f"{module}: config says quantized ({q}) but the checkpoint has no {module}.scales")
        return q

    def require(self, tensor: str):
        if tensor not in self.names:
            raise ValueError(f"checkpoint is missing tensor {tensor!r}")

    def program(self, inputs: Sequence[str]) -> Program:
        return Program(self.ops, tuple(inputs))

    # -- weights
    def embedding(self, name: str, ids: str, path: str | None = None) -> str:
        """Rows of ``path.weight`` for the token ids, in the compute dtype."""
        path = path or name
        self.require(f"{path}.weight")
        q = self.quant(path)
        wn, sn, bn = f"{path}.weight", f"{path}.scales", f"{path}.biases"
        if q is None:
            def fn(ctx, ids):
                return ctx.weights[wn][ids]
        else:
            mode, bits, gs = q.mode, q.bits, q.group_size

            def fn(ctx, ids):
                W = ctx.weights
                b = W.get(bn)
                return mx.dequantize(W[wn][ids], scales=W[sn][ids],
                                     biases=b[ids] if b is not None else None, group_size=gs,
                                     bits=bits, mode=mode, dtype=ctx.dtype if ctx.uniform else None)
        return self.op(name, "embedding", fn, [ids], [path], quant=_qattrs(q))

    def linear(self, name: str, x: str, path: str | None = None, **attrs) -> str:
        """``x @ W.T (+ bias)``; quantized weights through ``mx.quantized_matmul``.

        ``path`` is the module whose weight is applied (defaults to ``name``; a tied
        lm_head applies ``embed_tokens``).
        """
        path = path or name
        self.require(f"{path}.weight")
        q = self.quant(path)
        bias = self.has(f"{path}.bias")
        wn, sn, bn, biasn = f"{path}.weight", f"{path}.scales", f"{path}.biases", f"{path}.bias"
        if q is None:
            if bias:
                def fn(ctx, x):
                    W = ctx.weights
                    return mx.addmm(W[biasn], x, W[wn].T)
            else:
                def fn(ctx, x):
                    return x @ ctx.weights[wn].T
        else:
            mode, bits, gs = q.mode, q.bits, q.group_size

            def fn(ctx, x):
                W = ctx.weights
                y = mx.quantized_matmul(x, W[wn], scales=W[sn], biases=W.get(bn), transpose=True,
                                        group_size=gs, bits=bits, mode=mode)
                return y + W[biasn] if bias else y
        return self.op(name, "linear", fn, [x], [path], quant=_qattrs(q), bias=bias, **attrs)

    def rmsnorm(self, name: str, x: str, eps: float, path: str | None = None,
                plus_one: bool = False, scale: bool = True, **attrs) -> str:
        """``mx.fast.rms_norm`` over the last axis; ``plus_one``: Gemma 3's (1 + w) weight;
        ``scale=False``: no weight at all (Gemma 4's v_norm)."""
        path = path or name
        if not scale:
            def fn(ctx, x):
                return mx.fast.rms_norm(x, None, eps)
            return self.op(name, "rmsnorm", fn, [x], [], eps=eps, **attrs)
        wn = f"{path}.weight"
        self.require(wn)
        if plus_one:
            def fn(ctx, x):
                return mx.fast.rms_norm(x, 1.0 + ctx.weights[wn], eps)
        else:
            def fn(ctx, x):
                return mx.fast.rms_norm(x, ctx.weights[wn], eps)
        return self.op(name, "rmsnorm", fn, [x], [path], eps=eps, plus_one=plus_one, **attrs)

    # -- arithmetic
    def add(self, name: str, a: str, b: str, **attrs) -> str:
        return self.op(name, "add", lambda ctx, a, b: a + b, [a, b], **attrs)

    def scale(self, name: str, x: str, s: float, **attrs) -> str:
        return self.op(name, "scale", lambda ctx, x: x * s, [x], factor=s, **attrs)

    # -- attention
    def heads(self, name: str, x: str, n_heads: int, head_dim: int, **attrs) -> str:
        """[B, T, H*D] -> [B, H, T, D]: every per-head tensor is heads-first from here on."""
        def fn(ctx, x):
            B, T, _ = x.shape
            return x.reshape(B, T, n_heads, head_dim).transpose(0, 2, 1, 3)
        return self.op(name, "heads", fn, [x], heads=n_heads, head_dim=head_dim, **attrs)

    def rope(self, name: str, x: str, rp: dict, **attrs) -> str:
        """Rotary embedding of [B, H, T, D] at positions ``rope_offset[b] + t``."""
        dims, base, scale, freqs, trad = rp["dims"], rp["base"], rp["scale"], rp["freqs"], rp["traditional"]

        mscale = rp.get("mscale", 1.0)

        def fn(ctx, x, offset):
            if mscale != 1.0:
                x = x * mscale
            return mx.fast.rope(x, dims, traditional=trad, base=base, scale=scale,
                                offset=offset, freqs=freqs)
        return self.op(name, "rope", fn, [x, "rope_offset"], rope_type=rp["type"], dims=dims,
                       base=base, rope_scale=scale, traditional=trad, **attrs)

    def kv_cache(self, name: str, x: str, which: str, layer: int) -> str:
        """Append this chunk's keys/values ([B, Hkv, T, D]) to the cache; return all of them."""
        def fn(ctx, x):
            if ctx.cache is None:
                return x
            return ctx.cache.update(which, layer, x)
        return self.op(name, "cache", fn, [x], layer=layer, which=which)

    def scores(self, name: str, q: str, k: str, mask: str, scale: float,
               n_heads: int, n_kv_heads: int, **attrs) -> str:
        """Scaled, masked attention scores [B, H, T, S] (masked entries hold the dtype's
        lowest finite value, so they are finite and vanish in the softmax)."""
        rep = n_heads // n_kv_heads

        def fn(ctx, q, k, mask):
            B, H, T, D = q.shape
            if scale != 1.0:
                q = q * mx.array(scale, q.dtype)
            if rep > 1:
                q = q.reshape(B, n_kv_heads, rep, T, D)
                k = mx.expand_dims(k, 2)
            s = q @ k.swapaxes(-1, -2)
            if rep > 1:
                s = s.reshape(B, H, T, -1)
            return mx.where(mask, s, mx.array(mx.finfo(s.dtype).min, s.dtype))
        return self.op(name, "scores", fn, [q, k, mask], scale=scale, num_heads=n_heads,
                       num_kv_heads=n_kv_heads, mask=mask, **attrs)

    def softmax(self, name: str, s: str, **attrs) -> str:
        return self.op(name, "softmax", lambda ctx, s: mx.softmax(s, axis=-1, precise=True), [s], **attrs)

    def attend(self, name: str, p: str, v: str, n_heads: int, n_kv_heads: int, head_dim: int,
               **attrs) -> str:
        """Probabilities times values, heads concatenated: [B, T, H*D] (head h is the
        slice h*D:(h+1)*D of the last axis)."""
        rep = n_heads // n_kv_heads

        def fn(ctx, p, v):
            B, H, T, S = p.shape
            if rep > 1:
                o = p.reshape(B, n_kv_heads, rep, T, S) @ mx.expand_dims(v, 2)
                o = o.reshape(B, H, T, -1)
            else:
                o = p @ v
            return o.transpose(0, 2, 1, 3).reshape(B, T, -1)
        return self.op(name, "attend", fn, [p, v], num_heads=n_heads, head_dim=head_dim, **attrs)

    def lm_head(self, x: str, tie: bool = True) -> str:
        """``lm_head``: the checkpoint's lm_head when it has one, else the tied embeddings
        (``embed_tokens`` as a linear; attrs ``tied=True``)."""
        if self.has("lm_head.weight"):
            return self.linear("lm_head", x, tied=False)
        if not tie:
            raise ValueError("checkpoint is missing tensor 'lm_head.weight' (config.json says "
                             "tie_word_embeddings is false)")
        return self.linear("lm_head", x, path="embed_tokens", tied=True)

    def identity(self, name: str, x: str, kind: str = "output", **attrs) -> str:
        return self.op(name, kind, lambda ctx, x: x, [x], **attrs)


def _qattrs(q):
    if q is None:
        return None
    return {"mode": q.mode, "bits": q.bits, "group_size": q.group_size}


def layer_of(name: str) -> int | None:
    if name.startswith("layers."):
        part = name.split(".")[1]
        if part.isdigit():
            return int(part)
    return None


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
               windows: Mapping[str, int | None] | None = None, vocab_size: int | None = None) -> dict:
    """Program inputs for one forward: ids, per-sequence RoPE offsets and attention masks.

    ``attention_mask`` (1 = real token) supports left padding only.  With a cache, the
    chunk continues the cached positions and the mask covers cached + new keys.
    """
    ids = _as_ids(ids)
    B, T = ids.shape
    if vocab_size is not None and ids.size:
        lo, hi = mx.min(ids).item(), mx.max(ids).item()
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
        # left padding only: once a sequence starts, every later position is real
        started = mx.cumsum(v, axis=1) > 0
        if bool(mx.any(started & ~valid).item()):
            raise ValueError("attention_mask must be left padding (0s before the first 1 of each row, 1s after)")
        npad = S - mx.sum(v, axis=1)
        rope_offset = (offset - npad).astype(mx.int32)
    else:
        rope_offset = mx.full((B,), offset, mx.int32)

    qi = mx.arange(offset, S)[:, None]
    ki = mx.arange(S)[None]
    feeds = {"input_ids": ids, "rope_offset": rope_offset}
    for name, window in (windows or {"attn_mask": None}).items():
        m = ki <= qi
        if window is not None:
            m = m & (qi - ki < window)
        if valid is not None:
            m = (m[None] & valid[:, None, :]) | (ki == qi)[None]
            m = m[:, None]
        feeds[name] = m
    return feeds


# --------------------------------------------------------------------------- model

class Model:
    """A checkpoint, its op program and what is needed to run it.

    ``execute(model.program, model.context(...), model.feeds(ids))["logits"]``
    """

    def __init__(self, family: str, config, text_config: dict, checkpoint, program: Program,
                 tensor_names: Sequence[str], tokenizer=None, windows=None, path=None):
        self.family = family
        self.cfg = config
        self.config = text_config
        self.checkpoint = checkpoint
        self.program = program
        self.tokenizer = tokenizer
        self.path = path
        self.num_layers = int(config.num_hidden_layers)
        self.vocab_size = int(config.vocab_size)
        self._windows = windows or {"attn_mask": None}
        self._raw = _LazyTensors(checkpoint, tensor_names)
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

    # -- tokenizer
    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this checkpoint has no tokenizer.json: pass token ids instead of text")
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids) -> str:
        if self.tokenizer is None:
            raise ValueError("this checkpoint has no tokenizer.json")
        if isinstance(ids, mx.array):
            ids = ids.tolist()
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

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

    def make_cache(self) -> KVCache:
        return KVCache(self.num_layers)

    def feeds(self, ids, attention_mask=None, cache: KVCache | None = None) -> dict:
        return make_feeds(ids, attention_mask, cache, self._windows, self.vocab_size)

    def trace(self, ids_or_text, capture="stats", dtype=None, **kw):
        """A :class:`~workbench.trace.tracer.Trace` of this model (``workbench.trace(model, ...)``)."""
        from workbench.trace.tracer import trace
        return trace(self, ids_or_text, capture=capture, dtype=dtype, **kw)

    def __call__(self, ids, attention_mask=None, cache=None, dtype=None) -> mx.array:
        """Logits [B, T, vocab] (uncaptured, lazy)."""
        from workbench.program import execute
        return execute(self.program, self.context(dtype, cache), self.feeds(ids, attention_mask, cache))["logits"]

    # -- introspection
    def op_tensors(self, op_name: str) -> dict[str, mx.array]:
        """Every checkpoint tensor the op reads (weight, scales, biases, bias ...), as stored."""
        op = self.program[op_name]
        out = {}
        for p in op.params:
            if p in self._raw:
                out[p] = self._raw[p]
                continue
            for suffix in ("weight", "scales", "biases", "bias", "global_scale"):
                n = f"{p}.{suffix}"
                if n in self._raw:
                    out[n] = self._raw[n]
        return out

    @property
    def tensor_names(self) -> list[str]:
        return list(self._raw.names)
