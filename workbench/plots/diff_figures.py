"""The engine diff's figures (a :class:`workbench.diff.DiffReport` in, a ``Figure`` out):
:func:`error_curve` (per-op error along our execution order) and
:func:`position_error_map` (error by op and token position).  The figures of the model's
own values are in figures.py, whose conventions these follow."""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from matplotlib.figure import Figure

from workbench.plots.figures import short_label


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
        ax.set_xticks(range(T), [f"{i} {short_label(t, 8)}" for i, t in enumerate(tokens)], rotation=90, fontsize=7)
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
