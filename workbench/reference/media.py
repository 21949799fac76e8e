"""Images and audio for a multimodal reference model, preprocessed by the model's own
processor (mlx-vlm's), offline.

    ids, extra = prepare(model, "what is this?", images=["cat.png"], audio=[waveform])

Images: arrays ([H, W, 3] uint8, or float in [0, 1]) or PNG / JPEG paths.  Audio: 1-D
float waveforms at the feature extractor's sampling rate (16 kHz for Gemma 4), or WAV
paths (16- or 32-bit PCM or 32-bit float, plain or extensible; mono or the first channel).
Every error names the file (or the array) and what is wrong with it.  The placeholder tokens
go first, as the model's chat template puts them: for each image ``boi, image × n,
eoi``, for each clip ``boa, audio × m, eoa``, then the text.

Supported families: Gemma 4 (vision and audio).  Another family is refused by name.
"""
from __future__ import annotations

import json
import math
import os
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
        from PIL import Image, UnidentifiedImageError
        p = _regular(x)
        try:
            with Image.open(p) as im:
                return np.asarray(im.convert("RGB"))
        except (UnidentifiedImageError, OSError, ValueError) as e:
            raise ValueError(f"{p}: not an image PIL can read ({' '.join(str(e).split())[:120]})") from None
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


#: WAV sample formats read: (format tag, bits per sample) -> numpy dtype, scale to [-1, 1)
_WAV_FORMATS = {(1, 16): ("<i2", 1 / 32768.0), (1, 32): ("<i4", 1 / 2**31), (3, 32): ("<f4", 1.0)}
_EXTENSIBLE = 0xFFFE


def read_wav(p: Path) -> tuple[int, np.ndarray]:
    """(sampling rate, first channel as float32) of a RIFF/WAVE file: 16- or 32-bit PCM or
    32-bit IEEE float (plain or WAVE_FORMAT_EXTENSIBLE); anything else, or a file whose
    chunks or samples are cut short, is a ValueError naming the file and what is wrong."""
    data = p.read_bytes()
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError(f"{p}: not a WAV file (no RIFF/WAVE header)")
    fmt = samples = None
    off = 12
    while off + 8 <= len(data):
        cid, size = data[off:off + 4], int.from_bytes(data[off + 4:off + 8], "little")
        body = data[off + 8:off + 8 + size]
        if cid == b"fmt ":
            if len(body) < 16:
                raise ValueError(f"{p}: its fmt chunk is {len(body)} bytes, cut short (16 needed)")
            tag, ch, rate = (int.from_bytes(body[0:2], "little"), int.from_bytes(body[2:4], "little"),
                             int.from_bytes(body[4:8], "little"))
            bits = int.from_bytes(body[14:16], "little")
            if tag == _EXTENSIBLE and len(body) >= 26:
                tag = int.from_bytes(body[24:26], "little")  # the sub-format GUID's first two bytes
            fmt = (tag, ch, rate, bits)
        elif cid == b"data":
            if len(body) < size:
                raise ValueError(f"{p}: truncated: its data chunk says {size} bytes, the file holds {len(body)}")
            samples = body
        off += 8 + size + (size & 1)
    if fmt is None or samples is None:
        raise ValueError(f"{p}: a WAV file needs a fmt and a data chunk; {'fmt' if fmt is None else 'data'} "
                         "is missing")
    tag, ch, rate, bits = fmt
    if (tag, bits) not in _WAV_FORMATS:
        kind = {1: "PCM", 3: "float"}.get(tag, f"format {tag}")
        raise ValueError(f"{p}: {bits}-bit {kind} WAV is not supported (16- or 32-bit PCM, 32-bit float)")
    if ch < 1 or rate < 1:
        raise ValueError(f"{p}: {ch} channels at {rate} Hz: not a waveform")
    dt, scale = _WAV_FORMATS[(tag, bits)]
    frame = ch * bits // 8
    if len(samples) % frame:
        raise ValueError(f"{p}: truncated: {len(samples)} data bytes is not a whole number of "
                         f"{frame}-byte frames")
    a = np.frombuffer(samples, dt).reshape(-1, ch)[:, 0].astype(np.float32) * np.float32(scale)
    return rate, a


def load_audio(x, rate: int) -> np.ndarray:
    """1-D float32 waveform from an array or a WAV file at ``rate`` Hz."""
    if isinstance(x, (str, os.PathLike)):
        p = _regular(x)
        sr, a = read_wav(p)
        if sr != rate:
            raise ValueError(f"{p}: sampled at {sr} Hz, the model's feature extractor wants {rate} Hz")
        where = str(p)
    else:
        a = np.asarray(x, dtype=np.float32)
        where = "a waveform"
        if a.ndim != 1:
            raise ValueError(f"a waveform is 1-D, got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{where}: no samples")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{where}: holds NaN or Inf samples")
    return a


def _name(x) -> str:
    return str(x) if isinstance(x, (str, os.PathLike)) else f"an image of shape {tuple(np.shape(x))}"


def _process(run, images):
    """``run`` (the model's image processor) on the loaded images; its failure (a 1x1 image,
    ...) a ValueError naming the images."""
    arrs = [load_image(x) for x in images]
    try:
        return run(arrs)
    except Exception as e:  # noqa: BLE001 - the processor's own failure, said with the file
        raise ValueError(f"{', '.join(_name(x) for x in images)}: the model's image processor cannot take it "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:120]})") from None


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
        data, counts = _process(lambda arrs: ip(arrs), images)
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
        extra["pixel_values"] = mx.array(_process(lambda arrs: ip(arrs, return_tensors="np"), images)["pixel_values"])
        for _ in images:
            prefix += [_tok(cfg, "boi_token_index")] + [_tok(cfg, "image_token_index")] * n + [_tok(cfg, "eoi_token_index")]
    else:
        extra["pixel_values"] = None
    ids = mx.array([prefix + list(text_ids)], dtype=mx.int32)
    return ids, extra
