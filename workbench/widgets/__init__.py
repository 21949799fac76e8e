"""Widgets: thin ipywidgets views over the workbench's data objects (no logic of their own).

* :class:`StepDebugger` (a Trace): step, step over a layer, run to an op, run to the next
  non-finite value, back; stats, fp16/bf16 headroom, residual norms, heatmaps, attention.
* :class:`AttentionView` (an attention pattern, or ``AttentionView.from_trace(trace, layer)``):
  queries x keys with token labels, hover for each probability, a head selector.
* :class:`WeightBrowser` (an inspection Report): component -> layer -> tensor, problems marked.
* :class:`HazardTimeline` (a buffer Schedule): buffers x events, hazards linked to dispatches.
* :class:`DiffView` (a DiffReport): per-op error curve, first divergence marked.

Every widget writes what it shows through Output widgets' ``append_*`` methods and
HTML/Image widgets, so tests and nbval can read it without a browser.
"""
from workbench.widgets.attention import AttentionView
from workbench.widgets.diffview import DiffView
from workbench.widgets.debugger import StepDebugger
from workbench.widgets.hazards import HazardTimeline
from workbench.widgets.weights import WeightBrowser

__all__ = ["AttentionView", "DiffView", "HazardTimeline", "StepDebugger", "WeightBrowser"]
