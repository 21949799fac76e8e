"""Write the 4-bit affine quantized copy of the demo model (``assets/demo-4bit``).

Uses mlx-lm's own ``quantize_model`` (the same code path as ``mlx_lm.convert -q``), so the
checkpoint has the standard MLX quantized layout: ``<module>.weight`` (packed uint32),
``<module>.scales`` and ``<module>.biases`` (bfloat16), and a ``quantization`` block
(``group_size``, ``bits``, ``mode``) in config.json.  Layers whose input width is not a
multiple of the group size stay in bfloat16, as mlx-lm leaves them.
"""
from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from workbench import fsio

GROUP_SIZE = 32
BITS = 4


def write_4bit(src: Path, out: Path, group_size: int = GROUP_SIZE, bits: int = BITS) -> dict:
    from mlx_lm.utils import quantize_model

    from workbench.demo.loading import load_mlx_lm

    model, cfg = load_mlx_lm(src)
    model, qcfg = quantize_model(model, cfg, group_size=group_size, bits=bits, mode="affine")
    out.mkdir(parents=True, exist_ok=True)
    weights = dict(sorted(tree_flatten(model.parameters())))
    fsio.write_with(out / "model.safetensors", lambda p: mx.save_safetensors(p, weights, metadata={"format": "mlx"}))
    fsio.write_text(out / "config.json", json.dumps(qcfg, indent=2, sort_keys=True) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        fsio.write_bytes(out / f, fsio.read_bytes(src / f, fsio.MAX_CONFIG))
    return qcfg
