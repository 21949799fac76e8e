"""Model programs: one file per family, and :func:`load`.

``workbench.load(path, dtype=None)`` opens a checkpoint with the reader
(:mod:`workbench.checkpoint`), picks the family from ``model_type`` and builds the op
program over the checkpoint's tensors.  See docs/ops.md for every op name.  A family's
config and tensor table are the reader's (workbench/checkpoint/families/<family>.py);
its file here holds the op program.  A module-level model (the reference's own modules) is
opened by the floor above, as the top package provides it (workbench/traceable.py).
"""
from __future__ import annotations

import os

from workbench.dtypes import parse_dtype
from workbench.models import gemma3_text, gemma4_text, llama, qwen3
from workbench.models.attention import Programs
from workbench.models.builder import Builder  # noqa: F401  (re-exported)
from workbench.models.feeds import KVCache  # noqa: F401  (re-exported)
from workbench.models.model import Model, check_checkpoint
from workbench.models.streaming import StreamedModel
from workbench.sizes import parse_bytes
from workbench.traceable import provided

#: family name -> its program file (workbench/models/<family>.py; its Config, FAMILY and
#: MODEL_TYPES are the family file's: workbench/checkpoint/families/<family>.py)
FAMILIES = {m.FAMILY: m for m in (llama, qwen3, gemma3_text, gemma4_text)}
_BY_MODEL_TYPE = {t: m for m in FAMILIES.values() for t in m.MODEL_TYPES}


def family_of(model_type: str):
    try:
        return _BY_MODEL_TYPE[model_type]
    except KeyError:
        raise ValueError(f"unsupported model_type {model_type!r} (supported: {', '.join(sorted(_BY_MODEL_TYPE))})") from None


GRANULARITIES = ("auto", "op", "module")
LIBRARIES = ("mlx_lm", "mlx_vlm")


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
    Held weights are checked against the memory available before anything is read: more
    than there is raises :class:`workbench.device_memory.NotEnoughMemory` (a MemoryError
    and a ValueError), naming the bytes, the memory and the ``memory_budget`` that would
    stream them (docs/trace.md, "Models larger than memory").
    progress: a streamed model's progress bar: None (when slow, in a terminal or a
    notebook), True or False.
    """
    return load_model(path, dtype, granularity, library, attention, memory_budget, progress)


def load_model(path, dtype=None, granularity="auto", library=None, attention="fused", memory_budget=None,
          progress=None, preflight=True):
    """:func:`load`; ``preflight=False`` leaves the memory check to the caller (a rank of a
    distributed trace holds only its own layers' weights)."""
    from workbench.checkpoint.reader import Checkpoint

    if isinstance(path, str) and not path.strip():
        raise ValueError("load: path is empty: give a checkpoint directory or file")
    if not isinstance(path, (str, os.PathLike, Checkpoint)):
        raise TypeError("load: path must be a checkpoint directory or file (str or os.PathLike) or an opened "
                        f"Checkpoint, not {type(path).__name__}")
    if not isinstance(granularity, str) or granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {', '.join(GRANULARITIES)}, not {granularity!r}")
    if library is not None and (not isinstance(library, str) or library not in LIBRARIES):
        raise ValueError(f"library must be None, {' or '.join(repr(x) for x in LIBRARIES)}, not {library!r}")
    parse_dtype(dtype)  # (an unknown dtype refused before the checkpoint is opened)
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
        if preflight:
            _preflight_module(ck, path)
        model = provided("module_level")(path if isinstance(path, (str, os.PathLike)) else ck.root, ck, library)
        dt = parse_dtype(dtype)
        if dt is not None:
            model.default_dtype = dt
        return model
    mod = family_of(ck.model_type)
    text_config = dict(ck.text_config)
    check_checkpoint(ck)  # config read (the family's KEYS and read) and every tensor shape checked
    cfg = ck.arch.spec  # the family's Config
    names = list(ck.lm_names())
    programs = Programs(lambda explicit, queries, prune: mod.build(cfg, Builder(ck, names, explicit, queries, prune)),
                        cfg.num_hidden_layers)
    program = programs.get(attention)
    tok = ck.tokenizer()  # (None when there is none or it cannot be read: ck.tokenizer_error says why)
    where = dict(tokenizer=tok, windows=mod.windows(cfg),
                 path=str(path) if isinstance(path, (str, os.PathLike)) else None)
    if memory_budget is None:
        model = Model(mod.FAMILY, cfg, text_config, ck, program, names, **where)
    else:
        model = StreamedModel(mod.FAMILY, cfg, text_config, ck, program, names, memory_budget=memory_budget,
                              progress=progress, **where)
    model.programs = programs
    model.attention = attention  # (load's choice: program_for(None, prune=True) keeps it)
    dt = parse_dtype(dtype)
    if dt is not None:
        model.default_dtype = dt
        if memory_budget is not None:
            model.check_budget()  # (converted weights count too)
    if preflight and memory_budget is None:
        from workbench.models.streaming import preflight as check

        check(model)  # (NotEnoughMemory before any weight is read)
    elif preflight:  # a budget over the memory: what one segment reads at once must still fit
        from workbench.device_memory import check_fits

        seg = model.largest_segment
        check_fits(seg.nbytes, f"{model.path or 'the checkpoint'}: streamed, {seg.label} reads at once",
                   f"no memory budget streams it here (memory_budget {model.memory_budget} bytes was given)")
    return model


def _preflight_module(ck, path) -> None:
    """A module-level model holds every tensor of the checkpoint: refused in one line when
    their bytes are over the memory available."""
    from workbench.device_memory import check_fits

    total = sum(t.nbytes for t in ck.tensors.values())
    where = str(path) if isinstance(path, (str, os.PathLike)) else str(getattr(ck, "root", "the checkpoint"))
    check_fits(total, f"{where}: the weights need",
               "a module-level model holds its weights (streaming runs op programs only)")


__all__ = ["load", "load_model", "LIBRARIES", "Model", "StreamedModel", "KVCache", "FAMILIES", "family_of"]
