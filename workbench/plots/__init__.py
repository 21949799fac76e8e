"""matplotlib views, usable without widgets: each a pure function from data to a Figure.

* :func:`error_curve` (a DiffReport): per-op error along the execution order;
* :func:`position_error_map` (a DiffReport): error by op and token position;
* :func:`activation_heatmap`: an activation, tokens x channels;
* :func:`attention_pattern`: one head's attention weights;
* :func:`residual_norm_plot`: the residual-stream norm by layer;
* :func:`weight_histogram`: a tensor's value distribution (:func:`weight_values` reads a
  checkpoint weight, dequantized);
* :func:`logit_lens_plot` (a :class:`LogitLens` from :func:`logit_lens`).

``save(fig, "x.png")`` writes a PNG.  The computations (residual norms, logit lens)
live in :mod:`workbench.plots.analysis`, apart from the figures.
"""
from workbench.plots.analysis import LogitLens, ResidualNorms, logit_lens, project, residual_norms, weight_values
from workbench.plots.diff_figures import error_curve, position_error_map
from workbench.plots.figures import (activation_heatmap, attention_pattern, logit_lens_plot, residual_norm_plot, save,
                                     weight_histogram)

__all__ = ["error_curve", "position_error_map", "activation_heatmap", "attention_pattern", "residual_norm_plot", "weight_histogram",
           "logit_lens_plot", "logit_lens", "LogitLens", "residual_norms", "ResidualNorms", "project", "save",
           "weight_values"]
