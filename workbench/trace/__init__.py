"""Tracing: step through a model's op program, capture every value, hunt NaN.

    import workbench
    model = workbench.load("path/to/checkpoint")
    t = workbench.trace(model, "the cat sat", capture="stats", dtype="float16")
    t.step(); t.run(until="layers.2"); t.back()
    t.stats("layers.1.mlp.down_proj"); t.first_nonfinite()

What ``trace`` takes beside the prompt is grouped (:mod:`workbench.trace.options`):
``positions=Positions(logits="last")``, ``run=Run(attention="explicit", cache=...)``,
``storage=Storage(memory_budget="2GB")``.  See docs/trace.md.  ``workbench.trace`` is the module and is also callable:
``workbench.trace(model, ...)`` is :func:`workbench.trace.trace`.
"""
import sys as _sys
import types as _types

from workbench.trace.generate import Generation, generate
from workbench.trace.heads import head_stats, probabilities as attention_probabilities
from workbench.trace.hunt import CAUSES, Finding, HuntResult, diagnose, hunt
from workbench.trace.interventions import Intervention, inject, patch, replace, zero_head
from workbench.trace.modules import ModuleTrace
from workbench.trace.record import Record, is_record
from workbench.trace.stats import KEYS as STATS_KEYS
from workbench.trace.store import ValueStore
from workbench.trace.entry import prepare_ids, trace
from workbench.trace.options import Positions, Run, Storage
from workbench.trace.tracer import NONFINITE, Step, Trace, TraceError

__all__ = ["trace", "Positions", "Run", "Storage", "Trace", "ModuleTrace", "Record", "is_record", "Step", "TraceError", "NONFINITE", "generate", "Generation", "hunt", "HuntResult",
           "Finding", "diagnose", "CAUSES", "Intervention", "patch", "replace", "zero_head", "inject",
           "ValueStore", "STATS_KEYS", "prepare_ids", "head_stats", "attention_probabilities"]


class _CallableModule(_types.ModuleType):
    """Lets ``workbench.trace(model, ...)`` work although ``workbench.trace`` is a package."""

    def __call__(self, *args, **kwargs):
        return trace(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableModule
