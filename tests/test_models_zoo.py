"""Model programs on the zoo's checkpoints (helper A's writer, not mlx-lm's): every
architecture, float32 / affine 4-bit / mxfp4, both name layouts, against mlx-lm."""
from __future__ import annotations

import pytest

import workbench
import mlx.core as mx

import models_tiny as mt
from workbench import zoo

IDS = mx.array([[2, 17, 99, 4, 250, 31, 8, 8, 120, 64, 3, 77, 200, 5, 9, 11, 42, 1, 6, 13]])


def rel_err(a, b):
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    return mx.abs(a - b).max().item() / mx.abs(b).max().item()


CASES = [(arch, quant, layout, "bfloat16" if quant == "mxfp4" else "float32") for arch in zoo.ARCHS
         for quant, layout in [(None, "mlx"), (None, "hf"), ("affine4", "mlx"), ("mxfp4", "mlx")]]
# MX formats next to float32 tensors: mlx-lm dequantizes those embeddings to bfloat16 and the
# PLE path computes in it; with the storage dtype (dtype=None) the workbench does the same
CASES += [("gemma4_text", q, "mlx", "float32") for q in ("mxfp4", "mxfp8", "nvfp4")]


@pytest.mark.parametrize("arch,quant,layout,dtype", CASES)
def test_zoo_logits_match_mlx_lm(tmp_path, arch, quant, layout, dtype):
    path = zoo.build(arch, tmp_path / arch, quant=quant, layout=layout, dtype=dtype)
    model = workbench.load(path)
    out = model(IDS)
    ref = mt.ref_logits(path, IDS)
    assert out.shape == ref.shape
    assert rel_err(out, ref) <= (1e-4 if quant is None else 1e-3)
    assert mx.isfinite(out).all().item()


def test_tokenizer_from_checkpoint(tmp_path):
    model = workbench.load(zoo.build("gemma4_text", tmp_path / "g4"))
    assert model.tokenizer is not None
    ids = model.encode("hello world")
    assert ids and all(0 <= i < model.vocab_size for i in ids)
    assert "hello" in model.decode(ids)
    logits = model(mx.array([ids]))
    assert logits.shape == (1, len(ids), model.vocab_size)
    no_tok = workbench.load(zoo.build("llama", tmp_path / "ll", tokenizer=False))
    assert no_tok.tokenizer is None
    with pytest.raises(ValueError, match="no tokenizer"):
        no_tok.encode("hello")


def test_load_rejects_unsupported_model_type(tmp_path):
    import json
    path = zoo.build("llama", tmp_path / "ll")
    cfg = json.loads((path / "config.json").read_text())
    cfg["model_type"] = "not_a_model"
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="model_type 'not_a_model' is built neither by mlx-lm nor by mlx-vlm"):
        workbench.load(path)
    # a model type the reference builds, on a checkpoint that is not one: its error, in one line
    cfg["model_type"] = "mamba"
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="mlx-lm's mamba model cannot be built from this checkpoint") as e:
        workbench.load(path)
    assert "\n" not in str(e.value)


def test_missing_tensor_is_named_at_load(tmp_path):
    path = zoo.build("qwen3", tmp_path / "q", broken="missing-tensor")
    with pytest.raises(ValueError, match=r"missing-tensor: model\.layers\.\d+\.self_attn\.q_proj\.weight .* is missing"):
        workbench.load(path)


def test_nonfinite_weights_still_load_and_show_up(tmp_path):
    """NaN hunting needs to run checkpoints with bad values: load must not refuse them."""
    path = zoo.build("gemma4_text", tmp_path / "g", broken="nonfinite-values")
    model = workbench.load(path)
    bad = [op.name for op in model.program if any(
        not mx.isfinite(t).all().item() for t in model.op_tensors(op.name).values()
        if mx.issubdtype(t.dtype, mx.floating))]
    assert bad, "the planted non-finite norm weight is read by some op"
    assert not mx.isfinite(model(IDS)).all().item()
