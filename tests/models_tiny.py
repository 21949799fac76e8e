"""Tiny random checkpoints written with mlx-lm itself, and mlx-lm's forward as reference.

Used by tests/test_models*.py and tests/test_reference_archs.py.  Every tiny model is
built from mlx-lm's own classes by :func:`workbench.zoo.reference.write` (random init,
1-D parameters perturbed so norms and scalars are not all ones), saved as config.json +
model.safetensors, and read back by both mlx-lm and the workbench.
"""
from __future__ import annotations

import json
from pathlib import Path

import workbench  # noqa: F401  (fast BLAS before mlx.core)
import mlx.core as mx
from workbench.zoo import reference as zr

BASE = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, vocab_size=256)

CONFIGS = {
    "llama": dict(BASE, model_type="llama", rope_theta=10000.0, tie_word_embeddings=False,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                  max_position_embeddings=512),
    "llama_tied": dict(BASE, model_type="llama", rope_theta=10000.0, tie_word_embeddings=True),
    "qwen3": dict(BASE, model_type="qwen3", rope_theta=1000000.0, max_position_embeddings=512,
                  tie_word_embeddings=True),
    "qwen2": dict(BASE, model_type="qwen2", rope_theta=1000000.0, max_position_embeddings=512,
                  tie_word_embeddings=False),
    "qwen3_yarn": dict(BASE, model_type="qwen3", rope_theta=1000000.0, max_position_embeddings=512,
                       tie_word_embeddings=False,
                       rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}),
    "gemma3_text": dict(BASE, model_type="gemma3_text", num_hidden_layers=4, rope_theta=1000000.0,
                        rope_local_base_freq=10000.0, query_pre_attn_scalar=24, sliding_window=5,
                        sliding_window_pattern=2, rope_scaling={"rope_type": "linear", "factor": 8.0},
                        max_position_embeddings=512),
    # dense with PLE, KV sharing, double-wide MLP, sliding/full, global_head_dim, proportional RoPE
    "gemma4_text": dict(BASE, model_type="gemma4_text", num_hidden_layers=6, head_dim=16, global_head_dim=32,
                        num_key_value_heads=2, num_kv_shared_layers=3, hidden_size_per_layer_input=16,
                        vocab_size_per_layer_input=256, sliding_window=5, sliding_window_pattern=3,
                        use_double_wide_mlp=True, final_logit_softcapping=30.0, max_position_embeddings=512,
                        rope_parameters={"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                                            "rope_type": "proportional"},
                                         "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}),
    # attention_k_eq_v with its own global KV head count, no PLE, no sharing
    "gemma4_keqv": dict(BASE, model_type="gemma4_text", num_hidden_layers=4, head_dim=16, global_head_dim=32,
                        num_key_value_heads=2, num_global_key_value_heads=1, attention_k_eq_v=True,
                        num_kv_shared_layers=0, hidden_size_per_layer_input=0, sliding_window=5,
                        sliding_window_pattern=2, max_position_embeddings=512, final_logit_softcapping=30.0),
    # MoE block: router + experts in parallel with the dense MLP
    "gemma4_moe": dict(BASE, model_type="gemma4_text", num_hidden_layers=3, head_dim=16, global_head_dim=32,
                       num_kv_shared_layers=0, hidden_size_per_layer_input=0, sliding_window=5,
                       sliding_window_pattern=3, enable_moe_block=True, num_experts=4, top_k_experts=2,
                       final_logit_softcapping=30.0,
                       moe_intermediate_size=64, max_position_embeddings=512),
}


def multimodal(text: dict) -> dict:
    """A gemma4 multimodal config wrapping ``text`` (mlx-lm layout: language_model.model.*)."""
    t = dict(text)
    t.pop("model_type")
    return {"model_type": "gemma4", "text_config": dict(t, model_type="gemma4_text"),
            "vocab_size": t["vocab_size"]}


def build(dest, config: dict, quant: dict | None = None, seed: int = 0, dtype=None) -> Path:
    """Write a random tiny checkpoint of ``config`` with mlx-lm's classes; return its path
    (the zoo's writer: :func:`workbench.zoo.reference.write`)."""
    return zr.write(dest, config, quant=quant, seed=seed, dtype=dtype)


reference = zr.reference  # mlx-lm's model for the checkpoint at ``path``


def ref_logits(path, ids: mx.array) -> mx.array:
    return reference(path)(ids)


def to_hf_layout(src, dest, extra_shared_kv: bool = True) -> Path:
    """Rewrite an MLX-layout multimodal gemma4 checkpoint in the original Hugging Face layout:
    ``model.language_model.*`` names, experts fused as ``gate_up_proj`` [E, 2I, D] /
    ``down_proj`` [E, D, I]; KV-shared layers keep (unused) k/v projections as HF ships them."""
    src, dest = Path(src), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    w = mx.load(str(src / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    out = {}
    for k, v in w.items():
        if k.startswith("language_model.model."):
            k = "model.language_model." + k[len("language_model.model."):]
        elif k.startswith("language_model."):
            k = k[len("language_model."):]
        out[k] = v
    for k in [k for k in out if ".experts.switch_glu.gate_proj.weight" in k]:
        base = k[: -len(".switch_glu.gate_proj.weight")]
        g = out.pop(k)
        u = out.pop(f"{base}.switch_glu.up_proj.weight")
        out[f"{base}.gate_up_proj"] = mx.concatenate([g, u], axis=-2)
        out[f"{base}.down_proj"] = out.pop(f"{base}.switch_glu.down_proj.weight")
    tc = cfg.get("text_config", cfg)
    n, ns = tc["num_hidden_layers"], tc.get("num_kv_shared_layers", 0)
    if extra_shared_kv and ns:
        for i in range(n - ns, n):
            q = out[f"model.language_model.layers.{i}.self_attn.q_proj.weight"]
            hd = out[f"model.language_model.layers.{i}.self_attn.q_norm.weight"].shape[0]
            kv = tc["num_key_value_heads"] * hd
            for p in ("k_proj", "v_proj"):
                out[f"model.language_model.layers.{i}.self_attn.{p}.weight"] = mx.zeros((kv, q.shape[1]), q.dtype)
            out[f"model.language_model.layers.{i}.self_attn.k_norm.weight"] = mx.ones((hd,), q.dtype)
    mx.save_safetensors(str(dest / "model.safetensors"), out)
    (dest / "config.json").write_text(json.dumps(cfg, indent=1))
    return dest
