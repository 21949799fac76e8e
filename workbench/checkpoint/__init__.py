"""Checkpoint reading (header-only, lazy mmap), name layouts, architecture knowledge,
quantization and inspection.

    from workbench.checkpoint import open_checkpoint, CheckpointError
    ck = open_checkpoint(path)
    ck.lm_names(); ck.info(name); ck.load(name); ck.quant_of("layers.3.self_attn.q_proj")
"""
from workbench.checkpoint.quant import QuantSpec
from workbench.checkpoint.reader import Checkpoint, CheckpointError, Problem, TensorInfo, open_checkpoint

__all__ = ["open_checkpoint", "Checkpoint", "CheckpointError", "TensorInfo", "QuantSpec", "Problem", "inspect"]


def inspect(path, values: bool = False, **kw):
    """Inspect a checkpoint: returns a Report (``.ok``, ``.problems``, ``.to_dict()``)."""
    from workbench.checkpoint.inspect import inspect as _inspect

    return _inspect(path, values=values, **kw)
