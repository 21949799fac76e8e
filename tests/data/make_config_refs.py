"""Reference logits for tests/test_configs.py, computed once by torch + transformers.

Every case is a tiny model whose config.json is written by transformers' own
``save_pretrained`` (so it has exactly the keys and forms transformers >= 5 writes:
``rope_parameters``, Gemma 3's per-layer-type RoPE, Gemma 4's ``per_layer_config``),
whose weights come from :func:`weights` (a seeded numpy generator over the tensors
``workbench.checkpoint.arch`` expects; the test rebuilds them bit for bit), and whose
logits on :data:`IDS` are the transformers model's, in float32, eager attention.
``load_state_dict(strict=True)`` fails when our tensor list and transformers' differ.

    pip install --target /tmp/torchlib torch==2.13.0     # never a dependency of the project
    PYTHONPATH=/tmp/torchlib python tests/data/make_config_refs.py

writes tests/data/configs/<case>/{config.json, logits.npy}.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent / "configs"
IDS = [[3, 17, 42, 7, 99, 250, 1, 64, 128, 5, 200, 31]]  # longer than the sliding windows (4)

_BASE = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             vocab_size=256, rms_norm_eps=1e-6, max_position_embeddings=256)

#: case -> (transformers config class, kwargs, causal-LM class)
CASES = {
    # transformers >= 5 writes only rope_parameters (no top-level rope_theta / rope_scaling)
    "llama3_rope": ("LlamaConfig", dict(_BASE, num_hidden_layers=2, tie_word_embeddings=False,
                                        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                                         "factor": 8.0, "low_freq_factor": 1.0,
                                                         "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 16}),
                    "LlamaForCausalLM"),
    "qwen3_yarn": ("Qwen3Config", dict(_BASE, num_hidden_layers=2, tie_word_embeddings=True, max_position_embeddings=32,
                                       rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                                        "original_max_position_embeddings": 8}),
                   "Qwen3ForCausalLM"),
    # Gemma 3 4B's RoPE: linear x8 on the full layers, per layer type
    "gemma3_linear": ("Gemma3TextConfig", dict(_BASE, num_hidden_layers=4, query_pre_attn_scalar=24, sliding_window=4,
                                               layer_types=["sliding_attention", "full_attention",
                                                            "sliding_attention", "full_attention"],
                                               rope_parameters={
                                                   "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                      "rope_theta": 1000000.0},
                                                   "sliding_attention": {"rope_type": "default",
                                                                         "rope_theta": 10000.0}}),
                      "Gemma3ForCausalLM"),
    # Gemma 4: per_layer_config (written from global_head_dim / num_global_key_value_heads),
    # k_eq_v full layers with their own KV heads, PLE, proportional RoPE
    "gemma4_per_layer": ("Gemma4TextConfig", dict(_BASE, num_hidden_layers=4, global_head_dim=32,
                                                  num_global_key_value_heads=1, attention_k_eq_v=True,
                                                  hidden_size_per_layer_input=8, vocab_size_per_layer_input=256,
                                                  sliding_window=4, num_kv_shared_layers=0,
                                                  final_logit_softcapping=30.0,
                                                  layer_types=["sliding_attention", "full_attention",
                                                               "sliding_attention", "full_attention"]),
                         "Gemma4ForCausalLM"),
    # Gemma 4 with KV sharing and the double-wide MLP of the shared layers
    "gemma4_shared": ("Gemma4TextConfig", dict(_BASE, num_hidden_layers=4, global_head_dim=32,
                                               hidden_size_per_layer_input=0, sliding_window=4,
                                               num_kv_shared_layers=2, use_double_wide_mlp=True,
                                               final_logit_softcapping=None,
                                               layer_types=["sliding_attention", "full_attention",
                                                            "sliding_attention", "full_attention"]),
                      "Gemma4ForCausalLM"),
}


def weights(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Float32 tensors (canonical names, workbench.checkpoint.arch) for a config.json dict:
    matrices ~ N(0, 1/in), embeddings ~ N(0, 1), norm weights near their neutral value,
    layer scalars near 1."""
    from workbench.checkpoint.arch import build_arch

    a = build_arch(config)
    rng = np.random.default_rng(seed)
    out = {}
    for name, e in a.expected.items():
        if e.optional and not name.startswith("lm_head"):
            continue
        if name == "lm_head.weight" and a.tied:
            continue
        shp = e.shape
        if e.kind in ("norm", "vector", "scalar"):
            base = a.neutral_norm if e.kind == "norm" else 1.0
            v = base + 0.1 * rng.standard_normal(shp)
        elif e.kind == "embedding":
            v = rng.standard_normal(shp)
        else:
            v = rng.standard_normal(shp) / np.sqrt(shp[-1])
        out[name] = v.astype(np.float32)
    return out


def main() -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    for case, (cfg_cls, kw, lm_cls) in CASES.items():
        d = HERE / case
        d.mkdir(parents=True, exist_ok=True)
        cfg = getattr(transformers, cfg_cls)(**kw)
        cfg.save_pretrained(d)
        config = json.loads((d / "config.json").read_text())
        w = weights(config)
        model = getattr(transformers, lm_cls)(cfg).eval()
        model.config._attn_implementation = "eager"
        sd = {("lm_head.weight" if n == "lm_head.weight" else "model." + n): torch.from_numpy(v) for n, v in w.items()}
        if config.get("tie_word_embeddings", True):
            sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
        missing, unexpected = model.load_state_dict(sd, strict=False)
        missing = [m for m in missing if not m.endswith(("inv_freq", "embed_scale"))]
        if missing or unexpected:
            sys.exit(f"{case}: tensors differ from transformers': missing {missing}, unexpected {unexpected}")
        with torch.no_grad():
            # (hidden states asked for: transformers' KV-shared slicing fails without PLE otherwise)
            logits = model(torch.tensor(IDS), output_hidden_states=True).logits.float().numpy()
        np.save(d / "logits.npy", logits.astype(np.float32))
        print(case, logits.shape, float(np.abs(logits).max()))


if __name__ == "__main__":
    main()
