"""matplotlib views: pure functions from data (arrays, reports) to a ``Figure``.

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


def _short(s: str, n: int = 12) -> str:
    s = s.replace("\n", "\\n")
    return s if len(s) <= n else s[: n - 1] + "…"


# ------------------------------------------------------------------ per-op error curve

def error_curve(report: Any, metrics: Sequence[str] | None = None, title: str | None = None) -> Figure:
    """Per-op error along our execution order (log scale), layer boundaries, first divergence.

    ``report``: a :class:`workbench.diff.DiffReport`.  ``metrics``: any of ``nmse``,
    ``1-cosine``, ``max_abs``, ``max_rel``, ``local-nmse`` (default: nmse, 1-cosine, and
    local-nmse when the report has local errors).  Exact matches (error 0, or below 1e-12)
    leave a gap in their curve and get a tick at the bottom; ops whose shapes could not be reconciled are marked with an ``x`` at the
    top; the first local divergence (the op wrong on the engine's own inputs) with a
    triangle.
    """
    ops = list(report.ops)
    if metrics is None:
        metrics = ("nmse", "1-cosine") + (("local-nmse",) if any(getattr(o, "local_nmse", None) is not None
                                                                   for o in ops) else ())
    fig = Figure(figsize=(11, 4.2))
    ax = fig.add_subplot()
    tol = report.tolerance
    floor = 1e-12
    colors = {"nmse": "tab:blue", "1-cosine": "tab:orange", "max_abs": "tab:green", "max_rel": "tab:purple",
              "local-nmse": "tab:gray"}

    def val(o, m):
        if m == "1-cosine":
            return None if o.cosine is None or math.isnan(o.cosine) else 1.0 - o.cosine
        v = getattr(o, m.replace("-", "_"), None)
        return None if v is None or math.isnan(v) else v

    xs = np.array([o.index for o in ops])
    top = floor
    exact: set[int] = set()
    pos: list[float] = []
    for m in metrics:
        ys = np.array([np.nan if val(o, m) is None else val(o, m) for o in ops], dtype=float)
        ys = np.where(np.isinf(ys), np.nan, ys)
        if np.any(np.isfinite(ys)):
            top = max(top, float(np.nanmax(ys)))
        zero = np.isfinite(ys) & (ys < floor)  # exact (or below any meaningful precision)
        if m != "local-nmse":
            exact.update(int(x) for x in xs[zero])
        ys = np.where(zero, np.nan, ys)  # a gap in the curve, marked at the bottom instead
        pos += [float(v) for v in ys[np.isfinite(ys)]]
        style = dict(ls="none", ms=5, marker=".") if m == "local-nmse" else dict(ls="-", lw=1, ms=4, marker=".")
        label = "local nmse (our op on the engine's inputs)" if m == "local-nmse" else m
        ax.plot(xs, ys, color=colors.get(m), label=label, **style)
    ax.set_yscale("log")
    ymax = max(top * 20, 1.0)
    low = min(pos) / 10 if pos else 1e-9
    ax.set_ylim(low, ymax)
    if exact:
        ex = sorted(exact)
        ax.plot(ex, [low * 1.6] * len(ex), "|", color="0.45", ms=8, label="exact (error 0)")
    calibrated = getattr(report, "noise_dtype", None)
    for m, attr, conv in (("nmse", "limit_nmse", lambda v: v), ("1-cosine", "limit_cosine", lambda v: 1 - v)):
        if m not in metrics:
            continue
        if calibrated:
            lim = np.array([np.nan if getattr(o, attr, None) is None else conv(getattr(o, attr)) for o in ops])
            ax.step(xs, lim, where="mid", color=colors[m], ls=":", lw=1.2,
                    label=f"{m} limit ({tol.noise_factor:g} x our {calibrated} run)")
        elif m == "nmse":
            ax.axhline(tol.max_nmse, color=colors[m], ls=":", lw=1, label=f"nmse tolerance {tol.max_nmse:g}")
        else:
            ax.axhline(1 - tol.min_cosine, color=colors[m], ls=":", lw=1,
                       label=f"1-cosine tolerance {1 - tol.min_cosine:.3g}")
    budgeted = [o for o in ops if getattr(o, "local_rule", None) == "budget" and o.limit_power is not None]
    if "local-nmse" in metrics and budgeted:  # each op's rounding budget: the band up to its limit
        factor = (report.engine_precision.to_dict() if report.engine_precision is not None else {}).get("factor", 1.0)
        bx = np.array([o.index for o in budgeted])
        hi_ = np.array([o.limit_power for o in budgeted])
        ax.fill_between(bx, hi_ / factor, hi_, step="mid", color="tab:gray", alpha=0.18, lw=0,
                        label=f"rounding budget .. {factor:g}x (each op at its precision)")
        ax.plot(bx, [o.local_power for o in budgeted], ls="none", marker="_", ms=7, color="black",
                label="local error power (MSE / mean exact^2)")
    elif "local-nmse" in metrics and hasattr(tol, "local_max_nmse"):
        ax.axhline(tol.local_max_nmse, color=colors["local-nmse"], ls=":", lw=1,
                   label=f"local nmse tolerance {tol.local_max_nmse:g}")
    bad = [o for o in ops if o.status in ("shape", "ambiguous")]
    if bad:
        ax.plot([o.index for o in bad], [ymax / 2] * len(bad), "x", color="black", ms=7,
                label="shape not reconciled")
    nonfin = [o for o in ops if getattr(o, "nonfinite", None) is not None]
    if nonfin:  # their metrics are NaN: a mark at the top, never a gap that looks like "exact"
        n = sum(o.nonfinite["count"] for o in nonfin)
        ax.plot([o.index for o in nonfin], [ymax / 3] * len(nonfin), "D", color="magenta", ms=6,
                label=f"non-finite values ({len(nonfin)} ops, {n} elements)")
    # layer boundaries: the first op of each layer, in our order
    order = list(report.order)
    starts, last = [], None
    for i, n in enumerate(order):
        parts = n.split(".")
        layer = int(parts[1]) if len(parts) > 1 and parts[0] == "layers" and parts[1].isdigit() else None
        if layer is not None and layer != last:
            starts.append((i, layer))
            last = layer
    for i, layer in starts:
        ax.axvline(i - 0.5, color="0.85", lw=0.8, zorder=0)
    if starts:
        step = max(1, math.ceil(len(starts) / 24))
        sec = ax.secondary_xaxis("top")
        sec.set_xticks([i for i, _ in starts[::step]], [f"L{layer}" for _, layer in starts[::step]], fontsize=7)
        sec.set_xlabel("layer")
    fd = report.first_divergence
    if fd is not None:
        y = max((v for m in metrics if m != "local-nmse" and (v := val(fd, m)) is not None), default=None) \
            if fd.status == "diverged" else None
        y = ymax / 2 if y is None or y <= low else y
        ax.axvline(fd.index, color="red", lw=1.2, alpha=0.6)
        ax.plot([fd.index], [y], "o", ms=10, mfc="none", mec="red", mew=2,
                label=f"first divergence: {fd.op}")
        ax.annotate(fd.op, (fd.index, y), xytext=(8, 8), textcoords="offset points",
                    color="red", fontsize=8)
    fl = getattr(report, "first_local_divergence", None)
    if fl is not None and fl.local_nmse is not None:
        yl = fl.local_nmse if fl.local_nmse > low else low * 3
        ax.plot([fl.index], [yl], "v", ms=11, color="darkred", mec="white",
                label=f"first local divergence: {fl.op}")
        if fd is None or fl.op != fd.op:
            ax.annotate(fl.op, (fl.index, yl), xytext=(8, -14), textcoords="offset points",
                        color="darkred", fontsize=8)
    ax.set_xlim(-1, max(len(order), 1))
    ax.set_xlabel(f"op index in execution order ({len(order)} ops, {report.compared} compared)")
    ax.set_ylabel("error (log scale)")
    if title is None:
        cov = getattr(report, "coverage", None)
        low = cov is not None and not cov["enough"]  # too little of the dump compared: no verdict
        title = "engine vs reference: " + (
            f"first divergence at {fd.op}" if fd else
            f"no verdict: {cov['compared']} of the engine's {cov['engine_tensors']} tensors compared" if low else
            "no divergence")
        if fl is not None and (fd is None or fl.op != fd.op):
            title += f"; first op wrong on the engine's inputs: {fl.op}"
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, frameon=False)
    ax.grid(True, which="major", axis="y", alpha=0.3)
    return fig


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
        ax.set_yticks(range(a.shape[0]), [_short(t) for t in tokens], fontsize=7)
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
        ktoks = [_short(t) for t in tokens[-tk:]] if len(tokens) != tk else [_short(t) for t in tokens]
        qtoks = [_short(t) for t in tokens[-tq:]]
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
    lab = "last token" + (f" ({_short(tokens[-1])!s})" if tokens else "")
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
            ax.text(pi, li, _short(lens.label(tid), 9), ha="center", va="center", fontsize=7,
                    color="white" if p1[li, pi] > 0.6 else "black")
            if tid == int(lens.final_ids[pi]):
                ax.add_patch(_rect(pi, li))
    ax.set_yticks(range(L), [f"layers.{i}" for i in lens.layers], fontsize=7)
    xl = [f"{p}\n{_short(t, 9)}" for p, t in zip(lens.positions, lens.tokens)] if lens.tokens else \
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


def position_error_map(report: Any, tokens: Sequence[str] | None = None, title: str | None = None,
                       max_labels: int = 40) -> Figure:
    """Per op (rows, execution order) and token position (columns): the engine's RMS error
    relative to the reference's RMS, on a log colour scale.

    A RoPE bug shows as error growing to the right, a window or mask bug as a block that
    starts at one column, a bad first token as one column; propagation as everything below
    the first bad row.  ``report``: a DiffReport made with token positions (``compare``).
    """
    from matplotlib.colors import LogNorm

    rows = [o for o in report.ops if getattr(o, "position_error", None) is not None]
    if not rows:
        raise ValueError("the report has no per-position errors (compare() fills them from the token count)")
    T = max(len(o.position_error) for o in rows)
    data = np.full((len(rows), T), np.nan)
    for i, o in enumerate(rows):
        data[i, : len(o.position_error)] = np.asarray(o.position_error, dtype=float)
    pos = data[np.isfinite(data) & (data > 0)]
    vmax = max(float(pos.max()) if pos.size else 1.0, 1e-6)
    vmin = max(float(np.percentile(pos, 1)) if pos.size else vmax * 1e-6, vmax * 1e-8)
    vmin = min(vmin, vmax / 1e3)  # exact (0) cells, drawn at vmin, stay apart from real errors
    shown = np.where(np.isfinite(data), np.maximum(data, vmin), np.nan)
    fig = Figure(figsize=(max(6, min(14, 0.35 * T + 4)), max(4, min(12, 0.05 * len(rows) + 3))))
    ax = fig.add_subplot()
    import matplotlib

    cmap = matplotlib.colormaps["magma"].with_extremes(bad="0.85")
    im = ax.imshow(shown, aspect="auto", interpolation="nearest", cmap=cmap, norm=LogNorm(vmin=vmin, vmax=vmax))
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02).set_label("RMS error / RMS(reference)  (log)")
    # positions holding non-finite values (either side): their own colour, not "no data" grey
    nf = np.zeros((len(rows), T), dtype=bool)
    for i, o in enumerate(rows):
        per = (getattr(o, "nonfinite", None) or {}).get("per_row")
        if per is not None:
            nf[i, : len(per)] = np.asarray(per) > 0
    if nf.any():
        from matplotlib.colors import ListedColormap
        from matplotlib.patches import Patch

        ax.imshow(np.where(nf, 1.0, np.nan), aspect="auto", interpolation="nearest",
                  cmap=ListedColormap(["cyan"]).with_extremes(bad=(0, 0, 0, 0)), vmin=0, vmax=1)
        ax.legend(handles=[Patch(color="cyan", label=f"non-finite values ({int(nf.sum())} op x position cells)")],
                  loc="upper right", fontsize=7)
    fd = report.first_divergence
    step = max(1, math.ceil(len(rows) / max_labels))
    ticks = list(range(0, len(rows), step))
    fd_row = next((i for i, o in enumerate(rows) if fd is not None and o.op == fd.op), None)
    if fd_row is not None and fd_row not in ticks:
        ticks = sorted(ticks + [fd_row])
    ax.set_yticks(ticks, [rows[i].op for i in ticks], fontsize=6)
    if fd_row is not None:
        for lab, i in zip(ax.get_yticklabels(), ticks):
            if i == fd_row:
                lab.set_color("red")
                lab.set_fontweight("bold")
        ax.axhline(fd_row - 0.5, color="red", lw=1)
    last = None
    for i, o in enumerate(rows):  # layer boundaries
        if o.layer is not None and o.layer != last:
            if last is not None:
                ax.axhline(i - 0.5, color="white", lw=0.4, alpha=0.6)
            last = o.layer
    if tokens is not None and len(tokens) == T and T <= 64:
        ax.set_xticks(range(T), [f"{i} {_short(t, 8)}" for i, t in enumerate(tokens)], rotation=90, fontsize=7)
    ax.set_xlabel("token position")
    ax.set_ylabel("op (execution order)")
    pat = None
    if fd is not None and fd.position_error is not None:
        pat = fd.position_reading  # the diff's reading of its own profile (plots read data objects)
    if title is None:
        import textwrap

        title = "error by op and token position"
        if fd is not None:
            nfd = getattr(fd, "nonfinite", None)
            if nfd is not None:
                pat = (f"{nfd['count']} non-finite values, {nfd.get('pattern', 'irregular')}"
                       + (" (run `workbench hazards`)" if nfd["tile"] else ""))
            title += "\n" + textwrap.fill(f"first divergence {fd.op}" + (f": {pat}" if pat else ""), 90)
    ax.set_title(title, fontsize=10)
    return fig
