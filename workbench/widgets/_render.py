"""Presentation helpers shared by the widgets: fast heatmap images, HTML tables, number formats.

Nothing here computes anything about a model; it only turns arrays and records that the
data objects already hold into pixels and text.  Heatmaps are encoded straight to PNG with
numpy + zlib (a few ms for a few hundred thousand pixels), so a StepDebugger step stays
well under 50 ms; the matplotlib figures with axes and labels live in workbench.plots.
"""
from __future__ import annotations

import html
import math
import struct
import zlib
from functools import lru_cache

import numpy as np

from workbench.diff.budget import FACTOR, GROWTH
from workbench.dtypes import BF16_MAX, FP16_MAX  # noqa: F401  (the widgets read them from here)
from workbench.stats_schema import MEANING, SUMMARY


@lru_cache(maxsize=8)
def colour_table(cmap: str) -> np.ndarray:
    """256 x 3 uint8 colour table from a matplotlib colormap (imported once, lazily)."""
    from matplotlib import colormaps
    cm = colormaps[cmap]
    return (np.asarray(cm(np.linspace(0.0, 1.0, 256)))[:, :3] * 255).round().astype(np.uint8)


def png_bytes(rgb: np.ndarray) -> bytes:
    """Encode an [H, W, 3] uint8 array as PNG."""
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    h, w, _ = rgb.shape
    raw = np.empty((h, 1 + 3 * w), dtype=np.uint8)
    raw[:, 0] = 0  # filter type None per row
    raw[:, 1:] = rgb.reshape(h, 3 * w)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw.tobytes(), 1)) + chunk(b"IEND", b""))


def as_2d(a: np.ndarray, max_rows: int = 256, max_cols: int = 1024) -> tuple[np.ndarray, str]:
    """A 2-D view of an activation for a heatmap, and a note on what was done to get it.

    Leading dims of size 1 are dropped; 3-D [H, T, X] arrays are laid side by side per
    head; larger arrays are flattened to [rows, last dim].  Rows/columns beyond the limits
    are max-abs pooled (so an outlier never disappears from the picture).
    """
    a = np.asarray(a)
    note = []
    while a.ndim > 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim == 0:
        a = a.reshape(1, 1)
    elif a.ndim == 1:
        a = a.reshape(1, -1)
    elif a.ndim == 3:
        h, t, x = a.shape
        a = np.concatenate([a[i] for i in range(h)], axis=1)
        note.append(f"{h} heads side by side")
    elif a.ndim > 3:
        a = a.reshape(-1, a.shape[-1])
        note.append("flattened to rows x last dim")
    a = np.asarray(a, dtype=np.float32)
    r, c = a.shape
    if r > max_rows:
        a = _pool(a, max_rows, axis=0)
        note.append(f"{r} rows max-abs pooled to {a.shape[0]}")
    if c > max_cols:
        a = _pool(a, max_cols, axis=1)
        note.append(f"{c} columns max-abs pooled to {a.shape[1]}")
    return a, "; ".join(note)


def _pool(a: np.ndarray, n: int, axis: int) -> np.ndarray:
    size = a.shape[axis]
    k = math.ceil(size / n)
    pad = k * math.ceil(size / k) - size
    if axis == 0:
        a = np.pad(a, ((0, pad), (0, 0)))
        g = a.reshape(-1, k, a.shape[1])
        idx = np.abs(g).argmax(axis=1)
        return np.take_along_axis(g, idx[:, None, :], axis=1)[:, 0, :]
    a = np.pad(a, ((0, 0), (0, pad)))
    g = a.reshape(a.shape[0], -1, k)
    idx = np.abs(g).argmax(axis=2)
    return np.take_along_axis(g, idx[:, :, None], axis=2)[:, :, 0]


def heatmap(a: np.ndarray, cmap: str = "RdBu_r", symmetric: bool = True, vmax: float | None = None,
            target_width: int = 640, target_height: int = 160, vmin: float | None = None) -> tuple[bytes, int, int]:
    """A 2-D array as a PNG heatmap -> (png bytes, width px, height px).

    ``symmetric``: a diverging map centred on 0 (signed values); else a sequential map from
    ``vmin`` (default: the smallest value) to ``vmax``.

    Cells are integer blocks: columns get ``target_width // cols`` pixels (1..16), rows at
    least as many and up to ``target_height // rows`` (so a few tokens stay readable).
    Non-finite cells are drawn in bright green.
    """
    a = np.asarray(a, dtype=np.float32)
    finite = np.isfinite(a)
    vals = np.where(finite, a, 0.0)
    if symmetric:
        m = float(vmax if vmax is not None else (np.abs(vals).max() if vals.size else 1.0)) or 1.0
        x = np.clip((vals / m + 1.0) * 0.5, 0.0, 1.0)
    else:
        lo = float(vmin if vmin is not None else (vals.min() if vals.size else 0.0))
        hi = float(vmax if vmax is not None else (vals.max() if vals.size else 1.0))
        x = (vals - lo) / ((hi - lo) or 1.0)
    idx = np.clip((x * 255.0).round(), 0, 255).astype(np.uint8)
    rgb = colour_table(cmap)[idx]
    rgb[~finite] = (0, 255, 0)
    rows, cols = a.shape
    sx = max(1, min(16, target_width // max(1, cols)))
    sy = max(sx, min(16, target_height // max(1, rows)))
    if sx > 1 or sy > 1:
        rgb = np.repeat(np.repeat(rgb, sy, axis=0), sx, axis=1)
    return png_bytes(rgb), cols * sx, rows * sy


def heatmap_png(a: np.ndarray, cmap: str = "RdBu_r", symmetric: bool = True, target_width: int = 640,
                vmax: float | None = None, target_height: int = 160) -> bytes:
    """Just the PNG bytes of :func:`heatmap`."""
    return heatmap(a, cmap, symmetric, vmax, target_width, target_height)[0]


#: every abbreviation the widgets show, explained once (tooltips via :func:`abbr`, legends via :func:`glossary`)
GLOSSARY = {
    **{k: MEANING[k] for k in SUMMARY},
    "zeros": MEANING["zero_frac"],
    "zero_frac": MEANING["zero_frac"],
    "NaN": "not a number (e.g. 0/0, inf - inf); it spreads through every op that reads it",
    "+inf": "positive infinity (a value beyond the dtype's largest finite number)",
    "−inf": "negative infinity",
    "-inf": "negative infinity",
    "headroom": MEANING["headroom"],
    "fp16": f"float16: 16-bit floats, largest finite value {FP16_MAX:g}",
    "bf16": "bfloat16: 16-bit floats with float32's range (largest ~3.4e38) and fewer digits",
    "RMS": "root mean square: sqrt(mean(x²))",
    "‖x‖": "L2 norm of a token's residual vector: sqrt(sum of squares over channels)",
    "nmse": "normalised mean squared error: mean((engine − reference)²) / mean(reference²); 0 = identical",
    "NMSE": "normalised mean squared error: mean((engine − reference)²) / mean(reference²); 0 = identical",
    "cosine": "cosine similarity of engine and reference values as vectors; 1 = same direction",
    "cos": "cosine similarity of engine and reference values as vectors; 1 = same direction",
    "1-cosine": "1 − cosine similarity: 0 when the engine's values point the same way as the reference's",
    "max_abs": "largest absolute difference |engine − reference| over all elements",
    "max_rel": "largest relative difference |engine − reference| / |reference| (where the reference is not ~0)",
    "local nmse": "nmse of our op run on the engine's own inputs: is this op wrong, or only its inputs?",
    "local-nmse": "nmse of our op run on the engine's own inputs, and each op's rounding budget (band)",
    "budget": "how far an honest implementation at the engine's precision lands from the exact op, on the "
              "engine's own inputs (error power: MSE / mean(exact²))",
    "x budget": f"local error / rounding budget: beyond {FACTOR:g}x (the budget rule) or, where nothing could be "
                f"recomputed, the error's growth over its inputs' beyond {GROWTH:g}x (the growth rule) is a finding",
    "ref": "reference (our op program / the reference implementation)",
    "cb": "command buffer: the engine's batch of dispatches submitted together",
    "raw": "read after write: a read that may see a write it was not ordered after",
    "war": "write after read: a write that may clobber bytes before an earlier read finished",
    "waw": "write after write: two writes to the same bytes without an order between them",
    "✗": "missing: the config expects this tensor and the checkpoint has none",
    "!": "problem: present but unexpected, mis-shaped, wrong dtype or quantization, or non-finite",
    "attn": "self_attn (the attention block)",
    "mlp": "the feed-forward block (multi-layer perceptron)",
    "q/k/v/o_proj": "query / key / value / output projection of attention",
}


def abbr(term: str, text: str | None = None) -> str:
    """``term`` (or ``text``) as HTML with its explanation from :data:`GLOSSARY` as a tooltip."""
    shown = html.escape(term if text is None else text)
    tip = GLOSSARY.get(term)
    if tip is None:
        return shown
    return (f'<abbr title="{html.escape(tip, quote=True)}" style="text-decoration:underline dotted;'
            f'cursor:help">{shown}</abbr>')


def glossary(terms) -> str:
    """One plain-text legend line: ``term = explanation; ...`` (for text outputs)."""
    return "; ".join(f"{t} = {GLOSSARY[t]}" for t in terms)


def fmt(x, spec: str = ".4g") -> str:
    if x is None:
        return "–"
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return str(int(x))
    try:
        xf = float(x)
    except (TypeError, ValueError):
        return html.escape(str(x))
    if math.isnan(xf):
        return "nan"
    return format(xf, spec)


def shape_str(s) -> str:
    if s is None:
        return "–"
    return "[" + ", ".join(str(int(d)) for d in s) + "]"


def table(rows: list[tuple], header: tuple | None = None, cls: str = "wb-table") -> str:
    """A small HTML table; cells are escaped unless given as ``("html", markup)``."""
    def cell(v, tag="td"):
        if isinstance(v, tuple) and len(v) == 2 and v[0] == "html":
            return f"<{tag}>{v[1]}</{tag}>"
        return f"<{tag}>{html.escape(str(v))}</{tag}>"
    out = [f'<table class="{cls}" style="border-collapse:collapse;font-family:monospace;font-size:12px">']
    if header:
        out.append("<tr>" + "".join(cell(h, "th") for h in header) + "</tr>")
    for r in rows:
        out.append("<tr>" + "".join(cell(v) for v in r) + "</tr>")
    out.append("</table>")
    return "".join(out)


def headroom_bar(frac: float | None, label: str) -> str:
    """An inline bar showing how much of a dtype's range an activation uses."""
    if frac is None:
        pct, txt, color = 0.0, "–", "#eee"
    elif not math.isfinite(frac):
        pct, txt, color = 100.0, "overflow", "#c00"
    else:
        pct = min(100.0, max(0.0, frac * 100.0))
        txt = f"{frac:.2%}" if frac >= 1e-4 else f"{frac:.1e}"
        color = "#c00" if frac >= 0.5 else "#e90" if frac >= 0.1 else "#393"
    return (f'<span style="display:inline-block;width:50px">{abbr(label)}</span>'
            f'<span style="display:inline-block;width:160px;height:9px;background:#eee;vertical-align:middle">'
            f'<span style="display:block;width:{max(pct, 0.5):.1f}%;height:9px;background:{color}"></span></span>'
            f' <span style="font-family:monospace">{txt}</span>')


def figure_png(fig, dpi: int = 90) -> bytes:
    """A matplotlib Figure (from workbench.plots) as PNG bytes, without pyplot."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if fig.canvas is None or not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()
