"""StepDebugger: drive a Trace op by op and see every value as it is made.

    tr = workbench.trace(model, "the cat sat", capture="full")
    StepDebugger(tr)

Buttons: start (back to op #0) · back · step · step over layer (to the next layer boundary:
the end of the embedding ops, then the residual stream ``layers.{i}`` that ends each layer)
· next non-finite (stops at the next op whose output holds a NaN or an infinity, and
explains the first one) · end (run every remaining op) · run to an op.  "run to" takes a
full op name only: a name that is no op (a typo) runs nothing and the closest names are
suggested under the box (:func:`workbench.trace.navigate.find_op`).

A view drawn from a notebook's saved state (no kernel behind it) cannot run anything: the
committed notebooks save it with its buttons disabled and the line "run the cell to use
the buttons" (:func:`workbench.widgets.saved.mark_unrun`), and its text form says so too.

Shown for the current op (the last one run): its name, kind, layer, input and output
shapes; statistics and the fraction of float16's and bfloat16's range its largest value
uses (the headroom: close to 100% means about to overflow); a heatmap of the value
(tokens x channels; red/blue around zero for signed values, white to dark blue for
non-negative ones such as probabilities; non-finite cells bright green); on the attention
ops of a layer once its softmax ran (or its fused attention op: the probabilities are then
recomputed for that layer, within the page's size limit), the attention pattern with token
labels and hover (:class:`~workbench.widgets.attention.AttentionView`; pick the head); and
the residual-stream norm of every layer so far.  At module granularity attention is fused
inside a module (no step to recompute from): a one-line note says so instead.  Every abbreviation shown has a
tooltip (hover it).
A log (an Output widget) records every action.  Ops are numbered from 0, as
``Step.index`` and the NaN hunt number them: the header, the log and the hunt all say
``op #23`` for the 24th op.  Buttons work from any thread and show their errors in the
widget (:mod:`workbench.widgets._actions`).

The buttons' actions (the walk) are debugger_walk.py; this file builds the widgets and draws.
The widget only calls the Trace's public API (``step``, ``run``, ``back``, ``reset``,
``value``, ``stats``, ``first_nonfinite``) and :mod:`workbench.trace.navigate`, and draws
what comes back.  Values are shown when the
trace has them: use ``capture="full"`` (or patterns) to see every heatmap; with
``capture="stats"`` only the ops still live are drawn.
"""
from __future__ import annotations

import html
import math
import re

import ipywidgets as W
import numpy as np

from workbench.widgets._actions import Actions
from workbench.widgets.debugger_walk import CHUNK, DebuggerWalk  # noqa: F401  (CHUNK re-exported)
from workbench.widgets.saved import text_form
from workbench.widgets._render import (BF16_MAX, colour_table, FP16_MAX, abbr, as_2d, fmt, headroom_bar, heatmap, shape_str,
                                       table)
from workbench.trace.heads import context_op, probabilities
from workbench.widgets.attention import (AttentionView, decoded_tokens, module_note, pattern_op, softmax_op,
                                         token_labels)

_RESID = re.compile(r"^layers\.(\d+)$")
#: an attention step: op-program ops under ``self_attn``, or a module-level attention module call
_ATTN = re.compile(r"^layers\.(\d+)\.(?:self_attn|attention|attn)(?:\.|$)")

#: the numbering, said once in the header (the same as Step.index, the log and the NaN hunt)
_NUMBERING = "<br><span style='color:#777;font-size:90%'>ops are numbered #0 to #{last}, as Step.index</span>"

ATTENTION_MAX_BYTES = 64 * 2**20  # an attention pattern larger than this is not sent to the page


#: the steps whose rows are the head's positions (op programs: lm_head, logits; module level: logits)
_HEAD_OPS = ("lm_head", "logits")


def _to_numpy(v) -> np.ndarray:
    if isinstance(v, np.ndarray):
        return v
    import mlx.core as mx
    if v.dtype != mx.float32 and mx.issubdtype(v.dtype, mx.floating):
        v = v.astype(mx.float32)
    return np.array(v)


class StepDebugger(DebuggerWalk, W.VBox):
    """Step through a :class:`workbench.trace.Trace` with buttons; see each op's value (the
    buttons' actions: :class:`~workbench.widgets.debugger_walk.DebuggerWalk`; here the
    widgets and their drawing)."""

    def __init__(self, trace, tokens: list[str] | None = None, head: int = 0):
        self.trace = trace
        self.tokens = tokens if tokens is not None else self._tokens()
        self.last_update_s = 0.0
        colour_table("RdBu_r"), colour_table("Blues")  # colour tables ready before the first click

        b = lambda desc, icon, cls, tip: self._button(desc, icon, cls, tip)  # noqa: E731
        self.start_button = b("start", "fast-backward", "wb-start", "back to the start (op #0 not run yet)")
        self.back_button = b("back", "step-backward", "wb-back", "undo the last op")
        self.step_button = b("step", "step-forward", "wb-step", "run the next op")
        self.layer_button = b("step over layer", "forward", "wb-step-layer",
                              "run to the next layer boundary (the end of the embedding, then each layer)")
        self.nonfinite_button = b("next non-finite", "exclamation-triangle", "wb-next-nonfinite",
                                  "run until an op's output holds NaN or Inf")
        self.end_button = b("end", "fast-forward", "wb-run-end", "run every remaining op")
        # any text reaches Python (ensure_option would keep the last valid name typed, a prefix)
        self.target = W.Combobox(placeholder="op name, e.g. layers.1.self_attn.context",
                                 options=list(trace.ops), ensure_option=False, layout=W.Layout(width="330px"))
        self.target.add_class("wb-target")
        self.run_to_button = b("run to", "play", "wb-run-to", "run through the op named on the left (a full name)")
        self.target_hint = W.HTML()  # "no op named ...; did you mean ..." after a name that is no op
        self.target_hint.add_class("wb-target-hint")
        self.actions = act = Actions(redraw=self.refresh)
        self.start_button.on_click(act("start", lambda _: self.start()))
        self.back_button.on_click(act("back", lambda _: self.back()))
        self.step_button.on_click(act("step", lambda _: self.step()))
        self.layer_button.on_click(act("step over layer", lambda _: self.step_layer()))
        self.nonfinite_button.on_click(act("next non-finite", lambda _: self.next_nonfinite()))
        self.end_button.on_click(act("end", lambda _: self.run_to(None)))
        self.run_to_button.on_click(act("run to", lambda _: self.run_to(self.target.value or "")))

        self.progress = W.IntProgress(value=0, min=0, max=len(trace.ops), description="",
                                      layout=W.Layout(width="100%", height="10px"))
        self.progress.add_class("wb-progress")
        self.current = W.HTML()
        self.current.add_class("wb-current")
        self.stats_html = W.HTML()
        self.stats_html.add_class("wb-stats")
        self.heatmap = W.Image(format="png", layout=W.Layout(max_width="100%", object_fit="contain"))
        self.heatmap.add_class("wb-heatmap")
        self.heatmap_note = W.HTML()
        # the attention panel: the pattern (its own head selector, drawn in the page) or a note
        self._head0 = head  # the head shown first, once a pattern with that many heads appears
        self.attention = AttentionView(np.zeros((1, 1, 1), np.float32), [""], [""])
        self.attention.add_class("wb-attention")
        self.attention.layout.display = "none"
        self.attention_note = W.HTML()
        self.attention_note.add_class("wb-attention-note")
        self.attention_box = W.VBox([self.attention_note, self.attention])
        self.norms_html = W.HTML()
        self.norms_html.add_class("wb-residual-norms")
        self.output = W.Output(layout=W.Layout(max_height="160px", overflow="auto", border="1px solid #ddd"))
        self.output.add_class("wb-log")

        controls = W.HBox([self.start_button, self.back_button, self.step_button, self.layer_button,
                           self.nonfinite_button, self.end_button, self.target, self.run_to_button],
                          layout=W.Layout(flex_flow="row wrap"))
        left = W.VBox([self.stats_html, self.norms_html], layout=W.Layout(width="46%"))
        right = W.VBox([self.heatmap_note, self.heatmap, self.attention_box], layout=W.Layout(width="54%"))
        super().__init__([controls, self.target_hint, self.progress, self.current, act.area, W.HBox([left, right]),
                          self.output])
        self.add_class("wb-step-debugger")
        self.refresh()

    def __repr__(self) -> str:  # the text a page without the widget manager shows
        return text_form(self)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _button(desc, icon, cls, tip):
        btn = W.Button(description=desc, icon=icon, tooltip=tip, layout=W.Layout(width="auto"))
        btn.add_class(cls)
        return btn

    def _tokens(self):
        return decoded_tokens(self.trace)

    @property
    def current_step(self):
        steps = self.trace.steps
        return steps[-1] if steps else None

    def _residual_norms(self) -> dict[int, float]:
        """Layer -> RMS over tokens of ‖layers.{i}‖, from the statistics of the steps run so far."""
        norms = {}
        for s in self.trace.steps:
            m = _RESID.match(s.name)
            if m and s.stats and s.stats.get("std") is not None and s.output_shape:
                st = s.stats
                ms = (st["std"] or 0.0) ** 2 + (st["mean"] or 0.0) ** 2
                norms[int(m.group(1))] = math.sqrt(s.output_shape[-1] * ms) if math.isfinite(ms) else float("nan")
        return norms

    # ------------------------------------------------------------------ drawing
    def refresh(self) -> None:
        """Redraw everything from the trace's state (after every action; call it after
        changing the trace from code, e.g. ``trace.reset()``)."""
        tr = self.trace
        s = self.current_step
        self.progress.value = tr.position
        self._busy(False)
        n = len(tr.ops)
        if s is None:
            nxt = tr.program[0]
            self.current.value = (f"<b>ready</b>: 0 of {n} ops run; next: op #0 <code>{html.escape(nxt.name)}</code> "
                                  f"({html.escape(nxt.kind)}){_NUMBERING.format(last=n - 1)}")
            self.stats_html.value = ""
            self.heatmap.value = b""
            self.heatmap_note.value = ""
            self.attention_box.layout.display = "none"
            self._draw_norms()
            return
        nxt = "" if tr.done else f"; next: op #{tr.position} <code>{html.escape(tr.ops[tr.position])}</code>"
        layer = f", layer {s.layer}" if s.layer is not None else ""
        ins = ", ".join(shape_str(x) for x in s.input_shapes) or "–"
        bad = " <b style='color:#c00'>non-finite!</b>" if s.nonfinite else ""
        iv = (f"<br><i>intervened: {html.escape('; '.join(s.intervened))}</i>" if s.intervened else "")
        rows = getattr(tr, "logit_rows", None)
        if rows is not None and s.name in _HEAD_OPS:  # the head's rows: which positions they are
            iv += (f"<br><i>rows: the logits at {html.escape(rows.describe())}"
                   + (f" ({html.escape(rows.note)})" if rows.note else "") + "</i>")
        elif getattr(tr, "pruned", None) is not None and tr.pruned_at(s.name):
            iv += f"<br><i>rows: pruned, {html.escape(tr.pruned.describe())}</i>"
        self.current.value = (
            f"<b>op #{s.index}</b>: <code style='font-size:110%'><b>{html.escape(s.name)}</b></code> "
            f"({html.escape(s.kind)}{layer}){bad}<br>in {ins} → out {shape_str(s.output_shape)} {s.dtype}"
            f"<br>{tr.position} of {n} ops run{nxt}{iv}{_NUMBERING.format(last=n - 1)}")
        self._draw_stats(s)
        self._draw_value(s)
        self._draw_attention()
        self._draw_norms()

    def _draw_stats(self, s) -> None:
        st = s.stats
        if st is None:
            try:
                st = self.trace.stats(s.name)
            except KeyError:
                st = None
        if not st:
            self.stats_html.value = "<i>no statistics (capture=None)</i>"
            return
        rows = [(("html", abbr(k)), v) for k, v in (
            ("min", fmt(st["min"])), ("max", fmt(st["max"])), ("mean", fmt(st["mean"])), ("std", fmt(st["std"])),
            ("absmax", fmt(st["absmax"])), ("zeros", f"{st['zero_frac']:.1%}"))]
        nf = (st["nan"], st["posinf"], st["neginf"])
        color = "#c00" if any(nf) else "#393"
        rows.append((("html", f"{abbr('NaN')} / {abbr('+inf')} / {abbr('−inf')}"),
                     ("html", f"<span style='color:{color}'>{nf[0]} / {nf[1]} / {nf[2]}</span>")))
        am = st["absmax"]
        inf = bool(st["posinf"] or st["neginf"])
        f16 = float("inf") if inf else (am / FP16_MAX if am is not None and math.isfinite(am) else None)
        b16 = float("inf") if inf else (am / BF16_MAX if am is not None and math.isfinite(am) else None)
        b16_note = ""
        if inf and s.dtype == "float16":  # infinite because of float16's range: bfloat16's is unknown here
            b16, b16_note = None, " <i>(unknown: infinite in this float16 run)</i>"
        self.stats_html.value = (table(rows) + f"<div style='margin-top:4px'><b>{abbr('headroom')}</b> "
                                 f"({abbr('absmax')} / the dtype's largest finite value)</div>"
                                 + headroom_bar(f16, "fp16") + "<br>" + headroom_bar(b16, "bf16") + b16_note
                                 + "<div style='height:6px'></div>")

    def _value(self, name):
        try:
            return _to_numpy(self.trace.value(name))
        except KeyError:
            return None

    def _draw_value(self, s) -> None:
        v = self._value(s.name)
        if v is None:
            self.heatmap.value = b""
            self.heatmap_note.value = ("<i>value not kept (trace with capture='full' to see every op's "
                                       "heatmap)</i>")
            return
        if v.dtype.kind not in "fiub" or v.size == 0:
            self.heatmap.value = b""
            self.heatmap_note.value = f"<i>{v.dtype} value, not drawn</i>"
            return
        a, note = as_2d(v)
        finite = a[np.isfinite(a)]
        fin = np.abs(finite)
        vmax = float(np.percentile(fin, 99.5)) if fin.size else 1.0
        if not vmax > 0:
            vmax = float(fin.max()) if fin.size and fin.max() > 0 else 1.0
        signed = bool(finite.size and finite.min() < 0)
        if signed:  # a diverging map around zero
            png, w, h = heatmap(a, cmap="RdBu_r", symmetric=True, vmax=vmax, target_width=560, target_height=200)
            scale = f"blue &lt; 0 &lt; red, colours clipped at ±{vmax:.3g}"
        else:  # non-negative (probabilities, magnitudes): a sequential map from 0
            png, w, h = heatmap(a, cmap="Blues", symmetric=False,
                                vmin=0.0, vmax=vmax, target_width=560, target_height=200)
            scale = f"non-negative values: white = 0 to dark blue = {vmax:.3g} and above"
        self.heatmap.value = png
        self.heatmap.layout.width, self.heatmap.layout.height = f"{w}px", f"{h}px"
        self.heatmap_note.value = (f"<b>value</b> {shape_str(v.shape)} as {a.shape[0]} rows × {a.shape[1]} "
                                   f"columns ({scale}, the 99.5th percentile of |x|; green = {abbr('NaN')} or "
                                   f"{abbr('+inf', 'Inf')})" + (f"; {html.escape(note)}" if note else ""))

    def _attention_layer(self) -> int | None:
        """The layer of the current step when it is an attention step, else None."""
        s = self.current_step
        m = _ATTN.match(s.name) if s is not None else None
        return int(m.group(1)) if m else None

    def _draw_attention(self) -> None:
        layer = self._attention_layer()
        if layer is None:
            self.attention_box.layout.display = "none"
            return
        self.attention_box.layout.display = None
        name = pattern_op(self.trace, layer)
        why = module_note(self.trace)
        v = None
        if why is None:
            idx = None if name is None else self.trace.program.index(name)
            if idx is None:
                why = f"this program has no <code>{softmax_op(layer)}</code> op: no attention pattern to draw"
            elif idx >= self.trace.position:
                why = f"the attention pattern appears once op #{idx} <code>{name}</code> has run"
            elif name == softmax_op(layer):
                v = self._value(name)
                if v is None:
                    why = (f"the value of <code>{name}</code> was not kept (trace with capture='full' "
                           f"or a pattern matching it to see the attention pattern)")
            else:  # fused attention: the probabilities of this layer, recomputed (small prompts)
                v = self._fused_pattern(layer)
                if v is None:
                    why = (f"<code>{name}</code> is fused and its probabilities would be too large to "
                           f"recompute here; trace with attention=[{layer}] for this layer's softmax step")
                else:
                    name = f"{name} (fused; probabilities recomputed)"
        if v is None:
            self.attention.layout.display = "none"
            self.attention_note.value = f"<i>attention: {why}</i>"
            return
        while v.ndim > 3 and v.shape[0] == 1:
            v = v[0]
        if v.ndim == 4:  # a batch: first row
            v = v[0]
        if v.ndim == 2:
            v = v[None]
        heads, t, k = v.shape
        if v.size * 4 > ATTENTION_MAX_BYTES:
            self.attention.layout.display = "none"
            self.attention_note.value = (f"<i>attention: <code>{name}</code> is {heads} heads × {t} × {k} "
                                         f"({v.size * 4 / 2**20:.0f} MiB as float32), too large to send to the "
                                         f"page; draw one head with workbench.plots.attention_pattern</i>")
            return
        tq, tk = token_labels(self.trace, t, k, tokens=self.tokens)
        head = self.attention.head
        if self._head0 is not None:
            head, self._head0 = self._head0, None
        self.attention.show(v, tq, tk, head=min(max(0, head), heads - 1), title=name)
        self.attention.layout.display = None
        self.attention_note.value = (f"<b>attention pattern</b> of <code>{name}</code> ({heads} heads): row = "
                                     f"query token, column = key token it attends to; hover a cell for its "
                                     f"probability")

    def _fused_pattern(self, layer: int):
        """Layer ``layer``'s probabilities recomputed from its fused op's inputs, [B, H, T, S]
        float32 numpy, or None when they would pass ATTENTION_MAX_BYTES."""
        step = self.trace.step_info(context_op(layer))
        (B, H, T, _), S = step.input_shapes[0], step.input_shapes[1][2]  # queries, keys
        if B * H * T * S * 4 > ATTENTION_MAX_BYTES:
            return None
        return _to_numpy(probabilities(self.trace, layer)[1])

    def _draw_norms(self) -> None:
        norms = self._residual_norms()
        if not norms:
            self.norms_html.value = "<i>residual-stream norms appear here as layers finish</i>"
            return
        layers = sorted(norms)
        vals = [norms[i] for i in layers]
        finite = [x for x in vals if math.isfinite(x)]
        top = max(finite) if finite else 1.0
        bw, gap, H = 14, 3, 70
        w = len(layers) * (bw + gap) + 40
        parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{H + 28}" '
                 f'style="font-family:monospace;font-size:9px">']
        for k, (i, x) in enumerate(zip(layers, vals)):
            xx = 30 + k * (bw + gap)
            if math.isfinite(x):
                h = max(1.0, H * x / top) if top > 0 else 1.0
                parts.append(f'<rect x="{xx}" y="{H - h + 4:.1f}" width="{bw}" height="{h:.1f}" fill="#4a90d9">'
                             f'<title>layers.{i}: {x:.4g}</title></rect>')
            else:
                parts.append(f'<rect x="{xx}" y="4" width="{bw}" height="{H}" fill="#0c0">'
                             f'<title>layers.{i}: non-finite</title></rect>')
            parts.append(f'<text x="{xx + bw / 2}" y="{H + 16}" text-anchor="middle">{i}</text>')
        parts.append(f'<text x="0" y="12">{top:.3g}</text><text x="0" y="{H + 4}">0</text></svg>')
        self.norms_html.value = (f"<b>residual-stream norm</b> after each layer so far ({abbr('RMS')} over tokens "
                                 f"of {abbr('‖x‖')})<br>" + "".join(parts))
