"""The zoo: small checkpoints of every supported architecture, quantization mode and
name layout, single-file or sharded, clean or broken, written on the fly.

    from workbench import zoo
    path = zoo.build("gemma4_text", tmp / "g4", quant="mxfp4", shards=2)
    path = zoo.build("qwen3", tmp / "q3", broken="missing-tensor")

Tensors are generated from workbench.checkpoint.arch (our own architecture knowledge);
the tests prove that mlx-stored_as loads every clean checkpoint strictly.  Values are sensible:
matrices ~ N(0, 0.02), norm weights near their neutral value (1, or 0 for Gemma 3's
``1 + w`` norms), so logits are finite and non-trivial.

``build_sparse`` writes a Gemma-4-31B-shaped sharded checkpoint whose headers are real
and whose data sections are holes (sparse files), for the header-only benchmark.

Layout: configs.py (the config.json of every architecture), writer.py (safetensors and
tokenizer files), broken.py (the broken variants); this module builds checkpoints from them.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from workbench import fsio
from workbench.checkpoint.arch import build_arch
from workbench.zoo.broken import BROKEN, break_entries, break_files, break_index
from workbench.zoo.configs import (ARCHS, GEMMA4_31B, INSPECT_ONLY_ARCHS, LAYOUTS, QUANT_SPECS, QUANTS,  # noqa: F401
                                   base_config, tower_tensors)
from workbench.zoo.writer import to_entry, write_safetensors, write_tokenizer  # noqa: F401


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

    # canonical float tensors (KV-shared layers' optional k/v are written only in the HF layout, and by
    # Gemma 3n's mlx conversions: mlx-lm's gemma3n builds k/v on every layer)
    canon = {}
    for e in a.expected.values():
        if e.optional and not ((layout == "hf" or a.family == "gemma3n") and e.ignored_if_present
                               and e.name.startswith("layers.")):
            continue
        canon[e.name] = _values(rng, e, a.neutral_norm, dtype)

    # quantization, as mlx-stored_as's convert does it (every Linear / Embedding / SwitchLinear whose
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
    for n, shp in tower_tensors(arch, tc["hidden_size"]).items():
        nm = ("model." + n) if ((layout == "hf" and arch == "gemma4") or arch == "gemma3n") else n
        val = (1.0 if n.endswith("norm.weight") or "layernorm" in n else 0.0) if len(shp) == 1 else None
        if val is None:
            stored[nm] = mx.array((0.02 * rng.standard_normal(shp)).astype(np.float32)).astype(dtype)
        else:
            stored[nm] = mx.array((val + 0.02 * rng.standard_normal(shp)).astype(np.float32)).astype(dtype)

    entries = {n: to_entry(v) for n, v in stored.items()}
    target_layer = min(1, a.num_layers - 1)
    stored_as = lambda n: _stored_name(n, arch, layout, multimodal)  # noqa: E731
    break_entries(entries, broken, stored_as, target_layer)
    if "bad-config" in broken:
        tc.pop("num_hidden_layers", None)

    # shard and write
    names = list(entries)
    files = _write_shards(dest, entries, names, shards, broken, stored_as, target_layer)
    fsio.write_text(dest / "config.json", json.dumps(config, indent=2))
    if tokenizer:
        write_tokenizer(dest, tc["vocab_size"])
    break_files(dest, files, broken)
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


def _write_shards(dest: Path, entries: dict, names: list, shards: int, broken, stored_as, target_layer) -> list:
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
    dup = stored_as("norm.weight")
    for f, g in zip(files, groups):
        ents = {n: entries[n] for n in g}
        if "duplicate-tensor" in broken and f == files[0] and dup not in ents:
            ents[dup] = entries[dup]
        if "duplicate-tensor" in broken and f == files[-1] and dup not in ents:
            ents[dup] = entries[dup]
        write_safetensors(dest / f, ents, meta)
    break_index(wm, files, broken, stored_as, target_layer)
    idx = {"metadata": {"total_size": sum(len(e[2]) for e in entries.values())}, "weight_map": dict(sorted(wm.items()))}
    fsio.write_text(dest / "model.safetensors.index.json", json.dumps(idx, indent=2))
    return files



# ------------------------------------------------------------- sparse (header-only) checkpoints
def build_sparse(dest, *, config: dict | None = None, shard_bytes: int = 5 * 2**30, quant: str | None = None) -> Path:
    """A sharded checkpoint (MLX layout) whose headers are real and whose data are holes
    (sparse files): by default Gemma-4-31B-shaped BF16 with tiny towers (~60 GB apparent, a
    few MB on disk).  ``config``: a Gemma 4 text config (as GEMMA4_31B; its layer_types are
    made 5 sliding + 1 full), or a whole config.json with ``text_config`` (the real shapes of
    real_shapes.py: written as given, language model only, as mlx-lm's conversion keeps it).
    ``quant``: a name of QUANT_SPECS (anything else is a ValueError naming it); Gemma 4's
    router.proj stays 8-bit affine (mlx-lm's quant_predicate)."""
    if quant is not None and quant not in QUANT_SPECS:
        raise ValueError(f"unknown quantization {quant!r}; choose from {', '.join(QUANT_SPECS)}")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    whole = config is not None and "text_config" in config
    if whole:
        cfg = json.loads(json.dumps(config))
        tc = cfg["text_config"]
    else:
        tc = dict(config or GEMMA4_31B)
        tc["layer_types"] = (["sliding_attention"] * 5 + ["full_attention"]) * (tc["num_hidden_layers"] // 6) + \
            ["sliding_attention"] * (tc["num_hidden_layers"] % 6)
        cfg = {"model_type": "gemma4", "text_config": tc, "vocab_size": tc["vocab_size"]}
    a = build_arch(cfg)
    from workbench.checkpoint.sfile import nbytes_of

    ents = {}
    qs = QUANT_SPECS[quant] if quant else None
    qblock = {"group_size": qs[2], "bits": qs[1], "mode": qs[0]} if qs else None
    for e in a.expected.values():
        if e.optional:
            continue
        name = "language_model.model." + e.name if not e.name.startswith("lm_head") else "language_model." + e.name
        mode, bits, gs = qs or (None, None, None)
        if qs and a.family == "gemma4_text" and e.module.endswith("router.proj"):
            mode, bits, gs = "affine", 8, 64
            qblock[name[: -len(".weight")]] = {"group_size": 64, "bits": 8}
        if qs and e.quantizable and e.shape[-1] % gs == 0:
            mod = name[: -len(".weight")]
            ents[name] = ("U32", tuple(e.shape[:-1]) + (e.shape[-1] * bits // 32,), None)
            sdt = "U8" if mode != "affine" else "BF16"
            ents[mod + ".scales"] = (sdt, tuple(e.shape[:-1]) + (e.shape[-1] // gs,), None)
            if mode == "affine":
                ents[mod + ".biases"] = ("BF16", tuple(e.shape[:-1]) + (e.shape[-1] // gs,), None)
        else:
            ents[name] = ("BF16", e.shape, None)
    if not whole:
        for n, shp in tower_tensors("gemma4", tc["hidden_size"]).items():
            ents[n] = ("BF16", shp, None)
    if qblock:
        cfg["quantization"] = qblock
        if whole:
            cfg["quantization_config"] = dict(qblock)
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
