"""Multimodal checkpoints exactly as transformers 5 writes them, with torch's outputs.

For every case of :data:`CASES` (a transformers ``*ForConditionalGeneration`` with tiny
text, vision and audio configs), this script

1. ``save_pretrained``s a randomly initialised model of the config: config.json is
   exactly what transformers writes (``*_token_index`` keys, ``per_layer_config``,
   ``rope_parameters`` per layer type, its defaults spelled out), the safetensors names
   and shapes are its own;
2. replaces every stored tensor with :func:`tensor_values` (a numpy generator seeded by the
   tensor's name: the tests rebuild the file bit for bit from ``tensors.json``); the
   audio tower's clipping bounds (infinite when initialised) become finite, so that they
   clip;
3. loads that file back with ``from_pretrained`` (float32, eager attention; any missing or
   unexpected tensor stops the script) and runs it on fixed inputs: token ids with the
   image / audio placeholders, the image as the model's vision tower takes it (Gemma 3:
   ``[1, 3, H, W]`` pixels; Gemma 4: patches and their positions), the audio as
   transformers' feature extractor makes it from a fixed waveform.

Committed per case, in tests/data/multimodal/<case>/: config.json, tensors.json (name ->
[shape, dtype, base]), the inputs (``in_*.npy``) and torch's outputs (``out_*.npy``:
logits and each tower's output). torch is never a dependency of the project:

    pip install --target /tmp/torchlib torch==2.13.0
    PYTHONPATH=/tmp/torchlib .venv/bin/python tests/data/make_multimodal_refs.py [CASE ...]
"""
from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent / "multimodal"
TEXT = [3, 17, 42, 7, 99, 5, 200, 31]  # after the media; longer than the sliding windows (4)

#: a clipping bound transformers initialises to +-inf becomes this (so that it clips)
CLIP = 2.0

_TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=512,
             sliding_window=4, layer_types=["sliding_attention", "full_attention"])

#: case -> (config class, its keyword arguments, model class)
CASES: dict[str, tuple[str, dict, str]] = {
    # Gemma 3 4B's layout: SigLIP, the pooling projector, linear RoPE x8 on the full layers
    "gemma3": ("Gemma3Config", dict(
        text_config=dict(_TEXT, query_pre_attn_scalar=24,
                         rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                             "rope_theta": 100000.0},
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0}}),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           patch_size=4, image_size=16),
        mm_tokens_per_image=4, image_token_index=250, boi_token_index=251, eoi_token_index=252),
        "Gemma3ForConditionalGeneration"),
    # Gemma 4 with both towers: PLE, a larger head on the full layers, logit softcapping,
    # the audio tower's clipped linears
    "gemma4": ("Gemma4Config", dict(
        text_config=dict(_TEXT, global_head_dim=32, hidden_size_per_layer_input=8, vocab_size_per_layer_input=256,
                         num_kv_shared_layers=0, final_logit_softcapping=30.0),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=2, head_dim=16, patch_size=4, pooling_kernel_size=2,
                           position_embedding_size=64),
        audio_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          subsampling_conv_channels=[128, 4], output_proj_dims=32, conv_kernel_size=5),
        image_token_id=250, audio_token_id=251, boi_token_id=252, eoi_token_id=253, boa_token_id=254,
        eoa_token_index=255, video_token_id=249),
        "Gemma4ForConditionalGeneration"),
}


def tensor_values(name: str, shape, base: float) -> np.ndarray:
    """The float32 value of a stored tensor, from its name alone: matrices ~ N(0, 1/in),
    vectors and scalars ``base`` + N(0, 0.1^2)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    v = np.asarray(rng.standard_normal(tuple(shape), dtype=np.float32))
    if len(shape) >= 2:
        return v / np.float32(np.sqrt(np.prod(shape[1:])))
    return np.asarray(np.float32(base) + np.float32(0.1) * v, dtype=np.float32)


def write_checkpoint(dest: Path, case_dir: Path) -> Path:
    """Rebuild a case's checkpoint (config.json + model.safetensors) in ``dest``."""
    from safetensors.numpy import save_file

    dest.mkdir(parents=True, exist_ok=True)
    spec = json.loads((case_dir / "tensors.json").read_text())
    tensors = {name: tensor_values(name, shape, base).astype(dtype) for name, (shape, dtype, base) in spec.items()}
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(case_dir / "config.json", dest / "config.json")
    return dest


def inputs(case: str, config: dict) -> dict[str, np.ndarray]:
    """The fixed inputs of a case (numpy), placeholders first as the chat templates put them."""
    rng = np.random.default_rng(7)
    if case == "gemma3":
        n = config["mm_tokens_per_image"]
        size = config["vision_config"]["image_size"]
        img = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        pixels = (img.astype(np.float32) / 255 - 0.5) / 0.5  # (the processor's rescale and normalise)
        ids = [config["boi_token_index"]] + [config["image_token_index"]] * n + [config["eoi_token_index"]] + TEXT
        return {"input_ids": np.array([ids], np.int64), "image": img,
                "pixel_values": pixels.transpose(2, 0, 1)[None].copy()}
    vc = config["vision_config"]
    p, k = vc["patch_size"], vc["pooling_kernel_size"]
    img = rng.integers(0, 256, (4 * p * k // 2, 4 * p * k // 2 * 2, 3), dtype=np.uint8)  # 16 x 32: 8 tokens
    x = img.astype(np.float32) / 255  # Gemma 4: rescaled, not normalised
    hp, wp = x.shape[0] // p, x.shape[1] // p
    patches = x.reshape(hp, p, wp, p, 3).transpose(0, 2, 1, 3, 4).reshape(hp * wp, p * p * 3)
    gx, gy = np.meshgrid(np.arange(wp), np.arange(hp), indexing="xy")
    pos = np.stack([gx.ravel(), gy.ravel()], -1)
    wav = (rng.standard_normal(16000 // 4) * 0.1).astype(np.float32)  # 0.25 s
    return {"image": img, "pixel_values": patches[None], "image_position_ids": pos[None].astype(np.int64),
            "waveform": wav}


def build(case: str) -> None:
    import torch
    import transformers
    from safetensors import safe_open

    cfg_cls, kw, model_cls = CASES[case]
    d = HERE / case
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_cls)(**kw)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = getattr(transformers, model_cls)(cfg)
        model.save_pretrained(tmp / "init")
        spec = {}
        with safe_open(str(tmp / "init" / "model.safetensors"), "numpy") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                base = 0.0
                if t.ndim < 2:
                    m = float(t.astype(np.float64).mean())
                    base = math.copysign(CLIP, m) if math.isinf(m) else float(np.round(m, 3))
                spec[name] = [list(t.shape), str(t.dtype), base]
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tmp / "init" / "config.json", d / "config.json")
        (d / "tensors.json").write_text(json.dumps(spec, indent=0))
        config = json.loads((d / "config.json").read_text())
        write_checkpoint(tmp / "ckpt", d)
        model, info = getattr(transformers, model_cls).from_pretrained(
            tmp / "ckpt", dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise RuntimeError(f"{case}: {bad}")
    model.eval()
    x = inputs(case, config)
    outs: dict[str, np.ndarray] = {}
    with torch.no_grad():
        if case == "gemma3":
            ids = torch.tensor(x["input_ids"])
            pv = torch.tensor(x["pixel_values"])
            vt = model.model.vision_tower(pixel_values=pv).last_hidden_state
            outs["vision_tower"] = vt
            outs["multi_modal_projector"] = model.model.multi_modal_projector(vt)
            tt = (ids == config["image_token_index"]).long()
            outs["logits"] = model(input_ids=ids, pixel_values=pv, token_type_ids=tt).logits
            outs["logits_text"] = model(input_ids=torch.tensor([TEXT])).logits
        else:
            fe = transformers.Gemma4AudioFeatureExtractor()
            feats = fe([x["waveform"]], return_tensors="np", return_attention_mask=True)
            x["input_features"] = feats["input_features"].astype(np.float32)
            x["input_features_mask"] = feats["input_features_mask"].astype(bool)
            pv, pos = torch.tensor(x["pixel_values"]), torch.tensor(x["image_position_ids"])
            vt = model.model.vision_tower(pixel_values=pv, pixel_position_ids=pos).last_hidden_state
            outs["vision_tower"], outs["embed_vision"] = vt, model.model.embed_vision(inputs_embeds=vt)
            af, am = torch.tensor(x["input_features"]), torch.tensor(x["input_features_mask"])
            a = model.model.audio_tower(af, am)
            at = a.last_hidden_state[a.attention_mask]
            outs["audio_tower"], outs["embed_audio"] = at, model.model.embed_audio(inputs_embeds=at)
            n_img, n_aud = vt.shape[0], at.shape[0]
            ids = ([config["boi_token_id"]] + [config["image_token_id"]] * n_img + [config["eoi_token_id"]]
                   + [config["boa_token_id"]] + [config["audio_token_id"]] * n_aud + [config["eoa_token_index"]]
                   + TEXT)
            x["input_ids"] = np.array([ids], np.int64)
            outs["logits"] = model(input_ids=torch.tensor(x["input_ids"]), pixel_values=pv, image_position_ids=pos,
                                   input_features=af, input_features_mask=am).logits
            outs["logits_text"] = model(input_ids=torch.tensor([TEXT])).logits
    for k in list(d.glob("in_*.npy")) + list(d.glob("out_*.npy")):
        k.unlink()
    for k, v in x.items():
        np.save(d / f"in_{k}.npy", v)
    for k, v in outs.items():
        v = v.float().numpy()
        if not np.isfinite(v).all():
            raise RuntimeError(f"{case}: non-finite {k}")
        np.save(d / f"out_{k}.npy", v.astype(np.float32))
    size = sum(f.stat().st_size for f in d.iterdir())
    print(f"{case}: {len(spec)} tensors, {len(x['input_ids'][0])} tokens, "
          + ", ".join(f"{k} {tuple(v.shape)}" for k, v in outs.items()) + f"; {size / 1024:.0f} KiB", flush=True)


def main(argv) -> None:
    failed = []
    for case in argv or list(CASES):
        try:
            build(case)
        except Exception as e:  # report every case, then fail
            failed.append(case)
            print(f"{case}: FAILED {type(e).__name__}: {' '.join(str(e).split())[:600]}", flush=True)
    if failed:
        sys.exit(f"failed: {' '.join(failed)}")


if __name__ == "__main__":
    main(sys.argv[1:])
