"""matplotlib views: pure functions from data (arrays, reports) to a ``Figure``; here the
model's own values (activations, attention, the residual stream, weights, the logit lens),
the engine diff's figures in diff_figures.py.

They build ``matplotlib.figure.Figure`` objects directly (no pyplot state), so they work
under any backend, never pop up windows, and show once in a notebook.  ``save(fig, path)``
writes a PNG.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from workbench.arrays import to_numpy
from workbench.dtypes import FP16_MAX
from workbench.plots.analysis import LogitLens, ResidualNorms, residual_norms


def save(fig: Figure, path: str, dpi: int = 110) -> str:
    """Write the figure (format from the extension) through an exclusive temporary renamed
    into place; an unwritable place raises :class:`workbench.fsio.WriteError` naming it."""
    from workbench import fsio

    fsio.write_with(path, lambda tmp: fig.savefig(tmp, dpi=dpi, bbox_inches="tight"))
    return path


def short_label(s: str, n: int = 12) -> str:
    """A token or label on one line, at most ``n`` characters (an ellipsis where cut)."""
    s = s.replace("\n", "\\n")
    return s if len(s) <= n else s[: n - 1] + "…"


# ------------------------------------------------------------------ activations

def _sequential(name: str = "Blues", top: float = 1.0):
    """A sequential colour map (white -> dark) for values with no sign: probabilities,
    magnitudes.  ``top`` < 1 stops short of the darkest colour (so black NaN cells stand out)."""
    import matplotlib
    from matplotlib.colors import ListedColormap

    cm = matplotlib.colormaps[name]
    return cm if top >= 1.0 else ListedColormap(cm(np.linspace(0.0, top, 256)), name=name)


def activation_heatmap(x: Any, title: str | None = None, tokens: Sequence[str] | None = None,
                       clip_percentile: float = 99.5) -> Figure:
    """An activation as tokens x channels: diverging colours around zero for signed values,
    a sequential map (white -> blue, from 0) when no value is negative (probabilities,
    magnitudes), so that nothing with no sign is drawn as if it had one.

    Leading size-1 dims are dropped; a 3-D value (e.g. heads x tokens x dim) is drawn
    as its first axis stacked.  The colour scale is clipped at the ``clip_percentile`` of
    |x| so that a few outliers do not wash out the rest; the true min / max / absmax and
    non-finite counts are in the title.  NaN cells are black, +Inf magenta, -Inf cyan.
    """
    a = to_numpy(x)
    shape = list(a.shape)
    while a.ndim > 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim == 1:
        a = a[None]
    if a.ndim > 2:
        a = a.reshape(-1, a.shape[-1])
    fin = np.isfinite(a)
    vals = np.abs(a[fin])
    vmax = float(np.percentile(vals, clip_percentile)) if vals.size else 1.0
    vmax = vmax if vmax > 0 else (float(vals.max()) if vals.size and vals.max() > 0 else 1.0)
    fig = Figure(figsize=(10, max(2.5, min(8, 0.3 * a.shape[0] + 1.5))))
    ax = fig.add_subplot()
    import matplotlib

    shown = np.where(fin, a, np.nan)
    signed = bool(fin.any() and a[fin].min() < 0)
    if signed:
        cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="black")
        norm = TwoSlopeNorm(vcenter=0.0, vmin=-vmax, vmax=vmax)
    else:
        cmap = _sequential("Blues", top=0.85).with_extremes(bad="black")
        norm = matplotlib.colors.Normalize(vmin=0.0, vmax=vmax)
    im = ax.imshow(shown, aspect="auto", interpolation="nearest", cmap=cmap, norm=norm)
    for mask, color, label in ((np.isnan(a), "black", "nan"), (np.isposinf(a), "magenta", "+inf"),
                               (np.isneginf(a), "cyan", "-inf")):
        if mask.any():
            r, c = np.nonzero(mask)
            if r.size > 2000:  # too many to mark one by one: NaN cells are black anyway; keep the legend entry
                r, c = r[:0], c[:0]
            ax.plot(c, r, "s", color=color, mec="yellow", mew=0.8, ms=6, label=f"{label} ({int(mask.sum())})",
                    ls="none")
    if (~fin).any():
        ax.legend(fontsize=7, loc="upper right")
    cb = fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01)
    cb.set_label(f"value{'' if signed else ', non-negative'} (clipped at p{clip_percentile:g} |x| = {vmax:.3g})")
    ax.set_xlabel(f"channel (of {a.shape[1]})")
    if tokens is not None and len(tokens) == a.shape[0] and a.shape[0] <= 64:
        ax.set_yticks(range(a.shape[0]), [short_label(t) for t in tokens], fontsize=7)
        ax.set_ylabel("token")
    else:
        ax.set_ylabel("row (token)" if len(shape) <= 3 else "row")
    stats = (f"shape {shape}  min {np.min(a[fin]) if fin.any() else float('nan'):.3g}  "
             f"max {np.max(a[fin]) if fin.any() else float('nan'):.3g}  absmax {vals.max() if vals.size else 0:.3g}")
    nonfin = int((~fin).sum())
    if nonfin:
        stats += f"  non-finite {nonfin}"
    ax.set_title((title + "\n" if title else "") + stats, fontsize=9)
    return fig


def attention_pattern(weights: Any, head: int = 0, tokens: Sequence[str] | None = None,
                      title: str | None = None) -> Figure:
    """One head's attention weights, queries (rows) x keys (columns), 0..1.

    ``weights``: [B, H, Tq, Tk], [H, Tq, Tk] or [Tq, Tk] (post-softmax probabilities).
    Probabilities have no sign: a sequential map, white (0) to dark blue (1).  Masked cells
    (exactly 0: a later key, or outside a sliding window) are hatched, non-finite ones magenta.
    """
    a = to_numpy(weights)
    while a.ndim > 3 and a.shape[0] == 1:
        a = a[0]
    if a.ndim == 3:
        if not 0 <= head < a.shape[0]:
            raise ValueError(f"head {head} out of range: {a.shape[0]} heads")
        nheads = a.shape[0]
        a = a[head]
    elif a.ndim == 2:
        nheads = 1
    else:
        raise ValueError(f"expected attention weights [H, Tq, Tk], got shape {list(np.shape(weights))}")
    tq, tk = a.shape
    fig = Figure(figsize=(max(4.5, min(10, 0.32 * tk + 2.5)), max(4, min(9, 0.3 * tq + 2))))
    ax = fig.add_subplot()
    fin = np.isfinite(a)
    masked = fin & (a == 0)
    cmap = _sequential("Blues").with_extremes(bad=(0.0, 0.0, 0.0, 0.0))  # masked cells: the hatch shows through
    ax.patch.set_hatch("///")
    ax.patch.set_edgecolor("0.82")
    im = ax.imshow(np.ma.masked_array(a, mask=masked | ~fin), cmap=cmap, vmin=0.0, vmax=1.0,
                   interpolation="nearest", aspect="auto")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02).set_label("attention probability (0 to 1)")
    handles = []
    from matplotlib.patches import Patch

    if masked.any():
        handles.append(Patch(facecolor="white", edgecolor="0.6", hatch="///", label="masked (exactly 0)"))
    if (~fin).any():
        r, c = np.nonzero(~fin)
        ax.plot(c, r, "s", color="magenta", ms=5, ls="none")
        handles.append(Patch(color="magenta", label=f"NaN / inf ({int((~fin).sum())})"))
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="upper right", framealpha=0.9)
    if tokens is not None and len(tokens) >= tk and tk <= 48:
        ktoks = [short_label(t) for t in tokens[-tk:]] if len(tokens) != tk else [short_label(t) for t in tokens]
        qtoks = [short_label(t) for t in tokens[-tq:]]
        ax.set_xticks(range(tk), ktoks, rotation=90, fontsize=7)
        ax.set_yticks(range(tq), qtoks, fontsize=7)
    ax.set_xlabel("key position (attended to)")
    ax.set_ylabel("query position")
    ax.set_title(title or f"attention pattern, head {head} of {nheads}", fontsize=10)
    return fig


def residual_norm_plot(source: Any, tokens: Sequence[str] | None = None, title: str | None = None,
                       log: bool = True) -> Figure:
    """L2 norm of the residual stream after each layer: mean over tokens, min-max band, last token.

    ``source``: a :class:`ResidualNorms`, a Trace, a mapping of op values, or a list of
    per-layer arrays.
    """
    rn = source if isinstance(source, ResidualNorms) else residual_norms(source)
    L = np.array(rn.layers)
    fig = Figure(figsize=(8, 4))
    ax = fig.add_subplot()
    x = L
    mean, lo, hi = rn.norms.mean(1), rn.norms.min(1), rn.norms.max(1)
    if rn.embed is not None:
        x = np.concatenate([[-1], L])
        mean = np.concatenate([[rn.embed.mean()], mean])
        lo = np.concatenate([[rn.embed.min()], lo])
        hi = np.concatenate([[rn.embed.max()], hi])
    ax.fill_between(x, lo, hi, alpha=0.2, color="tab:blue", label="min-max over tokens")
    ax.plot(x, mean, "o-", color="tab:blue", ms=4, label="mean over tokens")
    last = rn.norms[:, -1] if rn.embed is None else np.concatenate([[rn.embed[-1]], rn.norms[:, -1]])
    lab = "last token" + (f" ({short_label(tokens[-1])!s})" if tokens else "")
    ax.plot(x, last, "s--", color="tab:red", ms=3, lw=1, label=lab)
    if log and np.all(lo > 0):
        from matplotlib.ticker import FuncFormatter

        ax.set_yscale("log")
        fmt = FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(fmt)
        ax.yaxis.set_minor_formatter(fmt if hi.max() / max(lo.min(), 1e-30) < 100 else FuncFormatter(lambda v, _: ""))
    ticks = list(x)
    labels = (["emb"] if rn.embed is not None else []) + [str(i) for i in rn.layers]
    step = max(1, math.ceil(len(ticks) / 24))
    ax.set_xticks(ticks[::step], labels[::step])
    ax.set_xlabel("layer (residual stream after it)")
    ax.set_ylabel("L2 norm" + (" (log)" if ax.get_yscale() == "log" else ""))
    ax.set_title(title or "residual-stream norm by layer")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return fig


def weight_histogram(w: Any, name: str = "weight", bins: int = 120, max_samples: int = 2_000_000,
                     seed: int = 0) -> Figure:
    """Distribution of a tensor's values (log counts), its statistics, and fp16's range if exceeded.

    Tensors above ``max_samples`` elements are histogrammed on a fixed random sample;
    the statistics in the box are over every element.
    """
    a = to_numpy(w).ravel()
    fin = np.isfinite(a)
    nonfin = int((~fin).sum())
    v = a[fin]
    sample = v
    if v.size > max_samples:
        sample = np.random.default_rng(seed).choice(v, size=max_samples, replace=False)
    fig = Figure(figsize=(7.5, 4))
    ax = fig.add_subplot()
    if v.size:
        # the bulk: a robust range, so that a few huge values do not squash the histogram into one bar
        lo, hi = (float(x) for x in np.percentile(sample, [0.01, 99.99]))
        span = (hi - lo) or max(abs(hi), 1e-6)
        vmin, vmax = float(v.min()), float(v.max())
        lo = vmin if vmin >= lo - span else lo - 0.1 * span  # keep the true range unless far outliers
        hi = vmax if vmax <= hi + span else hi + 0.1 * span
        if hi <= lo:
            lo, hi = lo - 0.5, hi + 0.5
        ax.hist(sample, bins=bins, range=(lo, hi), color="tab:blue", alpha=0.85, log=True)
        below, above = int((v < lo).sum()), int((v > hi).sum())
        mean, std = float(v.mean(dtype=np.float64)), float(v.std(dtype=np.float64))
        if lo <= mean <= hi:
            ax.axvline(mean, color="tab:orange", lw=1, ls="--", label=f"mean {mean:.3g}")
        ax.axvspan(max(lo, mean - std), min(hi, mean + std), color="tab:orange", alpha=0.1,
                   label=f"±1 std ({std:.3g})")
        if lo < 0 < hi:
            ax.axvline(0.0, color="0.4", lw=0.8)
        text = (f"n = {a.size:,}\nmin {v.min():.6g}\nmax {v.max():.6g}\nabsmax {np.abs(v).max():.6g}\n"
                f"zeros {int((v == 0).sum()):,}")
        for count, side, x in ((below, "below", lo), (above, "above", hi)):
            if count:
                text += f"\n{count:,} outlier(s) {side} the axis"
                ax.annotate(f"{count:,} ▶" if side == "above" else f"◀ {count:,}", (x, 0), xycoords=("data", "axes fraction"),
                            xytext=(0, 6), textcoords="offset points", ha="right" if side == "above" else "left",
                            color="red", fontsize=8)
        if np.abs(v).max() > FP16_MAX:
            text += f"\nexceeds float16 range ({FP16_MAX:g})!"
        if nonfin:
            text += f"\nnon-finite {nonfin:,}"
        ax.text(0.98, 0.97, text, transform=ax.transAxes, ha="right", va="top", fontsize=8,
                bbox=dict(boxstyle="round", fc="white", ec="0.7"),
                color="red" if (np.abs(v).max() > FP16_MAX or nonfin) else "black")
        ax.legend(fontsize=8, loc="upper left")
    else:
        ax.text(0.5, 0.5, f"no finite values ({nonfin:,} non-finite)", transform=ax.transAxes, ha="center")
    ax.set_xlabel("value")
    ax.set_ylabel("count (log)")
    ax.set_title(f"{name}  {list(np.shape(w))}" + (f"  (sampled {max_samples:,})" if v.size > max_samples else ""),
                 fontsize=10)
    return fig


def logit_lens_plot(lens: LogitLens, title: str | None = None) -> Figure:
    """Layers (rows, first at the bottom) x positions: each cell's top-1 token and its probability.

    Cells whose top-1 token equals the model's final prediction at that position are
    outlined; the colour is the top-1 probability.
    """
    L, P = len(lens.layers), len(lens.positions)
    p1 = lens.top_probs[:, :, 0]
    fig = Figure(figsize=(max(5, 1.15 * P + 2.5), max(3.5, 0.38 * L + 1.8)))
    ax = fig.add_subplot()
    im = ax.imshow(p1, origin="lower", cmap="Blues", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02).set_label("top-1 probability")
    for li in range(L):
        for pi in range(P):
            tid = int(lens.top_ids[li, pi, 0])
            ax.text(pi, li, short_label(lens.label(tid), 9), ha="center", va="center", fontsize=7,
                    color="white" if p1[li, pi] > 0.6 else "black")
            if tid == int(lens.final_ids[pi]):
                ax.add_patch(_rect(pi, li))
    ax.set_yticks(range(L), [f"layers.{i}" for i in lens.layers], fontsize=7)
    xl = [f"{p}\n{short_label(t, 9)}" for p, t in zip(lens.positions, lens.tokens)] if lens.tokens else \
        [str(p) for p in lens.positions]
    ax.set_xticks(range(P), xl, fontsize=7)
    ax.set_xlabel("position (input token); cells: predicted next token")
    ax.set_ylabel("residual stream after")
    ax.set_title(title or "logit lens: each layer read through the final norm and lm_head\n"
                          "(outlined: same as the model's final prediction)", fontsize=10)
    return fig


def _rect(x, y):
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.46, y - 0.44), 0.92, 0.88, fill=False, ec="tab:red", lw=1.4)
