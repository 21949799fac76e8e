"""The reference config reader's tables: which keys of config.json mlx-lm's families may leave
unread, derive, or read otherwise than the original, each entry with its reason.

Data only (checked against transformers 5.25's config classes and modeling files and mlx-lm
0.32), read by :func:`workbench.checkpoint.reference_config.normalise` and its checks, which
re-exports every table (import them from there):

* keys nobody reads: :data:`KEPT_UNREAD`, :data:`COMMON_IGNORED` (both granularities: the op
  families' rules, checkpoint/fields.py, read it too), :data:`IGNORED`;
* keys read under another name or meaning: :data:`ALIASES`, :data:`REMEANT`;
* values the original derives or fixes: :data:`DERIVATION_ONLY`, :data:`DERIVED`,
  :data:`IMPLIED`, :data:`FIXED`;
* sliding windows and layer patterns: :data:`WINDOWS_APPLIED` (checkpoint/corrections/windows.py
  applies them), :data:`WINDOW_UNREAD`, :data:`PERIODS`;
* keys and defaults known safe otherwise: :data:`READ_BY_CORRECTIONS`,
  :data:`REVIEWED_DEFAULTS`; configs known wrong: :data:`DEPARTURES`.
"""
from __future__ import annotations

from typing import Any


# ---------------------------------------------------------------------- keys nobody reads

#: keys published configs carry that the original config class keeps as plain attributes and no
#: model reads -> why they cannot change the logits (checked: no module of transformers 5.25 or
#: mlx-lm 0.32 names them); accepted at both granularities, at any value
KEPT_UNREAD: dict[str, str] = {
    "is_llama_config": "a nanotron (training framework) export flag SmolLM2 publishes; no model reads it",
    "rope_interleaved": "nanotron's RoPE layout flag, left in SmolLM2's config.json; transformers' Llama "
                        "always rotates halves and reads no such key (any value: the original's numbers)",
    "transformers.js_config": "transformers.js's (ONNX runtime) export hints SmolLM2 publishes; no Python model "
                              "reads them",
    "use_mrope": "Qwen2.5's config.json carries Qwen2-VL's multimodal-RoPE flag; Qwen2Config keeps it as a plain "
                 "attribute and no text model of transformers or mlx-lm reads it",
    "cache_implementation": "which KV-cache class generate() builds (Gemma 2/3 publish \"hybrid\"): read by "
                            "transformers' GenerationConfig, never by a model's forward",
}


#: keys any Hugging Face / MLX config may carry that do not change a text model's logits:
#: provenance, storage dtype, token ids, generation and training settings, and what is
#: read elsewhere (model_type picks the family, the quantization block is quant.py's)
COMMON_IGNORED = frozenset({
    "model_type", "quantization", "quantization_config",
    "architectures", "transformers_version", "_name_or_path", "torch_dtype", "dtype", "use_cache",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "initializer_range", "attention_dropout", "output_hidden_states", "output_attentions", "return_dict",
    "embd_pdrop", "resid_pdrop",  # (dropout: training only; Llama-family exports such as Nanbeige carry them)
    "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder", "id2label", "label2id", "problem_type",
    "tokenizer_class", "prefix", "finetuning_task", "task_specific_params", "torchscript", "use_bfloat16",
    "tf_legacy_loss", "pruned_heads", "tie_encoder_decoder", "add_cross_attention",
    "cross_attention_hidden_size", "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
    "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
}) | frozenset(KEPT_UNREAD)


#: keys that never change a causal LM's logits at inference: provenance, training-only
#: settings (dropout, init, aux losses, router noise), generation settings, token ids
IGNORED = COMMON_IGNORED | frozenset({
    "attn_pdrop", "embd_pdrop", "resid_pdrop", "hidden_dropout", "residual_dropout", "embedding_dropout",
    "classifier_dropout", "summary_first_dropout", "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "output_router_logits", "router_aux_loss_coef", "router_z_loss_coef",
    "router_jitter_noise", "input_jitter_noise", "rescale_prenorm_residual", "time_step_min", "time_step_max",
    "time_step_floor", "time_step_init_scheme", "time_step_scale", "use_mambapy", "use_associative_scan",
    "pretraining_tp", "eod_token_id", "image_token_id", "auto_map", "model_file", "num_nextn_predict_layers",
    "attention_softmax_in_fp32", "scale_attention_softmax_in_fp32", "reorder_and_upcast_attn",
    "use_kernels", "mlp_layer_types", "_sliding_window_pattern",
    "tie_word_embeddings", "max_position_embeddings", "initializer_factor", "use_return_dict",
    "gradient_checkpointing", "residual_in_fp32", "use_pre_ffw_norm",
})
# (tie_word_embeddings: a family that always ties has no lm_head, and mlx-lm's strict load
#  refuses a checkpoint that holds one; max_position_embeddings alone never changes the
#  logits of a prompt within it, RoPE scaling reads it from rope_scaling)


# ---------------------------------------------------------------------- another name, another meaning

#: family -> {mlx-lm field: the key transformers writes for it}
ALIASES: dict[str, dict[str, str]] = {
    "qwen3_moe": {"num_experts": "num_local_experts"},
    "gpt2": {"n_ctx": "n_positions"},
    "gpt_neox": {"rotary_emb_base": "rope_theta", "rotary_pct": "partial_rotary_factor"},
    "lfm2": {"block_dim": "hidden_size", "block_ff_dim": "intermediate_size"},
}


#: family -> {field mlx-lm reads under the original's key with another meaning: (the value that
#: gives mlx-lm's family the original's meaning, from the config as filled; why)}
REMEANT: dict[str, dict[str, tuple]] = {
    "jamba": {"expert_layer_offset": (
        lambda c: -c["expert_layer_offset"] % c["expert_layer_period"]
        if all(isinstance(c.get(k), int) and not isinstance(c.get(k), bool) for k in
               ("expert_layer_offset", "expert_layer_period")) and c["expert_layer_period"] > 0 else None,
        "transformers' Jamba puts experts on the layers i with i % expert_layer_period == expert_layer_offset, "
        "mlx-lm's jamba on those with (i + expert_layer_offset) % expert_layer_period == 0 (the same layers "
        "for periods 1 and 2 only)")},
}


# ---------------------------------------------------------------------- what the original derives or fixes

#: keys the original reads only to derive other config values -> where (checked in transformers
#: 5.25's config classes and modeling files): such a key, off its default, is accepted when the
#: original derives the same config with it as without it (its effect switched off by another key)
DERIVATION_ONLY: dict[str, str] = {
    "max_window_layers": "read only by the config classes of Qwen2/2-MoE/3/3-MoE and kin, to derive "
                         "layer_types, and only when use_sliding_window is true (Qwen1.5-MoE publishes 21 "
                         "with use_sliding_window false: every layer full attention either way)",
    "global_attn_every_n_layers": "read only by AfmoeConfig, to derive layer_types when the config has none "
                                  "(transformers writes layer_types beside it; mlx-lm's afmoe reads layer_types)",
}


def _int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


#: family -> {field mlx-lm requires: (the value the original's modeling code derives where the
#: config gives none or null, from the original's reading of the config; where it is)}
DERIVED: dict[str, dict[str, tuple]] = {
    "gpt_bigcode": {"n_inner": (
        lambda o: 4 * _int(getattr(o, "n_embd", None)) if _int(getattr(o, "n_embd", None)) else None,
        "transformers' GPTBigCodeMLP: inner_dim = n_inner if not None else 4 * hidden_size")},
    "mamba2": {"intermediate_size": (
        lambda o: int(o.expand * o.hidden_size) if _int(getattr(o, "expand", None)) and
        _int(getattr(o, "hidden_size", None)) else None,
        "transformers' Mamba2Mixer: intermediate_size = int(expand * hidden_size); Mamba2Config has no such "
        "key and checks hidden_size * expand == num_heads * head_dim")},
}


#: family -> {unread key: the value the family's code assumes, from the config}
IMPLIED: dict[str, dict[str, Any]] = {
    "gpt_neox": {"intermediate_size": lambda c: 4 * c["hidden_size"] if isinstance(c.get("hidden_size"), int) else None},
    "phimoe": {"attention_bias": lambda c: True, "lm_head_bias": lambda c: True},
    # (mlx-lm's mamba2 sizes its mixer num_heads * head_dim, which Mamba2Config checks equals
    #  expand * hidden_size: expand is that ratio)
    "mamba2": {"expand": lambda c: c["num_heads"] * c["head_dim"] // c["hidden_size"]
               if all(isinstance(c.get(k), int) and c.get(k) > 0 for k in ("num_heads", "head_dim", "hidden_size"))
               and c["num_heads"] * c["head_dim"] % c["hidden_size"] == 0 else None},
}


#: original model_type -> fields mlx-lm requires that the original has no key for, at what the
#: original architecture fixes them to (transformers' modeling code, not its config): filled when
#: the config lacks them; a config giving another value (one the original would not read) is
#: refused by name, unless it computes the same (reference_config.py checks)
FIXED: dict[str, dict[str, Any]] = {
    "apertus": {"mlp_bias": False, "post_norm": False, "qk_norm": True},
    # (transformers' HunYuanMoEV1, built by mlx-lm's hunyuan: one shared MLP of intermediate_size
    #  always added, q/k norms after RoPE, its own k/v on every layer (no cross-layer attention:
    #  cla_share_factor is read only with use_cla), experts of intermediate_size)
    "hunyuan_v1_moe": {"num_shared_expert": 1, "use_mixed_mlp_moe": True, "use_qk_norm": True, "use_cla": False,
                       "cla_share_factor": 1, "moe_intermediate_size": None},
}


# ---------------------------------------------------------------------- windows and layer patterns

#: original model_type -> which of its layers slide, for the originals whose sliding window mlx-lm's
#: family never applies (or, for Mistral through mlx-lm's llama, applies only where layer_types
#: says) and workbench applies at module level as transformers does (checkpoint/corrections/
#: windows.py): its prompts are not bounded by the window
WINDOWS_APPLIED: dict[str, str] = {
    "gemma2": "layer_types", "mistral": "every layer", "mixtral": "every layer", "phi3": "every layer",
    "phimoe": "every layer", "starcoder2": "every layer",
    # (Qwen: the window only with use_sliding_window true, on the layers the config class derives from
    #  max_window_layers -- Qwen2 / Qwen3 from that layer on, Qwen2-MoE the even layers below it --
    #  unless layer_types is given)
    "qwen2": "layer_types", "qwen2_moe": "layer_types", "qwen3": "layer_types",
}


#: original model_type -> why its config's sliding_window bounds nothing: its config class declares
#: the key, and no module of the original nor of mlx-lm's family reads it (accepted at any value)
WINDOW_UNREAD: dict[str, str] = {
    "nemotron_h": "NemotronHConfig declares sliding_window, but transformers' NemotronH masks its attention "
                  "layers with create_causal_mask (full) and builds its cache from layer_types (full_attention), "
                  "and mlx-lm's nemotron_h reads no window: no prompt length changes the numbers",
}


#: fields that give the layer pattern as a period (every p-th layer is the second kind)
PERIODS = {"sliding_window_pattern": ("sliding_attention", "full_attention"),
            "full_attention_interval": ("linear_attention", "full_attention")}


# ---------------------------------------------------------------------- known safe, known wrong

#: family -> {key its mlx-lm module does not read: the correction that reads it as the original
#: does (checkpoint/corrections/)}
READ_BY_CORRECTIONS: dict[str, dict[str, str]] = {
    "qwen2_moe": {"norm_topk_prob": "routing.py: the top-k weights divided by their sum, as transformers' "
                                    "Qwen2MoeTopKRouter does",
                  "use_sliding_window": "windows.py", "max_window_layers": "windows.py"},
    # (windows.py: the layers the original slides, from its layer_types derived as transformers derives it)
    **{f: {"use_sliding_window": "windows.py", "max_window_layers": "windows.py"} for f in ("qwen2", "qwen3")},
    "ernie4_5_moe": {"moe_norm_min": "routing.py: the floor of the top-k weights' sum, as transformers' "
                                     "Ernie4_5_MoeTopKRouter clamps it"},
    # (activation.py: the MLP runs the activation the original reads, where mlx-lm hard-codes one)
    "starcoder2": {"hidden_act": "activation.py"}, "gpt_bigcode": {"activation_function": "activation.py"},
    "gpt_neox": {"hidden_act": "activation.py"},
    "gemma": {"hidden_act": "activation.py", "hidden_activation": "activation.py"},
}


#: fields mlx-lm reads that no transformers config of the family writes, whose mlx-lm
#: default is what the original's modeling code does (checked against transformers'
#: modeling files; where a fixture exists, against torch's logits: tests/test_arch_refs.py)
REVIEWED_DEFAULTS: dict[str, frozenset] = {
    # rope_traditional: mlx-lm's switch between rotate-half and interleaved RoPE;
    # original_max_position_embeddings: read by long-context RoPE scaling only, which carries
    # it (rope_parameters, filled above)
    "*": frozenset({"rope_traditional", "original_max_position_embeddings"}),
    "llama": frozenset({"layer_types", "sliding_window", "mlp_bias", "attention_bias"}),
    # dots1's scoring_func: a field mlx-lm declares and never reads (its router is sigmoid plus
    # e_score_correction_bias, as transformers' Dots1TopkRouter always is)
    "dots1": frozenset({"mlp_bias", "scoring_func"}),
    # ernie4_5_moe: moe_capacity and moe_use_aux_free are declared, never read by mlx-lm (transformers'
    # config has neither: its router always adds e_score_correction_bias, zero where aux-free balancing
    # was off); moe_gate_act is no option of the original (its Ernie4_5_MoeTopKRouter is a softmax),
    # and the corrected router (checkpoint/corrections/routing.py) never reads it: at any value, the
    # original's numbers
    "ernie4_5_moe": frozenset({"moe_capacity", "moe_use_aux_free", "moe_gate_act"}),
    # afmoe (transformers' AfmoeTokenChoiceRouter): sigmoid scores (score_func), no expert groups
    # (n_group = topk_group = 1: mlx-lm groups only above 1), the top-k scores always divided by
    # their sum (route_norm true); the corrected router (checkpoint/corrections/routing.py) reads
    # none of the four: at any value, the original's numbers
    "afmoe": frozenset({"route_norm", "score_func", "n_group", "topk_group"}),
    "bitnet": frozenset({"mlp_bias"}), "olmo2": frozenset({"mlp_bias"}),
    "olmoe": frozenset({"mlp_bias"}), "granitemoehybrid": frozenset({"mlp_bias"}),
    "cohere": frozenset({"layer_norm_bias"}), "cohere2": frozenset({"layer_norm_bias"}),
    "gpt2": frozenset({"num_key_value_heads"}), "gpt_neox": frozenset({"num_key_value_heads"}),
    "gpt_bigcode": frozenset({"attention_bias", "mlp_bias"}),
    "deepseek_v2": frozenset({"moe_layer_freq"}),
    "deepseek_v3": frozenset({"moe_layer_freq", "scoring_func", "topk_method"}),
    "deepseek_v32": frozenset({"moe_layer_freq", "scoring_func", "topk_method", "indexer_rope_interleave"}),
    "glm4_moe": frozenset({"scoring_func", "topk_method"}),
    "hunyuan_v1_dense": frozenset({"use_qk_norm"}),
    "lfm2_moe": frozenset({"full_attn_idxs"}),  # derived from layer_types by mlx-lm itself
    "mamba": frozenset({"use_bcdt_rms", "mixer_rms_eps"}),  # set from model_type (falcon_mamba) by mlx-lm
    # (ssm_state_size: None, which mlx-lm reads as state_size, as transformers' Mamba2Mixer does;
    #  max_position_embeddings: a field mlx-lm's mamba2 declares and never reads)
    "mamba2": frozenset({"ssm_state_size", "max_position_embeddings"}),
    "ministral3": frozenset({"layer_types"}),
    # (no num_key_value_heads in per_layer_config: the full layers have the sliding ones' count)
    # (sliding_window_pattern: read only without layer_types, which transformers always writes)
    # (vocab_size_per_layer_input sizes a tensor: a wrong default is a shape mismatch, never silent)
    "gemma4_text": frozenset({"global_partial_rotary_factor", "partial_rotary_factor", "num_global_key_value_heads",
                              "sliding_window_pattern", "vocab_size_per_layer_input"}),
}


#: family -> [(when, why)]: configs whose numbers mlx-lm's family computes otherwise than the
#: original (transformers' modeling code), with no key to make them agree: refused, naming why
DEPARTURES: dict[str, list[tuple]] = {
    # (none left: ernie4_5_moe's e_score_correction_bias and afmoe's one expert a token are corrected,
    #  checkpoint/corrections/routing.py)
}
