"""Tiny multimodal checkpoints (Gemma 4 with vision and audio towers, Gemma 3 with its
SigLIP vision tower), written from mlx-vlm's own classes so that mlx-vlm loads them strictly.

    build_gemma4(dest)                                    # text 2 layers, vision 2, audio 2
    build_gemma4(dest, nan_at="audio_tower.layers.1.feed_forward1.ffw_layer_1.linear.weight")
    build_gemma3(dest)                                    # text 2 layers, vision 1 (16 x 16 images)

Gemma 4: token ids 250..255 are the placeholders (image, audio, boi, eoi, boa, eoa) of a
256-token vocabulary; Gemma 3: 250..252 (image, boi, eoi).  Random values; 1-D
parameters are perturbed so norms are not all ones.
"""
from __future__ import annotations

import copy
import importlib
import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map_with_path

from workbench import fsio

GEMMA4 = {
    "model_type": "gemma4", "vocab_size": 256, "image_token_id": 250, "audio_token_id": 251,
    "boi_token_id": 252, "eoi_token_id": 253, "boa_token_id": 254, "eoa_token_id": 255,
    "vision_soft_tokens_per_image": 4, "audio_ms_per_token": 40, "hidden_size": 64,
    "text_config": {"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 2,
                    "intermediate_size": 128, "num_attention_heads": 4, "head_dim": 16, "global_head_dim": 32,
                    "num_key_value_heads": 2, "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 16,
                    "vocab_size": 256, "vocab_size_per_layer_input": 256, "sliding_window": 8,
                    "sliding_window_pattern": 2, "max_position_embeddings": 512,
                    # (spelled out: where transformers' defaults differ from mlx-vlm's, these are mlx-vlm's)
                    "final_logit_softcapping": 30.0, "use_double_wide_mlp": True,
                    "rope_parameters": {"full_attention": {"partial_rotary_factor": 1.0, "rope_theta": 1000000.0,
                                                           "rope_type": "proportional"},
                                        "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 10000.0,
                                                              "rope_type": "default"}}},
    "vision_config": {"model_type": "gemma4_vision", "hidden_size": 32, "intermediate_size": 64,
                      "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16,
                      "global_head_dim": 16, "patch_size": 4, "pooling_kernel_size": 2,
                      "position_embedding_size": 64, "default_output_length": 4},
    "audio_config": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "subsampling_conv_channels": [8, 4], "output_proj_dims": 32, "conv_kernel_size": 5},
}


GEMMA3 = {
    "model_type": "gemma3", "vocab_size": 256, "image_token_index": 250, "boi_token_index": 251,
    "eoi_token_index": 252, "pad_token_id": 0, "hidden_size": 64, "mm_tokens_per_image": 4,
    "text_config": {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
                    "num_attention_heads": 4, "head_dim": 16, "num_key_value_heads": 2, "vocab_size": 256,
                    "sliding_window": 8, "sliding_window_pattern": 2, "query_pre_attn_scalar": 16,
                    "mm_tokens_per_image": 4, "max_position_embeddings": 512},
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                      "num_hidden_layers": 1, "num_attention_heads": 2, "patch_size": 4, "image_size": 16},
}


def build_gemma3(dest, *, seed: int = 0, dtype=None, nan_at: str | None = None) -> Path:
    """Write a tiny Gemma 3 checkpoint with its vision tower (``nan_at``: see build_gemma4)."""
    return _build("gemma3", GEMMA3, ["text", "vision"], dest, seed=seed, dtype=dtype, nan_at=nan_at)


def build_gemma4(dest, *, audio: bool = True, seed: int = 0, dtype=None, nan_at: str | None = None,
                 scale: dict | None = None) -> Path:
    """Write a tiny Gemma 4 checkpoint with towers; ``nan_at`` plants a NaN in that tensor,
    ``scale`` multiplies tensors by factors (e.g. to provoke a float16 overflow)."""
    cfg = copy.deepcopy(GEMMA4)
    if not audio:
        cfg.pop("audio_config")
    return _build("gemma4", cfg, ["text", "vision", "audio"], dest, seed=seed, dtype=dtype, nan_at=nan_at,
                  scale=scale)


def _build(model_type: str, cfg: dict, parts: list, dest, *, seed, dtype, nan_at, scale=None) -> Path:
    from mlx_vlm.utils import update_module_configs

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    cfg = copy.deepcopy(cfg)
    mod = importlib.import_module(f"mlx_vlm.models.{model_type}")
    mc = update_module_configs(mod.ModelConfig.from_dict(cfg), mod, cfg, parts)
    mx.random.seed(seed)
    model = mod.Model(mc)
    model.update(tree_map_with_path(
        lambda p, v: v + 0.2 * mx.random.normal(v.shape, dtype=v.dtype) if v.ndim == 1 else v,
        model.parameters()))
    if dtype is not None:
        model.set_dtype(dtype)
    weights = dict(tree_flatten(model.parameters()))
    for name, factor in (scale or {}).items():
        weights[name] = weights[name] * factor
    if nan_at is not None:
        w = weights[nan_at]
        flat = w.reshape(-1)
        weights[nan_at] = mx.where(mx.arange(flat.size) == 0, mx.array(float("nan"), w.dtype), flat).reshape(w.shape)
    fsio.write_with(dest / "model.safetensors", lambda p: mx.save_safetensors(p, weights, metadata={"format": "mlx"}))
    fsio.write_text(dest / "config.json", json.dumps(cfg, indent=1))
    return dest
