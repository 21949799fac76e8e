"""Engine diff: dump our reference's activations, compare an engine's dump, find the first divergence.

>>> ref = workbench.diff.dump("model/", out="ref.safetensors", prompt="Hello")
>>> report = workbench.diff.compare("model/", "engine.npz", prompt="Hello", rules="rules.json")
>>> report.first_divergence, report.ops, report.to_dict()

Without a model: :func:`compare_arrays` over plain mappings of arrays.  Real engines:
``compare(..., engine_adapter="transformers" | "llama.cpp")`` (workbench/diff/engines),
:func:`torch_hooks` to dump a transformers model, :func:`read_eval_callback` for llama.cpp's
eval-callback text.  See docs/diff.md.
"""
from workbench.diff.api import Reference, compare, dump, is_reference_dump, run_reference
from workbench.diff.layout import LayoutError, reconcile
from workbench.diff.metrics import Tolerance, error_metrics
from workbench.diff.naming import RulesError, apply_rules, compile_rules, load_rules
from workbench.diff.readers import DumpError, read_dump, write_dump
from workbench.diff.report import DiffError, DiffReport, OpDiff, compare_arrays
from workbench.diff.weights import WeightDiff, compare_weights, weight_values
from workbench.diff.ggml_text import read_eval_callback
from workbench.diff.torch_hooks import torch_hooks  # (torch is imported when it is called, not here)

__all__ = [
    "compare", "dump", "run_reference", "Reference", "is_reference_dump", "compare_arrays",
    "DiffReport", "OpDiff", "Tolerance", "error_metrics", "reconcile", "LayoutError",
    "compile_rules", "load_rules", "apply_rules", "RulesError", "read_dump", "write_dump",
    "DumpError", "DiffError", "WeightDiff", "compare_weights", "weight_values", "torch_hooks",
    "read_eval_callback",
]
