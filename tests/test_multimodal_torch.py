"""Multimodal checkpoints as transformers 5 writes them, read by the workbench (mlx-vlm at
module level) and compared with torch's own outputs (tests/data/make_multimodal_refs.py).

Both sides get the same token ids, pixels and audio features (committed with the torch
outputs), so no preprocessing difference enters; Gemma 3's image also goes through the
user's path (``workbench.trace(model, ids, images=[...])``).  Bound: 1e-4 of the largest
|value| of each output, float32."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import workbench
import mlx.core as mx

pytest.importorskip("mlx_vlm", reason="the multimodal tests need the vlm extra")  # installed by scripts/setup.sh

from workbench.checkpoint.reference_config_vlm import normalise_vlm  # noqa: E402
from workbench.reference import media  # noqa: E402

DATA = Path(__file__).parent / "data"
_spec = importlib.util.spec_from_file_location("make_multimodal_refs", DATA / "make_multimodal_refs.py")
refs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(refs)

TOL = 1e-4


def _case(name):
    d = refs.HERE / name
    return d, (lambda k: np.load(d / f"{k}.npy"))


def _close(got, want, what):
    got = np.asarray(got, dtype=np.float32).reshape(np.shape(want))
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err <= TOL, f"{what}: max error {err:.2e} of max |value| (bound {TOL:g})"
    return err


@pytest.fixture(scope="module")
def g3(tmp_path_factory):
    d, _ = _case("gemma3")
    return workbench.load(refs.write_checkpoint(tmp_path_factory.mktemp("g3") / "ckpt", d), granularity="module")


@pytest.fixture(scope="module")
def g4(tmp_path_factory):
    d, _ = _case("gemma4")
    return workbench.load(refs.write_checkpoint(tmp_path_factory.mktemp("g4") / "ckpt", d), granularity="module")


def test_committed_data_is_small():
    size = sum(f.stat().st_size for f in refs.HERE.rglob("*") if f.is_file())
    assert size < 400_000, size


def test_gemma3_image_equals_torch(g3):
    _, ld = _case("gemma3")
    assert g3.library == "mlx_vlm"
    ids = ld("in_input_ids")
    text = ids[0, 6:].tolist()
    # the user's path: the image through the processor, placeholders before the text
    t = workbench.trace(g3, text, images=[ld("in_image")], capture="full")
    t.run()
    assert np.array_equal(np.array(t.ids), ids)
    _, extra = media.prepare(g3, text, images=[ld("in_image")])
    np.testing.assert_allclose(np.array(extra["pixel_values"]), ld("in_pixel_values"), atol=1e-6)
    _close(t.value("vision_tower"), ld("out_vision_tower"), "vision_tower")
    _close(t.value("multi_modal_projector"), ld("out_multi_modal_projector"), "multi_modal_projector")
    _close(t.logits, ld("out_logits")[0], "logits with an image")
    # the same forward called directly, on the committed pixels
    _close(g3(mx.array(ids), pixel_values=mx.array(ld("in_pixel_values"))), ld("out_logits"), "logits (call)")
    _close(g3(mx.array([refs.TEXT])), ld("out_logits_text"), "text-only logits")
    # the language model's steps are recorded as in a text-only trace
    for name in ("layers.0", "layers.1.self_attn", "language_model", "logits"):
        assert name in t.ops, name


def test_gemma3_image_tokens_attend_within_their_image_only(g3):
    """The masks of transformers' Gemma 3: text causal, an image bidirectional within itself,
    sliding layers within the window; a token before an image never sees it."""
    from workbench.reference.gemma3_vlm import masks

    ids = np.array([[5, 250, 250, 250, 6, 250, 250, 7, 8, 9]])
    full, sliding = (np.array(m)[0, 0] for m in masks(ids, 250, 2))
    assert full[1, 3] and full[3, 1] and not full[2, 5] and full[5, 2] and not full[0, 1] and full[6, 5]
    # (the window bounds the past only: k > q - window)
    assert sliding[1, 3] and not sliding[3, 1] and not sliding[5, 2] and sliding[9, 8] and not sliding[9, 7]
    assert sliding[5, 6] and not full[4, 5]


def test_gemma4_image_and_audio_equal_torch(g4):
    _, ld = _case("gemma4")
    module, _ = g4.module()
    pv, pos = mx.array(ld("in_pixel_values")), mx.array(ld("in_image_position_ids"))
    feats, fmask = mx.array(ld("in_input_features")), mx.array(ld("in_input_features_mask"))
    v = module.vision_tower(pv, pos)
    _close(v, ld("out_vision_tower"), "vision_tower")
    _close(module.embed_vision(v), ld("out_embed_vision"), "embed_vision")
    a, amask = module.audio_tower(feats, ~fmask)
    a = np.array(a)[~np.array(amask)]
    _close(a, ld("out_audio_tower"), "audio_tower")
    _close(module.embed_audio(mx.array(a)), ld("out_embed_audio"), "embed_audio")
    ids = mx.array(ld("in_input_ids"))
    extra = dict(pixel_values=pv, image_position_ids=pos, input_features=feats, input_features_mask=fmask)
    _close(g4(ids, **extra), ld("out_logits"), "logits with an image and an audio clip")
    _close(g4(mx.array([refs.TEXT])), ld("out_logits_text"), "text-only logits")
    # a module-level trace records the towers, on the same inputs
    from workbench.reference.model import Session
    from workbench.trace.modules import ModuleTrace
    t = ModuleTrace(Session(g4, ids, g4.default_dtype, None, extra), capture="full", model=g4, batched=False,
                    ids=ids, attention_mask=None)
    t.run()
    _close(t.logits, ld("out_logits")[0], "traced logits")
    _close(t.value("embed_vision"), ld("out_embed_vision"), "traced embed_vision")


def test_gemma4_audio_features_equal_transformers(g4):
    """Our processor's audio features (mlx-vlm's extractor) against transformers' on the same waveform."""
    _, ld = _case("gemma4")
    _, extra = media.prepare(g4, [5], audio=[ld("in_waveform")])
    want = ld("in_input_features")
    got = np.array(extra["input_features"])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-4 * np.abs(want).max())
    assert np.array_equal(np.array(extra["input_features_mask"]), ld("in_input_features_mask"))


# ---------------------------------------------------------------------- the config as mlx-vlm reads it

def _config(name):
    return json.loads((refs.HERE / name / "config.json").read_text())


def test_transformers_config_forms_become_mlx_vlm_fields():
    c4 = normalise_vlm(_config("gemma4"), "gemma4")
    assert c4["eoa_token_id"] == 255 and c4["text_config"]["global_head_dim"] == 32
    assert c4["text_config"]["final_logit_softcapping"] == 30.0 and c4["text_config"]["use_double_wide_mlp"] is False
    c3 = normalise_vlm(_config("gemma3"), "gemma3")
    tc = c3["text_config"]
    assert tc["sliding_window_pattern"] == 2 and tc["mm_tokens_per_image"] == 4
    assert (tc["rope_global_base_freq"], tc["rope_local_base_freq"]) == (100000.0, 5000.0)
    assert tc["rope_scaling"]["rope_type"] == "linear" and tc["rope_scaling"]["factor"] == 8.0
    raw = _config("gemma4")
    normalise_vlm(raw, "gemma4")
    assert "global_head_dim" not in raw["text_config"]  # (a copy)
    # absent keys take transformers' defaults, not mlx-vlm's
    bare = _config("gemma4")
    del bare["text_config"]["final_logit_softcapping"], bare["text_config"]["num_kv_shared_layers"]
    b = normalise_vlm(bare, "gemma4")["text_config"]
    assert b["final_logit_softcapping"] is None and b["num_kv_shared_layers"] == 0


@pytest.mark.parametrize("family, edit, key", [
    ("gemma3", lambda c: c["text_config"].update(attn_logit_softcapping=50.0), "text_config.attn_logit_softcapping"),
    ("gemma3", lambda c: c["text_config"].update(layer_types=["full_attention", "sliding_attention"]),
     "text_config.layer_types"),
    ("gemma3", lambda c: c["text_config"]["rope_parameters"]["sliding_attention"].update(rope_type="linear", factor=2.0),
     "sliding_attention.rope_type"),
    ("gemma3", lambda c: c["text_config"].update(some_new_switch=3), "text_config.some_new_switch"),
    ("gemma4", lambda c: c["text_config"]["per_layer_config"].update({"0": {"head_dim": 32}}), "sliding layer 0"),
    ("gemma4", lambda c: c["text_config"]["per_layer_config"]["1"].update(sliding_window=8), "sliding_window"),
    ("gemma4", lambda c: c.update(eoa_token_id=254), "eoa_token_id"),
    ("gemma4", lambda c: c["text_config"].update(use_bidirectional_attention="all"),
     "text_config.use_bidirectional_attention"),
    ("gemma4", lambda c: c["audio_config"].update(hidden_act="gelu"), "audio_config.hidden_act"),
])
def test_what_mlx_vlm_would_get_wrong_is_refused_in_one_line(family, edit, key, tmp_path):
    c = _config(family)
    edit(c)
    with pytest.raises(ValueError, match=key.replace(".", r"\.").replace("[", r"\[")) as e:
        normalise_vlm(c, family)
    assert "\n" not in str(e.value)
    # and loading such a checkpoint says the same, in one line
    d, _ = _case(family)
    p = refs.write_checkpoint(tmp_path / "ckpt", d)
    (p / "config.json").write_text(json.dumps(c))
    with pytest.raises(ValueError) as e:
        workbench.load(p, granularity="module")
    assert "\n" not in str(e.value) and key.split(".")[-1].split(" ")[-1] in str(e.value)
