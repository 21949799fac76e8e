"""Tiny random checkpoints of mlx-lm architectures, built from mlx-lm's own classes.

    from workbench.zoo import reference as zr
    path = zr.build("mixtral", tmp / "mx")                      # float32, tokenizer.json
    path = zr.build("phi3", tmp / "p3", dtype="bfloat16", quant="affine4")
    path = zr.write(tmp / "x", {"model_type": "qwen2", ...})   # any config mlx-lm builds

Where :func:`workbench.zoo.build` writes tensors from our own architecture knowledge,
this writes whatever ``mlx_lm.models.<type>`` (after mlx-lm's model-type remapping)
constructs: random init, every 1-D parameter perturbed so norm weights, biases and
scalars are not all ones or zeros, saved as config.json + model.safetensors, which
mlx-lm loads strictly.  ``ARCHS`` holds a tiny config per architecture (hidden 64,
2 layers, vocab 256), dense and mixture-of-experts.
"""
from __future__ import annotations

import copy
import importlib
import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map_with_path

from workbench import fsio

_BASE = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, vocab_size=256,
             max_position_embeddings=512, tie_word_embeddings=False)

#: architecture -> tiny config.json (mlx-lm's model_type; "mistral" is built by mlx-lm's llama)
ARCHS: dict[str, dict] = {
    # dense
    "mistral": dict(_BASE, model_type="mistral", rope_theta=1000000.0),
    "qwen2": dict(_BASE, model_type="qwen2", rope_theta=1000000.0),
    "phi3": dict(_BASE, model_type="phi3", rope_theta=10000.0, partial_rotary_factor=1.0),
    "phi": dict(_BASE, model_type="phi", num_key_value_heads=4, partial_rotary_factor=0.5,
                layer_norm_eps=1e-5),
    "olmo2": dict(_BASE, model_type="olmo2", rope_theta=10000.0),
    # (hidden_act named: without it the original runs its default gelu_pytorch_tanh, mlx-lm the exact GELU)
    "starcoder2": dict(_BASE, model_type="starcoder2", norm_epsilon=1e-5, rope_theta=100000.0, hidden_act="gelu"),
    "gemma2": dict(_BASE, model_type="gemma2", query_pre_attn_scalar=16.0, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0, rope_theta=10000.0),
    "cohere": dict(_BASE, model_type="cohere", layer_norm_eps=1e-5, logit_scale=0.0625, use_qk_norm=True,
                   rope_theta=10000.0),
    "granite": dict(_BASE, model_type="granite", logits_scaling=4.0, attention_multiplier=0.25,
                    embedding_multiplier=6.0, residual_multiplier=0.5, attention_bias=False, mlp_bias=False,
                    rope_theta=10000.0),
    "gemma3n": {"model_type": "gemma3n", "text_config": {
        "model_type": "gemma3n_text", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
        "num_attention_heads": 4, "head_dim": 16, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
        "vocab_size": 256, "vocab_size_per_layer_input": 256, "hidden_size_per_layer_input": 16,
        "num_kv_shared_layers": 0, "sliding_window": 8, "max_position_embeddings": 512,
        "rope_local_base_freq": 10000.0, "rope_theta": 1000000.0, "final_logit_softcapping": 30.0,
        "layer_types": ["sliding_attention", "full_attention"], "activation_sparsity_pattern": [0.95, 0.0],
        "altup_num_inputs": 4, "altup_coef_clip": 120.0, "altup_correct_scale": True, "altup_active_idx": 0,
        "laurel_rank": 8, "rope_scaling": None}},
    # mixture of experts
    "mixtral": dict(_BASE, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2, rope_theta=1e6),
    "qwen3_moe": dict(_BASE, model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                      mlp_only_layers=[], moe_intermediate_size=32, norm_topk_prob=True, rope_theta=1e6),
    "qwen2_moe": dict(_BASE, model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64, rope_theta=1e6),
    "olmoe": dict(_BASE, model_type="olmoe", num_experts=4, num_experts_per_tok=2, norm_topk_prob=False,
                  rope_theta=10000.0),
    "gpt_oss": dict(_BASE, model_type="gpt_oss", intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
                    sliding_window=4, rope_theta=150000.0, layer_types=["sliding_attention", "full_attention"]),
    "deepseek_v3": dict(_BASE, model_type="deepseek_v3", num_key_value_heads=4, moe_intermediate_size=32, head_dim=8,
                        n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, routed_scaling_factor=1.5,
                        kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16,
                        topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True, n_group=2,
                        topk_group=1, moe_layer_freq=1, first_k_dense_replace=1, rope_theta=10000.0),
}

#: the mixture-of-experts architectures of ARCHS
MOE = ("mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "gpt_oss", "deepseek_v3")

#: quantization name (as in workbench.zoo) -> (mode, bits, group_size)
QUANT_SPECS = {"affine4": ("affine", 4, 32), "affine8": ("affine", 8, 32), "mxfp4": ("mxfp4", 4, 32),
               "mxfp8": ("mxfp8", 8, 32), "nvfp4": ("nvfp4", 4, 16)}

_DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def model_classes(config: dict):
    """``(Model, ModelArgs)`` of ``mlx_lm.models.<model_type>`` (mlx-lm's remapping applied)."""
    from mlx_lm.utils import MODEL_REMAPPING

    mt = config.get("model_type")
    if not isinstance(mt, str):
        raise ValueError("config has no string model_type")
    name = MODEL_REMAPPING.get(mt, mt)
    try:
        mod = importlib.import_module(f"mlx_lm.models.{name}")
    except ImportError as e:
        raise ValueError(f"mlx-lm has no model {name!r} (model_type {mt!r})") from e
    return mod.Model, mod.ModelArgs


def write(dest, config: dict, *, quant=None, seed: int = 0, dtype=None, tokenizer: bool = False) -> Path:
    """Write a random checkpoint of ``config`` built by mlx-lm's classes into ``dest``.

    quant: a name of QUANT_SPECS or ``{"group_size", "bits", "mode"}`` (mlx-lm's
    ``quantize_model``); dtype: None (float32 as built), a name or an ``mx.Dtype``;
    tokenizer: also write the zoo's word-level tokenizer.json."""
    from mlx_lm.utils import quantize_model

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(config)
    mx.random.seed(seed)
    cls, args_cls = model_classes(config)
    model = cls(args_cls.from_dict(config))
    # perturb vectors (norm weights, biases, scalars, router scales) so nothing is trivially one
    model.update(tree_map_with_path(
        lambda p, v: v + 0.2 * mx.random.normal(v.shape, dtype=v.dtype) if v.ndim == 1 else v,
        model.parameters()))
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(_DTYPES)}")
        dtype = _DTYPES[dtype]
    if dtype is not None:
        model.set_dtype(dtype)
    if quant:
        if isinstance(quant, str):
            if quant not in QUANT_SPECS:
                raise ValueError(f"unknown quantization {quant!r}; choose from {', '.join(QUANT_SPECS)}")
            mode, bits, gs = QUANT_SPECS[quant]
            quant = {"mode": mode, "bits": bits, "group_size": gs}
        model, config = quantize_model(model, config, quant.get("group_size"), quant.get("bits"),
                                       mode=quant.get("mode", "affine"))
    weights = dict(tree_flatten(model.parameters()))
    fsio.write_with(dest / "model.safetensors", lambda p: mx.save_safetensors(p, weights, metadata={"format": "mlx"}))
    fsio.write_text(dest / "config.json", json.dumps(config, indent=1))
    if tokenizer:
        from workbench.zoo.writer import write_tokenizer

        tc = config.get("text_config", config)
        write_tokenizer(dest, tc["vocab_size"])
    return dest


def build(arch: str, dest, *, quant=None, seed: int = 0, dtype=None, tokenizer: bool = True,
          **config_overrides) -> Path:
    """Write a tiny random checkpoint of ``arch`` (a key of ARCHS) into ``dest``; return its
    path.  ``config_overrides`` replace fields of the (text) config."""
    if arch not in ARCHS:
        raise ValueError(f"unknown reference architecture {arch!r}; choose from {', '.join(ARCHS)}")
    config = copy.deepcopy(ARCHS[arch])
    (config.get("text_config") or config).update(config_overrides)
    return write(dest, config, quant=quant, seed=seed, dtype=dtype, tokenizer=tokenizer)


def reference(path):
    """mlx-lm's own model for the checkpoint at ``path`` (loaded strictly)."""
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(path), strict=True)
    return model
