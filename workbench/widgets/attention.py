"""AttentionView: one head's attention pattern as a grid of token-labelled cells, with hover.

    AttentionView(pattern, tokens_q, tokens_k)          # pattern [H, T, S] or [T, S], 0..1
    AttentionView.from_trace(trace, layer=1, head=0)    # layer 1's probabilities (see below)

Rows are query tokens (the token that attends), columns key tokens (the tokens it reads
from); each row sums to 1.  Cells are coloured white (0) to dark blue (1): probabilities
have no sign, so the colour map is sequential, never a diverging red/blue one.  A masked
cell (exactly 0: a key after the query, or outside a sliding window) is hatched, not
coloured; a NaN or infinite cell is bright green.  Hovering a cell shows
``query token → key token: p = 0.123``; the selector above the grid picks the head.

The view is an anywidget: its JavaScript is the ESM module below, as a Python string (no
build step), in the spirit of CircuitsVis.  It holds no logic: the pattern travels as
float32 bytes (``pattern``, C order, ``shape`` = [H, T, S]) with the token labels, and the
page only draws them.  Up to ~64 tokens fit at a readable size; beyond that the grid keeps
its cell size and scrolls, with the token labels pinned to its edges.  All heads travel
with the view, so switching heads needs no kernel (also in a notebook opened unexecuted).
"""
from __future__ import annotations

import anywidget
import numpy as np
import traitlets as T

from workbench.arrays import as_ndim
from workbench.trace.heads import context_op, probabilities
from workbench.trace.step import TraceError

#: the colour map of probabilities (sequential; matplotlib's name, sampled in Python)
CMAP = "Blues"

_ESM = r"""
const CSS_PREFIX = "wb-attn";

function label(tok) {
  let s = String(tok).replace(/\n/g, "⏎").replace(/\t/g, "⇥");
  if (s.trim() === "") s = s.replace(/ /g, "␣") || "∅";
  return s;
}
function short(s, n) { return s.length <= n ? s : s.slice(0, n - 1) + "…"; }
function fmtP(p) {
  if (Number.isNaN(p)) return "NaN";
  if (!Number.isFinite(p)) return p > 0 ? "+inf" : "-inf";
  if (p === 0) return "0 (masked)";
  if (Math.abs(p) < 0.001) return p.toExponential(1);
  return p.toFixed(3);
}
function floats(dv) {
  // the pattern bytes: a DataView (ipywidgets' binary buffer); copied so that the offset is aligned
  if (!dv || !dv.byteLength) return new Float32Array(0);
  const buf = dv.buffer.slice(dv.byteOffset, dv.byteOffset + dv.byteLength);
  return new Float32Array(buf);
}
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function render({ model, el: host }) {
  const root = el("div", CSS_PREFIX);
  host.appendChild(root);

  function draw() {
    root.innerHTML = "";
    const shape = model.get("shape") || [0, 0, 0];
    const [H, Tq, Tk] = shape;
    const data = floats(model.get("pattern"));
    const tq = model.get("tokens_q") || [];
    const tk = model.get("tokens_k") || [];
    const palette = model.get("palette") || [];
    const head = Math.min(Math.max(0, model.get("head") | 0), Math.max(0, H - 1));
    const cell = model.get("cell_px");

    // header: title, head selector
    const top = el("div", CSS_PREFIX + "-top");
    const title = model.get("title");
    if (title) top.appendChild(el("span", CSS_PREFIX + "-title", title));
    const sel = el("select", CSS_PREFIX + "-head");
    sel.title = "attention head (each head has its own pattern)";
    for (let h = 0; h < H; h++) {
      const o = el("option", null, "head " + h + " of " + H);
      o.value = String(h);
      if (h === head) o.selected = true;
      sel.appendChild(o);
    }
    sel.disabled = H <= 1;
    sel.addEventListener("change", () => {
      model.set("head", parseInt(sel.value, 10));
      model.save_changes();
    });
    top.appendChild(sel);
    root.appendChild(top);

    // legend: the colour scale and what blank / green cells mean
    const legend = el("div", CSS_PREFIX + "-legend");
    legend.appendChild(el("span", null, "p = 0 "));
    const bar = el("span", CSS_PREFIX + "-bar");
    if (palette.length) bar.style.background = "linear-gradient(to right, " +
      [0, 64, 128, 192, 255].map(i => palette[i]).join(", ") + ")";
    legend.appendChild(bar);
    legend.appendChild(el("span", null, " 1 (attention probability, each row sums to 1) · "));
    legend.appendChild(el("span", CSS_PREFIX + "-swatch " + CSS_PREFIX + "-masked"));
    legend.appendChild(el("span", null, " masked (exactly 0: a later key, or outside the window) · "));
    const g = el("span", CSS_PREFIX + "-swatch");
    g.style.background = "#00ff00";
    legend.appendChild(g);
    legend.appendChild(el("span", null, " NaN or ±inf (not a number / infinite)"));
    root.appendChild(legend);

    const hover = el("div", CSS_PREFIX + "-hover", "hover a cell: query token → key token: p");
    root.appendChild(hover);
    if (!H || !Tq || !Tk || data.length < H * Tq * Tk) {
      root.appendChild(el("div", null, "no attention pattern"));
      return;
    }

    // the grid: [corner | key labels] over [query labels | cells], labels pinned while scrolling
    const scroll = el("div", CSS_PREFIX + "-scroll");
    const grid = el("div", CSS_PREFIX + "-grid");
    const font = Math.max(8, Math.min(12, cell - 2));
    grid.style.fontSize = font + "px";
    grid.style.gridTemplateColumns = "auto " + (Tk * cell) + "px";
    const corner = el("div", CSS_PREFIX + "-corner", "query ↓ key →");
    corner.title = "rows: query tokens (the token attending); columns: key tokens (attended to)";
    grid.appendChild(corner);
    const cols = el("div", CSS_PREFIX + "-cols");
    const colEls = [];
    for (let j = 0; j < Tk; j++) {
      const t = label(tk[j] ?? "");
      const c = el("div", CSS_PREFIX + "-col", short(t, 14) + " " + j);
      c.style.width = cell + "px";
      c.title = "key #" + j + ": " + t;
      cols.appendChild(c);
      colEls.push(c);
    }
    grid.appendChild(cols);
    const rows = el("div", CSS_PREFIX + "-rows");
    const rowEls = [];
    for (let i = 0; i < Tq; i++) {
      const t = label(tq[i] ?? "");
      const r = el("div", CSS_PREFIX + "-row", i + " " + short(t, 14));
      r.style.height = cell + "px";
      r.style.lineHeight = cell + "px";
      r.title = "query #" + i + ": " + t;
      rows.appendChild(r);
      rowEls.push(r);
    }
    grid.appendChild(rows);

    const area = el("div", CSS_PREFIX + "-area");
    area.style.width = Tk * cell + "px";
    area.style.height = Tq * cell + "px";
    const canvas = el("canvas", CSS_PREFIX + "-cells");
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(Tk * cell * dpr);
    canvas.height = Math.round(Tq * cell * dpr);
    canvas.style.width = Tk * cell + "px";
    canvas.style.height = Tq * cell + "px";
    const ctx = canvas.getContext("2d");
    ctx.scale(dpr, dpr);
    const hatch = document.createElement("canvas");
    hatch.width = hatch.height = 6;
    const hc = hatch.getContext("2d");
    hc.fillStyle = "#ffffff"; hc.fillRect(0, 0, 6, 6);
    hc.strokeStyle = "#d0d0d0"; hc.lineWidth = 1;
    hc.beginPath(); hc.moveTo(0, 6); hc.lineTo(6, 0); hc.stroke();
    const masked = ctx.createPattern(hatch, "repeat");
    const base = head * Tq * Tk;
    for (let i = 0; i < Tq; i++) {
      for (let j = 0; j < Tk; j++) {
        const p = data[base + i * Tk + j];
        if (!Number.isFinite(p)) ctx.fillStyle = "#00ff00";
        else if (p === 0) ctx.fillStyle = masked;
        else ctx.fillStyle = palette[Math.max(0, Math.min(255, Math.round(p * 255)))] || "#000";
        ctx.fillRect(j * cell, i * cell, cell, cell);
      }
    }
    if (cell >= 8) {  // thin grid lines between cells
      ctx.strokeStyle = "rgba(255,255,255,0.6)"; ctx.lineWidth = 1;
      ctx.beginPath();
      for (let i = 1; i < Tq; i++) { ctx.moveTo(0, i * cell + 0.5); ctx.lineTo(Tk * cell, i * cell + 0.5); }
      for (let j = 1; j < Tk; j++) { ctx.moveTo(j * cell + 0.5, 0); ctx.lineTo(j * cell + 0.5, Tq * cell); }
      ctx.stroke();
    }
    area.appendChild(canvas);
    const cursor = el("div", CSS_PREFIX + "-cursor");
    cursor.style.width = cursor.style.height = cell + "px";
    area.appendChild(cursor);
    const tip = el("div", CSS_PREFIX + "-tip");
    area.appendChild(tip);
    grid.appendChild(area);
    scroll.appendChild(grid);
    root.appendChild(scroll);

    let last = null;
    function clear() {
      if (last) { rowEls[last[0]].classList.remove("on"); colEls[last[1]].classList.remove("on"); }
      last = null;
    }
    area.addEventListener("mousemove", (ev) => {
      const r = canvas.getBoundingClientRect();
      const j = Math.floor((ev.clientX - r.left) / cell), i = Math.floor((ev.clientY - r.top) / cell);
      if (i < 0 || j < 0 || i >= Tq || j >= Tk) return;
      if (last && last[0] === i && last[1] === j) return;
      clear();
      last = [i, j];
      rowEls[i].classList.add("on"); colEls[j].classList.add("on");
      const p = data[base + i * Tk + j];
      const text = label(tq[i] ?? "") + " → " + label(tk[j] ?? "") + ": p = " + fmtP(p);
      const where = "query #" + i + ", key #" + j + ", head " + head;
      hover.textContent = text + "  (" + where + ")";
      hover.dataset.query = String(i); hover.dataset.key = String(j);
      tip.textContent = text;
      cursor.style.display = "block";
      cursor.style.left = j * cell + "px"; cursor.style.top = i * cell + "px";
      tip.style.display = "block";  // beside the cell, flipped to stay inside the grid
      let x = (j + 1) * cell + 4, y = (i + 1) * cell + 2;
      if (x + tip.offsetWidth > Tk * cell) x = Math.max(0, j * cell - tip.offsetWidth - 4);
      if (y + tip.offsetHeight > Tq * cell) y = Math.max(0, i * cell - tip.offsetHeight - 2);
      tip.style.left = x + "px"; tip.style.top = y + "px";
    });
    area.addEventListener("mouseleave", () => {
      clear();
      cursor.style.display = "none"; tip.style.display = "none";
    });
  }

  model.on("change", draw);  // once per message from the kernel (Python sets the traits together)
  draw();
  return () => model.off("change", draw);
}

export default { render };
"""

_CSS = """
.wb-attn { font-family: monospace; font-size: 11px; color: #222; }
.wb-attn-top { display: flex; gap: 10px; align-items: center; margin-bottom: 3px; }
.wb-attn-title { font-weight: bold; }
.wb-attn-head { font-family: monospace; font-size: 11px; }
.wb-attn-legend { color: #555; margin-bottom: 3px; }
.wb-attn-bar { display: inline-block; width: 90px; height: 9px; vertical-align: middle; border: 1px solid #ccc; }
.wb-attn-swatch { display: inline-block; width: 10px; height: 10px; vertical-align: middle; border: 1px solid #ccc; }
.wb-attn-masked { background: repeating-linear-gradient(135deg, #fff 0 2px, #d0d0d0 2px 3px); }
.wb-attn-hover { min-height: 15px; margin-bottom: 3px; white-space: pre; }
.wb-attn-scroll { max-width: 100%; max-height: 760px; overflow: auto; border: 1px solid #eee;
                  display: inline-block; vertical-align: top; }
.wb-attn-grid { display: grid; background: #fff; }
.wb-attn-corner { position: sticky; left: 0; top: 0; z-index: 3; background: #fff; color: #888;
                  font-size: 9px; display: flex; align-items: flex-end; justify-content: flex-end; padding: 2px; }
.wb-attn-cols { display: flex; position: sticky; top: 0; z-index: 2; background: #fff; }
.wb-attn-col { writing-mode: vertical-rl; transform: rotate(180deg); white-space: pre; overflow: hidden;
               text-align: left; padding: 2px 0; box-sizing: border-box; display: flex; align-items: center; }
.wb-attn-rows { position: sticky; left: 0; z-index: 1; background: #fff; padding-right: 4px; }
.wb-attn-row { white-space: pre; text-align: right; overflow: hidden; }
.wb-attn-row.on, .wb-attn-col.on { background: #ffe9a8; font-weight: bold; }
.wb-attn-area { position: relative; }
.wb-attn-cells { display: block; image-rendering: pixelated; }
.wb-attn-cursor { position: absolute; display: none; box-sizing: border-box; border: 2px solid #e67e22;
                  pointer-events: none; }
.wb-attn-tip { position: absolute; display: none; pointer-events: none; background: #333; color: #fff;
               padding: 2px 5px; border-radius: 3px; white-space: pre; z-index: 4; font-size: 11px; }
"""


def _palette(cmap: str = CMAP) -> list[str]:
    from workbench.widgets._render import colour_table

    return ["#%02x%02x%02x" % tuple(int(c) for c in rgb) for rgb in colour_table(cmap)]


def _as_heads(pattern) -> np.ndarray:
    """[H, T, S] float32 from [H, T, S], [T, S] or [1, ..., H, T, S] (numpy or mlx)."""
    if not isinstance(pattern, np.ndarray):
        try:
            import mlx.core as mx
            if isinstance(pattern, mx.array):
                pattern = np.array(pattern.astype(mx.float32))
        except ImportError:  # pragma: no cover - mlx is a dependency
            pass
    a = np.asarray(pattern)
    if a.ndim < 2:
        raise ValueError(f"attention pattern: expected [H, T, S] or [T, S], got shape {list(a.shape)}")
    a = as_ndim(a, 3, "an attention pattern [H, T, S] or [T, S]")
    if a.dtype.kind not in "fiub":
        raise ValueError(f"attention pattern: expected numbers, got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype="<f4")


def _labels(tokens, n: int, what: str) -> list[str]:
    if tokens is None:
        return [str(i) for i in range(n)]
    tokens = [str(t) for t in tokens]
    if len(tokens) != n:
        raise ValueError(f"attention pattern: {len(tokens)} {what} tokens for {n} {what} positions")
    return tokens


def cell_px(t: int, s: int) -> int:
    """Cell size: ~640 px for the larger side, between 10 px (then the grid scrolls) and 28 px."""
    return int(max(10, min(28, 640 // max(1, t, s))))


class AttentionView(anywidget.AnyWidget):
    """An attention pattern (heads x queries x keys, probabilities) with token labels and hover."""

    _esm = T.Unicode(_ESM).tag(sync=True)
    _css = T.Unicode(_CSS).tag(sync=True)
    pattern = T.Bytes(b"").tag(sync=True)          # float32, C order, shape below
    shape = T.List(T.Int(), [0, 0, 0]).tag(sync=True)  # [H, T, S]
    tokens_q = T.List(T.Unicode()).tag(sync=True)
    tokens_k = T.List(T.Unicode()).tag(sync=True)
    head = T.Int(0).tag(sync=True)
    title = T.Unicode("").tag(sync=True)
    palette = T.List(T.Unicode()).tag(sync=True)   # 256 colours of CMAP, 0 -> 1
    cell_px = T.Int(16).tag(sync=True)

    def __init__(self, pattern, tokens_q=None, tokens_k=None, head: int = 0, title: str = "", **kw):
        super().__init__(palette=_palette(), **kw)
        self.add_class("wb-attention-view")
        self.show(pattern, tokens_q, tokens_k, head=head, title=title)

    def show(self, pattern, tokens_q=None, tokens_k=None, head: int | None = None, title: str | None = None):
        """Draw another pattern (same rules as the constructor); ``head`` None keeps the current
        head when it exists in the new pattern, else shows the last head."""
        a = _as_heads(pattern)
        h, t, s = a.shape
        q, k = _labels(tokens_q, t, "query"), _labels(tokens_k, s, "key")
        want = self.head if head is None else int(head)
        if head is not None and not 0 <= want < h:
            raise ValueError(f"attention pattern: head {want} out of range ({h} heads)")
        with self.hold_sync():
            self.pattern = a.tobytes()
            self.shape = [h, t, s]
            self.tokens_q, self.tokens_k = q, k
            self.head = min(max(0, want), h - 1)
            self.cell_px = cell_px(t, s)
            if title is not None:
                self.title = title
        return self

    @T.validate("head")
    def _valid_head(self, proposal):
        h = int(proposal["value"])
        n = self.shape[0] if self.shape else 0
        if n and not 0 <= h < n:
            raise T.TraitError(f"head {h} out of range ({n} heads)")
        return h

    # ------------------------------------------------------------------ reading the state back
    @property
    def num_heads(self) -> int:
        return int(self.shape[0])

    @property
    def patterns(self) -> np.ndarray:
        """Every head's pattern as shown, [H, T, S] float32."""
        return np.frombuffer(self.pattern, dtype="<f4").reshape(self.shape)

    @property
    def values(self) -> np.ndarray:
        """The shown head's pattern, [T, S] float32 (row = query, column = key)."""
        return self.patterns[self.head]

    # ------------------------------------------------------------------ from a trace
    @classmethod
    def from_trace(cls, trace, layer: int, head: int = 0, batch: int = 0, tokens=None) -> "AttentionView":
        """Layer ``layer``'s attention probabilities in ``trace`` (run past its attention):
        the ``layers.{layer}.self_attn.softmax`` step of an explicit layer (captured or
        recomputed), or, for fused attention (the default), recomputed from the queries and
        keys of ``layers.{layer}.self_attn.context`` for that layer only; token labels
        decoded with the trace's model (``tokens`` overrides them)."""
        name, a = attention_pattern_of(trace, layer, batch)
        tq, tk = token_labels(trace, a.shape[1], a.shape[2], batch, tokens)
        return cls(a, tq, tk, head=head, title=f"{name}")


def softmax_op(layer: int) -> str:
    return f"layers.{layer}.self_attn.softmax"


def module_note(trace) -> str | None:
    """Why a trace has no attention pattern to draw, when that is its granularity (else None)."""
    if trace.granularity == "module":
        return ("module granularity: attention runs fused inside the self_attn module "
                "(mx.fast.scaled_dot_product_attention), so there is no softmax step and no pattern to draw")
    return None


def pattern_op(trace, layer: int) -> str | None:
    """The op after which layer ``layer``'s pattern can be drawn: its softmax step (explicit
    attention), its fused attention op (probabilities recomputed), or None (no such op)."""
    for name in (softmax_op(layer), context_op(layer)):
        if name in trace.program and (name == softmax_op(layer) or trace.program[name].kind == "attention"):
            return name
    return None


def attention_pattern_of(trace, layer: int, batch: int = 0) -> tuple[str, np.ndarray]:
    """(op name, [H, T, S] float32) of layer ``layer``'s attention probabilities in ``trace``
    (:func:`workbench.trace.heads.probabilities`: the softmax step, or recomputed for a
    fused layer; the name is then the fused op's)."""
    name = softmax_op(layer)
    why = module_note(trace)
    if why is not None or pattern_op(trace, layer) is None:
        raise ValueError(f"{name}: no such op in this trace" + (f" ({why})" if why else " (see trace.ops)"))
    try:
        name, v = probabilities(trace, layer)
    except TraceError as e:
        raise ValueError(str(e)) from None
    a = np.asarray(_as_heads_batched(v))
    if a.ndim == 4:
        if not 0 <= batch < a.shape[0]:
            raise ValueError(f"{name}: batch row {batch} out of range ({a.shape[0]} rows)")
        a = a[batch]
    return name, _as_heads(a)


def _as_heads_batched(v):
    import mlx.core as mx

    if isinstance(v, mx.array):
        return np.array(v.astype(mx.float32))
    return np.asarray(v, dtype=np.float32)


def token_labels(trace, t: int, s: int, batch: int = 0, tokens=None) -> tuple[list[str], list[str]]:
    """Query and key labels for a [T, S] pattern of ``trace``: its decoded tokens (the last T
    for queries); keys before the trace's own tokens (a KV cache) are labelled ``cache #i``.
    Positions as text when the model cannot decode."""
    if tokens is None:
        tokens = decoded_tokens(trace, batch)
    if tokens is None:
        return [str(i) for i in range(s - t, s)], [str(j) for j in range(s)]
    tokens = list(tokens)
    q = tokens[-t:] if len(tokens) >= t else [str(i) for i in range(s - t, s)]
    if len(tokens) >= s:
        k = tokens[-s:]
    else:
        k = [f"cache #{j}" for j in range(s - len(tokens))] + tokens
    return q, k


def decoded_tokens(trace, batch: int = 0) -> list[str] | None:
    """One string per input token of ``trace`` (its model's tokenizer), or None."""
    model = getattr(trace, "model", None)
    ids = getattr(trace, "ids", None)
    if model is None or ids is None or getattr(model, "tokenizer", None) is None:
        return None
    try:
        rows = ids.tolist()
        row = rows[batch] if ids.ndim == 2 else rows
        return [model.decode([int(i)]) for i in row]
    except Exception:  # noqa: BLE001 - a tokenizer that cannot decode single ids: no labels
        return None
