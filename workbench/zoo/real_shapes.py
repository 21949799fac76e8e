"""Real-shaped configurations: Gemma 4 E2B, E4B, 26B-A4B, 31B and Gemma 3 12B, as the
config.json their published checkpoints carry, and writers for checkpoints of those shapes.

    from workbench.zoo import real_shapes as rs
    cfg = rs.config("e2b")                                   # the published config.json dict
    cfg = rs.config("e2b", layers=6, vocab_size=4096)        # real widths, fewer layers / tokens
    rs.build_header_only("31b", tmp / "h", quant="affine4")  # real headers, data sections are holes
    rs.build_random("e2b", tmp / "r", layers=6, vocab_size=4096)   # random values, mlx-lm's own init

Values: every number below is the published config.json value; where each came from is
noted beside it (``SOURCES``).  The dicts are in the form the published checkpoints carry
(transformers 5 ``Gemma4ForConditionalGeneration`` / 4.50 ``Gemma3ForConditionalGeneration``:
``text_config`` nested, Gemma 4's flat ``global_head_dim`` / ``num_global_key_value_heads``,
the per-layer-type ``rope_parameters``), which mlx-lm / mlx-vlm and our reader read alike.
``config(name, form="transformers")`` gives the same model in the form the installed
transformers (5.24) writes today (Gemma 4: ``per_layer_config`` instead of the flat keys,
zero-padded layer keys); mlx-lm does not read that form, our reader does (tests compare the
two readings).

Cutting (``layers=N``): the first N layer types of the published pattern with the last made
full attention (transformers forces that too); KV sharing keeps the published fraction of
shared layers, lowered until every shared layer has an earlier non-shared layer of its type
(so E2B at 6 layers keeps one KV-shared, double-wide full-attention layer).  ``vocab_size=V``
cuts the vocabulary (and the per-layer-input vocabulary) to V.  Widths are never cut.

Random checkpoints are written from mlx-lm's own classes (``workbench.zoo.reference``'s
model classes, its ``quantize_model``), shard by shard so the peak is one shard, never the
whole model; header-only ones through ``workbench.zoo.build_sparse`` (real headers, holes
for data: a 60 GB checkpoint costs a few MB on disk).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

from workbench import fsio
from workbench.zoo.configs import QUANT_SPECS

NAMES = ("e2b", "e4b", "26b-a4b", "31b", "gemma3-12b")
#: quantization name -> (mode, bits, group_size): mlx-community's 4-bit (affine, groups of 64) and mxfp4
QUANTS = {k: QUANT_SPECS[k] for k in ("affine4", "mxfp4")}

#: where each shape's values were confirmed (public copies of the published config.json and
#: reference implementations; see the comments in _text_config for the values no copy confirmed)
SOURCES = {
    "e2b": ["mlx-lm 0.32.2 mlx_lm/models/gemma4_text.py ModelArgs defaults (the E2B shape)",
            "google/gemma.cpp PR 919 'Add Gemma 4 E2B and E4B model configs' (35 layers, d=1536, "
            "FFN 6144/12288 double-wide, SWA 4:1, window 512, head dims 256/512, vocab 262144)",
            "transformers 5.24 models/gemma4/configuration_gemma4.py (checkpoint google/gemma-4-e2b-it)"],
    "e4b": ["google/gemma.cpp PR 919 (42 layers, d=2560, FFN 10240 uniform, SWA 5:1, window 512, "
            "head dims 256/512)",
            "public copies of the E4B text_config (8 heads, 2 KV heads, 18 KV-shared layers, PLE 256, "
            "use_double_wide_mlp false)"],
    "26b-a4b": ["Layr-Labs/mlxfast-gemma4-26b-a4b-engine fixtures/gemma4_26b_a4b_config.json "
                "(the mlx-community 4-bit checkpoint's config.json, transformers 5.6.2)",
                "mlx-vlm 0.7.10 mlx_vlm/models/diffusion_gemma/config.py TextConfig defaults (same trunk)"],
    "31b": ["huggingface.co/OpenMOSE/Gemma4-Text config.json (the 31B text_config)",
            "workbench.zoo.configs.GEMMA4_31B (build_sparse's shape, the same values)"],
    "gemma3-12b": ["AI-Hypercomputer/maxtext src/MaxText/utils/ckpt_conversion/utils/hf_model_configs.py "
                   "gemma3_12b_config (d=3840, 48 layers, FFN 15360, 16 heads, 8 KV heads, head_dim 256, "
                   "window 1024, pattern 6, linear RoPE factor 8)",
                   "google/gemma-3-4b-it config.json form (the published 12B's has the same keys)"],
}

_S, _F = "sliding_attention", "full_attention"
_G4_ROPE = {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}
_G4_TOKENS = {"audio_token_id": 258881, "boa_token_id": 256000, "boi_token_id": 255999, "eoa_token_id": 258883,
              "eoa_token_index": 258883, "eoi_token_id": 258882, "eos_token_id": [1, 106],
              "image_token_id": 258880, "video_token_id": 258884}
_G4_VISION = {"model_type": "gemma4_vision", "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 16,
              "num_attention_heads": 12, "num_key_value_heads": 12, "head_dim": 64, "global_head_dim": 64,
              "patch_size": 16, "pooling_kernel_size": 3, "position_embedding_size": 10240,
              "default_output_length": 280, "rms_norm_eps": 1e-06,
              "rope_parameters": {"rope_theta": 100.0, "rope_type": "default"}, "standardize": False,
              "use_clipped_linears": True}
_G4_VISION_LARGE = dict(_G4_VISION, hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                        num_attention_heads=16, num_key_value_heads=16, head_dim=72, global_head_dim=72,
                        standardize=True, use_clipped_linears=False)
_G4_AUDIO = {"model_type": "gemma4_audio", "hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 8,
             "subsampling_conv_channels": [128, 32], "conv_kernel_size": 5, "attention_chunk_size": 12,
             "attention_context_left": 13, "attention_context_right": 0, "residual_weight": 0.5,
             "use_clipped_linears": True}


def _gemma4_text(**kw) -> dict:
    """A Gemma 4 text_config with the keys transformers 5 writes (values set per shape)."""
    c = {"attention_bias": False, "attention_dropout": 0.0, "attention_k_eq_v": False, "bos_token_id": 2,
         "dtype": "bfloat16", "enable_moe_block": False, "eos_token_id": 1, "final_logit_softcapping": 30.0,
         "global_head_dim": 512, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
         "initializer_range": 0.02, "model_type": "gemma4_text", "moe_intermediate_size": None,
         "num_experts": None, "num_global_key_value_heads": None, "pad_token_id": 0, "rms_norm_eps": 1e-06,
         "rope_parameters": copy.deepcopy(_G4_ROPE), "tie_word_embeddings": True, "top_k_experts": None,
         "use_bidirectional_attention": None, "use_cache": True, "vocab_size": 262144,
         "vocab_size_per_layer_input": 262144}
    c.update(kw)
    return c


def _types(n: int, period: int) -> list:
    return [_F if (i + 1) % period == 0 else _S for i in range(n)]


def _text_config(name: str) -> dict:
    if name == "e2b":
        # mlx-lm ModelArgs defaults / gemma.cpp PR 919: 35 layers, 4 sliding + 1 full, 20 KV-shared, double-wide
        return _gemma4_text(hidden_size=1536, num_hidden_layers=35, intermediate_size=6144, num_attention_heads=8,
                            num_key_value_heads=1, num_kv_shared_layers=20, hidden_size_per_layer_input=256,
                            use_double_wide_mlp=True, sliding_window=512, max_position_embeddings=131072,
                            layer_types=_types(35, 5))
    if name == "e4b":
        # gemma.cpp PR 919: 42 layers, 5 sliding + 1 full, uniform FFN (use_double_wide_mlp false)
        return _gemma4_text(hidden_size=2560, num_hidden_layers=42, intermediate_size=10240, num_attention_heads=8,
                            num_key_value_heads=2, num_kv_shared_layers=18, hidden_size_per_layer_input=256,
                            use_double_wide_mlp=False, sliding_window=512, max_position_embeddings=131072,
                            layer_types=_types(42, 6))
    if name == "26b-a4b":
        # the mlx-community 26B-A4B config.json (transformers 5.6.2), verbatim values
        return _gemma4_text(hidden_size=2816, num_hidden_layers=30, intermediate_size=2112, num_attention_heads=16,
                            num_key_value_heads=8, num_global_key_value_heads=2, attention_k_eq_v=True,
                            enable_moe_block=True, num_experts=128, top_k_experts=8, moe_intermediate_size=704,
                            num_kv_shared_layers=0, hidden_size_per_layer_input=0, use_double_wide_mlp=False,
                            sliding_window=1024, max_position_embeddings=262144,
                            use_bidirectional_attention="vision", layer_types=_types(30, 6))
    if name == "31b":
        # max_position_embeddings 262144 and use_bidirectional_attention "vision" as in the 26B-A4B's
        # (the medium models share them); every width from the 31B text_config copy
        return _gemma4_text(hidden_size=5376, num_hidden_layers=60, intermediate_size=21504, num_attention_heads=32,
                            num_key_value_heads=16, num_global_key_value_heads=4, attention_k_eq_v=True,
                            num_kv_shared_layers=0, hidden_size_per_layer_input=0, use_double_wide_mlp=False,
                            sliding_window=1024, max_position_embeddings=262144,
                            use_bidirectional_attention="vision", layer_types=_types(60, 6))
    if name == "gemma3-12b":
        # the published google/gemma-3-12b-it text_config lists only these; everything else is
        # Gemma3TextConfig's default (vocab 262208, head_dim 256, query_pre_attn_scalar 256,
        # rope_theta 1e6, rope_local_base_freq 1e4, pattern 6, gelu_pytorch_tanh)
        return {"hidden_size": 3840, "intermediate_size": 15360, "model_type": "gemma3_text",
                "num_attention_heads": 16, "num_hidden_layers": 48, "num_key_value_heads": 8,
                "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}
    raise ValueError(f"unknown real shape {name!r}; choose from {', '.join(NAMES)}")


def _published(name: str) -> dict:
    tc = _text_config(name)
    if name == "gemma3-12b":
        return {"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
                "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
                "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3", "text_config": tc,
                "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
                "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                                  "model_type": "siglip_vision_model", "num_attention_heads": 16,
                                  "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False}}
    small = name in ("e2b", "e4b")
    return {"architectures": ["Gemma4ForConditionalGeneration"], "audio_config": dict(_G4_AUDIO) if small else None,
            **_G4_TOKENS, "dtype": "bfloat16", "initializer_range": 0.02, "model_type": "gemma4",
            "text_config": tc, "tie_word_embeddings": True, "transformers_version": "5.6.2",
            "vision_config": dict(_G4_VISION if small else _G4_VISION_LARGE), "vision_soft_tokens_per_image": 280}


def _cut(tc: dict, layers: int) -> None:
    L = tc["num_hidden_layers"]
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= L:
        raise ValueError(f"layers must be an integer in 1..{L}, got {layers!r}")
    tc["num_hidden_layers"] = layers
    if "layer_types" not in tc:  # Gemma 3: the pattern (every 6th layer full) is read from the layer count
        return
    lt = tc["layer_types"][:layers]
    lt[-1] = _F
    tc["layer_types"] = lt
    shared = tc.get("num_kv_shared_layers") or 0
    if shared:
        k = round(layers * shared / L)
        while k and any(t not in lt[:layers - k] for t in lt[layers - k:]):
            k -= 1
        tc["num_kv_shared_layers"] = k


def config(name: str, *, layers: int | None = None, vocab_size: int | None = None,
           form: str = "published") -> dict:
    """The config.json of real shape ``name`` (a fresh dict).  ``layers`` / ``vocab_size`` cut
    the depth / vocabulary (widths stay real); ``form``: "published" (what the checkpoints on
    the hub carry) or "transformers" (what transformers 5.24 writes for the same model)."""
    if name not in NAMES:
        raise ValueError(f"unknown real shape {name!r}; choose from {', '.join(NAMES)}")
    if form not in ("published", "transformers"):
        raise ValueError(f"unknown config form {form!r}; choose from published, transformers")
    cfg = _published(name)
    tc = cfg["text_config"]
    if layers is not None:
        _cut(tc, layers)
    if vocab_size is not None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 16:
            raise ValueError(f"vocab_size must be an integer >= 16, got {vocab_size!r}")
        tc["vocab_size"] = vocab_size
        if "vocab_size_per_layer_input" in tc:
            tc["vocab_size_per_layer_input"] = vocab_size
        cfg["vocab_size"] = vocab_size  # mlx-lm's wrappers take the top-level vocab_size (default: the real one)
    if form == "transformers":
        cfg = _transformers_form(cfg)
    return cfg


def _transformers_form(cfg: dict) -> dict:
    """Gemma 4: what transformers >= 5.24 writes: per_layer_config (zero-padded layer keys) for
    the full-attention layers instead of global_head_dim / num_global_key_value_heads.
    Gemma 3: rope_parameters per layer type instead of rope_scaling (+ the defaults spelled out)."""
    cfg = copy.deepcopy(cfg)
    tc = cfg["text_config"]
    if tc.get("model_type") == "gemma4_text":
        ghd, gkv = tc.pop("global_head_dim"), tc.pop("num_global_key_value_heads")
        width = len(str(tc["num_hidden_layers"] - 1))
        over = {"head_dim": ghd, **({"num_key_value_heads": gkv} if tc["attention_k_eq_v"] and gkv else {})}
        tc["per_layer_config"] = {str(i).zfill(width): dict(over) for i, t in enumerate(tc["layer_types"])
                                  if t == _F}
        return cfg
    rs = tc.pop("rope_scaling")
    tc.update({"head_dim": 256, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
               "hidden_activation": "gelu_pytorch_tanh", "sliding_window_pattern": 6,
               "vocab_size": tc.get("vocab_size", 262208),
               "rope_parameters": {"full_attention": {"rope_theta": 1000000.0, **rs},
                                   "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}})
    return cfg


# ---------------------------------------------------------------------------- writers

def build_header_only(name: str, dest, *, quant: str | None = None, layers: int | None = None,
                      shard_bytes: int = 5 * 2**30) -> Path:
    """A checkpoint of shape ``name`` whose headers are real and whose data are holes (sparse
    files): ``workbench inspect`` reads it at full size, nothing can compute with it."""
    from workbench.zoo import build_sparse

    if quant is not None and quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r}; choose from {', '.join(QUANTS)}")
    return build_sparse(dest, config=config(name, layers=layers), shard_bytes=shard_bytes, quant=quant)


def nbytes(name: str, *, quant: str | None = None, layers: int | None = None,
           vocab_size: int | None = None) -> int:
    """Bytes of the language model's tensors at this shape (what a random checkpoint writes)."""
    from workbench.checkpoint.arch import build_arch

    a = build_arch(config(name, layers=layers, vocab_size=vocab_size))
    total = 0
    for e in a.expected.values():
        if e.optional:
            continue
        n = 1
        for s in e.shape:
            n *= s
        if quant and e.quantizable and e.shape[-1] % QUANTS[quant][2] == 0:
            mode, bits, gs = QUANTS[quant]
            total += n * bits // 8 + (n // gs) * (1 if mode != "affine" else 4)
        else:
            total += 2 * n
    return total


def build_random(name: str, dest, *, quant: str | None = None, layers: int | None = None,
                 vocab_size: int | None = None, dtype: str = "bfloat16", seed: int = 0,
                 shard_bytes: int = 4 * 2**30, tokenizer: bool = False) -> Path:
    """A random checkpoint of shape ``name`` written from mlx-lm's own classes (its init, its
    ``quantize_model``; 1-D parameters perturbed so norms are not all ones), in the MLX layout
    mlx-lm loads strictly.  quant: None, "affine4" (groups of 64) or "mxfp4"; dtype: the float
    dtype.  Written shard by shard (an index when more than one), so memory peaks at one shard."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_map_with_path
    from mlx_lm.utils import quantize_model

    from workbench.zoo.reference import model_classes

    if quant is not None and quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r}; choose from {', '.join(QUANTS)}")
    dtypes = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}
    if dtype not in dtypes:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(dtypes)}")
    cfg = config(name, layers=layers, vocab_size=vocab_size)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for old in [*dest.glob("*.safetensors"), dest / "model.safetensors.index.json"]:
        if old.is_file():
            old.unlink()
    mx.random.seed(seed)
    cls, args_cls = model_classes(cfg)
    model = cls(args_cls.from_dict(copy.deepcopy(cfg)))
    model.update(tree_map_with_path(
        lambda p, v: v + 0.2 * mx.random.normal(v.shape, dtype=v.dtype) if v.ndim == 1 else v,
        model.parameters()))
    model.set_dtype(dtypes[dtype])
    saved_cfg = copy.deepcopy(cfg)
    if quant:
        mode, bits, gs = QUANTS[quant]
        model, qcfg = quantize_model(model, copy.deepcopy(cfg), gs, bits, mode=mode)  # its quant_predicate
        saved_cfg["quantization"] = qcfg["quantization"]
        saved_cfg["quantization_config"] = qcfg.get("quantization_config", qcfg["quantization"])
    weights = dict(tree_flatten(model.parameters()))
    del model
    _write_shards(dest, weights, shard_bytes)
    fsio.write_text(dest / "config.json", json.dumps(saved_cfg, indent=2))
    if tokenizer:
        from workbench.zoo.writer import write_tokenizer

        write_tokenizer(dest, saved_cfg["text_config"]["vocab_size"])
    return dest


def _write_shards(dest: Path, weights: dict, shard_bytes: int) -> None:
    import mlx.core as mx

    groups, size = [[]], 0
    for n, v in weights.items():
        if size + v.nbytes > shard_bytes and groups[-1]:
            groups.append([])
            size = 0
        groups[-1].append(n)
        size += v.nbytes
    k = len(groups)
    files = ["model.safetensors"] if k == 1 else [f"model-{i + 1:05d}-of-{k:05d}.safetensors" for i in range(k)]
    wm, total = {}, 0
    for f, g in zip(files, groups):
        shard = {n: weights.pop(n) for n in g}
        mx.eval(list(shard.values()))
        fsio.write_with(dest / f, lambda p, s=shard: mx.save_safetensors(p, s, metadata={"format": "mlx"}))
        total += sum(v.nbytes for v in shard.values())
        wm.update({n: f for n in g})
        del shard
    if k > 1:
        idx = {"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}
        fsio.write_text(dest / "model.safetensors.index.json", json.dumps(idx, indent=2))
