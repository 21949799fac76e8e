"""The zoo writes checkpoints that the reference (mlx-lm) loads strictly: this proves our
architecture knowledge (workbench.checkpoint.arch) matches what a correct checkpoint holds."""
import json

import numpy as np
import pytest

import workbench  # noqa: F401
from workbench import zoo
from workbench.checkpoint import open_checkpoint

import mlx.core as mx  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402

ALL = zoo.ARCHS + zoo.INSPECT_ONLY_ARCHS
CLEAN = [(a, q, "mlx") for a in ALL for q in zoo.QUANTS] + [(a, None, "hf") for a in ALL]


@pytest.mark.parametrize("arch,quant,layout", CLEAN, ids=[f"{a}-{q}-{l}" for a, q, l in CLEAN])
def test_mlx_lm_loads_zoo_strictly(tmp_path, arch, quant, layout):
    # MoE experts run through gather_mm, which MLX's CPU backend has only for float32
    dtype = "float32" if arch == "gemma4_moe" else "bfloat16"
    p = zoo.build(arch, tmp_path / "ck", quant=quant, layout=layout, shards=2 if layout == "hf" else 1, dtype=dtype)
    model, _ = load_model(p, strict=True)  # raises on any missing or extra weight
    logits = model(mx.array([[2, 5, 6, 7, 8]]))
    out = np.array(logits.astype(mx.float32))
    assert out.shape == (1, 5, 256)
    assert np.isfinite(out).all()
    assert out.std() > 1e-3  # non-trivial


def test_hf_layout_names(tmp_path):
    p = zoo.build("gemma4", tmp_path / "g4", layout="hf", shards=2,
                  enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=64)
    idx = json.loads((p / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.language_model.layers.0.experts.gate_up_proj" in idx
    assert "model.language_model.layers.0.experts.down_proj" in idx
    assert "model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight" in idx
    # KV-shared layers keep their k/v projections in the original layout
    assert "model.language_model.layers.5.self_attn.k_proj.weight" in idx
    ck = open_checkpoint(p)
    assert ck.layout == "hf"
    g = ck.info("layers.0.experts.switch_glu.gate_proj.weight")
    assert g.shape == (4, 64, 64) and g.part == "gate"
    fused = np.array(ck.load("layers.0.experts.switch_glu.up_proj.weight").astype(mx.float32))
    src = ck.sfiles[g.file].read_numpy(g.source_name)
    full = np.array(mx.array(src).view(mx.bfloat16).astype(mx.float32))
    assert np.array_equal(fused, full[:, 64:, :])


def test_mlx_layout_omits_kv_shared_projections(tmp_path):
    p = zoo.build("gemma4_text", tmp_path / "g4")
    ck = open_checkpoint(p)
    names = ck.lm_names()
    assert "layers.3.self_attn.k_proj.weight" in names
    assert "layers.4.self_attn.k_proj.weight" not in names  # layers 4, 5 share K/V
    assert ck.info("layers.4.mlp.gate_proj.weight").shape == (256, 64)  # double-wide MLP
    assert ck.info("layers.3.mlp.gate_proj.weight").shape == (128, 64)
    assert ck.info("layers.2.self_attn.q_proj.weight").shape == (128, 64)  # full layer: global_head_dim 64
    assert ck.info("layers.1.self_attn.q_proj.weight").shape == (64, 64)


def test_values_are_sensible(tmp_path):
    p = zoo.build("gemma3_text", tmp_path / "g3")
    ck = open_checkpoint(p)
    q = np.array(ck.load("layers.0.self_attn.q_proj.weight").astype(mx.float32))
    assert 0.015 < q.std() < 0.025
    n = np.array(ck.load("layers.0.input_layernorm.weight").astype(mx.float32))
    assert abs(n.mean()) < 0.01  # Gemma 3 norms compute x * (1 + w): neutral 0
    p = zoo.build("qwen3", tmp_path / "q3")
    n = np.array(open_checkpoint(p).load("norm.weight").astype(mx.float32))
    assert abs(n.mean() - 1) < 0.01


def test_router_override_in_config(tmp_path):
    p = zoo.build("gemma4_moe", tmp_path / "m", quant="mxfp4")
    cfg = json.loads((p / "config.json").read_text())
    assert cfg["quantization"]["mode"] == "mxfp4"
    assert cfg["quantization"]["model.layers.0.router.proj"] == {"group_size": 64, "bits": 8}
    ck = open_checkpoint(p)
    assert str(ck.quant_of("layers.0.router.proj")) == "affine 8-bit g64"
    assert str(ck.quant_of("layers.0.experts.switch_glu.gate_proj")) == "mxfp4 4-bit g32"
    assert ck.info("layers.0.router.proj.biases").dtype == "BF16"
    assert "layers.0.experts.switch_glu.gate_proj.biases" not in ck


def test_sharding_and_tokenizer(tmp_path):
    p = zoo.build("llama", tmp_path / "l", shards=3)
    files = sorted(f.name for f in p.glob("*.safetensors"))
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    ck = open_checkpoint(p)
    assert not ck.problems
    assert ck.tokenizer_path is not None
    from tokenizers import Tokenizer
    assert Tokenizer.from_file(str(ck.tokenizer_path)).get_vocab_size() == 256


def test_sparse_31b(tmp_path):
    p = zoo.build_sparse(tmp_path / "big")
    apparent = sum(f.stat().st_size for f in p.glob("*.safetensors"))
    on_disk = sum(f.stat().st_blocks * 512 for f in p.glob("*.safetensors"))
    assert apparent > 50e9 and on_disk < 100e6
    ck = open_checkpoint(p)
    assert ck.num_layers == 60 and not ck.problems
    assert ck.info("layers.5.self_attn.q_proj.weight").shape == (32 * 512, 5376)
    assert "layers.5.self_attn.v_proj.weight" not in ck  # attention_k_eq_v on full layers


def test_unknown_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown zoo architecture"):
        zoo.build("gpt2", tmp_path / "x")
    with pytest.raises(ValueError, match="unquantized"):
        zoo.build("llama", tmp_path / "x", quant="mxfp4", layout="hf")


CONVERT = [("gemma4_moe", "mxfp4"), ("gemma4", "affine4"), ("gemma4_kv", "nvfp4"), ("gemma3", "mxfp8"),
           ("gemma3n", "affine8"), ("qwen3", "mxfp4"), ("llama", "affine4")]


@pytest.mark.parametrize("arch,quant", CONVERT, ids=[f"{a}-{q}" for a, q in CONVERT])
def test_inspector_accepts_mlx_lm_converter_output(tmp_path, arch, quant):
    """The reference converter's own output (mlx-lm: load the HF layout, quantize_model with the
    model's quant_predicate, save_model / save_config) is inspected clean, with the modes,
    overrides and name layout it wrote."""
    import workbench
    from mlx_lm.utils import quantize_model, save_config, save_model

    hf = zoo.build(arch, tmp_path / "hf", layout="hf", shards=2)
    model, config = load_model(hf, lazy=True, strict=True)
    mode, bits, gs = zoo.QUANT_SPECS[quant]
    model, config = quantize_model(model, config, gs, bits, mode=mode)
    out = tmp_path / "mlx"
    save_model(out, model)
    save_config(config, out / "config.json")
    r = workbench.inspect(out, values=True, progress=False)
    if arch in zoo.INSPECT_ONLY_ARCHS:
        # mlx-lm's converter keeps Gemma 3n's language model only, its config still naming the towers:
        # workbench.load opens it with mlx-vlm, which finds no towers, so inspect reports exactly that
        assert [(p.code, p.severity) for p in r.problems] == [("missing-tensor", "error")], \
            [p.message for p in r.problems]
        assert "library='mlx_lm' opens its language model alone" in r.problems[0].message
        with pytest.raises(ValueError, match="mlx-vlm's gemma3n"):
            workbench.load(out)
        assert workbench.load(out, library="mlx_lm").library == "mlx_lm"
    else:
        assert r.ok and not [p for p in r.problems if p.severity == "error"], [p.message for p in r.problems]
    assert r.quantization["mode"] == mode and r.quantization["quantized_modules"] > 0
    assert f"{mode} {bits}-bit g{gs}" in r.quantization["specs"]
    if arch == "gemma4_moe":  # the router stays 8-bit affine through a per-path override
        assert r.quantization["specs"]["affine 8-bit g64"] == 4
        assert r.moe["router_quantization"] == "affine 8-bit g64"
    ck = open_checkpoint(out)
    assert ck.layout == "mlx"


def test_nvfp4_global_scale_from_converter(tmp_path):
    import workbench
    from mlx_lm.utils import quantize_model, save_config, save_model

    hf = zoo.build("gemma4_moe", tmp_path / "hf", layout="hf")
    model, config = load_model(hf, lazy=True)
    model, config = quantize_model(model, config, 16, 4, mode="nvfp4", global_scale=True)
    out = tmp_path / "mlx"
    save_model(out, model)
    save_config(config, out / "config.json")
    load_model(out, strict=True)
    r = workbench.inspect(out, values=True, progress=False)
    assert r.ok and not r.problems, [p.message for p in r.problems]
    ck = open_checkpoint(out)
    assert ck.info("layers.0.experts.switch_glu.gate_proj.global_scale").shape == (4,)
    # without the tensor the config's request is unmet
    cfg = json.loads((out / "config.json").read_text())
    raw = (out / "model.safetensors").read_bytes()
    old = b'"model.layers.0.experts.switch_glu.up_proj.global_scale"'
    (out / "model.safetensors").write_bytes(raw.replace(old, b'"model.layers.0.experts.switch_glu.up_proj.global_scalx"'))
    r = workbench.inspect(out)
    assert ("quantization-mismatch", "model.layers.0.experts.switch_glu.up_proj.weight") in \
        {(p.code, p.tensor) for p in r.problems}
    assert cfg["quantization"]["model.layers.0.experts.switch_glu.up_proj"]["global_scale"] is True


def test_rebuild_leaves_no_stale_shards(tmp_path):
    zoo.build("llama", tmp_path / "x", shards=3)
    p = zoo.build("llama", tmp_path / "x")
    assert sorted(f.name for f in p.glob("*.safetensors")) == ["model.safetensors"]
    assert not (p / "model.safetensors.index.json").exists()
    assert not open_checkpoint(p).problems
