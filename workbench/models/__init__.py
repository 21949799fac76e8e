"""Model programs: one file per family, and :func:`load`.

``workbench.load(path, dtype=None)`` opens a checkpoint with the reader
(:mod:`workbench.checkpoint`), picks the family from ``model_type`` and builds the op
program over the checkpoint's tensors.  See docs/ops.md for every op name.
"""
from __future__ import annotations

import os

from workbench.models import gemma3_text, gemma4_text, llama, qwen3
from workbench.dtypes import parse_dtype
from workbench.models.attention import Programs
from workbench.models.builder import Builder  # noqa: F401  (re-exported)
from workbench.models.feeds import KVCache  # noqa: F401  (re-exported)
from workbench.models.model import Model
from workbench.models.streaming import StreamedModel
from workbench.sizes import parse_bytes

FAMILIES = {m.FAMILY: m for m in (llama, qwen3, gemma3_text, gemma4_text)}
_BY_MODEL_TYPE = {t: m for m in FAMILIES.values() for t in m.MODEL_TYPES}


def family_of(model_type: str):
    try:
        return _BY_MODEL_TYPE[model_type]
    except KeyError:
        raise ValueError(f"unsupported model_type {model_type!r} (supported: {', '.join(sorted(_BY_MODEL_TYPE))})") from None


GRANULARITIES = ("auto", "op", "module")


def load(path, dtype=None, granularity: str = "auto", library: str | None = None, attention="fused",
         memory_budget=None, progress=None):
    """Open a checkpoint directory (or an already opened reader) as a runnable model.

    dtype: None keeps the storage dtype as compute dtype; "float32" | "bfloat16" |
    "float16" computes in that dtype whatever the storage dtype.
    granularity: "op" (our op program: every matmul, norm, softmax ... is a step),
    "module" (the reference implementation's own modules, recorded: any architecture
    mlx-lm or mlx-vlm builds), or "auto" (op where a program exists, else module).
    library: "mlx_lm" | "mlx_vlm" forces the reference used at module granularity.
    attention: "fused" (one op per layer, no [B, H, T, S] scores), "explicit" (scores ->
    softmax -> context steps) or the layers to make explicit (workbench.models.attention).
    memory_budget: bytes (``8 * 2**30``) or a size (``"8GB"``, ``"512 MiB"``): stream the
    weights, one layer at a time, within it (workbench.models.streaming); None holds them.
    progress: a streamed model's progress bar: None (when slow, in a terminal or a
    notebook), True or False.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {', '.join(GRANULARITIES)}, not {granularity!r}")
    if memory_budget is not None:
        memory_budget = parse_bytes(memory_budget, "memory_budget")
    if progress is not None and not isinstance(progress, bool):
        raise ValueError(f"progress must be None, True or False, not {progress!r}")
    if isinstance(path, (str, os.PathLike)):
        from workbench.checkpoint import open_checkpoint
        ck = open_checkpoint(path)
    else:
        ck = path
    from workbench import registry
    if granularity == "module" or (granularity == "auto" and (
            registry.op_family(ck.config) is None or library is not None)):
        if memory_budget is not None:
            raise ValueError("memory_budget: streaming runs op programs (llama, qwen3, gemma3_text, "
                             "gemma4_text); a module-level model holds its weights")
        if attention != "fused":
            raise ValueError(f"attention={attention!r}: a module-level model runs its own attention modules "
                             "(fused, no scores step); explicit attention needs an op program")
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
    programs = Programs(lambda explicit, queries: mod.build(cfg, Builder(ck, names, explicit, queries)),
                        cfg.num_hidden_layers)
    program = programs.get(attention)
    tok = None
    tok_path = getattr(ck, "tokenizer_path", None)
    if tok_path and os.path.exists(tok_path):
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(tok_path))
    where = dict(tokenizer=tok, windows=mod.windows(cfg),
                 path=str(path) if isinstance(path, (str, os.PathLike)) else None)
    if memory_budget is None:
        model = Model(mod.FAMILY, cfg, text_config, ck, program, names, **where)
    else:
        model = StreamedModel(mod.FAMILY, cfg, text_config, ck, program, names, memory_budget=memory_budget,
                              progress=progress, **where)
    model.programs = programs
    dt = parse_dtype(dtype)
    if dt is not None:
        model.default_dtype = dt
        if memory_budget is not None:
            model.check_budget()  # (converted weights count too)
    return model


__all__ = ["load", "Model", "StreamedModel", "KVCache", "FAMILIES", "family_of"]
