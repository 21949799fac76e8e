"""Images and audio for a multimodal reference model, preprocessed by the model's own
processor (mlx-vlm's), offline.

    ids, extra = prepare(model, "what is this?", images=["cat.png"], audio=[waveform])

Images: arrays ([H, W, 3] uint8, or float in [0, 1]) or PNG / JPEG paths.  Audio: 1-D
float waveforms at the feature extractor's sampling rate (16 kHz for Gemma 4), or WAV
paths (PCM 16-bit or 32-bit float, mono or the first channel).  The placeholder tokens
go first, as the model's chat template puts them: for each image ``boi, image × n,
eoi``, for each clip ``boa, audio × m, eoa``, then the text.

Supported families: Gemma 4 (vision and audio).  Another family is refused by name.
"""
from __future__ import annotations

import json
import math
import os
import wave
import warnings
from pathlib import Path
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

MAX_MEDIA_BYTES = 256 * 2**20


def _processor_config(root: Path) -> dict:
    for name in ("processor_config.json", "preprocessor_config.json"):
        p = root / name
        if p.is_file():
            if p.stat().st_size > 1_000_000:
                raise ValueError(f"{p}: larger than 1 MB")
            d = json.loads(p.read_text())
            if isinstance(d, dict):
                return d.get("image_processor", d) if isinstance(d.get("image_processor"), dict) else d
    return {}


def _regular(path) -> Path:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: not a regular file")
    if p.stat().st_size > MAX_MEDIA_BYTES:
        raise ValueError(f"{p}: larger than {MAX_MEDIA_BYTES // 2**20} MB")
    return p


def load_image(x) -> np.ndarray:
    """[H, W, 3] uint8 from an array or a PNG / JPEG file."""
    if isinstance(x, (str, os.PathLike)):
        from PIL import Image
        with Image.open(_regular(x)) as im:
            return np.asarray(im.convert("RGB"))
    a = np.asarray(x)
    if a.ndim != 3 or a.shape[-1] not in (1, 3, 4):
        raise ValueError(f"an image is [H, W, 3] (channels last), got shape {a.shape}")
    if a.dtype != np.uint8:
        if not np.all(np.isfinite(a)):
            raise ValueError("image values must be finite")
        a = (np.clip(a.astype(np.float64), 0, 1) * 255).round().astype(np.uint8)
    if a.shape[-1] == 1:
        a = np.repeat(a, 3, axis=-1)
    return a[..., :3]


def load_audio(x, rate: int) -> np.ndarray:
    """1-D float32 waveform from an array or a WAV file at ``rate`` Hz."""
    if isinstance(x, (str, os.PathLike)):
        p = _regular(x)
        with wave.open(str(p), "rb") as w:
            sr, ch, width, n = w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()
            data = w.readframes(n)
        if sr != rate:
            raise ValueError(f"{p}: sampled at {sr} Hz, the model's feature extractor wants {rate} Hz")
        if width == 2:
            a = np.frombuffer(data, "<i2").astype(np.float32) / 32768.0
        elif width == 4:
            a = np.frombuffer(data, "<i4").astype(np.float32) / 2**31
        else:
            raise ValueError(f"{p}: {8 * width}-bit WAV is not supported (16 or 32-bit PCM)")
        return a.reshape(-1, ch)[:, 0]
    a = np.asarray(x, dtype=np.float32)
    if a.ndim != 1:
        raise ValueError(f"a waveform is 1-D, got shape {a.shape}")
    return a


def _int_cfg(cfg, key, default):
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"config.json: {key!r} must be a positive integer, got {v!r}")
    return v


def _tok(cfg: dict, key: str) -> int:
    """A placeholder token id, under either of its names (``x_token_id`` / ``x_token_index``)."""
    other = key[: -len("_id")] + "_index" if key.endswith("_id") else key[: -len("_index")] + "_id"
    v = cfg.get(key, cfg.get(other))
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"config.json: {key} (or {other}) must be a token id, got {v!r}")
    return v


def prepare(model, text_ids: Sequence[int], images=(), audio=()) -> tuple[mx.array, dict[str, Any]]:
    """(input_ids [1, T], keyword inputs of the reference forward) for one prompt."""
    cfg = getattr(model, "vlm_config", None) or model.full_config  # (token ids under mlx-vlm's names)
    if model.family == "gemma3":
        if audio:
            raise ValueError("Gemma 3 has no audio tower")
        return _gemma3(model, cfg, text_ids, images)
    if model.family != "gemma4":
        raise ValueError(f"images and audio are supported for gemma4 and gemma3 checkpoints, not {model.family!r}")
    root = Path(model.checkpoint.root)
    proc = _processor_config(root)
    vc, ac = cfg.get("vision_config") or {}, cfg.get("audio_config")
    prefix: list[int] = []
    extra: dict[str, Any] = {}
    if images:
        from mlx_vlm.models.gemma4.processing_gemma4 import Gemma4ImageProcessor
        ip = Gemma4ImageProcessor(
            patch_size=_int_cfg(proc, "patch_size", vc.get("patch_size", 16)),
            max_soft_tokens=_int_cfg(proc, "max_soft_tokens", cfg.get("vision_soft_tokens_per_image", 280)),
            pooling_kernel_size=_int_cfg(proc, "pooling_kernel_size", vc.get("pooling_kernel_size", 3)))
        data, counts = ip([load_image(x) for x in images])
        pv = data["pixel_values"]
        if isinstance(pv, list):
            raise ValueError("images of different aspect ratios: trace them one at a time")
        extra["pixel_values"] = mx.array(pv)
        for n in counts:
            prefix += [_tok(cfg, "boi_token_id")] + [_tok(cfg, "image_token_id")] * n + [_tok(cfg, "eoi_token_id")]
    if audio:
        if not isinstance(ac, dict):
            raise ValueError("this checkpoint has no audio tower (config.json has no audio_config)")
        from mlx_vlm.models.gemma4.audio_feature_extractor import Gemma4AudioFeatureExtractor
        with warnings.catch_warnings():  # transformers' note on mel filters with no frequency bin
            warnings.simplefilter("ignore")
            fe = Gemma4AudioFeatureExtractor()
            waves = [load_audio(x, fe.sampling_rate) for x in audio]
            feats = fe(waves, return_attention_mask=True)
        ms = _int_cfg(cfg, "audio_ms_per_token", 40)
        cap = _int_cfg(proc, "audio_seq_length", 750)
        extra["input_features"] = mx.array(np.stack(feats["input_features"]))
        extra["input_features_mask"] = mx.array(np.stack(feats["input_features_mask"]))
        for w in waves:
            n = min(math.ceil(1000 * len(w) / fe.sampling_rate / ms), cap)
            prefix += [_tok(cfg, "boa_token_id")] + [_tok(cfg, "audio_token_id")] * n + [_tok(cfg, "eoa_token_id")]
    ids = mx.array([prefix + list(text_ids)], dtype=mx.int32)
    return ids, extra


def _gemma3(model, cfg: dict, text_ids: Sequence[int], images) -> tuple[mx.array, dict[str, Any]]:
    """Gemma 3: SigLIP at ``vision_config.image_size`` (transformers' Gemma 3 image processor,
    its PIL backend: resize, rescale, normalise to [-1, 1]), ``mm_tokens_per_image`` image
    tokens each between boi and eoi (the forward: workbench/reference/gemma3_vlm.py)."""
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()  # "PyTorch was not found": we need none of it here
    from transformers import Gemma3ImageProcessorPil

    vc, tc = cfg.get("vision_config") or {}, cfg.get("text_config") or {}
    size = _int_cfg(vc, "image_size", 896)
    n = _int_cfg(tc, "mm_tokens_per_image", cfg.get("mm_tokens_per_image", 256))
    prefix: list[int] = []
    extra: dict[str, Any] = {}
    if images:
        ip = Gemma3ImageProcessorPil(size={"height": size, "width": size})
        extra["pixel_values"] = mx.array(ip([load_image(x) for x in images], return_tensors="np")["pixel_values"])
        for _ in images:
            prefix += [_tok(cfg, "boi_token_index")] + [_tok(cfg, "image_token_index")] * n + [_tok(cfg, "eoi_token_index")]
    else:
        extra["pixel_values"] = None
    ids = mx.array([prefix + list(text_ids)], dtype=mx.int32)
    return ids, extra
