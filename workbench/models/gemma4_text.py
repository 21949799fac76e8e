"""Gemma 4 (text): the language model of every Gemma 4 checkpoint, dense and MoE.

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

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from workbench import registry
from workbench.checkpoint import fields as F
from workbench.checkpoint.fields import ConfigError, show
from workbench.models.builder import Builder, geglu
from workbench.models.rope import rope_params

FAMILY = "gemma4_text"
MODEL_TYPES = registry.model_types(FAMILY)
#: config.json keys this family reads, knowingly ignores, or reads at given values only
KEYS = F.Keys(
    handled=frozenset({"hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                       "head_dim", "global_head_dim", "num_key_value_heads", "num_global_key_value_heads",
                       "per_layer_config", "rms_norm_eps", "vocab_size", "vocab_size_per_layer_input",
                       "hidden_size_per_layer_input", "num_kv_shared_layers", "rope_parameters",
                       "max_position_embeddings", "sliding_window", "sliding_window_pattern", "layer_types",
                       "attention_k_eq_v", "final_logit_softcapping", "use_double_wide_mlp",
                       "enable_moe_block", "num_experts", "top_k_experts", "moe_intermediate_size",
                       "tie_word_embeddings"}),
    # "vision": image tokens attend both ways; text tokens (all we run) stay causal;
    # mlx-lm's ModelArgs declares (and a config written from it carries) three more keys:
    # the two RoPE fractions it never reads (rope_parameters holds them) and its RoPE switch
    only={"hidden_activation": ("gelu_pytorch_tanh",), "attention_bias": (False,),
          "use_bidirectional_attention": (None, "vision"), "global_partial_rotary_factor": (0.25,),
          "partial_rotary_factor": (1.0,), "rope_traditional": (False,)})


@dataclass
class Config:
    """What the config reader (:func:`read`) returns and the program reads: per-layer
    ``head_dims`` / ``kv_heads`` (from transformers' ``per_layer_config``, or the older
    ``global_head_dim`` / ``num_global_key_value_heads`` of full layers) and ``rope`` per
    layer type."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    head_dims: list
    kv_heads: list
    rms_norm_eps: float
    vocab_size: int
    num_kv_shared_layers: int
    hidden_size_per_layer_input: int
    rope: dict
    sliding_window: int
    attention_k_eq_v: bool
    final_logit_softcapping: float | None
    use_double_wide_mlp: bool
    enable_moe_block: bool
    num_experts: int | None
    top_k_experts: int | None
    moe_intermediate_size: int | None
    layer_types: list
    tie_word_embeddings: bool
    vocab_size_per_layer_input: int | None = None

    # -- per-layer geometry
    def is_full(self, i: int) -> bool:
        return self.layer_types[i] == "full_attention"

    def head_dim_of(self, i: int) -> int:
        return self.head_dims[i]

    def k_eq_v(self, i: int) -> bool:
        return self.attention_k_eq_v and self.is_full(i)

    def kv_heads_of(self, i: int) -> int:
        return self.kv_heads[i]

    @property
    def first_kv_shared(self) -> int:
        return self.num_hidden_layers - self.num_kv_shared_layers

    def kv_source(self, i: int) -> int:
        """The layer whose keys/values layer ``i`` attends to (itself unless KV-shared)."""
        if i < self.first_kv_shared:
            return i
        same = [j for j in range(self.first_kv_shared) if self.layer_types[j] == self.layer_types[i]]
        if not same:
            raise ValueError(f"layer {i} shares KV but no earlier {self.layer_types[i]} layer computes it")
        return same[-1]


# --------------------------------------------------------------------------- config.json

#: RoPE per layer type where the config gives none (mlx-lm)
ROPE_DEFAULTS = {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                    "rope_type": "proportional"},
                 "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}


def _per_layer(tc, L, lt, hd, kvh, k_eq_v):
    """Per-layer head_dim and KV-head count: transformers >= 5 writes ``per_layer_config``
    (``{"3": {"head_dim": 512, "num_key_value_heads": 4}}``, full layers only); older configs
    ``global_head_dim`` / ``num_global_key_value_heads`` for the full layers."""
    plc = tc.get("per_layer_config")
    hds, kvs = [hd] * L, [kvh] * L
    if plc is None:
        ghd = F.read_int(tc, "global_head_dim", 512, allow_none=True)
        gkv = F.read_int(tc, "num_global_key_value_heads", None, allow_none=True)
        for i in range(L):
            if lt[i] == "full_attention":
                hds[i] = ghd or hd
                if k_eq_v and gkv is not None:
                    kvs[i] = gkv
        return hds, kvs
    if not isinstance(plc, dict):
        raise ConfigError(f"config.json: per_layer_config must be an object, got {show(plc)}")
    for key, over in plc.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < L):
            raise ConfigError(f"config.json: per_layer_config key {show(key)} is not a layer index below {L}")
        if not isinstance(over, dict):
            raise ConfigError(f"config.json: per_layer_config.{key} must be an object, got {show(over)}")
        i = int(key)
        for k in over:
            if k not in ("head_dim", "num_key_value_heads"):
                raise ConfigError(f"config.json: per_layer_config.{key}.{k} is not handled (per layer: head_dim, "
                                  "num_key_value_heads)")
        hds[i] = F.read_int(over, "head_dim", hd, where=f"per_layer_config.{key}.head_dim")
        kvs[i] = F.read_int(over, "num_key_value_heads", kvh, where=f"per_layer_config.{key}.num_key_value_heads")
    # the older keys may stand beside per_layer_config only when they agree with it
    for key, vals in (("global_head_dim", hds), ("num_global_key_value_heads", kvs)):
        v = tc.get(key)
        if v is not None and any(vals[i] != v for i in range(L) if lt[i] == "full_attention") and \
                (key == "global_head_dim" or k_eq_v):
            raise ConfigError(f"config.json: {key} = {show(v)} disagrees with per_layer_config")
    return hds, kvs


def _stated(tc, key, mlx_default, hf_default, unless=False):
    """``tc`` itself, when it gives ``key`` or ``unless`` (the key has no effect); otherwise a
    ConfigError: mlx-lm and transformers read a missing ``key`` differently (``mlx_default`` /
    ``hf_default``), so a config without it does not say which model it is."""
    if key in tc or unless:
        return tc
    raise ConfigError(f"config.json has no {key}: transformers reads {show(hf_default)} there, mlx-lm "
                      f"{show(mlx_default)}; add the one this checkpoint was trained with")


def read(tc: dict) -> Config:
    """The text config read (mlx-lm's defaults where a key may be omitted; where mlx-lm and
    transformers default differently the config must say: ``_stated``), every value checked."""
    D = F.read_int(tc, "hidden_size")
    L = F.read_int(tc, "num_hidden_layers")
    H = F.read_int(tc, "num_attention_heads")
    V = F.read_int(tc, "vocab_size")
    I = F.read_int(tc, "intermediate_size", 6144)
    hd = F.read_int(tc, "head_dim", 256)
    kvh = F.read_int(tc, "num_key_value_heads", 1)
    nshared = F.read_int(_stated(tc, "num_kv_shared_layers", 20, 0), "num_kv_shared_layers", positive=False)
    P = F.read_int(tc, "hidden_size_per_layer_input", 256, positive=False, allow_none=True) or 0
    Vp = F.read_int(tc, "vocab_size_per_layer_input", 262144, allow_none=True) or V
    k_eq_v = F.read_bool(tc, "attention_k_eq_v", False)
    double = F.read_bool(_stated(tc, "use_double_wide_mlp", True, False, unless=nshared == 0),
                         "use_double_wide_mlp", True)
    moe = F.read_bool(tc, "enable_moe_block", False)
    tied = F.read_bool(tc, "tie_word_embeddings", True)
    eps = F.read_float(tc, "rms_norm_eps", 1e-6, maximum=1.0)
    window = F.read_int(tc, "sliding_window", 512)
    cap = F.read_float(_stated(tc, "final_logit_softcapping", 30.0, None), "final_logit_softcapping",
                       allow_none=True)
    pat = F.read_int(tc, "sliding_window_pattern", 5)
    p = ["sliding_attention"] * (pat - 1) + ["full_attention"]
    lt = F.read_layer_types(tc, L, (p * (L // len(p) + 1))[:L])
    if nshared > L:
        raise ConfigError(f"config.json: num_kv_shared_layers {nshared} > num_hidden_layers {L}")
    hds, kvs = _per_layer(tc, L, lt, hd, kvh, k_eq_v)
    for t in set(lt):  # one RoPE table per layer type: its layers share head_dim and KV heads
        idx = [i for i in range(L) if lt[i] == t]
        if len({hds[i] for i in idx}) > 1 or len({kvs[i] for i in idx}) > 1:
            raise ConfigError(f"config.json: per_layer_config gives {t} layers different head_dim / "
                              "num_key_value_heads (not handled)")
    for i in range(L):
        F.check_heads(H, kvs[i], f"layer {i}'s num_key_value_heads")
        F.check_even(hds[i], f"layer {i}'s head_dim")
    first_shared = L - nshared
    for i in range(first_shared, L):
        if lt[i] not in lt[:first_shared]:
            raise ConfigError(f"config.json: layer {i} shares KV but no earlier {lt[i]} layer computes it "
                              f"(num_kv_shared_layers {nshared})")
    rope = F.read_rope_by_type(tc, ROPE_DEFAULTS)
    rope = {t: F.read_rope(r, f"rope_parameters.{t}") for t, r in rope.items()}
    E = Im = K = None
    if moe:
        E = F.read_int(tc, "num_experts")
        Im = F.read_int(tc, "moe_intermediate_size")
        K = F.read_int(tc, "top_k_experts")
        if K > E:
            raise ConfigError(f"config.json: top_k_experts {K} > num_experts {E}")
    return Config(hidden_size=D, num_hidden_layers=L, intermediate_size=I, num_attention_heads=H,
                  head_dims=hds, kv_heads=kvs, rms_norm_eps=eps, vocab_size=V, num_kv_shared_layers=nshared,
                  hidden_size_per_layer_input=P, rope=rope, sliding_window=window, attention_k_eq_v=k_eq_v,
                  final_logit_softcapping=cap, use_double_wide_mlp=double, enable_moe_block=moe, num_experts=E,
                  top_k_experts=K, moe_intermediate_size=Im, layer_types=list(lt), tie_word_embeddings=tied,
                  vocab_size_per_layer_input=Vp if P else None)


def tensors(cfg: Config, a: F.Arch) -> None:
    """The checkpoint's tensors (mlx-lm's models/gemma4_text.py names)."""
    D, H, V, L, I = cfg.hidden_size, cfg.num_attention_heads, cfg.vocab_size, cfg.num_hidden_layers, \
        cfg.intermediate_size
    P, first_shared = cfg.hidden_size_per_layer_input, cfg.first_kv_shared
    E, Im = cfg.num_experts, cfg.moe_intermediate_size
    if cfg.enable_moe_block:
        a.moe = {"num_experts": E, "top_k": cfg.top_k_experts, "moe_intermediate_size": Im}
    a.add("embed_tokens.weight", (V, D), "embedding")
    for i in range(L):
        h, nkv = cfg.head_dims[i], cfg.kv_heads[i]
        has_kv = i < first_shared
        pre = f"layers.{i}.self_attn"
        a.add(f"{pre}.q_proj.weight", (H * h, D), "linear", i)
        # KV-shared layers reuse an earlier layer's K/V: their k/v projections may be absent
        a.add(f"{pre}.k_proj.weight", (nkv * h, D), "linear", i, optional=not has_kv, ignored_if_present=not has_kv)
        if not cfg.k_eq_v(i):
            a.add(f"{pre}.v_proj.weight", (nkv * h, D), "linear", i, optional=not has_kv,
                  ignored_if_present=not has_kv)
        a.add(f"{pre}.o_proj.weight", (D, H * h), "linear", i)
        a.add(f"{pre}.q_norm.weight", (h,), "norm", i)
        a.add(f"{pre}.k_norm.weight", (h,), "norm", i, optional=not has_kv, ignored_if_present=not has_kv)
        Ii = I * (2 if (cfg.use_double_wide_mlp and i >= first_shared > 0) else 1)
        F.mlp_tensors(a, i, D, Ii)
        F.norm_tensors(a, i, D, ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                                 "post_feedforward_layernorm"))
        if cfg.enable_moe_block:
            a.add(f"layers.{i}.router.proj.weight", (E, D), "linear", i)
            a.add(f"layers.{i}.router.scale", (D,), "vector", i)
            a.add(f"layers.{i}.router.per_expert_scale", (E,), "vector", i)
            a.add(f"layers.{i}.experts.switch_glu.gate_proj.weight", (E, Im, D), "experts", i)
            a.add(f"layers.{i}.experts.switch_glu.up_proj.weight", (E, Im, D), "experts", i)
            a.add(f"layers.{i}.experts.switch_glu.down_proj.weight", (E, D, Im), "experts", i)
            F.norm_tensors(a, i, D, ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                                     "pre_feedforward_layernorm_2"))
        if P:
            a.add(f"layers.{i}.per_layer_input_gate.weight", (P, D), "linear", i)
            a.add(f"layers.{i}.per_layer_projection.weight", (D, P), "linear", i)
            a.add(f"layers.{i}.post_per_layer_input_norm.weight", (D,), "norm", i)
        a.add(f"layers.{i}.layer_scalar", (1,), "scalar", i)
    a.add("norm.weight", (D,), "norm")
    if P:
        a.add("embed_tokens_per_layer.weight", (cfg.vocab_size_per_layer_input, L * P), "embedding")
        a.add("per_layer_model_projection.weight", (L * P, D), "linear")
        a.add("per_layer_projection_norm.weight", (P,), "norm")
    if not cfg.tie_word_embeddings:
        a.add("lm_head.weight", (V, D), "linear")


# --------------------------------------------------------------------------- program


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
