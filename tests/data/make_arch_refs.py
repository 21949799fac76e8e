"""Checkpoints exactly as transformers 5 writes them, with torch's logits: one per architecture.

For every case of :data:`CASES` (a transformers model_type and the config fields that
make it tiny), this script

1. builds the config with transformers' own config class and ``save_pretrained``s a
   randomly initialised ``AutoModelForCausalLM`` of it: config.json is exactly what
   transformers writes (``rope_parameters``, renamed keys, its defaults spelled out), the
   safetensors names and shapes are what its ``save_pretrained`` writes (after its own
   weight conversions: per-expert tensors, Conv1D layouts, ...);
2. replaces every stored tensor with :func:`tensor_values` (a numpy generator seeded by the
   tensor's name: the tests rebuild the file bit for bit from ``tensors.json``);
3. loads that file back with ``from_pretrained`` (float32, eager attention; any missing or
   unexpected tensor stops the script) and writes torch's logits on :data:`IDS`.

Committed per case, in tests/data/archs/<case>/: config.json, tensors.json (name -> [shape,
dtype, base]), logits.npy. torch is never a dependency of the project:

    pip install --target /tmp/torchlib torch==2.13.0
    PYTHONPATH=/tmp/torchlib .venv/bin/python tests/data/make_arch_refs.py [CASE ...]
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent / "archs"
IDS = [[3, 17, 42, 7, 99, 250, 1, 64, 128, 5, 200, 31]]  # longer than the sliding windows (4)

#: what makes any config tiny, where the config has the field
SHRINK = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=512,
              moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=4, num_local_experts=4,
              n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, kv_lora_rank=16, q_lora_rank=32,
              qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, first_k_dense_replace=1, n_group=2,
              topk_group=1, sliding_window=4, n_embd=64, n_layer=2, n_head=4, n_positions=512, n_inner=128,
              n_ctx=512, d_model=64, ffn_dim=128, block_size=512, pad_token_id=0)

#: a RoPE no default matches: a transformers-5 config keeps it only in rope_parameters
ROPE = {"rope_type": "default", "rope_theta": 5000.0}


def _rope(**extra):
    return {"rope_parameters": dict(ROPE, **extra)}


#: DeepSeek's YaRN (V2-Lite's factors, a shorter original context)
YARN = {"rope_parameters": {"rope_type": "yarn", "rope_theta": 5000.0, "factor": 4.0,
                            "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                            "mscale": 0.707, "mscale_all_dim": 0.707}}

#: gpt-oss's RoPE as gpt-oss publishes it (its correction range not truncated)
GPT_OSS_YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "original_max_position_embeddings": 4096, "truncate": False}

#: Phi-3.5's LongRoPE, shrunk: one factor per rotated frequency (head_dim 16), short for
#: prompts up to original_max_position_embeddings, long past it
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0, 1.02, 1.1, 1.3, 1.6, 2.1, 2.8, 3.6],
            "long_factor": [1.0, 1.5, 2.5, 4.0, 7.0, 12.0, 20.0, 32.0]}

#: Phi-3.5-MoE's LongRoPE: its published attention scales (short_mscale = long_mscale), shrunk factors
PHIMOE_LONGROPE = dict(LONGROPE, short_mscale=1.243163121016122, long_mscale=1.243163121016122)

#: case -> (transformers model_type, config fields on top of SHRINK)
CASES: dict[str, tuple[str, dict]] = {
    # the op families (also traced op by op)
    "llama": ("llama", _rope()),
    "mistral": ("mistral", _rope()),
    "qwen2": ("qwen2", _rope()),
    "qwen3": ("qwen3", _rope()),
    # Qwen's own window: use_sliding_window true slides the layers from max_window_layers on (here layer 1)
    "qwen2_window": ("qwen2", dict(_rope(), use_sliding_window=True, max_window_layers=1)),
    "qwen3_window": ("qwen3", dict(_rope(), use_sliding_window=True, max_window_layers=1)),
    # (hidden 80: sqrt(80) is not a bfloat16, so an embedding scale rounded to one shows)
    "gemma3_text": ("gemma3_text", dict(hidden_size=80, query_pre_attn_scalar=24,
                                        layer_types=["sliding_attention", "full_attention"],
                                        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                            "rope_theta": 100000.0},
                                                         "sliding_attention": {"rope_type": "default",
                                                                               "rope_theta": 5000.0}})),
    # Gemma 4 as transformers 5 writes it: per_layer_config, per-type rope_parameters, PLE
    "gemma4_text": ("gemma4_text", dict(hidden_size=80, num_hidden_layers=4, global_head_dim=32,
                                        hidden_size_per_layer_input=8, vocab_size_per_layer_input=256,
                                        num_kv_shared_layers=2, use_double_wide_mlp=True,
                                        final_logit_softcapping=30.0,
                                        layer_types=["sliding_attention", "full_attention",
                                                     "sliding_attention", "full_attention"])),
    "gemma3n_text": ("gemma3n_text", dict(num_hidden_layers=2, vocab_size_per_layer_input=256,
                                          hidden_size_per_layer_input=16, num_kv_shared_layers=0,
                                          laurel_rank=8, layer_types=["sliding_attention", "full_attention"],
                                          activation_sparsity_pattern=[0.0, 0.0], intermediate_size=[128, 128])),
    # Gemma 3n as E2B publishes it, shrunk (30 layers -> 10): four local layers then a global one;
    # the last layers (10 of 30 there, 4 of 10 here) carry no k/v weights and read the k/v of the
    # last earlier layer of their kind; a Gaussian top-k (0.95) on the first layers' MLP gate
    "gemma3n_e2b": ("gemma3n_text", dict(num_hidden_layers=10, vocab_size_per_layer_input=256,
                                         hidden_size_per_layer_input=16, laurel_rank=8, num_kv_shared_layers=4,
                                         layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 2,
                                         activation_sparsity_pattern=[0.95] * 4 + [0.0] * 6,
                                         intermediate_size=[128] * 10)),
    # dense
    "gemma": ("gemma", dict(_rope(), hidden_size=80)),
    "gemma2": ("gemma2", dict(_rope(), hidden_size=80, query_pre_attn_scalar=24, attn_logit_softcapping=20.0,
                              final_logit_softcapping=15.0)),
    "phi": ("phi", _rope(partial_rotary_factor=0.25)),
    "phi3": ("phi3", _rope(partial_rotary_factor=0.5)),
    # (no window: the whole prompt is compared; a 12-token prompt is under 64, over 8)
    "phi3_longrope": ("phi3", dict(sliding_window=None, original_max_position_embeddings=64,
                                   rope_parameters=dict(LONGROPE, original_max_position_embeddings=64))),
    "phi3_longrope_long": ("phi3", dict(sliding_window=None, original_max_position_embeddings=8,
                                        rope_parameters=dict(LONGROPE, original_max_position_embeddings=8))),
    # Phi-3-mini-4k's RoPE (transformers' defaults: every dimension rotated, base 10000)
    "phi3_4k": ("phi3", dict(sliding_window=None)),
    "starcoder2": ("starcoder2", _rope()),
    # Ministral (mlx-lm builds it as llama): a window on the layers layer_types marks sliding
    "ministral": ("ministral", dict(_rope(), layer_types=["sliding_attention", "full_attention"])),
    "cohere": ("cohere", dict(_rope(), logit_scale=0.125, use_qk_norm=False)),
    "cohere2": ("cohere2", dict(_rope(), logit_scale=0.125, layer_types=["sliding_attention", "full_attention"])),
    "smollm3": ("smollm3", dict(_rope(), no_rope_layers=[1, 0])),
    "olmo2": ("olmo2", _rope()),
    "olmo3": ("olmo3", dict(layer_types=["sliding_attention", "full_attention"],
                            rope_parameters={"full_attention": dict(ROPE), "sliding_attention": dict(ROPE)})),
    "granite": ("granite", dict(_rope(), logits_scaling=4.0, attention_multiplier=0.2, embedding_multiplier=6.0,
                                residual_multiplier=0.5)),
    "stablelm": ("stablelm", _rope(partial_rotary_factor=0.25)),
    "gpt_neox": ("gpt_neox", dict(_rope(partial_rotary_factor=0.25), intermediate_size=256)),
    "gpt2": ("gpt2", dict(n_inner=None)),
    "gpt_bigcode": ("gpt_bigcode", {}),
    "gptj": ("gptj", dict(rotary_dim=8, n_inner=None)),
    "glm": ("glm", _rope(partial_rotary_factor=0.5)),
    "glm4": ("glm4", _rope(partial_rotary_factor=0.5)),
    "helium": ("helium", _rope()),
    "apertus": ("apertus", dict(_rope(), hidden_act="xielu")),
    "exaone4": ("exaone4", dict(_rope(), layer_types=["sliding_attention", "full_attention"])),
    "seed_oss": ("seed_oss", _rope()),
    "ernie4_5": ("ernie4_5", _rope()),
    "hunyuan_v1_dense": ("hunyuan_v1_dense", _rope()),
    "nemotron": ("nemotron", _rope(partial_rotary_factor=0.5)),
    "olmo": ("olmo", _rope()),
    # dynamic NTK RoPE: the 12-token prompt passes max_position_embeddings (8), so the base grows
    "olmo2_dynamic": ("olmo2", dict(max_position_embeddings=8,
                                    rope_parameters={"rope_type": "dynamic", "rope_theta": 5000.0, "factor": 2.0})),
    # the same on an op family (op level computes the frequencies per forward: workbench/rope.py)
    "llama_dynamic": ("llama", dict(max_position_embeddings=8,
                                    rope_parameters={"rope_type": "dynamic", "rope_theta": 5000.0, "factor": 2.0})),
    # GPT-BigCode with transformers' default n_inner (null: 4 x n_embd)
    "gpt_bigcode_inner_null": ("gpt_bigcode", dict(n_inner=None)),
    # mixture of experts
    "mixtral": ("mixtral", _rope()),
    "qwen2_moe": ("qwen2_moe", dict(_rope(), decoder_sparse_step=1, mlp_only_layers=[])),
    "qwen2_moe_norm_topk": ("qwen2_moe", dict(_rope(), decoder_sparse_step=1, mlp_only_layers=[],
                                              norm_topk_prob=True)),
    # Qwen2-MoE's window: the even layers below max_window_layers (here layer 0)
    "qwen2_moe_window": ("qwen2_moe", dict(_rope(), decoder_sparse_step=1, mlp_only_layers=[],
                                           use_sliding_window=True, max_window_layers=2)),
    "qwen3_moe": ("qwen3_moe", dict(_rope(), decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)),
    "olmoe": ("olmoe", _rope()),
    "phimoe": ("phimoe", dict(_rope(), attention_bias=True, lm_head_bias=True)),
    # Phi-3.5-MoE's LongRoPE (short_mscale / long_mscale as it publishes them), a 12-token prompt
    # under original_max_position_embeddings (64) and over it (8)
    "phimoe_longrope": ("phimoe", dict(sliding_window=None, attention_bias=True, lm_head_bias=True,
                                       rope_parameters=dict(PHIMOE_LONGROPE, original_max_position_embeddings=64))),
    "phimoe_longrope_long": ("phimoe", dict(sliding_window=None, attention_bias=True, lm_head_bias=True,
                                            rope_parameters=dict(PHIMOE_LONGROPE, original_max_position_embeddings=8))),
    "granitemoe": ("granitemoe", _rope()),
    # HunYuan-MoE (mlx-lm's hunyuan): top 2 of 4 experts renormalised, and its shared MLP
    "hunyuan_v1_moe": ("hunyuan_v1_moe", dict(_rope(), moe_topk=2)),
    # ERNIE 4.5 MoE: a dense first layer, then 4 experts (top 2) picked by their softmax plus the
    # aux-free balancing bias (moe_statics.e_score_correction_bias: written, so non-zero here)
    "ernie4_5_moe": ("ernie4_5_moe", dict(_rope(), moe_num_experts=4, moe_k=2, moe_num_shared_experts=1,
                                          moe_layer_start_index=1, tie_word_embeddings=False)),
    # AFMoE with one expert a token: transformers divides its sigmoid score by itself (weight 1, times
    # route_scale); a dense first layer, a sliding then a global layer
    "afmoe_top1": ("afmoe", dict(_rope(), num_experts_per_tok=1, num_dense_layers=1, global_attn_every_n_layers=2,
                                 layer_types=["sliding_attention", "full_attention"])),
    # transformers' defaults, one expert (still a gate, the expert and the shared MLP), tied head, and
    # the NTK-alpha RoPE Hunyuan-A13B publishes (alpha 1000; "dynamic" with an alpha is a fixed base)
    "hunyuan_v1_moe_one_expert": ("hunyuan_v1_moe", dict(num_experts=1, moe_topk=1, tie_word_embeddings=True,
                                                         rope_parameters={"rope_type": "dynamic", "alpha": 1000.0,
                                                                          "factor": 1.0, "rope_theta": 5000.0})),
    "deepseek_v2": ("deepseek_v2", dict(YARN, q_lora_rank=None, n_group=1, topk_group=1, head_dim=8,
                                        num_key_value_heads=4)),
    "deepseek_v3": ("deepseek_v3", dict(YARN, head_dim=8, num_key_value_heads=4)),
    "glm4_moe": ("glm4_moe", _rope(partial_rotary_factor=0.5)),
    "gpt_oss": ("gpt_oss", dict(_rope(), layer_types=["sliding_attention", "full_attention"])),
    "gpt_oss_yarn": ("gpt_oss", dict(rope_parameters=dict(GPT_OSS_YARN), max_position_embeddings=131072,
                                     layer_types=["sliding_attention", "full_attention"])),
    # state space and hybrids
    "mamba": ("mamba", dict(state_size=8, conv_kernel=4, expand=2, time_step_rank=8)),
    "lfm2": ("lfm2", dict(_rope(), layer_types=["conv", "full_attention"], block_ff_dim=128)),
    # Jamba: a Mamba layer, then an attention layer, each with 4 experts, top 2 (transformers keeps the
    # top-2 weights of the softmax over all experts, unrenormalised)
    "jamba": ("jamba", dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=1, expert_layer_offset=0,
                            mamba_d_state=8)),
    # Jamba with experts every third layer from layer 1 (1 and 4 of 5: mlx-lm reads the offset as (i + offset) % period)
    "jamba_period3": ("jamba", dict(num_hidden_layers=5, attn_layer_period=2, attn_layer_offset=1,
                                    expert_layer_period=3, expert_layer_offset=1, mamba_d_state=8)),
    # Nemotron-H (Mamba-2, attention, MLP layers): transformers writes its time_step_limit [0, inf] as
    # [0.0, {"__float__": "Infinity"}]; (NemotronHConfig declares a sliding_window no module reads: null)
    "nemotron_h": ("nemotron_h", dict(sliding_window=None, hybrid_override_pattern="M*M-", mamba_num_heads=8,
                                      mamba_head_dim=8, ssm_state_size=8, n_groups=1, mamba_d_conv=4)),
    # the same with a window its config class declares and nothing reads (12 tokens past window 4)
    "nemotron_h_window": ("nemotron_h", dict(sliding_window=4, hybrid_override_pattern="M*M-", mamba_num_heads=8,
                                             mamba_head_dim=8, ssm_state_size=8, n_groups=1, mamba_d_conv=4)),
    "qwen3_next": ("qwen3_next", dict(_rope(partial_rotary_factor=0.5),
                                      layer_types=["linear_attention", "full_attention"],
                                      linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                                      linear_value_head_dim=16, decoder_sparse_step=1, mlp_only_layers=[])),
}


def tensor_values(name: str, shape, base: float) -> np.ndarray:
    """The float32 value of a stored tensor, from its name alone: matrices ~ N(0, 1/in),
    vectors ``base`` (what the model's own init put there: 1 for a norm weight, 0 for a
    bias) + N(0, 0.1^2)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    v = np.asarray(rng.standard_normal(tuple(shape), dtype=np.float32))
    if len(shape) >= 2:
        return v / np.float32(np.sqrt(shape[-1]))
    return np.asarray(np.float32(base) + np.float32(0.1) * v, dtype=np.float32)


def write_checkpoint(dest: Path, case_dir: Path) -> Path:
    """Rebuild a case's checkpoint (config.json + model.safetensors) in ``dest`` from its
    committed config.json and tensors.json."""
    from safetensors.numpy import save_file

    dest.mkdir(parents=True, exist_ok=True)
    spec = json.loads((case_dir / "tensors.json").read_text())
    tensors = {}
    for name, (shape, dtype, base) in spec.items():
        v = tensor_values(name, shape, base)
        tensors[name] = v.astype(dtype) if dtype != "bfloat16" else v
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(case_dir / "config.json", dest / "config.json")
    return dest


def make_config(model_type: str, fields: dict):
    """transformers' config class built from keyword arguments (so that what it derives,
    e.g. layer types or head sizes, follows the tiny sizes): SHRINK where the class has
    the field, then ``fields``."""
    from transformers import AutoConfig

    cls = type(AutoConfig.for_model(model_type))
    default = cls().to_dict()
    kw = {k: v for k, v in SHRINK.items() if k in default}
    kw.update(fields)
    return cls(**kw)


def tensor_spec(path: Path) -> dict:
    """name -> [shape, dtype, base] of the safetensors file transformers saved: what
    :func:`write_checkpoint` rebuilds the values from (``base``: a vector's rounded mean, so
    norms keep their scale)."""
    from safetensors import safe_open

    spec = {}
    with safe_open(str(path), "numpy") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            base = float(np.round(t.astype(np.float64).mean(), 3)) if t.ndim < 2 else 0.0
            spec[name] = [list(t.shape), str(t.dtype), base]
    return spec


def torch_logits(case: str, ckpt: Path) -> np.ndarray:
    """torch's float32 logits on :data:`IDS` of the checkpoint folder ``ckpt``, loaded by
    transformers' own class (eager attention); a missing, unexpected or mismatched tensor, or
    a non-finite logit, stops the script."""
    import torch
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager",
                                                       output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise RuntimeError(f"{case}: {bad}")
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor(IDS)).logits.float().numpy()
    if not np.isfinite(logits).all():
        raise RuntimeError(f"{case}: non-finite logits")
    return logits


def build(case: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model_type, fields = CASES[case]
    d = HERE / case
    torch.manual_seed(0)
    cfg = make_config(model_type, fields)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model.save_pretrained(tmp / "init")
        spec = tensor_spec(tmp / "init" / "model.safetensors")
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tmp / "init" / "config.json", d / "config.json")
        (d / "tensors.json").write_text(json.dumps(spec, indent=0))
        write_checkpoint(tmp / "ckpt", d)
        logits = torch_logits(case, tmp / "ckpt")
    np.save(d / "logits.npy", logits.astype(np.float32))
    print(f"{case}: {len(spec)} tensors, max |logit| {np.abs(logits).max():.3g}", flush=True)


def main(argv) -> None:
    cases = argv or list(CASES)
    failed = []
    for case in cases:
        try:
            build(case)
        except Exception as e:  # report every case, then fail
            failed.append(case)
            shutil.rmtree(HERE / case, ignore_errors=True)
            print(f"{case}: FAILED {type(e).__name__}: {' '.join(str(e).split())[:300]}", flush=True)
    if failed:
        sys.exit(f"failed: {' '.join(failed)}")


if __name__ == "__main__":
    main(sys.argv[1:])
