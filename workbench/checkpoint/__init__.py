"""Checkpoint reading (header-only, lazy tensor access), name layouts, architecture knowledge,
quantization and inspection.

    from workbench.checkpoint import open_checkpoint, CheckpointError
    ck = open_checkpoint(path)
    ck.lm_names(); ck.info(name); ck.load(name); ck.quant_of("layers.3.self_attn.q_proj")

    import workbench
    report = workbench.inspect(path, values=False)   # see workbench.checkpoint.inspect
"""
from workbench.checkpoint.quant import QuantSpec
from workbench.checkpoint.reader import Checkpoint, CheckpointError, Problem, TensorInfo, open_checkpoint

__all__ = ["open_checkpoint", "Checkpoint", "CheckpointError", "TensorInfo", "QuantSpec", "Problem"]

# The inspector is the submodule ``workbench.checkpoint.inspect`` (``inspect()``, ``Report``,
# ``diff()``); ``workbench.inspect(path, values=False)`` is its entry point. Its parts:
# checks.py (config against tensors), value_scan.py (``values=True``, statistics from
# values.py, whose native kernels values_native.py builds from values_native.c), render.py (text),
# compare.py (diff).
