"""The zoo's configs: the config.json of every tiny architecture, the quantization and
layout choices, the tiny vision/audio towers, and the Gemma-4-31B shape of build_sparse."""
from __future__ import annotations

ARCHS = ("gemma4_text", "gemma4_moe", "gemma4_kv", "gemma4", "gemma3_text", "gemma3", "qwen3", "llama")
#: architectures the inspector knows (and mlx-lm loads) but workbench's model programs do not run; their
#: towers are stand-ins mlx-vlm cannot load, so ``workbench.load`` (which opens them with mlx-vlm) refuses
#: them and inspect reports that, its language model aside (tests/test_inspect.py)
INSPECT_ONLY_ARCHS = ("gemma3n",)
QUANTS = (None, "affine4", "affine8", "mxfp4", "mxfp8", "nvfp4")
LAYOUTS = ("mlx", "hf")

#: quant name -> (mode, bits, group_size)
QUANT_SPECS = {"affine4": ("affine", 4, 64), "affine8": ("affine", 8, 64), "mxfp4": ("mxfp4", 4, 32),
               "mxfp8": ("mxfp8", 8, 32), "nvfp4": ("nvfp4", 4, 16)}

_ROPE_G4 = {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 10000.0, "rope_type": "default"}}


def _gemma4_text_cfg(**kw) -> dict:
    c = {"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 6, "intermediate_size": 128,
         "num_attention_heads": 2, "head_dim": 32, "global_head_dim": 64, "num_key_value_heads": 1,
         "num_global_key_value_heads": None, "num_kv_shared_layers": 2, "hidden_size_per_layer_input": 16,
         "vocab_size": 256, "vocab_size_per_layer_input": 256,
         "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                         "sliding_attention", "sliding_attention", "full_attention"],
         "sliding_window": 16, "sliding_window_pattern": 3, "rms_norm_eps": 1e-6, "final_logit_softcapping": 30.0,
         "use_double_wide_mlp": True, "enable_moe_block": False, "attention_k_eq_v": False,
         "num_experts": None, "top_k_experts": None, "moe_intermediate_size": None,
         "tie_word_embeddings": True, "max_position_embeddings": 4096, "rope_parameters": _ROPE_G4,
         "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
    c.update(kw)
    return c


def base_config(arch: str) -> dict:
    """The config.json the zoo writes for ``arch`` (before overrides)."""
    lt4 = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    if arch == "gemma4_text":
        return _gemma4_text_cfg()
    if arch == "gemma4_moe":
        return _gemma4_text_cfg(num_hidden_layers=4, layer_types=lt4, num_kv_shared_layers=0,
                                hidden_size_per_layer_input=0, enable_moe_block=True, num_experts=4,
                                top_k_experts=2, moe_intermediate_size=64)
    if arch == "gemma4_kv":
        return _gemma4_text_cfg(num_hidden_layers=4, layer_types=lt4, num_kv_shared_layers=0,
                                hidden_size_per_layer_input=0, attention_k_eq_v=True, num_attention_heads=4,
                                num_key_value_heads=2, num_global_key_value_heads=1, head_dim=16,
                                global_head_dim=32)
    if arch == "gemma4":
        return {"model_type": "gemma4", "text_config": _gemma4_text_cfg(), "vocab_size": 256,
                "vision_config": {"model_type": "gemma4_vision", "hidden_size": 32, "num_hidden_layers": 1,
                                  "intermediate_size": 64, "patch_size": 4},
                "audio_config": {"model_type": "gemma4_audio", "hidden_size": 32, "num_hidden_layers": 1},
                "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
    g3 = {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 6, "intermediate_size": 128,
          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "query_pre_attn_scalar": 32,
          "sliding_window": 16, "sliding_window_pattern": 6, "vocab_size": 256, "rope_theta": 1000000.0,
          "rope_local_base_freq": 10000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
          "rope_scaling": None, "final_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": 1,
          "pad_token_id": 0}
    if arch == "gemma3_text":
        return g3
    if arch == "gemma3":
        return {"model_type": "gemma3", "text_config": g3, "vocab_size": 256,
                "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "num_hidden_layers": 1,
                                  "intermediate_size": 64, "patch_size": 4},
                "mm_tokens_per_image": 4, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
    if arch == "gemma3n":
        t = {"model_type": "gemma3n_text", "hidden_size": 64, "num_hidden_layers": 4,
             "intermediate_size": [128, 128, 256, 256], "num_attention_heads": 2, "head_dim": 32,
             "rms_norm_eps": 1e-6, "vocab_size": 256, "num_key_value_heads": 1, "num_kv_shared_layers": 2,
             "vocab_size_per_layer_input": 256, "sliding_window": 16, "max_position_embeddings": 4096,
             "rope_local_base_freq": 10000.0, "rope_theta": 1000000.0, "final_logit_softcapping": 30.0,
             "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
             "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0], "hidden_size_per_layer_input": 16,
             "altup_num_inputs": 4, "altup_coef_clip": 120.0, "altup_correct_scale": True, "altup_active_idx": 0,
             "laurel_rank": 16, "rope_scaling": None}
        return {"model_type": "gemma3n", "text_config": t, "vocab_size": 256,
                "vision_config": {"model_type": "gemma3n_vision", "hidden_size": 32},
                "audio_config": {"model_type": "gemma3n_audio", "hidden_size": 32},
                "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
    if arch == "qwen3":
        return {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 3, "intermediate_size": 128,
                "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 256,
                "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "rope_theta": 1000000.0,
                "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
    if arch == "llama":
        return {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 3, "intermediate_size": 128,
                "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 256, "rms_norm_eps": 1e-5,
                "rope_theta": 10000.0, "tie_word_embeddings": False, "max_position_embeddings": 4096,
                "attention_bias": False, "mlp_bias": False, "bos_token_id": 2, "eos_token_id": 1,
                "pad_token_id": 0}
    raise ValueError(f"unknown zoo architecture {arch!r}; choose from {', '.join(ARCHS + INSPECT_ONLY_ARCHS)}")


def tower_tensors(arch: str, text_hidden: int) -> dict:
    """name -> shape of the tiny vision/audio towers (separate components)."""
    t = {}
    if arch in ("gemma4", "gemma3n"):
        v = "vision_tower"
        t[f"{v}.patch_embedder.input_proj.weight"] = (32, 48)
        t[f"{v}.patch_embedder.position_embedding_table"] = (2, 16, 32)
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[f"{v}.encoder.layers.0.self_attn.{n}.linear.weight"] = (32, 32)
        t[f"{v}.encoder.layers.0.mlp.gate_proj.linear.weight"] = (64, 32)
        t[f"{v}.encoder.layers.0.mlp.up_proj.linear.weight"] = (64, 32)
        t[f"{v}.encoder.layers.0.mlp.down_proj.linear.weight"] = (32, 64)
        t[f"{v}.encoder.layers.0.input_layernorm.weight"] = (32,)
        t[f"{v}.encoder.layers.0.post_attention_layernorm.weight"] = (32,)
        t["embed_vision.embedding_projection.weight"] = (text_hidden, 32)
        a = "audio_tower"
        t[f"{a}.subsample_conv_projection.layer0.conv.weight"] = (8, 3, 3, 1)
        t[f"{a}.subsample_conv_projection.input_proj_linear.weight"] = (32, 64)
        for n in ("q_proj", "k_proj", "v_proj", "post"):
            t[f"{a}.layers.0.self_attn.{n}.linear.weight"] = (32, 32)
        t[f"{a}.layers.0.feed_forward1.ffw_layer_1.linear.weight"] = (64, 32)
        t[f"{a}.layers.0.feed_forward1.ffw_layer_2.linear.weight"] = (32, 64)
        t[f"{a}.layers.0.norm_out.weight"] = (32,)
        t[f"{a}.output_proj.weight"] = (32, 32)
        t["embed_audio.embedding_projection.weight"] = (text_hidden, 32)
    elif arch == "gemma3":
        v = "vision_tower.vision_model"
        t[f"{v}.embeddings.patch_embedding.weight"] = (32, 4, 4, 3)
        t[f"{v}.embeddings.position_embedding.weight"] = (16, 32)
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            t[f"{v}.encoder.layers.0.self_attn.{n}.weight"] = (32, 32)
            t[f"{v}.encoder.layers.0.self_attn.{n}.bias"] = (32,)
        t[f"{v}.encoder.layers.0.mlp.fc1.weight"] = (64, 32)
        t[f"{v}.encoder.layers.0.mlp.fc2.weight"] = (32, 64)
        t[f"{v}.encoder.layers.0.layer_norm1.weight"] = (32,)
        t[f"{v}.encoder.layers.0.layer_norm2.weight"] = (32,)
        t[f"{v}.post_layernorm.weight"] = (32,)
        t["multi_modal_projector.mm_input_projection_weight"] = (32, text_hidden)
        t["multi_modal_projector.mm_soft_emb_norm.weight"] = (32,)
    return t



#: the Gemma-4-31B text config (build_sparse's default shape)
GEMMA4_31B = {
    "model_type": "gemma4_text", "hidden_size": 5376, "num_hidden_layers": 60, "intermediate_size": 21504,
    "num_attention_heads": 32, "head_dim": 256, "global_head_dim": 512, "num_key_value_heads": 16,
    "num_global_key_value_heads": 4, "attention_k_eq_v": True, "num_kv_shared_layers": 0,
    "hidden_size_per_layer_input": 0, "vocab_size": 262144, "sliding_window": 1024, "sliding_window_pattern": 6,
    "final_logit_softcapping": 30.0, "tie_word_embeddings": True, "enable_moe_block": False,
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
}
