"""The zoo: small checkpoints of every supported architecture, quantization mode and
name layout, single-file or sharded, clean or broken, written on the fly.

    from workbench import zoo
    path = zoo.build("gemma4_text", tmp / "g4", quant="mxfp4", shards=2)
    path = zoo.build("qwen3", tmp / "q3", broken="missing-tensor")

Tensors are generated from workbench.checkpoint.arch (our own architecture knowledge);
the tests prove that mlx-lm loads every clean checkpoint strictly.  Values are sensible:
matrices ~ N(0, 0.02), norm weights near their neutral value (1, or 0 for Gemma 3's
``1 + w`` norms), so logits are finite and non-trivial.

``build_sparse`` writes a Gemma-4-31B-shaped sharded checkpoint whose headers are real
and whose data sections are holes (sparse files), for the header-only benchmark.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

import workbench  # noqa: F401  (fast BLAS before mlx.core)
from workbench import fsio
from workbench.checkpoint.arch import build_arch

ARCHS = ("gemma4_text", "gemma4_moe", "gemma4_kv", "gemma4", "gemma3_text", "gemma3", "qwen3", "llama")
#: architectures the inspector knows (and mlx-lm loads) but workbench's model programs do not run
INSPECT_ONLY_ARCHS = ("gemma3n",)
QUANTS = (None, "affine4", "affine8", "mxfp4", "mxfp8", "nvfp4")
LAYOUTS = ("mlx", "hf")

#: quant name -> (mode, bits, group_size)
QUANT_SPECS = {"affine4": ("affine", 4, 64), "affine8": ("affine", 8, 64), "mxfp4": ("mxfp4", 4, 32),
               "mxfp8": ("mxfp8", 8, 32), "nvfp4": ("nvfp4", 4, 16)}

#: broken variant -> problem code the inspector must report
BROKEN = {
    "missing-tensor": "missing-tensor",        # a layer's q_proj is gone
    "misnamed": "unexpected-tensor",           # mlp.down_proj stored as mlp.down_prj (+ missing-tensor)
    "unexpected-tensor": "unexpected-tensor",  # an extra tensor no architecture uses
    "shape-mismatch": "shape-mismatch",        # mlp.gate_proj stored transposed (quantized: a row short)
    "dtype-mismatch": "dtype-mismatch",        # a norm weight stored as int32
    "quantization-mismatch": "quantization-mismatch",  # one module packed with other bits than config says
    "duplicate-tensor": "duplicate-tensor",    # one tensor in two shards
    "missing-shard": "missing-shard",          # a shard named by the index is deleted
    "index-mismatch": "index-mismatch",        # the index maps a tensor to the wrong shard
    "truncated-file": "truncated-file",        # the last shard loses its tail
    "bad-header": "bad-header",                # header JSON garbled
    "header-too-large": "bad-header",          # header length field past the 100 MB cap
    "overlapping-offsets": "bad-header",       # two tensors' data_offsets overlap
    "path-escape": "path-escape",              # the index names ../outside.safetensors
    "nonfinite-values": "nonfinite-values",    # NaN, +Inf, -Inf written into a norm weight
    "bad-config": "bad-config",                # config.json lacks num_hidden_layers
}

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


def _tower_tensors(arch: str, text_hidden: int) -> dict:
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


# ------------------------------------------------------------------ writing
_ST_DTYPE = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.uint32): "U32",
             np.dtype(np.uint8): "U8", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64",
             np.dtype(np.uint16): "BF16"}


def _to_entry(arr) -> tuple:
    """mx.array / np.ndarray -> (dtype, shape, bytes). numpy uint16 is taken as BF16 bits."""
    import mlx.core as mx

    if isinstance(arr, mx.array):
        if arr.dtype == mx.bfloat16:
            a = np.array(arr.view(mx.uint16))
            return "BF16", tuple(a.shape), a.tobytes()
        arr = np.array(arr)
    arr = np.ascontiguousarray(arr)
    return _ST_DTYPE[arr.dtype], tuple(arr.shape), arr.tobytes()


def write_safetensors(path, entries: dict, metadata: dict | None = None, *, sparse_sizes: dict | None = None):
    """Write a safetensors file. ``entries``: name -> (dtype, shape, bytes). With
    ``sparse_sizes`` (name -> nbytes) the data is not written: the file gets its full
    length as a hole (a sparse file)."""
    from workbench.checkpoint.sfile import nbytes_of

    hdr = {}
    if metadata:
        hdr["__metadata__"] = metadata
    off = 0
    names = list(entries)
    for n in names:
        dt, shape, data = entries[n]
        nb = nbytes_of(dt, shape)
        hdr[n] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + nb]}
        off += nb
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with fsio.atomic_write(path) as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        if sparse_sizes is not None:
            f.truncate(8 + len(h) + off)
            return
        for n in names:
            f.write(entries[n][2])


def write_tokenizer(dest: Path, vocab_size: int):
    """A word-level tokenizer.json of ``vocab_size`` entries (specials, common words, letters, digits)."""
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers
    except ImportError:  # pragma: no cover
        return
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    words = ["the", "a", "an", "is", "of", "and", "to", "in", "it", "that", "on", "for", "with", "as", "was",
             "cat", "dog", "sat", "mat", "hello", "world", "model", "layer", "weight", "token", "engine",
             ".", ",", "!", "?"]
    words += [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    vocab = {}
    for w in specials + words:
        if w not in vocab and len(vocab) < vocab_size:
            vocab[w] = len(vocab)
    i = 0
    while len(vocab) < vocab_size:
        vocab[f"w{i}"] = len(vocab)
        i += 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fsio.write_with(dest / "tokenizer.json", lambda p: tok.save(p))


def _values(rng, e, neutral: float, dtype):
    import mlx.core as mx

    if e.kind in ("norm",):
        v = neutral + 0.02 * rng.standard_normal(e.shape)
    elif e.kind == "scalar":
        v = np.ones(e.shape)
    elif e.kind == "vector":
        if e.name.endswith(("router.scale", "per_expert_scale")):
            v = 1.0 + 0.02 * rng.standard_normal(e.shape)
        else:  # biases
            v = 0.02 * rng.standard_normal(e.shape)
    else:
        v = 0.02 * rng.standard_normal(e.shape)
    return mx.array(v.astype(np.float32)).astype(dtype)


def build(arch: str, dest, *, quant: str | None = None, layout: str = "mlx", shards: int = 1, seed: int = 0,
          broken=None, tokenizer: bool = True, dtype: str = "bfloat16", **config_overrides) -> Path:
    """Write a tiny random checkpoint of ``arch`` into ``dest`` (created) and return its path.

    arch: one of ARCHS (or INSPECT_ONLY_ARCHS); quant: one of QUANTS; layout: "mlx" (MLX-converted names) or "hf"
    (original Hugging Face names, fused MoE experts, unquantized); shards: number of
    .safetensors files (an index is written when > 1); broken: a name (or list) from
    BROKEN; dtype: "bfloat16" (default), "float16" or "float32" for the float tensors (MLX's CPU
    gather_mm, used by MoE experts, needs float32); config_overrides: fields replaced in the
    (text) config.
    """
    import mlx.core as mx

    if arch not in ARCHS + INSPECT_ONLY_ARCHS:
        raise ValueError(f"unknown zoo architecture {arch!r}; choose from {', '.join(ARCHS + INSPECT_ONLY_ARCHS)}")
    if quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r}; choose from {QUANTS}")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose from {LAYOUTS}")
    if layout == "hf" and quant:
        raise ValueError("the Hugging Face layout is unquantized (quant=None)")
    broken = [broken] if isinstance(broken, str) else list(broken or [])
    for b in broken:
        if b not in BROKEN:
            raise ValueError(f"unknown broken variant {b!r}; choose from {', '.join(BROKEN)}")
    if any(b in ("duplicate-tensor", "missing-shard", "index-mismatch", "path-escape") for b in broken):
        shards = max(shards, 2)
    if "quantization-mismatch" in broken and not quant:
        quant = "affine4"

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for old in [*dest.glob("*.safetensors"), dest / "model.safetensors.index.json"]:
        if old.is_file():  # a rebuild into the same folder leaves no stale shard behind
            old.unlink()
    config = base_config(arch)
    multimodal = "text_config" in config
    tc = config["text_config"] if multimodal else config
    tc.update(config_overrides)
    if multimodal:
        config["vocab_size"] = tc["vocab_size"]
    a = build_arch(config)
    rng = np.random.default_rng(seed)
    dtype = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}[dtype]

    # canonical float tensors (KV-shared layers' optional k/v are written only in the HF layout)
    canon = {}
    for e in a.expected.values():
        if e.optional and not (layout == "hf" and e.ignored_if_present and e.name.startswith("layers.")):
            continue
        canon[e.name] = _values(rng, e, a.neutral_norm, dtype)

    # quantization, as mlx-lm's convert does it (every Linear / Embedding / SwitchLinear whose
    # input width fits the group size; Gemma 4's router.proj stays 8-bit affine)
    qblock = None
    prefix = {"mlx": "language_model.model." if multimodal else "model.", "hf": ""}[layout]
    if arch == "gemma3n":
        prefix = "model.language_model."
    if quant:
        mode, bits, gs = QUANT_SPECS[quant]
        qblock = {"group_size": gs, "bits": bits, "mode": mode}
        for e in list(a.expected.values()):
            if not e.quantizable or e.name not in canon or e.shape[-1] % gs:
                continue
            m_mode, m_bits, m_gs = mode, bits, gs
            if a.family == "gemma4_text" and e.module.endswith("router.proj"):
                m_mode, m_bits, m_gs = "affine", 8, 64
                key = (prefix if e.module != "lm_head" else prefix.replace("model.", "")) + e.module
                qblock[key] = {"group_size": 64, "bits": 8}
            if "quantization-mismatch" in broken and e.name == f"layers.{min(1, a.num_layers - 1)}.mlp.up_proj.weight":
                m_mode, m_bits, m_gs = {"mxfp4": ("mxfp8", 8, 32), "mxfp8": ("mxfp4", 4, 32),
                                        "nvfp4": ("mxfp4", 4, 32)}.get(m_mode, ("affine", 12 - m_bits, m_gs))
            r = mx.quantize(canon[e.name], group_size=m_gs, bits=m_bits, mode=m_mode)
            canon[e.name] = r[0]
            canon[e.module + ".scales"] = r[1]
            if len(r) > 2 and r[2] is not None and m_mode == "affine":
                canon[e.module + ".biases"] = r[2]
        config["quantization"] = qblock
        config["quantization_config"] = dict(qblock)

    # stored names
    stored = {}
    for n, v in canon.items():
        stored[_stored_name(n, arch, layout, multimodal)] = v
    if layout == "hf" and a.moe:
        for i in range(a.num_layers):
            base = _stored_name(f"layers.{i}.experts", arch, layout, multimodal)
            g = stored.pop(f"{base}.switch_glu.gate_proj.weight")
            u = stored.pop(f"{base}.switch_glu.up_proj.weight")
            d = stored.pop(f"{base}.switch_glu.down_proj.weight")
            stored[f"{base}.gate_up_proj"] = mx.concatenate([g, u], axis=-2)
            stored[f"{base}.down_proj"] = d
    if layout == "hf" and arch == "llama":
        for i in range(a.num_layers):
            stored[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = mx.array(
                (1.0 / (10000.0 ** (np.arange(0, 32, 2) / 32))).astype(np.float32))
    for n, shp in _tower_tensors(arch, tc["hidden_size"]).items():
        nm = ("model." + n) if ((layout == "hf" and arch == "gemma4") or arch == "gemma3n") else n
        val = (1.0 if n.endswith("norm.weight") or "layernorm" in n else 0.0) if len(shp) == 1 else None
        if val is None:
            stored[nm] = mx.array((0.02 * rng.standard_normal(shp)).astype(np.float32)).astype(dtype)
        else:
            stored[nm] = mx.array((val + 0.02 * rng.standard_normal(shp)).astype(np.float32)).astype(dtype)

    entries = {n: _to_entry(v) for n, v in stored.items()}
    L1 = min(1, a.num_layers - 1)
    lm = lambda n: _stored_name(n, arch, layout, multimodal)  # noqa: E731
    _break_entries(entries, broken, lm, L1, a)
    if "bad-config" in broken:
        tc.pop("num_hidden_layers", None)

    # shard and write
    names = list(entries)
    files = _write_shards(dest, entries, names, shards, broken, lm, L1)
    fsio.write_text(dest / "config.json", json.dumps(config, indent=2))
    if tokenizer:
        write_tokenizer(dest, tc["vocab_size"])
    _break_files(dest, files, broken)
    return dest


def _stored_name(n: str, arch: str, layout: str, multimodal: bool) -> str:
    if n == "lm_head.weight" or n.startswith("lm_head."):
        if layout == "mlx" and multimodal:
            return "language_model." + n
        return n
    if (layout == "hf" and arch == "gemma4") or arch == "gemma3n":
        return "model.language_model." + n
    if multimodal:
        return "language_model.model." + n
    return "model." + n


def _break_entries(entries: dict, broken, lm, L1, a):
    def pop_module(mod):
        out = {}
        for suf in (".weight", ".scales", ".biases"):
            k = lm(mod + suf)
            if k in entries:
                out[suf] = entries.pop(k)
        return out

    if "missing-tensor" in broken:
        pop_module(f"layers.{L1}.self_attn.q_proj")
    if "misnamed" in broken:
        for suf, v in pop_module(f"layers.{L1}.mlp.down_proj").items():
            entries[lm(f"layers.{L1}.mlp.down_prj") + suf] = v
    if "unexpected-tensor" in broken:
        entries[lm(f"layers.{L1}.self_attn.attn_logit_bias")] = _to_entry(np.zeros((4,), np.float32))
    if "shape-mismatch" in broken:
        k = lm(f"layers.{L1}.mlp.gate_proj.weight")
        dt, shp, data = entries[k]
        if dt != "U32":
            arr = np.frombuffer(data, {"BF16": np.uint16, "F16": np.uint16, "F32": np.float32}[dt]).reshape(shp)
            arr = arr.T.copy()
            entries[k] = (dt, arr.shape, arr.tobytes())
        else:  # quantized: drop the last output row of the packed weight
            arr = np.frombuffer(data, np.uint32).reshape(shp)[:-1].copy()
            entries[k] = ("U32", arr.shape, arr.tobytes())
    if "dtype-mismatch" in broken:
        k = lm(f"layers.{L1}.input_layernorm.weight")
        dt, shp, data = entries[k]
        entries[k] = _to_entry(np.ones(shp, np.int32))
    if "nonfinite-values" in broken:
        k = lm(f"layers.{L1}.post_attention_layernorm.weight")
        dt, shp, data = entries[k]
        if dt == "BF16":
            arr = np.frombuffer(data, np.uint16).copy()
            arr[0], arr[1], arr[2], arr[3] = 0x7FC0, 0x7F80, 0xFF80, 0x7FC0  # NaN, +Inf, -Inf, NaN
        else:
            arr = np.frombuffer(data, {"F32": np.float32, "F16": np.float16}[dt]).copy()
            arr[:4] = [np.nan, np.inf, -np.inf, np.nan]
        entries[k] = (dt, shp, arr.tobytes())


def _write_shards(dest: Path, entries: dict, names: list, shards: int, broken, lm, L1) -> list:
    meta = {"format": "mlx"}
    if shards <= 1:
        write_safetensors(dest / "model.safetensors", entries, meta)
        return ["model.safetensors"]
    total = sum(len(e[2]) for e in entries.values())
    per = total / shards
    groups, acc, cur = [[] for _ in range(shards)], 0, 0
    for n in names:
        if acc >= per * (cur + 1) and cur < shards - 1:
            cur += 1
        groups[cur].append(n)
        acc += len(entries[n][2])
    files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    wm = {}
    for f, g in zip(files, groups):
        for n in g:
            wm[n] = f
    dup = lm("norm.weight")
    for f, g in zip(files, groups):
        ents = {n: entries[n] for n in g}
        if "duplicate-tensor" in broken and f == files[0] and dup not in ents:
            ents[dup] = entries[dup]
        if "duplicate-tensor" in broken and f == files[-1] and dup not in ents:
            ents[dup] = entries[dup]
        write_safetensors(dest / f, ents, meta)
    if "index-mismatch" in broken:
        k = lm(f"layers.{L1}.self_attn.o_proj.weight")
        wm[k] = files[-1] if wm[k] != files[-1] else files[0]
    if "path-escape" in broken:
        wm[lm("norm.weight")] = "../outside.safetensors"  # (the zoo writes nothing outside dest)
    idx = {"metadata": {"total_size": sum(len(e[2]) for e in entries.values())}, "weight_map": dict(sorted(wm.items()))}
    fsio.write_text(dest / "model.safetensors.index.json", json.dumps(idx, indent=2))
    return files


def _break_files(dest: Path, files: list, broken):
    if "missing-shard" in broken:
        os.remove(dest / files[-1])
    if "truncated-file" in broken:
        p = dest / files[-1]
        size = p.stat().st_size
        with open(p, "r+b") as f:
            f.truncate(size - max(64, size // 10))
    if "bad-header" in broken:
        p = dest / files[0]
        b = bytearray(p.read_bytes())
        b[8 + 1: 8 + 6] = b"!!!!!"  # garble the first key
        fsio.write_bytes(p, bytes(b))
    if "header-too-large" in broken:
        p = dest / files[0]
        with open(p, "r+b") as f:
            f.write(struct.pack("<Q", 200_000_000))
    if "overlapping-offsets" in broken:
        p = dest / files[0]
        raw = p.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        hdr = json.loads(raw[8: 8 + n])
        ts = sorted((k for k in hdr if k != "__metadata__"), key=lambda k: hdr[k]["data_offsets"][0])
        a_, b_ = hdr[ts[0]], hdr[ts[1]]
        ln = b_["data_offsets"][1] - b_["data_offsets"][0]
        b_["data_offsets"] = [a_["data_offsets"][0], a_["data_offsets"][0] + ln]
        h = json.dumps(hdr, separators=(",", ":")).encode()
        h += b" " * (n - len(h)) if len(h) <= n else b""
        h2 = h if len(h) == n else h + b" " * ((8 - len(h) % 8) % 8)
        fsio.write_bytes(p, struct.pack("<Q", len(h2)) + h2 + raw[8 + n:])


# ------------------------------------------------------------- sparse 31B shape
GEMMA4_31B = {
    "model_type": "gemma4_text", "hidden_size": 5376, "num_hidden_layers": 60, "intermediate_size": 21504,
    "num_attention_heads": 32, "head_dim": 256, "global_head_dim": 512, "num_key_value_heads": 16,
    "num_global_key_value_heads": 4, "attention_k_eq_v": True, "num_kv_shared_layers": 0,
    "hidden_size_per_layer_input": 0, "vocab_size": 262144, "sliding_window": 1024, "sliding_window_pattern": 6,
    "final_logit_softcapping": 30.0, "tie_word_embeddings": True, "enable_moe_block": False,
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
}


def build_sparse(dest, *, config: dict | None = None, shard_bytes: int = 5 * 2**30, quant: str | None = None) -> Path:
    """A Gemma-4-31B-shaped sharded BF16 checkpoint (multimodal wrapper, MLX layout) whose
    headers are real and whose data are holes: ~60 GB apparent, a few MB on disk."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    tc = dict(config or GEMMA4_31B)
    tc["layer_types"] = (["sliding_attention"] * 5 + ["full_attention"]) * (tc["num_hidden_layers"] // 6) + \
        ["sliding_attention"] * (tc["num_hidden_layers"] % 6)
    cfg = {"model_type": "gemma4", "text_config": tc, "vocab_size": tc["vocab_size"]}
    a = build_arch(cfg)
    from workbench.checkpoint.sfile import nbytes_of

    ents = {}
    qs = QUANT_SPECS.get(quant) if quant else None
    for e in a.expected.values():
        if e.optional:
            continue
        name = "language_model.model." + e.name if not e.name.startswith("lm_head") else "language_model." + e.name
        if qs and e.quantizable and e.shape[-1] % qs[2] == 0:
            mode, bits, gs = qs
            mod = name[: -len(".weight")]
            ents[name] = ("U32", tuple(e.shape[:-1]) + (e.shape[-1] * bits // 32,), None)
            sdt = "U8" if mode != "affine" else "BF16"
            ents[mod + ".scales"] = (sdt, tuple(e.shape[:-1]) + (e.shape[-1] // gs,), None)
            if mode == "affine":
                ents[mod + ".biases"] = ("BF16", tuple(e.shape[:-1]) + (e.shape[-1] // gs,), None)
        else:
            ents[name] = ("BF16", e.shape, None)
    for n, shp in _tower_tensors("gemma4", tc["hidden_size"]).items():
        ents[n] = ("BF16", shp, None)
    if qs:
        cfg["quantization"] = {"group_size": qs[2], "bits": qs[1], "mode": qs[0]}
    groups, cur, size = [[]], 0, 0
    for n, (dt, shp, _) in ents.items():
        nb = nbytes_of(dt, shp)
        if size + nb > shard_bytes and groups[-1]:
            groups.append([])
            size = 0
        groups[-1].append(n)
        size += nb
    k = len(groups)
    wm = {}
    for i, g in enumerate(groups):
        f = f"model-{i + 1:05d}-of-{k:05d}.safetensors"
        sub = {n: ents[n] for n in g}
        write_safetensors(dest / f, sub, {"format": "mlx"}, sparse_sizes={n: 0 for n in g})
        for n in g:
            wm[n] = f
    fsio.write_text(dest / "model.safetensors.index.json", json.dumps({"metadata": {}, "weight_map": wm}))
    fsio.write_text(dest / "config.json", json.dumps(cfg, indent=2))
    return dest
