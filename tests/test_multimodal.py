"""Gemma 4's vision and audio towers traced at module level through mlx-vlm.

The tiny checkpoint comes from workbench.zoo.multimodal (mlx-vlm's own classes); the
reference numbers are mlx-vlm's own modules called directly (torch's numbers on checkpoints
transformers writes: tests/test_multimodal_torch.py)."""
import wave

import numpy as np
import pytest

import workbench
import mlx.core as mx

pytest.importorskip("mlx_vlm", reason="the multimodal tests need the vlm extra")  # installed by scripts/setup.sh

from workbench.reference import media  # noqa: E402
from workbench.zoo.multimodal import build_gemma4  # noqa: E402

AUDIO_W = "audio_tower.layers.1.feed_forward1.ffw_layer_1.linear.weight"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_gemma4(tmp_path_factory.mktemp("g4mm") / "g4")


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)
    wav = (rng.standard_normal(16000 // 5) * 0.1).astype(np.float32)
    return img, wav


def _reference(path):
    from mlx_vlm.utils import load_model
    from pathlib import Path
    return load_model(Path(path))


def test_towers_and_logits_equal_mlx_vlm(ckpt, inputs):
    img, wav = inputs
    model = workbench.load(ckpt, granularity="module")
    assert model.library == "mlx_vlm"
    t = workbench.trace(model, [5, 6, 7], images=[img], audio=[wav], capture="full")
    t.run()
    ids, extra = media.prepare(model, [5, 6, 7], images=[img], audio=[wav])
    assert ids.shape == (1, 1 + 4 + 1 + 1 + 5 + 1 + 3)
    ref = _reference(ckpt)
    v = ref.vision_tower(extra["pixel_values"])
    assert mx.array_equal(t.value("vision_tower"), v)
    assert mx.array_equal(t.value("embed_vision"), ref.embed_vision(v))
    a, _ = ref.audio_tower(extra["input_features"], ~extra["input_features_mask"].astype(mx.bool_))
    assert mx.array_equal(t.value("audio_tower"), a)
    assert mx.array_equal(t.value("embed_audio"), ref.embed_audio(a))
    assert mx.array_equal(t.logits, ref(ids, **extra).logits)
    names = t.ops
    for prefix in ("vision_tower.encoder.layers.1.", "audio_tower.layers.1.", "embed_vision.", "embed_audio.",
                   "layers.1.self_attn."):
        assert any(n.startswith(prefix) for n in names), prefix
    # the towers run before the language model
    assert names.index("embed_audio") < names.index("layers.0")


def test_files_equal_arrays(ckpt, inputs, tmp_path):
    from PIL import Image
    img, wav = inputs
    Image.fromarray(img).save(tmp_path / "x.png")
    with wave.open(str(tmp_path / "x.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        pcm = np.clip(np.round(wav * 32768), -32768, 32767).astype("<i2")
        w.writeframes(pcm.tobytes())
    model = workbench.load(ckpt, granularity="module")
    ids_a, ex_a = media.prepare(model, [5], images=[img], audio=[pcm.astype(np.float32) / 32768])
    ids_f, ex_f = media.prepare(model, [5], images=[tmp_path / "x.png"], audio=[tmp_path / "x.wav"])
    assert mx.array_equal(ids_a, ids_f)
    for k in ex_a:
        assert mx.array_equal(ex_a[k], ex_f[k]), k


def test_planted_audio_nan_found_at_its_module(tmp_path, inputs):
    img, wav = inputs
    p = build_gemma4(tmp_path / "nan", nan_at=AUDIO_W)
    model = workbench.load(p, granularity="module")
    t = workbench.trace(model, [5, 6], audio=[wav])
    f = t.first_nonfinite()
    assert f is not None
    assert f.op == "audio_tower.layers.1.feed_forward1.ffw_layer_1.linear"
    assert f.cause == "nonfinite-weight"
    assert AUDIO_W in f.detail
    # the text-only forward never touches the audio tower: clean
    assert workbench.trace(model, [5, 6]).first_nonfinite() is None


def test_media_needs_a_module_level_model(ckpt, inputs):
    img, _ = inputs
    op_model = workbench.load(ckpt)  # gemma4: our op program by default
    assert getattr(op_model, "granularity", "op") == "op"
    with pytest.raises(workbench.trace.TraceError, match="granularity='module'"):
        workbench.trace(op_model, [5], images=[img])


def test_bad_media_is_refused(ckpt, tmp_path):
    model = workbench.load(ckpt, granularity="module")
    with pytest.raises(ValueError, match="not a regular file"):
        media.prepare(model, [5], images=[tmp_path])
    with pytest.raises(ValueError, match=r"\[H, W, 3\]"):
        media.prepare(model, [5], images=[np.zeros((4, 4))])
    with pytest.raises(ValueError, match="1-D"):
        media.prepare(model, [5], audio=[np.zeros((2, 4))])
    with wave.open(str(tmp_path / "8k.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\0\0" * 100)
    with pytest.raises(ValueError, match="8000 Hz"):
        media.prepare(model, [5], audio=[tmp_path / "8k.wav"])


def test_missing_extra_names_it(monkeypatch):
    from workbench import registry
    monkeypatch.setattr(registry, "_installed", lambda pkg: pkg != "mlx_vlm")
    with pytest.raises(registry.MissingExtra, match=r"workbench\[vlm\]"):
        registry.reference_for({"model_type": "gemma4", "vision_config": {}, "text_config": {}})


def test_gemma3_image_tower_equals_mlx_vlm(tmp_path):
    from workbench.zoo.multimodal import build_gemma3

    p = build_gemma3(tmp_path / "g3")
    model = workbench.load(p, granularity="module")
    img = np.random.default_rng(1).integers(0, 255, (20, 24, 3), dtype=np.uint8)
    t = workbench.trace(model, [5, 6, 7], images=[img], capture="full")
    t.run()
    ids, extra = media.prepare(model, [5, 6, 7], images=[img])
    assert ids.tolist()[0][:6] == [251, 250, 250, 250, 250, 252]
    ref = _reference(p)
    h, _, _ = ref.vision_tower(extra["pixel_values"].transpose(0, 2, 3, 1), output_hidden_states=True)
    assert mx.array_equal(t.value("vision_tower"), h)
    assert mx.array_equal(t.value("multi_modal_projector"), ref.multi_modal_projector(h))
    assert mx.array_equal(t.logits, model(ids, **extra))
    # mlx-vlm's own call needs a mask with pixels, and with it every layer attends to every
    # position (no causal, no sliding mask): not what the original computes (torch's numbers:
    # tests/test_multimodal_torch.py)
    bad = ref(ids, mask=mx.ones(ids.shape, dtype=mx.int32), **extra).logits[0]
    assert not mx.allclose(t.logits[0], bad, atol=1e-3)
    with pytest.raises(ValueError, match="no audio tower"):
        media.prepare(model, [5], audio=[np.zeros(100, np.float32)])
