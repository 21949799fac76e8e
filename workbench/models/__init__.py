"""Model programs: one file per family, and :func:`load`.

``workbench.load(path, dtype=None)`` opens a checkpoint with the reader
(:mod:`workbench.checkpoint`), picks the family from ``model_type`` and builds the op
program over the checkpoint's tensors.  See docs/ops.md for every op name.
"""
from __future__ import annotations

import os

from workbench.models import gemma3_text, gemma4_text, llama, qwen3
from workbench.dtypes import parse_dtype
from workbench.models.builder import Builder  # noqa: F401  (re-exported)
from workbench.models.feeds import KVCache  # noqa: F401  (re-exported)
from workbench.models.model import Model

FAMILIES = {m.FAMILY: m for m in (llama, qwen3, gemma3_text, gemma4_text)}
_BY_MODEL_TYPE = {t: m for m in FAMILIES.values() for t in m.MODEL_TYPES}


def family_of(model_type: str):
    try:
        return _BY_MODEL_TYPE[model_type]
    except KeyError:
        raise ValueError(f"unsupported model_type {model_type!r} (supported: {', '.join(sorted(_BY_MODEL_TYPE))})") from None


GRANULARITIES = ("auto", "op", "module")


def load(path, dtype=None, granularity: str = "auto", library: str | None = None):
    """Open a checkpoint directory (or an already opened reader) as a runnable model.

    dtype: None keeps the storage dtype as compute dtype; "float32" | "bfloat16" |
    "float16" computes in that dtype whatever the storage dtype.
    granularity: "op" (our op program: every matmul, norm, softmax ... is a step),
    "module" (the reference implementation's own modules, recorded: any architecture
    mlx-lm or mlx-vlm builds), or "auto" (op where a program exists, else module).
    library: "mlx_lm" | "mlx_vlm" forces the reference used at module granularity.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {', '.join(GRANULARITIES)}, not {granularity!r}")
    if isinstance(path, (str, os.PathLike)):
        from workbench.checkpoint import open_checkpoint
        ck = open_checkpoint(path)
    else:
        ck = path
    from workbench import registry
    if granularity == "module" or (granularity == "auto" and (
            registry.op_family(ck.config) is None or library is not None)):
        from workbench.reference import open_reference
        model = open_reference(path if isinstance(path, (str, os.PathLike)) else ck.root, ck, library)
        dt = parse_dtype(dtype)
        if dt is not None:
            model.default_dtype = dt
        return model
    mod = family_of(ck.model_type)
    text_config = dict(ck.text_config)
    cfg = mod.Config.from_checkpoint(ck)  # config read (arch.KEYS) and every tensor shape checked
    names = list(ck.lm_names())
    b = Builder(ck, names)
    program = mod.build(cfg, b)
    tok = None
    tok_path = getattr(ck, "tokenizer_path", None)
    if tok_path and os.path.exists(tok_path):
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(tok_path))
    model = Model(mod.FAMILY, cfg, text_config, ck, program, names, tokenizer=tok,
                  windows=mod.windows(cfg), path=str(path) if isinstance(path, (str, os.PathLike)) else None)
    dt = parse_dtype(dtype)
    if dt is not None:
        model.default_dtype = dt
    return model


__all__ = ["load", "Model", "KVCache", "FAMILIES", "family_of"]
