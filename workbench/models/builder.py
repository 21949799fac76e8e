"""The op builder every model family uses, and the fused element-wise kernels.

A family's program (llama.py, qwen3.py, gemma3_text.py, gemma4_text.py) reads top to
bottom like its paper: ``build(cfg, b)`` over the family's Config (its config dataclass,
checkpoint/families/<family>.py) emits named ops through
the :class:`Builder` helpers below (``b.linear``, ``b.rmsnorm``, ``b.rope`` ...).  Every
helper appends one :class:`~workbench.program.Op` and returns its name, so the family
code is plain dataflow over names::

    h = b.rmsnorm(f"layers.{i}.input_layernorm", x, eps)
    q = b.linear(f"layers.{i}.self_attn.q_proj", h)

Op functions are real MLX computations over the checkpoint's tensors, read at call time
from ``ctx.weights`` (converted once per compute dtype; quantized weights stay packed
and go through ``mx.quantized_matmul`` / ``mx.gather_qmm`` with the checkpoint's mode).
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Callable, Container, Iterable, Sequence

import mlx.core as mx
import mlx.nn as nn

from workbench.attention import attention_mask, attention_scores, fused_attention, heads_concat, real_keys
from workbench.program import Op, Program, layer_of
from workbench.rope import dynamic_freqs


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


#: a gated MLP's activation name -> its fused kernel
_GLU = {"silu": swiglu, "gelu_approx": geglu}


# --------------------------------------------------------------------------- builder

class Builder:
    """Appends named ops; every helper returns the name of the op it emitted."""

    def __init__(self, ck, tensor_names: Iterable[str], explicit: Container[int] = (),
                 queries: tuple[int, int] | None = None, prune: bool = False):
        """``explicit``: the layers whose attention is emitted as explicit scores / softmax /
        context steps (:meth:`attention`); every other layer's is one fused op.  ``queries``:
        ``(start, stop)`` query positions the explicit steps cover (None: every query).
        ``prune``: the family emits :meth:`live_rows` where its stream stops feeding any
        other position (Gemma 4's first KV-shared layer); from there on rows are a suffix."""
        self.ck = ck
        self.names = set(tensor_names)
        self.explicit = explicit
        self.queries = queries
        self.prune = prune
        #: True once :meth:`live_rows` ran: the stream's rows are the last ones of the forward
        self.tail = False
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
        """The program over ``inputs`` and ``key_valid`` (what fused attention reads: the
        feeds always carry it)."""
        return Program(self.ops, tuple(inputs) + ("key_valid",))

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

    def rope(self, name: str, x: str, rope: dict, **attrs) -> str:
        """Rotary embedding of [B, H, T, D] at positions ``rope_offset[b] + t``; ``rope``:
        the arguments from :func:`workbench.rope.rope_params`.  After :meth:`live_rows`
        the rows are the forward's last ones: the op also reads ``input_ids`` and shifts the
        positions by the rows left out (``T - rows``)."""
        dims, base, scale, freqs, trad = rope["dims"], rope["base"], rope["scale"], rope["freqs"], rope["traditional"]

        mscale, dynamic = rope.get("mscale", 1.0), rope.get("dynamic")

        def fn(ctx, x, offset, ids=None):
            if mscale != 1.0:
                x = x * mscale
            if ids is not None and ids.shape[1] != x.shape[2]:
                offset = offset + (ids.shape[1] - x.shape[2])
            f = freqs if dynamic is None else dynamic_freqs(dims, dynamic, mx.max(offset) + x.shape[2])
            return mx.fast.rope(x, dims, traditional=trad, base=base, scale=scale,
                                offset=offset, freqs=f)
        inputs = [x, "rope_offset"] + (["input_ids"] if self.tail else [])
        return self.op(name, "rope", fn, inputs, rope_type=rope["type"], dims=dims,
                       base=base, rope_scale=scale, traditional=trad, **attrs)

    def live_rows(self, name: str, x: str, **attrs) -> str:
        """The stream [B, T, D] from the first position the context asks the head for on
        (``ctx.logit_rows``; every row when it asks for all): the ops after it compute those
        rows only.  Emitted (``prune``) where no later op reads another position of the
        stream -- Gemma 4's KV-shared layers write no cache, so their other rows reach no
        output -- as llama.cpp drops unread rows before its last layer and mlx-lm's chunked
        prefill skips those layers.  The values of the kept rows are the same; statistics of
        the later ops cover the kept positions only (``Trace.positions``)."""
        def fn(ctx, x):
            start = live_start(ctx)
            return x[:, start:] if start else x
        self.tail = True
        return self.op(name, "rows", fn, [x], **attrs)

    def kv_cache(self, name: str, x: str, which: str, layer: int) -> str:
        """Append this chunk's keys/values ([B, Hkv, T, D]) to the cache; return all of them."""
        def fn(ctx, x):
            if ctx.cache is None:
                return x
            return ctx.cache.update(which, layer, x)
        return self.op(name, "cache", fn, [x], layer=layer, which=which)

    def attention(self, module: str, q: str, k: str, v: str, mask: str, scale: float,
                  n_heads: int, n_kv_heads: int, head_dim: int, **attrs) -> str:
        """Attention of queries [B, H, T, D] over keys/values [B, Hkv, S, D] under a boolean
        mask; returns ``{module}.context`` [B, T, H*D] (head h: the slice h*D:(h+1)*D).

        Fused (the default): one op, kind "attention", through
        ``mx.fast.scaled_dot_product_attention`` as mlx-lm calls it (the [B, H, T, S]
        scores are never materialised); it reads the feed ``key_valid`` and makes the mask
        ``mask`` names itself (``window``: a sliding layer's, in ``attrs``).  Explicit (the
        layer is in ``self.explicit``): the steps ``{module}.scores`` -> ``.softmax`` ->
        ``.context`` (kind "attend") over the feed ``mask``.  Both context ops carry the
        same attrs (num_heads, num_kv_heads, head_dim, scale, mask, fused, window ...)."""
        layer = layer_of(module)
        common = dict(num_heads=n_heads, num_kv_heads=n_kv_heads, head_dim=head_dim, scale=scale, mask=mask)
        if layer in self.explicit and self.queries is not None:
            return self._attention_rows(module, q, k, v, mask, scale, n_heads, n_kv_heads, head_dim, common, attrs)
        if layer in self.explicit:
            s = self.scores(f"{module}.scores", q, k, mask, scale, n_heads, n_kv_heads, **attrs)
            p = self.softmax(f"{module}.softmax", s)
            return self.attend(f"{module}.context", p, v, n_heads, n_kv_heads, head_dim,
                               scale=scale, mask=mask, fused=False, **attrs)

        window = attrs.get("window")

        def fn(ctx, q, k, v, valid):
            return heads_concat(fused_attention(q, k, v, valid, scale, window))
        return self.op(f"{module}.context", "attention", fn, [q, k, v, "key_valid"], **common, fused=True,
                       **attrs)

    def cached_attention(self, module: str, layer: int, q: str, k: str, v: str, scale: float, n_heads: int,
                         n_kv_heads: int, head_dim: int, window: int | None = None) -> str:
        """The block's attention after its q/k/v heads: keys and values through the layer's
        KV cache (``k_cache`` / ``v_cache``), :meth:`attention` under the causal mask (or the
        sliding one, ``window`` set), and ``o_proj``: the lines the dense families share."""
        k = self.kv_cache(f"{module}.k_cache", k, "k", layer)
        v = self.kv_cache(f"{module}.v_cache", v, "v", layer)
        mask = "attn_mask" if window is None else "attn_mask_sliding"
        o = self.attention(module, q, k, v, mask, scale, n_heads, n_kv_heads, head_dim, window=window)
        return self.linear(f"{module}.o_proj", o)

    def _attention_rows(self, module, q, k, v, mask, scale, n_heads, n_kv_heads, head_dim, common, attrs) -> str:
        """Explicit steps for the query positions ``self.queries`` only: ``scores`` /
        ``softmax`` [B, H, rows, S] (rows: the positions of this forward's queries in that
        range, none when they are all outside it) and ``context``: the fused kernel's output
        with those rows replaced by ``softmax @ values``."""
        start, stop = self.queries
        window = attrs.get("window")
        rep = n_heads // n_kv_heads

        def rows(q, k):
            T, S = q.shape[2], k.shape[2]
            first = S - T  # query t is at position first + t
            return min(max(start - first, 0), T), min(max(stop - first, 0), T)

        def scores(ctx, q, k, valid):  # the mask's rows made here: no [T, S] mask for a long prompt
            r0, r1 = rows(q, k)
            S = k.shape[2]
            m = attention_mask(S - q.shape[2] + r0, r1 - r0, 0, S, window, real_keys(valid))
            return attention_scores(q[:, :, r0:r1], k, m, scale)
        s = self.op(f"{module}.scores", "scores", scores, [q, k, "key_valid"], scale=scale, num_heads=n_heads,
                    num_kv_heads=n_kv_heads, mask=mask, queries=self.queries, **attrs)
        p = self.softmax(f"{module}.softmax", s, queries=self.queries)

        def context(ctx, q, k, v, valid, p):
            o = fused_attention(q, k, v, valid, scale, window)
            r0, r1 = rows(q, k)
            if r1 > r0:
                B, H, R, S = p.shape
                if rep > 1:
                    e = (p.reshape(B, n_kv_heads, rep, R, S) @ mx.expand_dims(v, 2)).reshape(B, H, R, -1)
                else:
                    e = p @ v
                o = mx.concatenate([o[:, :, :r0], e.astype(o.dtype), o[:, :, r1:]], axis=2)
            return heads_concat(o)
        return self.op(f"{module}.context", "attention", context, [q, k, v, "key_valid", p], **common, fused=True,
                       queries=self.queries, **attrs)

    def scores(self, name: str, q: str, k: str, mask: str, scale: float,
               n_heads: int, n_kv_heads: int, **attrs) -> str:
        """Scaled, masked attention scores [B, H, T, S] (masked entries hold the dtype's
        lowest finite value, so they are finite and vanish in the softmax)."""
        def fn(ctx, q, k, mask):
            if mask.ndim >= 2 and mask.shape[-2] > q.shape[2]:  # after live_rows: the last rows' mask
                mask = mask[..., mask.shape[-2] - q.shape[2]:, :]
            return attention_scores(q, k, mask, scale)
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
            return heads_concat(o)
        return self.op(name, "attend", fn, [p, v], num_heads=n_heads, num_kv_heads=n_kv_heads,
                       head_dim=head_dim, **attrs)

    # -- blocks
    def gated_mlp(self, module: str, h: str, activation: str) -> str:
        """``down_proj(act(gate_proj(h)) * up_proj(h))`` under ``module`` (ops gate_proj,
        up_proj, act, down_proj); ``activation``: "silu" (SwiGLU) or "gelu_approx" (GeGLU)."""
        glu = _GLU[activation]
        g = self.linear(f"{module}.gate_proj", h)
        u = self.linear(f"{module}.up_proj", h)
        a = self.op(f"{module}.act", "glu", lambda ctx, g, u: glu(g, u), [g, u], activation=activation)
        return self.linear(f"{module}.down_proj", a)

    def lm_head(self, x: str, tie: bool = True) -> str:
        """``lm_head``: the checkpoint's lm_head when it has one, else the tied embeddings
        (``embed_tokens`` as a linear; attrs ``tied=True``), for the positions the context's
        ``logit_rows`` names (every one when it is None; workbench/trace/logits.py)."""
        if self.has("lm_head.weight"):
            name = self.linear("lm_head", x, tied=False)
        elif not tie:
            raise ValueError("checkpoint is missing tensor 'lm_head.weight' (config.json says "
                             "tie_word_embeddings is false)")
        else:
            name = self.linear("lm_head", x, path="embed_tokens", tied=True)
        op = self.ops[-1]
        self.ops[-1] = replace(op, fn=_rows_only(op.fn))
        return name

    def logits(self, x: str, cap: float | None = None) -> str:
        """The ``logits`` op, the program's last: ``x`` as it is, or soft-capped
        (``tanh(x / cap) * cap``, attrs ``cap``) when ``cap`` is set."""
        if cap:
            return self.op("logits", "softcap", lambda ctx, x: softcap(x, cap), [x], cap=cap)
        return self.identity("logits", x)

    def identity(self, name: str, x: str, kind: str = "output", **attrs) -> str:
        return self.op(name, kind, lambda ctx, x: x, [x], **attrs)


def live_start(ctx) -> int:
    """The first position :meth:`Builder.live_rows` keeps: the first the head computes (0:
    every one, or no ``ctx.logit_rows``)."""
    rows = getattr(ctx, "logit_rows", None)
    return 0 if rows is None else rows.first


def _rows_only(fn):
    """The head computed for the positions the context asks for (``ctx.logit_rows``, a
    :class:`workbench.trace.logits.LogitRows`; None: every position)."""
    def head(ctx, x):
        rows = getattr(ctx, "logit_rows", None)
        if rows is None:
            return fn(ctx, x)
        return rows.head(lambda h: fn(ctx, h), x)
    return head


def _qattrs(q):
    if q is None:
        return None
    return {"mode": q.mode, "bits": q.bits, "group_size": q.group_size}
