"""Load a demo checkpoint: a forward function, its tokenizer, greedy generation.

The demo model loads through ``workbench.load`` -- the same path as any checkpoint --
and generates with ``workbench.generate``.  The reference path (``load_mlx_lm``) builds mlx-lm's own gemma4_text ``Model`` from config.json and loads
model.safetensors into it (quantized layers rebuilt from the config's ``quantization``
block, exactly as ``mlx_lm.utils.load_model`` does).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn

from workbench.errors import UsageError
from workbench.demo.tokenizer import EOS_ID


@dataclass
class Demo:
    path: Path
    config: dict
    tokenizer: Any  # tokenizers.Tokenizer
    forward: Callable[[mx.array], mx.array]  # ids [B, L] -> logits [B, L, V]
    loader: str
    model: Any = None  # the workbench Model (workbench.load)
    _mlx_lm_model: Any = None

    @property
    def mlx_lm_model(self):
        """mlx-lm's gemma4_text Model on the same checkpoint (the reference), computing in
        float32 (exact patterns; MLX's CPU gather_mm for MoE runs float32 only)."""
        if self._mlx_lm_model is None:
            m = load_mlx_lm(self.path)[0]
            m.set_dtype(mx.float32)
            self._mlx_lm_model = m
        return self._mlx_lm_model

    def generate(self, ids: list[int], max_tokens: int, stop_at_eos: bool = True) -> list[int]:
        """Greedy continuation of ``ids`` (without the prompt)."""
        if max_tokens <= 0:
            return []
        if self.model is not None:
            from workbench.trace.generate import generate
            g = generate(self.model, [int(i) for i in ids], max_tokens=max_tokens, capture=None,
                         stop=[EOS_ID] if stop_at_eos else None)
            out = list(g.tokens)
            return out[:out.index(EOS_ID)] if stop_at_eos and EOS_ID in out else out
        seq = mx.array([ids])
        out: list[int] = []
        for _ in range(max_tokens):
            nxt = int(mx.argmax(self.forward(seq)[0, -1]).item())
            if stop_at_eos and nxt == EOS_ID:
                break
            out.append(nxt)
            seq = mx.concatenate([seq, mx.array([[nxt]], dtype=seq.dtype)], axis=1)
        return out


def _read_config(path: Path) -> dict:
    if not path.is_dir():
        raise UsageError(f"{path}: no such checkpoint directory")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise UsageError(f"{cfg_file}: missing (a checkpoint directory needs config.json)")
    try:
        return json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise UsageError(f"{cfg_file}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None


def _read_tokenizer(path: Path):
    from tokenizers import Tokenizer

    f = path / "tokenizer.json"
    if not f.is_file():
        raise UsageError(f"{f}: missing")
    try:
        return Tokenizer.from_file(str(f))
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON
        raise UsageError(f"{f}: cannot be read by tokenizers ({str(e).splitlines()[0]})") from None


def build_model(cfg: dict):
    """mlx-lm's gemma4_text Model of ``cfg`` (random weights)."""
    from mlx_lm.models import gemma4_text
    return gemma4_text.Model(gemma4_text.ModelArgs.from_dict(cfg))


def load_mlx_lm(path: str | Path):
    """mlx-lm's gemma4_text Model with the checkpoint's weights (the reference)."""
    path = Path(path)
    cfg = _read_config(path)
    if cfg.get("model_type") != "gemma4_text":
        raise UsageError(f"{path / 'config.json'}: model_type is {cfg.get('model_type')!r}, the demo loader "
                         "reads gemma4_text")
    wfile = path / "model.safetensors"
    if not wfile.is_file():
        raise UsageError(f"{wfile}: missing")
    try:
        weights = mx.load(str(wfile))
    except Exception as e:
        raise UsageError(f"{wfile}: not a readable safetensors file ({e})") from None
    model = build_model(cfg)
    weights = model.sanitize(weights)
    q = cfg.get("quantization")
    if q:
        def pred(p, m):
            if not hasattr(m, "to_quantized") or f"{p}.scales" not in weights:
                return False
            return q.get(p, True) if isinstance(q.get(p), dict) else True
        nn.quantize(model, group_size=q["group_size"], bits=q["bits"], mode=q.get("mode", "affine"),
                    class_predicate=pred)
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise UsageError(f"{wfile}: does not match config.json ({e})") from None
    mx.eval(model.parameters())
    model.eval()
    return model, cfg


def load_demo(path: str | Path, loader: str = "workbench", dtype: str | None = None) -> Demo:
    """``loader``: "workbench" (``workbench.load``) or "mlx-lm" (the reference).
    ``dtype``: compute dtype ("float32", "bfloat16"; None: the storage dtype)."""
    path = Path(path)
    cfg = _read_config(path)
    tok = _read_tokenizer(path)
    if loader == "mlx-lm":
        model, cfg = load_mlx_lm(path)
        if dtype is not None:
            model.set_dtype(getattr(mx, dtype))
        return Demo(path=path, config=cfg, tokenizer=tok, forward=model, loader="mlx-lm", _mlx_lm_model=model)
    from workbench.models import load
    try:
        model = load(path, dtype=dtype)
    except (ValueError, OSError) as e:
        raise UsageError(f"{path}: {e}") from None
    return Demo(path=path, config=cfg, tokenizer=tok, forward=model, loader="workbench.load", model=model)
