"""Gemma 3n (inspect only: no op program, the reference runs it): the tensors a sound
checkpoint holds (mlx-lm's models/gemma3n.py names): AltUp, LAuReL, per-layer inputs."""
from __future__ import annotations

from workbench.checkpoint import fields as F

FAMILY = "gemma3n"


def arch(tc: dict) -> F.Arch:
    """Gemma 3n (mlx-lm models/gemma3n.py): AltUp, LAuReL, per-layer inputs; the last
    num_kv_shared_layers layers' k/v projections may be absent (checkpoint/corrections/gemma3n.py);
    per-layer intermediate sizes may be a list."""
    D = F.read_int(tc, "hidden_size")
    L = F.read_int(tc, "num_hidden_layers")
    H = F.read_int(tc, "num_attention_heads")
    V = F.read_int(tc, "vocab_size")
    hd = F.read_int(tc, "head_dim")
    kvh = F.read_int(tc, "num_key_value_heads")
    P = F.read_int(tc, "hidden_size_per_layer_input")
    Vp = F.read_int(tc, "vocab_size_per_layer_input")
    n = F.read_int(tc, "altup_num_inputs")
    r = F.read_int(tc, "laurel_rank")
    Is = tc.get("intermediate_size")
    if isinstance(Is, list):
        if len(Is) != L or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in Is):
            raise F.ConfigError(f"config.json: intermediate_size must list {L} positive integers")
    else:
        Is = [F.read_int(tc, "intermediate_size")] * L
    lt = tc.get("layer_types")
    if not isinstance(lt, list) or len(lt) != L or any(t not in ("sliding_attention", "full_attention") for t in lt):
        raise F.ConfigError(f"config.json: layer_types must list {L} entries of sliding_attention/full_attention")
    shared = tc.get("num_kv_shared_layers", 0)
    if isinstance(shared, bool) or not isinstance(shared, int) or not 0 <= shared < L:
        raise F.ConfigError(f"config.json: num_kv_shared_layers must be an integer from 0 to {L - 1}, got {shared!r}")
    a = F.Arch("gemma3n", tc, L, layer_types=list(lt), neutral_norm=1.0, tied=True)
    a.add("embed_tokens.weight", (V, D), "embedding")
    for i in range(L):
        F.attention_tensors(a, i, D, H, kvh, hd, qk_norm=True)
        if i >= L - shared:  # (KV-shared: transformers 5 writes no k/v here, an older save's are never read)
            for m in ("k_proj", "v_proj", "k_norm"):
                e = a.expected[f"layers.{i}.self_attn.{m}.weight"]
                a.add(e.name, e.shape, e.kind, i, optional=True, ignored_if_present=True)
        F.mlp_tensors(a, i, D, Is[i])
        F.norm_tensors(a, i, D, ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                              "post_feedforward_layernorm", "post_per_layer_input_norm"))
        a.add(f"layers.{i}.altup.correct_output_scale", (D,), "vector", i)
        a.add(f"layers.{i}.altup.correction_coefs.weight", (n, n), "linear", i)
        a.add(f"layers.{i}.altup.prediction_coefs.weight", (n * n, n), "linear", i)
        a.add(f"layers.{i}.altup.modality_router.weight", (n, D), "linear", i)
        a.add(f"layers.{i}.altup.router_norm.weight", (D,), "norm", i)
        a.add(f"layers.{i}.laurel.linear_left.weight", (r, D), "linear", i)
        a.add(f"layers.{i}.laurel.linear_right.weight", (D, r), "linear", i)
        a.add(f"layers.{i}.laurel.post_laurel_norm.weight", (D,), "norm", i)
        a.add(f"layers.{i}.per_layer_input_gate.weight", (P, D), "linear", i)
        a.add(f"layers.{i}.per_layer_projection.weight", (D, P), "linear", i)
    a.add("embed_tokens_per_layer.weight", (Vp, L * P), "embedding")
    a.add("per_layer_model_projection.weight", (L * P, D), "linear")
    a.add("per_layer_projection_norm.weight", (P,), "norm")
    for j in range(n - 1):
        a.add(f"altup_projections.{j}.weight", (D, D), "linear")
        a.add(f"altup_unembed_projections.{j}.weight", (D, D), "linear")
    a.add("norm.weight", (D,), "norm")
    return a
