"""Published config.json files, sizes shrunk, with torch's logits (issue 40, item 1).

tests/data/published/<case>/ holds

* original.json -- the config.json as published (copied from a public repository that
  vendors it; source.json names the repository, path and commit, SOURCES.md lists them);
* config.json -- :func:`shrink` (original): sizes only (hidden, layers, heads, head_dim,
  vocab, experts, ranks, a window that can bind, LongRoPE's factor lists), every other key as
  published; tests/test_published.py checks the two agree;
* tensors.json -- name -> [shape, dtype, base] of what transformers' ``save_pretrained``
  writes for that config (values rebuilt bit for bit by make_arch_refs.tensor_values);
* logits.npy -- torch float32 logits on :data:`IDS` (eager attention), transformers reading
  config.json exactly as published.

A config with a ``quantization`` block (an mlx-community conversion) gets MLX's quantized
tensors (:func:`write_quantized`: ``mx.quantize`` of the float values, affine, the block's
bits and group size, every matrix whose input dimension the group divides); torch runs on
the dequantized values (``mx.dequantize`` of the same bits), so both sides compute with the
same weights and the only difference left is the arithmetic.

    PYTHONPATH=/tmp/torchlib .venv/bin/python tests/data/make_published_refs.py [CASE ...]
"""
from __future__ import annotations

import copy
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent
HERE = DATA / "published"
_spec = importlib.util.spec_from_file_location("make_arch_refs", DATA / "make_arch_refs.py")
arch_refs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(arch_refs)
IDS = arch_refs.IDS  # 12 tokens: longer than every shrunk window (4)

HIDDEN, HEADS, HEAD_DIM, WIDE_HEAD_DIM, VOCAB, LAYERS, WINDOW = 64, 4, 16, 32, 256, 2, 4
#: sizes set to a fixed small value wherever the config has them
FIXED = dict(hidden_size=HIDDEN, n_embd=HIDDEN, intermediate_size=128, moe_intermediate_size=32,
             shared_expert_intermediate_size=64, num_attention_heads=HEADS, n_head=HEADS, vocab_size=VOCAB,
             kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
             num_local_experts=4, num_experts=4, n_routed_experts=4)
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _subsample(xs: list, n: int) -> list:
    """``n`` of ``xs`` evenly spaced, first and last kept (LongRoPE's factors, one per
    rotated frequency, stay a rising curve of the same range)."""
    idx = np.round(np.linspace(0, len(xs) - 1, n)).astype(int)
    return [xs[i] for i in idx]


def shrink(original: dict) -> dict:
    """The config with tiny sizes and every other key as published."""
    c = copy.deepcopy(original)
    heads0 = c.get("num_attention_heads", c.get("n_head"))
    hidden0 = c.get("hidden_size", c.get("n_embd"))
    layers0 = c.get("num_hidden_layers", c.get("n_layer"))
    # Gemma 3's pattern (5 local, 1 global) needs its whole period to show both kinds
    layers = c.get("sliding_window_pattern") or LAYERS
    for k, v in FIXED.items():
        if isinstance(c.get(k), int):
            c[k] = v
    for k in ("num_hidden_layers", "n_layer"):
        if k in c:
            c[k] = layers
    if isinstance(c.get("n_inner"), int):  # (n_inner: null means 4 x n_embd in the original)
        c["n_inner"] = c["n_inner"] * HIDDEN // hidden0
    kv0 = c.get("num_key_value_heads")
    if isinstance(kv0, int):
        c["num_key_value_heads"] = HEADS if kv0 == heads0 else 1 if kv0 == 1 else 2
    if isinstance(c.get("head_dim"), int):
        # a head_dim other than hidden / heads stays other than it
        old = c["head_dim"]
        c["head_dim"] = HEAD_DIM if old * heads0 == hidden0 else WIDE_HEAD_DIM
        if c.get("query_pre_attn_scalar") == old:
            c["query_pre_attn_scalar"] = c["head_dim"]
    if isinstance(c.get("query_pre_attn_scalar"), int) and c["query_pre_attn_scalar"] == hidden0 // heads0:
        c["query_pre_attn_scalar"] = HIDDEN // HEADS
    for k in ("num_experts_per_tok", "experts_per_token"):
        if isinstance(c.get(k), int):
            c[k] = min(c[k], 2)
    if isinstance(c.get("q_lora_rank"), int):
        c["q_lora_rank"] = 32
    if isinstance(c.get("first_k_dense_replace"), int):
        c["first_k_dense_replace"] = min(c["first_k_dense_replace"], layers - 1)
    mwl = c.get("max_window_layers")
    if isinstance(mwl, int) and mwl <= layers0:
        c["max_window_layers"] = layers if mwl == layers0 else max(1, min(layers - 1, round(mwl * layers / layers0)))
    if isinstance(c.get("layer_types"), list):
        c["layer_types"] = c["layer_types"][:layers]
    # a window shorter than the context binds: shrunk so that the 12-token prompt crosses it
    ctx = c.get("max_position_embeddings", c.get("n_positions"))
    if isinstance(c.get("sliding_window"), int) and (ctx is None or c["sliding_window"] < ctx):
        c["sliding_window"] = WINDOW
    # token ids index the (shrunk) vocabulary
    for k in TOKEN_IDS:
        v = c.get(k)
        if isinstance(v, int) and v >= VOCAB:
            c[k] = v % VOCAB
        elif isinstance(v, list):
            c[k] = [t % VOCAB if isinstance(t, int) and t >= VOCAB else t for t in v]
    rs = c.get("rope_scaling")
    if isinstance(rs, dict) and isinstance(rs.get("long_factor"), list):
        head_dim = c.get("head_dim") or HIDDEN // HEADS
        n = int(head_dim * c.get("partial_rotary_factor", 1.0)) // 2
        for k in ("long_factor", "short_factor"):
            rs[k] = _subsample(rs[k], n)
    return c


def cases() -> list[str]:
    return sorted(p.name for p in HERE.iterdir() if (p / "original.json").is_file())


def quantization(config: dict) -> dict | None:
    q = config.get("quantization")
    return q if isinstance(q, dict) else None


def _float_tensors(case_dir: Path) -> dict[str, np.ndarray]:
    spec = json.loads((case_dir / "tensors.json").read_text())
    return {n: arch_refs.tensor_values(n, shape, base) for n, (shape, _dtype, base) in spec.items()}


def quantized_tensors(case_dir: Path, dequantize: bool = False) -> dict[str, np.ndarray]:
    """MLX's tensors of a quantized case (weight, scales, biases of every matrix the group
    size divides; the rest float32), or, with ``dequantize``, the float values those bits
    stand for under the original names (what torch is given)."""
    import mlx.core as mx

    q = quantization(json.loads((case_dir / "config.json").read_text()))
    gs, bits = q["group_size"], q["bits"]
    out = {}
    for name, v in _float_tensors(case_dir).items():
        if v.ndim == 2 and name.endswith(".weight") and v.shape[-1] % gs == 0:
            w, s, b = mx.quantize(mx.array(v), group_size=gs, bits=bits)
            if dequantize:
                out[name] = np.array(mx.dequantize(w, s, b, group_size=gs, bits=bits))
            else:
                stem = name[: -len(".weight")]
                out[name], out[stem + ".scales"], out[stem + ".biases"] = np.array(w), np.array(s), np.array(b)
        else:
            out[name] = v
    return out


def write_case(dest: Path, case_dir: Path) -> Path:
    """Rebuild a case's checkpoint in ``dest``: its config.json and its safetensors (MLX's
    quantized tensors where the config has a quantization block)."""
    config = json.loads((case_dir / "config.json").read_text())
    if quantization(config) is None:
        return arch_refs.write_checkpoint(dest, case_dir)
    from safetensors.numpy import save_file

    dest.mkdir(parents=True, exist_ok=True)
    save_file(quantized_tensors(case_dir), str(dest / "model.safetensors"), metadata={"format": "mlx"})
    shutil.copyfile(case_dir / "config.json", dest / "config.json")
    return dest


def _torch_config(config: dict) -> dict:
    """What transformers is given: the config as published, less MLX's quantization block
    (transformers would read ``quantization_config`` as a quantizer of its own)."""
    return {k: v for k, v in config.items() if k not in ("quantization", "quantization_config")}


def build(case: str) -> None:
    import torch
    from safetensors.numpy import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    d = HERE / case
    config = shrink(json.loads((d / "original.json").read_text()))
    (d / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "cfg").mkdir()
        (tmp / "cfg" / "config.json").write_text(json.dumps(_torch_config(config)))
        cfg = AutoConfig.from_pretrained(tmp / "cfg")
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model.save_pretrained(tmp / "init")
        spec = arch_refs.tensor_spec(tmp / "init" / "model.safetensors")
        (d / "tensors.json").write_text(json.dumps(spec, indent=0))
        ck = tmp / "ckpt"
        if quantization(config) is None:
            arch_refs.write_checkpoint(ck, d)
        else:
            ck.mkdir()
            save_file(quantized_tensors(d, dequantize=True), str(ck / "model.safetensors"), metadata={"format": "pt"})
            (ck / "config.json").write_text(json.dumps(_torch_config(config)))
        logits = arch_refs.torch_logits(case, ck)
    np.save(d / "logits.npy", logits.astype(np.float32))
    print(f"{case}: {config['model_type']}, {len(spec)} tensors, max |logit| {np.abs(logits).max():.3g}", flush=True)


def write_sources() -> None:
    rows = ["# Published configs: where each original.json comes from", "",
            "Written by tests/data/make_published_refs.py from each case's source.json.  There is no network",
            "to huggingface.co here: each file is a copy that a public GitHub repository vendors, found through",
            "a stored index of such repositories.  Copies kept as Python dicts (mlc-llm's model presets) are",
            "written back as JSON (True / False / None as true / false / null), keys in their order.  Where the",
            "index names no repository, the index's file id is given with the URL the copy names.", "",
            "| case | model_type | repository | path | commit | entry | note |", "|---|---|---|---|---|---|---|"]
    for c in cases():
        s = json.loads((HERE / c / "source.json").read_text())
        mt = json.loads((HERE / c / "original.json").read_text())["model_type"]
        rows.append(f"| {c} | {mt} | {s['repo']} | {s['path']} | {s.get('commit', '')[:12]} | {s['entry']} | "
                    f"{s.get('note', '')} |")
    (HERE / "SOURCES.md").write_text("\n".join(rows) + "\n")


def main(argv) -> None:
    failed = []
    for case in argv or cases():
        try:
            build(case)
        except Exception as e:  # report every case, then fail
            failed.append(case)
            print(f"{case}: FAILED {type(e).__name__}: {' '.join(str(e).split())[:300]}", flush=True)
    write_sources()
    if failed:
        sys.exit(f"failed: {' '.join(failed)}")


if __name__ == "__main__":
    main(sys.argv[1:])
