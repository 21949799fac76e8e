"""Model programs against mlx-lm: logits, quantization, layouts, padding, KV cache, dtypes."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import workbench
import mlx.core as mx

import models_tiny as mt
from workbench.program import execute

IDS = mx.array([[1, 5, 9, 33, 2, 7, 100, 200, 3, 4, 17, 250]])  # longer than the sliding windows (5)
ARCHS = ["llama", "llama_tied", "qwen2", "qwen3", "qwen3_yarn", "gemma3_text", "gemma4_text", "gemma4_keqv", "gemma4_moe"]


def rel_err(a, b) -> float:
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    return mx.abs(a - b).max().item() / mx.abs(b).max().item()


def logits(model, ids, mask=None, cache=None, dtype=None):
    return execute(model.program, model.context(dtype, cache), model.feeds(ids, mask, cache))["logits"]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Checkpoints built on demand, once per module."""
    made = {}

    def get(name, quant=None, dtype=None, mm=False):
        key = (name, str(quant), str(dtype), mm)
        if key not in made:
            cfg = mt.CONFIGS[name]
            if mm:
                cfg = mt.multimodal(cfg)
            d = tmp_path_factory.mktemp(name)
            made[key] = mt.build(d, cfg, quant=quant, dtype=dtype)
        return made[key]
    return get


# ---------------------------------------------------------------- logits == mlx-lm

@pytest.mark.parametrize("arch", ARCHS)
def test_float32_logits_match_mlx_lm(ckpts, arch):
    path = ckpts(arch)
    model = workbench.load(path)
    out = logits(model, IDS)
    ref = mt.ref_logits(path, IDS)
    assert out.shape == ref.shape == (1, IDS.shape[1], mt.CONFIGS[arch]["vocab_size"])
    assert out.dtype == mx.float32
    assert rel_err(out, ref) <= 1e-4
    assert model.program.ops[-1].name == "logits"


def test_gemma4_multimodal_wrapper_loads_language_model(ckpts):
    path = ckpts("gemma4_text", mm=True)
    model = workbench.load(path)
    assert model.family == "gemma4_text"
    assert model.config["hidden_size_per_layer_input"] == 16
    assert rel_err(logits(model, IDS), mt.ref_logits(path, IDS)) <= 1e-4


@pytest.mark.parametrize("arch", ["gemma4_text", "gemma4_moe"])
def test_hugging_face_layout(ckpts, tmp_path, arch):
    mlx_path = ckpts(arch, mm=True)
    hf = mt.to_hf_layout(mlx_path, tmp_path / "hf")
    model = workbench.load(hf)
    assert model.checkpoint.layout == "hf"
    ref = mt.ref_logits(mlx_path, IDS)
    assert rel_err(logits(model, IDS), ref) <= 1e-4
    assert rel_err(logits(model, IDS), logits(workbench.load(mlx_path), IDS)) <= 1e-6


QUANTS = {
    "affine4": (dict(mode="affine", bits=4, group_size=32), None),
    # MX formats are stored next to bfloat16 tensors, as real checkpoints are
    "mxfp4": (dict(mode="mxfp4"), mx.bfloat16),
}


@pytest.mark.parametrize("quant", list(QUANTS))
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3_text", "gemma4_text", "gemma4_moe"])
def test_quantized_logits_match_mlx_lm(ckpts, arch, quant):
    q, dt = QUANTS[quant]
    path = ckpts(arch, quant=q, dtype=dt)
    model = workbench.load(path)
    out = logits(model, IDS)
    assert rel_err(out, mt.ref_logits(path, IDS)) <= 1e-3
    # quantized weights stay packed: no dequantized copy is ever made
    qp = model.program["layers.0.self_attn.q_proj"]
    assert qp.attrs["quant"]["mode"] == q["mode"]
    w = model.context().weights
    for name in model.tensor_names:
        mod = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and model.checkpoint.quant_of(mod) is not None and name in w._memo:
            assert w._memo[name].dtype == mx.uint32, name


@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_other_quant_modes_for_experts(ckpts, mode):
    path = ckpts("gemma4_moe", quant=dict(mode=mode), dtype=mx.bfloat16)
    model = workbench.load(path)
    assert model.program["layers.0.experts.switch_glu.gate_proj"].attrs["quant"]["mode"] == mode
    assert rel_err(logits(model, IDS), mt.ref_logits(path, IDS)) <= 1e-3


# ---------------------------------------------------------------- names

def _consumed_check(model):
    arch = model.checkpoint.arch
    names = model.program.names
    for t in model.tensor_names:
        if not t.endswith(".weight"):
            continue
        exp = arch.expected.get(t) if arch is not None else None
        if exp is not None and exp.ignored_if_present:
            continue  # e.g. k/v projections HF ships for KV-shared layers; loaders drop them
        mod = t[: -len(".weight")]
        assert mod in names, f"no op named {mod!r} consumes {t}"
        assert mod in model.program[mod].params, f"op {mod!r} does not list {mod} in its params"


@pytest.mark.parametrize("arch", ARCHS)
def test_every_weight_consumed_by_op_named_by_module(ckpts, arch):
    model = workbench.load(ckpts(arch))
    _consumed_check(model)
    # and every param an op lists is a real checkpoint tensor/module
    for op in model.program:
        for p in op.params:
            assert model.op_tensors(op.name), f"{op.name} lists {p}, which the checkpoint lacks"
    names = model.program.names
    for i in range(model.num_layers):
        assert f"layers.{i}" in names
        assert model.program[f"layers.{i}"].layer == i


def test_every_weight_consumed_hf_and_quantized(ckpts, tmp_path):
    _consumed_check(workbench.load(mt.to_hf_layout(ckpts("gemma4_text", mm=True), tmp_path / "hf")))
    _consumed_check(workbench.load(ckpts("gemma4_moe", quant=dict(mode="affine", bits=4, group_size=32))))


def test_op_tensors(ckpts):
    model = workbench.load(ckpts("llama_tied", quant=dict(mode="affine", bits=4, group_size=32)))
    t = model.op_tensors("layers.1.mlp.down_proj")
    assert set(t) == {"layers.1.mlp.down_proj.weight", "layers.1.mlp.down_proj.scales",
                      "layers.1.mlp.down_proj.biases"}
    assert set(model.op_tensors("lm_head")) == {"embed_tokens.weight", "embed_tokens.scales", "embed_tokens.biases"}
    assert model.op_tensors("layers.0.self_attn.context") == {}
    m4 = workbench.load(ckpts("gemma4_moe"))
    assert set(m4.op_tensors("layers.0.router.weights")) == {"layers.0.router.per_expert_scale"}
    assert set(m4.op_tensors("layers.0")) == {"layers.0.layer_scalar"}


def _doc_patterns():
    text = (Path(__file__).resolve().parents[1] / "docs" / "ops.md").read_text()
    return set(re.findall(r"`([a-z_0-9.{}]+)`", text))


@pytest.mark.parametrize("arch", ARCHS)
def test_op_names_are_documented(ckpts, arch):
    documented = _doc_patterns()
    model = workbench.load(ckpts(arch))
    for name in model.program.names:
        generic = re.sub(r"^layers\.\d+", "layers.{i}", name)
        assert generic in documented, f"{name} ({generic}) is not in docs/ops.md"
    for inp in model.program.inputs:
        assert inp in documented


# ---------------------------------------------------------------- batches, cache

@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "gemma4_text", "gemma4_moe"])
def test_left_padded_batch_matches_single_runs(ckpts, arch):
    model = workbench.load(ckpts(arch))
    a = IDS[0].tolist()
    b = [8, 9, 10, 11, 12, 13, 14]
    pad = len(a) - len(b)
    ids = mx.array([a, [0] * pad + b])
    mask = mx.array([[1] * len(a), [0] * pad + [1] * len(b)])
    out = logits(model, ids, mask)
    la, lb = logits(model, mx.array([a])), logits(model, mx.array([b]))
    assert rel_err(out[0], la[0]) <= 1e-5
    assert rel_err(out[1, pad:], lb[0]) <= 1e-5
    assert mx.isfinite(out).all().item()  # padding rows are garbage but finite


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3_text", "gemma4_text", "gemma4_keqv", "gemma4_moe"])
def test_kv_cache_generation_matches_full_forward(ckpts, arch):
    model = workbench.load(ckpts(arch))
    full = logits(model, IDS)
    cache = model.make_cache()
    parts = [logits(model, IDS[:, :4], cache=cache)]
    for t in range(4, IDS.shape[1]):
        parts.append(logits(model, IDS[:, t:t + 1], cache=cache))
    assert cache.offset == IDS.shape[1]
    assert rel_err(mx.concatenate(parts, axis=1), full) <= 1e-5


def test_kv_cache_with_left_padding(ckpts):
    model = workbench.load(ckpts("gemma4_text"))
    a = IDS[0].tolist()
    b = [8, 9, 10, 11, 12, 13]
    pad = len(a) - len(b)
    ids = mx.array([a, [0] * pad + b])
    mask = mx.array([[1] * len(a), [0] * pad + [1] * len(b)])
    full = logits(model, ids, mask)
    cache = model.make_cache()
    parts = [logits(model, ids[:, :8], mask[:, :8], cache)]
    for t in range(8, ids.shape[1]):
        parts.append(logits(model, ids[:, t:t + 1], None, cache))
    assert rel_err(mx.concatenate(parts, axis=1), full) <= 1e-5


def test_greedy_generation_matches_mlx_lm(ckpts):
    """Greedy tokens from the workbench's cache equal mlx-lm's generate_step."""
    from mlx_lm.generate import generate_step

    path = ckpts("gemma4_text")
    model = workbench.load(path)
    ref = mt.reference(path)
    want = [int(t) for t, _ in zip((tok for tok, _ in generate_step(IDS[0], ref, max_tokens=6)), range(6))]
    cache = model.make_cache()
    out = logits(model, IDS, cache=cache)
    got = []
    for _ in range(6):
        nxt = int(mx.argmax(out[0, -1]).item())
        got.append(nxt)
        out = logits(model, mx.array([[nxt]]), cache=cache)
    assert got == want


def test_feeds_reject_bad_input(ckpts):
    model = workbench.load(ckpts("llama"))
    with pytest.raises(ValueError, match="left padding"):
        model.feeds(mx.array([[1, 2, 3]]), mx.array([[1, 0, 1]]))
    with pytest.raises(ValueError, match="out of range"):
        model.feeds(mx.array([[1, 2, 999]]))
    with pytest.raises(ValueError, match="does not match"):
        model.feeds(mx.array([[1, 2, 3]]), mx.array([[1, 1]]))


# ---------------------------------------------------------------- dtype control

@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "gemma4_text", "gemma4_moe"])
def test_compute_dtype_applies_to_every_op(ckpts, arch, dtype):
    model = workbench.load(ckpts(arch))  # stored in float32
    dt = getattr(mx, dtype)
    vals = execute(model.program, model.context(dtype), model.feeds(IDS), keep=lambda n: True)
    for name, v in vals.items():
        if mx.issubdtype(v.dtype, mx.floating):
            assert v.dtype == dt, f"{name} computed in {v.dtype}, not {dtype}"
    assert vals["logits"].shape == (1, IDS.shape[1], 256)
    # close to float32 (a sanity bound for half precision on a tiny random model)
    assert rel_err(vals["logits"], logits(model, IDS)) < 0.2


def test_float32_from_bfloat16_storage_matches_upcast_reference(ckpts):
    path = ckpts("gemma4_text", dtype=mx.bfloat16)
    model = workbench.load(path)
    assert model.dtype == mx.bfloat16
    assert logits(model, IDS).dtype == mx.bfloat16
    ref = mt.reference(path)
    ref.set_dtype(mx.float32)
    out = logits(model, IDS, dtype="float32")
    assert out.dtype == mx.float32
    assert rel_err(out, ref(IDS)) <= 1e-4
    # load(dtype=...) sets the default compute dtype
    assert logits(workbench.load(path, dtype="float32"), IDS).dtype == mx.float32


def test_float16_residual_clip_matches_mlx_lm_for_gemma3(ckpts):
    path = ckpts("gemma3_text", dtype=mx.float16)
    model = workbench.load(path)
    assert rel_err(logits(model, IDS), mt.ref_logits(path, IDS)) <= 1e-3


@pytest.mark.parametrize("quant", [None, "affine4"])
def test_moe_sorted_expert_path_matches_mlx_lm(ckpts, quant):
    """From 64 (token, expert) pairs on the expert rows are sorted for the kernels."""
    q = QUANTS[quant][0] if quant else None
    path = ckpts("gemma4_moe", quant=q)
    model = workbench.load(path)
    ids = mx.array([[(7 * i + 3) % 256 for i in range(40)], [(5 * i + 1) % 256 for i in range(40)]])
    out = logits(model, ids)
    assert rel_err(out, mt.ref_logits(path, ids)) <= 1e-4
    # the same tokens through the small (unsorted) path, a few at a time with the cache
    cache = model.make_cache()
    parts = [logits(model, ids[:1, t:t + 8], cache=cache) for t in range(0, 40, 8)]
    assert rel_err(mx.concatenate(parts, axis=1), out[:1]) <= 1e-5
