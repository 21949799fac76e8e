"""WeightBrowser: a checkpoint's tensors as component -> layer -> tensor, problems marked.

A view over the inspector's :class:`Report` (``workbench.inspect(path, values=True)``)::

    WeightBrowser(workbench.inspect("model/", values=True))

Left: pick a component, a layer ("·" for tensors outside the layers) and a tensor; a
tensor with a problem is marked ``✗`` (missing: expected by the config, not in the
files) or ``!`` (present but wrong: unexpected, shape, dtype, quantization, non-finite).
Right: the tensor's record (file, byte offset, dtype, shape; with ``values=True`` its
statistics), its problems with the inspector's suggestion, and a histogram of its values
(:func:`workbench.plots.weight_histogram`; quantized weights are dequantized for it).
Below: a layers x tensors heatmap of one statistic (pick it) from the report — a layer
whose norm weights or projections look unlike their neighbours stands out at once.
"""
from __future__ import annotations

import html
import math
import re
from collections import OrderedDict

import ipywidgets as W
import numpy as np
from IPython.display import HTML, Image

from workbench.widgets._actions import Actions
from workbench.widgets.saved import text_form
from workbench.widgets._render import GLOSSARY, abbr, fmt, table

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")
GLOBAL = "·"
STATS = ("std", "absmax", "mean", "min", "max", "zero_frac")
_BAD_CODES = {"missing-tensor": "✗"}
#: the layer list's "·", said where it shows
GLOSSARY_LAYER = f"{GLOBAL} = tensors outside the layers (embeddings, final norm)"


def _parts(name: str) -> tuple[int | None, str]:
    m = _LAYER.search(name)
    if m:
        return int(m.group(1)), m.group(2)
    return None, name


class WeightBrowser(W.VBox):
    """Browse an inspection report's tensors with the inspector's problems marked."""

    def __repr__(self) -> str:  # the text a page without the widget manager shows
        return text_form(self)

    def __init__(self, report, stat: str = "std"):
        self.report = report
        d = report.to_dict()
        self._tensors = {t["name"]: t for t in d.get("tensors", [])}
        self._problems: dict[str, list[dict]] = {}
        for p in d["problems"]:
            key = p.get("tensor") or "(checkpoint)"
            self._problems.setdefault(key, []).append(p)
        # component -> layer -> [tensor names]; missing tensors (expected, absent) are listed too
        tree: dict[str, dict] = OrderedDict()
        for name, t in self._tensors.items():
            layer, _ = _parts(t.get("canonical") or name)
            tree.setdefault(t.get("component", "language_model"), {}).setdefault(layer, []).append(name)
        for p in d["problems"]:
            n = p.get("tensor")
            if n and n not in self._tensors and p["code"] == "missing-tensor":
                layer, _ = _parts(n)
                lst = tree.setdefault("language_model", {}).setdefault(layer if layer is not None else p.get("layer"), [])
                if n not in lst:
                    lst.append(n)
        self._tree = tree
        n_err = sum(p["severity"] == "error" for p in d["problems"])
        n_warn = len(d["problems"]) - n_err
        status = ("<b style='color:#393'>OK</b>" if d["ok"] else f"<b style='color:#c00'>{n_err} error(s)</b>")
        comps = ", ".join(f"{k} {v}" for k, v in d["components"].items())
        self.summary = W.HTML(
            f"{status}{f', {n_warn} warning(s)' if n_warn else ''} — {html.escape(str(d['model_type']))}, "
            f"{d['num_layers']} layers; components: {html.escape(comps)}; quantization: "
            f"{html.escape(self._quant_str(d['quantization']))}"
            + ("" if self._has_values() else " <i>(inspect with values=True for statistics)</i>"))
        self.summary.add_class("wb-weights-summary")
        self.problems_html = W.HTML(self._problems_html(d["problems"]))
        self.problems_html.add_class("wb-weights-problems")

        self.component = W.Dropdown(options=list(tree), description="component", layout=W.Layout(width="330px"))
        self.layer = W.Select(rows=10, layout=W.Layout(width="110px"))
        self.tensor = W.Select(rows=10, layout=W.Layout(width="420px"))
        self.tensor.add_class("wb-weights-tensor")
        self.component.add_class("wb-weights-component")
        self.layer.add_class("wb-weights-layer")
        self.detail = W.Output(layout=W.Layout(width="100%"))
        self.detail.add_class("wb-weights-detail")
        self.stat = W.Dropdown(options=STATS, value=stat if stat in STATS else "std",
                               description="statistic", layout=W.Layout(width="220px"),
                               tooltip="; ".join(f"{k}: {GLOSSARY[k]}" for k in STATS))
        self.stat.add_class("wb-weights-stat")
        self.grid = W.HTML()
        self.grid.add_class("wb-weights-grid")
        self.actions = act = Actions()
        self.component.observe(act("pick a component", lambda ch: self._fill_layers()), names="value")
        self.layer.observe(act("pick a layer", lambda ch: self._fill_tensors()), names="value")
        self.tensor.observe(act("pick a tensor", lambda ch: self._show()), names="value")
        self.stat.observe(act("pick a statistic", lambda ch: self._draw_grid()), names="value")
        self.legend = W.HTML(f"<span style='color:#555;font-size:90%'>{abbr('✗')} missing · {abbr('!')} problem · "
                             f"{GLOSSARY_LAYER} (hover a marked word for its meaning)</span>")
        self.legend.add_class("wb-weights-legend")
        tree_box = W.VBox([self.component, W.HBox([self.layer, self.tensor]), self.legend])
        super().__init__([self.summary, self.problems_html, act.area, W.HBox([tree_box, self.detail]), self.stat,
                          self.grid])
        self.add_class("wb-weight-browser")
        self._fill_layers()
        first_bad = next((p.get("tensor") for p in d["problems"] if p.get("tensor")), None)
        if first_bad:
            self.select(first_bad)
        self._draw_grid()

    # ------------------------------------------------------------------ helpers
    def _has_values(self) -> bool:
        return any(t.get("stats") for t in self._tensors.values())

    @staticmethod
    def _quant_str(q) -> str:
        if not q or (isinstance(q, dict) and q.get("mode") is None and q.get("bits") is None):
            return "none"
        if isinstance(q, dict):
            keys = [k for k in ("mode", "bits", "group_size") if k in q]
            if keys:
                return " ".join(f"{k}={q[k]}" for k in keys)
        return str(q)[:80]

    def _problems_html(self, problems) -> str:
        if not problems:
            return "<span style='color:#393'>no problems</span>"
        rows = []
        for p in problems:
            color = "#c00" if p["severity"] == "error" else "#b60"
            sug = f" → did you mean <code>{html.escape(p['suggestion'])}</code>?" if p.get("suggestion") else ""
            rows.append((("html", f"<span style='color:{color}'>{p['severity']}</span>"),
                         ("html", f"<code>{p['code']}</code>"),
                         ("html", html.escape(p["message"]) + sug)))
        return table(rows, ("", "code", "problem"))

    def _mark(self, name: str) -> str:
        ps = self._problems.get(name)
        if not ps:
            return "  "
        return _BAD_CODES.get(ps[0]["code"], "!") + " "

    def _layer_label(self, layer) -> str:
        return GLOBAL if layer is None else str(layer)

    def _fill_layers(self) -> None:
        layers = self._tree.get(self.component.value, {})
        opts = []
        for layer in sorted(layers, key=lambda x: (-1 if x is None else x)):
            bad = any(n in self._problems for n in layers[layer])
            opts.append((("! " if bad else "  ") + self._layer_label(layer), layer))
        self.layer.options = opts
        if opts:
            self.layer.value = opts[0][1]
        self._fill_tensors()

    def _fill_tensors(self) -> None:
        names = sorted(self._tree.get(self.component.value, {}).get(self.layer.value, []))
        self.tensor.options = [(self._mark(n) + n, n) for n in names]
        if names and self.tensor.value not in names:
            self.tensor.value = names[0]

    # ------------------------------------------------------------------ public
    def select(self, name: str) -> None:
        """Show one tensor (by its name as stored, or as reported in a problem)."""
        for comp, layers in self._tree.items():
            for layer, names in layers.items():
                if name in names:
                    self.component.value = comp
                    self.layer.value = layer
                    if self.tensor.value == name:
                        self._show()
                    else:
                        self.tensor.value = name
                    return
        raise KeyError(f"no tensor {name!r} in this report")

    def _show(self) -> None:
        name = self.tensor.value
        self.detail.outputs = ()
        if name is None:
            return
        t = self._tensors.get(name)
        ps = self._problems.get(name, [])
        if t is None:
            self.detail.append_stdout(f"{name}: expected by the config, not in the checkpoint\n")
        else:
            self.detail.append_stdout(f"{name}  {t['dtype']} {list(t['shape'])}  {t['file']} @ byte {t['offset']}\n")
        for p in ps:
            self.detail.append_stdout(f"  {p['severity']} {p['code']}: {p['message']}"
                                      + (f" (suggestion: {p['suggestion']})" if p.get("suggestion") else "") + "\n")
        if t is None:
            return
        st = t.get("stats")
        if st:
            rows = [(("html", abbr(k)), fmt(st.get(k))) for k in ("min", "max", "mean", "std", "absmax")]
            rows.append((("html", f"{abbr('NaN')} / {abbr('+inf')} / {abbr('−inf')}"),
                         f"{st.get('nan', 0)} / {st.get('posinf', 0)} / {st.get('neginf', 0)}"))
            rows.append((("html", abbr("zeros")), f"{(st.get('zero_frac') or 0):.2%}"))
            self.detail.append_display_data(HTML(table(rows)))
        v = self._values(t)
        if v is not None:
            from workbench.plots import weight_histogram
            from workbench.widgets._render import figure_png

            fig = weight_histogram(v, name=name)
            self.detail.append_display_data(Image(figure_png(fig, dpi=70)))

    def _values(self, t):
        """The tensor's values (dequantized when packed, by workbench.plots.weight_values), or None."""
        if t["dtype"] not in ("F32", "F16", "BF16", "U32", "U8", "F64") or int(np.prod(t["shape"] or [1])) == 0:
            return None
        if t["dtype"] in ("U32", "U8") and not (t.get("canonical") or t["name"]).endswith(".weight"):
            return None
        from workbench.checkpoint import CheckpointError, open_checkpoint
        from workbench.plots import weight_values
        try:
            ck = getattr(self, "_ck", None)
            if ck is None:
                ck = self._ck = open_checkpoint(self.report.path)
            return weight_values(ck, t.get("canonical") or t["name"])
        except (CheckpointError, ValueError, KeyError, RuntimeError) as e:
            self.detail.append_stdout(f"  (values not shown: {e})\n")
            return None

    def _draw_grid(self) -> None:
        """Layers x tensors heatmap of one statistic (HTML table; hover a cell for its value)."""
        stat = self.stat.value
        cells: dict[int, dict[str, float]] = {}
        status: dict[int, dict[str, str]] = {}
        cols: list[str] = []
        for name, t in self._tensors.items():
            layer, rest = _parts(t.get("canonical") or name)
            if layer is None or t.get("component", "language_model") != "language_model":
                continue
            if rest not in cols:
                cols.append(rest)
            st = t.get("stats")
            if st and st.get(stat) is not None:
                cells.setdefault(layer, {})[rest] = float(st[stat])
            if name in self._problems:
                status.setdefault(layer, {})[rest] = "!"
        for n, ps in self._problems.items():
            layer, rest = _parts(n)
            if layer is not None and any(p["code"] == "missing-tensor" for p in ps):
                rest = re.sub(r"^(model\.|language_model\.)+", "", rest)
                if rest not in cols:
                    cols.append(rest)
                status.setdefault(layer, {})[rest] = "✗"
        layers = sorted(set(cells) | set(status))
        if not layers:
            self.grid.value = "<i>no per-layer tensors</i>"
            return
        cols = [c for c in cols if not c.endswith((".scales", ".biases"))]
        # colour per column: each column normalised by its own range (tensors differ in scale)
        out = ["<div style='overflow:auto'><table style='border-collapse:collapse;font-family:monospace;"
               "font-size:10px'><tr><th></th>"]
        short = [c.replace(".weight", "").replace("self_attn.", "attn.") for c in cols]
        out += [f"<th style='writing-mode:vertical-rl;transform:rotate(180deg);padding:2px'>{html.escape(s)}</th>"
                for s in short]
        out.append("</tr>")
        col_rng = {}
        for c in cols:
            vs = [cells[l][c] for l in layers if c in cells.get(l, {}) and math.isfinite(cells[l][c])]
            col_rng[c] = (min(vs), max(vs)) if vs else (0.0, 0.0)
        for l in layers:
            out.append(f"<tr><th style='padding:0 4px'>layer {l}</th>")
            for c in cols:
                mark = status.get(l, {}).get(c)
                v = cells.get(l, {}).get(c)
                if mark:
                    out.append(f"<td title='{html.escape(c)}: {'missing' if mark == '✗' else 'problem'}' "
                               f"style='background:#fdd;color:#c00;text-align:center;width:18px'>{mark}</td>")
                elif v is None:
                    out.append("<td style='background:#f6f6f6;width:18px'></td>")
                elif not math.isfinite(v):
                    out.append(f"<td title='{html.escape(c)}: {v}' style='background:#0c0;width:18px'></td>")
                else:
                    lo, hi = col_rng[c]
                    x = 0.5 if hi <= lo else (v - lo) / (hi - lo)
                    r, g, b = (int(255 - 180 * x), int(255 - 120 * x), 255)
                    out.append(f"<td title='layers.{l}.{html.escape(c)} {stat} = {v:.4g}' "
                               f"style='background:rgb({r},{g},{b});width:18px;height:14px'></td>")
            out.append("</tr>")
        out.append("</table></div>")
        self.grid.value = (f"<b>{html.escape(stat)} per layer and tensor</b> (each column scaled to its own range; "
                           f"dark = high; {abbr('✗')} missing, {abbr('!')} problem; hover for values)<br>"
                           f"<span style='color:#555;font-size:90%'>{html.escape(stat)} = {html.escape(GLOSSARY[stat])};"
                           f" {abbr('attn')} = self_attn; {abbr('q/k/v/o_proj')} = query/key/value/output "
                           f"projections</span>" + "".join(out))
