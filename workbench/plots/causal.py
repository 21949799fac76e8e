"""Figures for the causal tools (workbench.causal): pure functions from a result to a Figure.

* :func:`patching_heatmap` -- a :class:`~workbench.causal.PatchingResult`: layer x position
  (or layer x head), the normalised effect of patching each activation (0 = as corrupted,
  1 = as clean), diverging around 0;
* :func:`ablation_plot` -- an :class:`~workbench.causal.AblationResult`: the metric with
  each group ablated against the unablated baseline (bars), or the layer x head grid of
  :func:`~workbench.causal.ablate_heads`;
* :func:`dla_plot` -- a :class:`~workbench.causal.DLAResult`: each component's direct
  contribution (bars) beside each head's (grid);
* :func:`induction_plot` -- an :class:`~workbench.causal.InductionResult`: induction and
  previous-token scores per layer x head (0..1, sequential colours).

They read the results' fields only (no import of workbench.causal).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure



def _grid(ax, fig, a: np.ndarray, rows: Sequence[str], cols: Sequence[str], label: str, diverging: bool = True,
          vmax: float | None = None, fmt: str = "{:.2f}"):
    """A heatmap with one annotated number per cell (NaN cells blank)."""
    import matplotlib

    fin = np.isfinite(a)
    if diverging:
        m = vmax or (float(np.max(np.abs(a[fin]))) if fin.any() else 1.0) or 1.0
        cmap, norm = matplotlib.colormaps["RdBu"].with_extremes(bad="#dddddd"), TwoSlopeNorm(0.0, -m, m)
    else:
        cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#dddddd")
        norm = matplotlib.colors.Normalize(0.0, vmax if vmax is not None else 1.0)
    im = ax.imshow(np.where(fin, a, np.nan), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02).set_label(label)
    if a.size <= 400:
        for (r, c), v in np.ndenumerate(a):
            if np.isfinite(v):
                dark = abs(norm(v) - 0.5) > 0.3 if diverging else norm(v) < 0.6
                ax.text(c, r, fmt.format(v), ha="center", va="center", fontsize=7,
                        color="white" if dark else "black")
    ax.set_yticks(range(len(rows)), list(rows), fontsize=8)
    ax.set_xticks(range(len(cols)), [str(c)[:14] for c in cols], fontsize=7,
                  rotation=90 if len(cols) > 8 else 0)
    return im


def patching_heatmap(result: Any, normalized: bool = True, title: str | None = None) -> Figure:
    """Rows (embedding / layers) x columns (positions, or heads): the effect of patching
    that activation from the clean run into the corrupted one."""
    a = result.effect if normalized else result.values
    fig = Figure(figsize=(max(5.0, 0.55 * a.shape[1] + 2.5), max(3.0, 0.42 * a.shape[0] + 1.8)))
    ax = fig.add_subplot()
    label = "effect: 0 = corrupted, 1 = clean" if normalized else result.metric
    if normalized:
        _grid(ax, fig, a, result.rows, result.cols, label, vmax=max(1.0, float(np.nanmax(np.abs(a))) if np.isfinite(a).any() else 1.0))
    else:
        _grid(ax, fig, a, result.rows, result.cols, label)
    ax.set_xlabel("attention head" if result.site == "heads" else "position: clean/corrupted token")
    ax.set_ylabel({"resid": "residual stream after", "heads": "layer"}.get(result.site, f"{result.site} output of"))
    what = {"resid": "residual stream", "attn": "attention outputs", "mlp": "MLP outputs",
            "heads": "head outputs (all positions)"}.get(result.site, result.site)
    ax.set_title(title or f"activation patching of {what}, clean -> corrupted\n{result.metric}: "
                          f"clean {result.clean:.3g}, corrupted {result.corrupted:.3g}", fontsize=10)
    return fig


def ablation_plot(result: Any, title: str | None = None) -> Figure:
    """Bars of the metric with each group ablated (the baseline as a line); or, for a result
    of ``ablate_heads``, the layer x head grid of the change in the metric."""
    if result.grid is not None:
        a = result.grid - result.baseline
        fig = Figure(figsize=(max(4.5, 0.8 * a.shape[1] + 2.5), max(3.0, 0.45 * a.shape[0] + 1.8)))
        ax = fig.add_subplot()
        _grid(ax, fig, a, result.grid_rows, result.grid_cols, "change in the metric")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
    else:
        n = len(result.labels)
        fig = Figure(figsize=(7, max(2.5, 0.35 * n + 1.5)))
        ax = fig.add_subplot()
        ax.barh(range(n), result.values, color=["tab:red" if e < 0 else "tab:blue" for e in result.effect])
        ax.axvline(result.baseline, color="black", lw=1, ls="--", label=f"not ablated ({result.baseline:.3g})")
        for i, v in enumerate(result.values):
            ax.text(v, i, f" {v:.3g}", va="center", fontsize=7)
        ax.set_yticks(range(n), list(result.labels), fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(result.metric)
        ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title or f"{result.mode} ablation: {result.metric}\n(baseline {result.baseline:.3g})", fontsize=10)
    return fig


def dla_plot(result: Any, title: str | None = None) -> Figure:
    """Direct logit attribution: components (bars, left) and attention heads (grid, right)."""
    fig = Figure(figsize=(11, max(3.5, 0.28 * len(result.labels) + 2.0)), layout="constrained")
    ax, axh = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    v = np.asarray(result.values)
    ax.barh(range(len(v)), v, color=["tab:blue" if x >= 0 else "tab:red" for x in v])
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(v)), list(result.labels), fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("direct contribution")
    ax.set_title(f"sum {result.total:.3g} = lm_head {result.lm_head_value:.3g}\n"
                 f"(model's logits {result.logits_value:.3g})", fontsize=9)
    h = np.asarray(result.heads)
    if h.size:
        _grid(axh, fig, h, [f"L{i}" for i in range(h.shape[0])], [f"H{j}" for j in range(h.shape[1])],
              "direct contribution")
        axh.set_xlabel("head")
        axh.set_ylabel("layer")
    axh.set_title("per head (rows sum to the layer's attn bar)", fontsize=9)
    fig.suptitle(title or f"direct logit attribution of {result.metric}\n"
                          "(final norm's scale frozen at the full residual, as TransformerLens)", fontsize=10)
    return fig


def induction_plot(result: Any, title: str | None = None) -> Figure:
    """Induction and previous-token scores per layer x head (mean attention weight, 0..1)."""
    fig = Figure(figsize=(10, max(3.0, 0.45 * result.scores.shape[0] + 2.0)), layout="constrained")
    rows = [f"L{i}" for i in range(result.scores.shape[0])]
    cols = [f"H{j}" for j in range(result.scores.shape[1])]
    for k, (a, name) in enumerate(((result.scores, "induction"), (result.previous_token, "previous-token"))):
        ax = fig.add_subplot(1, 2, k + 1)
        _grid(ax, fig, a, rows, cols, "mean attention weight", diverging=False)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{name} score", fontsize=9)
    sep = "" if result.sep is None else " with a separator"
    fig.suptitle(title or f"heads on {result.batch} sequences of {result.seq_len} random tokens repeated{sep}",
                 fontsize=10)
    return fig
