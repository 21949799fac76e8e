"""Gemma 4 (text): the language model of every Gemma 4 checkpoint, dense and MoE.

The op program; what the config says and the checkpoint's tensors are the family's file,
workbench/checkpoint/families/gemma4_text.py (its Config is what :func:`build` reads).

What is particular to Gemma 4, in the order the forward pass meets it:

* embeddings scaled by sqrt(hidden_size);
* per-layer embeddings (PLE, the small models): a second embedding table gives every
  layer a [hidden_size_per_layer_input] vector per token, mixed with a projection of
  the scaled embeddings (``per_layer_inputs``); each layer gates it into its residual
  stream after the MLP;
* attention: q_norm / k_norm per head, v_norm (RMS, no weight), scale 1.0;
  sliding layers use head_dim, RoPE "default" (base 10k) and a sliding-window mask;
  full layers use their own head_dim (per_layer_config, formerly global_head_dim),
  "proportional" RoPE (only a fraction of the dimensions rotate) and the causal mask;
* attention_k_eq_v (large models): full layers have no v_proj, values are the k_proj
  output (before k_norm) and may have their own head count (per_layer_config's
  num_key_value_heads, formerly num_global_key_value_heads);
* KV sharing: the last ``num_kv_shared_layers`` layers compute only queries and attend
  to the keys/values of the last earlier layer of the same type (no k/v ops of their own);
  their MLP may be twice as wide (use_double_wide_mlp; the weights say how wide);
* sandwich norms around attention and the feed-forward block;
* MoE (enable_moe_block): the dense MLP and a router-selected set of experts run in
  parallel, each with its own norms, and are summed;
* every layer's output is multiplied by its ``layer_scalar``;
* final logit soft-cap: ``tanh(logits / cap) * cap``.
"""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from workbench.checkpoint.families.gemma4_text import FAMILY, MODEL_TYPES, Config  # noqa: F401  (the family's)
from workbench.models.builder import Builder, geglu
from workbench.rope import rope_params


def windows(cfg: Config) -> dict:
    return {"attn_mask": None, "attn_mask_sliding": cfg.sliding_window}


# --------------------------------------------------------------------------- embeddings

def embed(b: Builder, cfg: Config) -> tuple[str, str | None]:
    """Scaled token embeddings, and the per-layer inputs [B, T, L, P] when the model has PLE."""
    x = b.embedding("embed_tokens", "input_ids")
    x = b.scale("embed_scale", x, cfg.hidden_size ** 0.5)
    P, L = cfg.hidden_size_per_layer_input, cfg.num_hidden_layers
    if not P:
        return x, None

    def unflatten(y):
        return mx.unflatten(y, -1, (L, P))
    e = b.embedding("embed_tokens_per_layer", "input_ids")
    e = b.op("per_layer_embed_scale", "scale", lambda ctx, e: unflatten(e * P ** 0.5), [e], factor=P ** 0.5)
    p = b.linear("per_layer_model_projection", x)
    p = b.op("per_layer_projection_scale", "scale", lambda ctx, p: unflatten(p * cfg.hidden_size ** -0.5),
             [p], factor=cfg.hidden_size ** -0.5)
    p = b.rmsnorm("per_layer_projection_norm", p, cfg.rms_norm_eps)
    return x, b.op("per_layer_inputs", "add", lambda ctx, p, e: (p + e) * 2.0 ** -0.5, [p, e], factor=2.0 ** -0.5)


# --------------------------------------------------------------------------- attention

def attention(b: Builder, cfg: Config, i: int, h: str, rope: dict) -> str:
    a = f"layers.{i}.self_attn"
    H, Hkv, D, eps = cfg.num_attention_heads, cfg.kv_heads_of(i), cfg.head_dim_of(i), cfg.rms_norm_eps
    kind = "full_attention" if cfg.is_full(i) else "sliding_attention"
    layer_rope = rope[kind]
    q = b.heads(f"{a}.q_heads", b.linear(f"{a}.q_proj", h), H, D)
    q = b.rope(f"{a}.q_rope", b.rmsnorm(f"{a}.q_norm", q, eps), layer_rope)
    src = cfg.kv_source(i)
    if src == i:
        kp = b.linear(f"{a}.k_proj", h)
        vp = kp if cfg.k_eq_v(i) else b.linear(f"{a}.v_proj", h)
        k = b.heads(f"{a}.k_heads", kp, Hkv, D)
        v = b.heads(f"{a}.v_heads", vp, Hkv, D)
        k = b.rope(f"{a}.k_rope", b.rmsnorm(f"{a}.k_norm", k, eps), layer_rope)
        v = b.rmsnorm(f"{a}.v_norm", v, eps, scale=False)
        k = b.kv_cache(f"{a}.k_cache", k, "k", i)
        v = b.kv_cache(f"{a}.v_cache", v, "v", i)
    else:  # KV-shared: the source layer's full keys/values (cache included)
        k, v = f"layers.{src}.self_attn.k_cache", f"layers.{src}.self_attn.v_cache"
    sliding = not cfg.is_full(i)
    o = b.attention(a, q, k, v, "attn_mask_sliding" if sliding else "attn_mask", 1.0, H, Hkv, D,
                    window=cfg.sliding_window if sliding else None, kv_source=src)
    return b.linear(f"{a}.o_proj", o)


# --------------------------------------------------------------------------- feed-forward

def mlp(b: Builder, i: int, h: str) -> str:
    return b.gated_mlp(f"layers.{i}.mlp", h, "gelu_approx")


def router(b: Builder, cfg: Config, i: int, x: str) -> tuple[str, str]:
    """RMS-norm (weight ``scale / sqrt(hidden)``) -> proj -> top-k -> softmax * per-expert scale."""
    r = f"layers.{i}.router"
    k, eps, root = cfg.top_k_experts, cfg.rms_norm_eps, cfg.hidden_size ** -0.5
    scale_n, pes_n = f"{r}.scale", f"{r}.per_expert_scale"
    b.require(scale_n)
    b.require(pes_n)
    n = b.op(f"{r}.norm", "rmsnorm",
             lambda ctx, x: mx.fast.rms_norm(x, ctx.weights[scale_n] * root, eps), [x], [scale_n], eps=eps)
    s = b.linear(f"{r}.proj", n)
    idx = b.op(f"{r}.top_k", "topk",
               lambda ctx, s: mx.stop_gradient(mx.argpartition(s, kth=-k, axis=-1)[..., -k:]), [s], k=k)

    def weights(ctx, s, idx):
        w = mx.softmax(mx.take_along_axis(s, idx, axis=-1), axis=-1)
        return w * ctx.weights[pes_n][idx]
    w = b.op(f"{r}.weights", "router_weights", weights, [s, idx], [pes_n])
    return idx, w


def expert_linear(b: Builder, name: str, x: str, idx: str) -> str:
    """Each token's k selected experts: [B, T, D] or [B, T, k, D] -> [B, T, k, out].

    ``mx.gather_mm`` (``mx.gather_qmm`` for quantized experts) over [E, out, in] weights.
    Like mlx-lm, from 64 (token, expert) pairs on the rows are sorted by expert for the
    kernel and put back in token order afterwards (the values are the same)."""
    b.require(f"{name}.weight")
    q = b.quant(name)
    wn, sn, bn = f"{name}.weight", f"{name}.scales", f"{name}.biases"

    def matmul(ctx, x, idx, sorted_indices):
        W = ctx.weights
        if q is not None:
            return mx.gather_qmm(x, W[wn], W[sn], W.get(bn), rhs_indices=idx, transpose=True,
                                 group_size=q.group_size, bits=q.bits, mode=q.mode,
                                 sorted_indices=sorted_indices)
        w = W[wn]
        if x.dtype != mx.float32 and mx.default_device() == mx.cpu:
            # MLX's CPU gather_mm is float32-only: compute in float32, round back
            return mx.gather_mm(x.astype(mx.float32), w.astype(mx.float32).swapaxes(-1, -2), rhs_indices=idx,
                                sorted_indices=sorted_indices).astype(x.dtype)
        return mx.gather_mm(x, w.swapaxes(-1, -2), rhs_indices=idx, sorted_indices=sorted_indices)

    def fn(ctx, x, idx):
        per_token = x.ndim == idx.ndim  # [B, T, D] (gate/up) or [B, T, k, D] (down)
        if idx.size < 64:
            x = mx.expand_dims(x, (-2, -3)) if per_token else mx.expand_dims(x, -2)
            return matmul(ctx, x, idx, False).squeeze(-2)
        k = idx.shape[-1]
        flat = idx.flatten()
        order = mx.argsort(flat)
        rows = x.reshape(-1, 1, x.shape[-1])
        rows = rows[order // k] if per_token else rows[order]
        y = matmul(ctx, rows, flat[order], True)[mx.argsort(order)]
        return y.reshape(*idx.shape, y.shape[-1])
    return b.op(name, "expert_linear", fn, [x, idx], [name],
                quant=None if q is None else {"mode": q.mode, "bits": q.bits, "group_size": q.group_size})


def experts(b: Builder, i: int, x: str, idx: str, w: str) -> str:
    e = f"layers.{i}.experts.switch_glu"
    g = expert_linear(b, f"{e}.gate_proj", x, idx)
    u = expert_linear(b, f"{e}.up_proj", x, idx)
    a = b.op(f"{e}.act", "glu", lambda ctx, g, u: geglu(g, u), [g, u], activation="gelu_approx")
    d = expert_linear(b, f"{e}.down_proj", a, idx)
    return b.op(f"layers.{i}.experts.combine", "combine",
                lambda ctx, d, w: (mx.expand_dims(w, -1) * d).sum(-2), [d, w])


def feed_forward(b: Builder, cfg: Config, i: int, x: str) -> str:
    L, eps = f"layers.{i}", cfg.rms_norm_eps
    h = b.rmsnorm(f"{L}.pre_feedforward_layernorm", x, eps)
    h = mlp(b, i, h)
    if cfg.enable_moe_block:
        h1 = b.rmsnorm(f"{L}.post_feedforward_layernorm_1", h, eps)
        idx, w = router(b, cfg, i, x)
        h2 = b.rmsnorm(f"{L}.pre_feedforward_layernorm_2", x, eps)
        h2 = b.rmsnorm(f"{L}.post_feedforward_layernorm_2", experts(b, i, h2, idx, w), eps)
        h = b.add(f"{L}.ffn_sum", h1, h2)
    return b.rmsnorm(f"{L}.post_feedforward_layernorm", h, eps)


# --------------------------------------------------------------------------- layers

def per_layer_input(b: Builder, cfg: Config, i: int, x: str, per_layer_inputs: str) -> str:
    """Gate the layer's PLE vector into the residual stream."""
    L = f"layers.{i}"
    g = b.linear(f"{L}.per_layer_input_gate", x)
    g = b.op(f"{L}.per_layer_input_act", "glu",
             lambda ctx, g, inputs: mx.multiply(nn.gelu_approx(g), last_rows(inputs, g)[:, :, i, :]),
             [g, per_layer_inputs],
             activation="gelu_approx")
    g = b.linear(f"{L}.per_layer_projection", g)
    g = b.rmsnorm(f"{L}.post_per_layer_input_norm", g, cfg.rms_norm_eps)
    return b.add(f"{L}.per_layer_residual", x, g)


def last_rows(inputs, x):
    """The per-layer inputs [B, T, L, P] at the rows of ``x`` [B, T', ...]: its last T' (after
    ``live_rows`` the stream holds the forward's last positions only; else all of them)."""
    T, rows = inputs.shape[1], x.shape[1]
    return inputs if rows == T else inputs[:, T - rows:]


def layer(b: Builder, cfg: Config, i: int, x: str, per_layer_inputs: str | None, rope: dict) -> str:
    L, eps = f"layers.{i}", cfg.rms_norm_eps
    h = b.rmsnorm(f"{L}.input_layernorm", x, eps)
    h = b.rmsnorm(f"{L}.post_attention_layernorm", attention(b, cfg, i, h, rope), eps)
    x = b.add(f"{L}.attn_residual", x, h)
    x = b.add(f"{L}.ffn_residual", x, feed_forward(b, cfg, i, x))
    if per_layer_inputs is not None:
        x = per_layer_input(b, cfg, i, x, per_layer_inputs)
    ls = f"{L}.layer_scalar"
    if b.has(ls):
        return b.op(L, "scale", lambda ctx, x: x * ctx.weights[ls], [x], [ls])
    return b.identity(L, x, kind="output")


def build(cfg: Config, b: Builder):
    rope = {}
    for kind, p in cfg.rope.items():  # one table per layer type, at that type's head_dim
        if kind in cfg.layer_types:
            rope[kind] = rope_params(cfg.head_dims[cfg.layer_types.index(kind)], p)
    x, per_layer_inputs = embed(b, cfg)
    for i in range(cfg.num_hidden_layers):
        if b.prune and i == cfg.first_kv_shared:  # KV-shared layers write no cache: their other rows reach nothing
            x = b.live_rows(f"layers.{i}.live_rows", x)
        x = layer(b, cfg, i, x, per_layer_inputs, rope)
    x = b.rmsnorm("norm", x, cfg.rms_norm_eps)
    x = b.lm_head(x, tie=cfg.tie_word_embeddings)
    b.logits(x, cap=cfg.final_logit_softcapping)
    return b.program(["input_ids", "rope_offset", "attn_mask", "attn_mask_sliding"])
