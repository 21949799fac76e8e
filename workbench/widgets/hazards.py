"""HazardTimeline: buffers x events, live ranges, reads/writes, hazards linked to their dispatches.

A view over a :class:`workbench.buffers.Schedule` and the analyzer's hazards::

    from workbench.widgets import HazardTimeline
    HazardTimeline(schedule)            # runs workbench.buffers.analyze(schedule)
    HazardTimeline(schedule, hazards)   # or shows hazards you already have

Rows are buffers (those involved in hazards first), columns are events; a grey bar is the
buffer's live range (alloc/first use to free/last use), blue ticks are reads, orange ticks
writes, red boxes hazards.  Picking a hazard in the list marks its dispatch (solid line)
and the earlier event involved (dashed) and prints both dispatches' reads and writes.
"""
from __future__ import annotations

import html
from typing import Any, Sequence

import ipywidgets as W
from IPython.display import HTML

from workbench.widgets._actions import Actions
from workbench.widgets.saved import text_form
from workbench.widgets._render import GLOSSARY, abbr, table

READ, WRITE, BOTH = 1, 2, 3
_COLORS = {READ: "#4a90d9", WRITE: "#e67e22", BOTH: "#8e44ad"}


def _buffer_rows(sch, hazards) -> tuple[list[str], dict[str, tuple[int, int]], dict[str, dict[int, int]]]:
    """Buffers in display order, their live ranges [first, last] event, and access marks."""
    n = len(sch.events)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    freed: dict[str, int] = {}
    marks: dict[str, dict[int, int]] = {}
    for i, e in enumerate(sch.events):
        if e.type == "alloc":
            first.setdefault(e.buffer, i)
            last[e.buffer] = i
        elif e.type == "free":
            freed[e.buffer] = i
            last[e.buffer] = i
        elif e.type == "dispatch":
            for acc, bit in ((e.reads, READ), (e.writes, WRITE)):
                for a in acc:
                    first.setdefault(a.buffer, i)
                    last[a.buffer] = max(last.get(a.buffer, i), i)
                    m = marks.setdefault(a.buffer, {})
                    m[i] = m.get(i, 0) | bit
    for b, spec in sch.buffers.items():
        if spec.initialized or b not in first:
            first[b] = 0 if spec.initialized else first.get(b, 0)
        last.setdefault(b, first[b])
    for b, i in freed.items():
        last[b] = i
    hz_bufs = []
    for h in hazards:
        if h.buffer is not None and h.buffer not in hz_bufs:
            hz_bufs.append(h.buffer)
    rest = sorted((b for b in first if b not in hz_bufs), key=lambda b: (first[b], b))
    order = hz_bufs + rest
    live = {b: (first.get(b, 0), min(last.get(b, n - 1), n - 1)) for b in order}
    return order, live, marks


class HazardTimeline(W.VBox):
    """Buffers x events timeline of a schedule, with the analyzer's hazards highlighted."""

    max_rows = 48
    width = 900
    label_w = 170
    row_h = 16

    def __repr__(self) -> str:  # the text a page without the widget manager shows
        return text_form(self)

    def __init__(self, schedule: Any, hazards: Sequence | None = None):
        from workbench.buffers import analyze, summarize
        from workbench.buffers.schedule import as_schedule

        self.schedule = as_schedule(schedule)
        self.hazards = list(analyze(self.schedule) if hazards is None else hazards)
        self._rows, self._live, self._marks = _buffer_rows(self.schedule, self.hazards)
        n = max(1, len(self.schedule.events))
        counts = summarize(self.hazards)
        summ = ", ".join(f"{k} ×{v}" for k, v in counts.items() if v) or "none"
        self.summary = W.HTML(
            f"<b>{len(self.schedule.events)} events</b> ({len(self.schedule.dispatches())} dispatches, "
            f"mode {html.escape(self.schedule.mode)}), <b>{len(self._rows)} buffers</b>; "
            f"hazards: <b style='color:{'#c00' if self.hazards else '#393'}'>{html.escape(summ)}</b>")
        self.summary.add_class("wb-hazard-summary")
        opts = [(f"{i}: {h.kind} at event {h.event}" + (f" (vs {h.other})" if h.other is not None else "")
                 + (f" on {h.buffer}" if h.buffer else ""), i) for i, h in enumerate(self.hazards)]
        self.picker = W.Select(options=opts or [("no hazards", -1)], rows=min(8, max(2, len(opts))),
                               layout=W.Layout(width="100%"))
        self.picker.add_class("wb-hazard-picker")
        self.window = W.IntRangeSlider(value=(0, n - 1), min=0, max=n - 1, description="events",
                                       continuous_update=False, layout=W.Layout(width="100%"))
        self.window.add_class("wb-hazard-window")
        self.chart = W.HTML()
        self.chart.add_class("wb-hazard-chart")
        self.detail = W.Output(layout=W.Layout(border="1px solid #ddd", padding="4px"))
        self.detail.add_class("wb-hazard-detail")
        self.actions = act = Actions()
        self.picker.observe(act("pick a hazard", lambda ch: self._on_pick()), names="value")
        self.window.observe(act("move the event window", lambda ch: self._draw()), names="value")
        self.legend = W.HTML("<span style='color:#555;font-size:90%'>" + " · ".join(
            f"{abbr(k)} = {html.escape(GLOSSARY[k])}" for k in ("raw", "war", "waw", "cb")) + "</span>")
        self.legend.add_class("wb-hazard-legend")
        super().__init__([self.summary, act.area, self.chart, self.window, self.picker, self.legend, self.detail])
        self.add_class("wb-hazard-timeline")
        self._draw()
        if self.hazards:
            self.picker.value = 0
            self._on_pick()

    # ------------------------------------------------------------------ interaction
    @property
    def selected(self):
        v = self.picker.value
        return self.hazards[v] if v is not None and v >= 0 else None

    def select(self, index: int) -> None:
        """Pick hazard ``index`` (zooms the window onto it if it is outside)."""
        if self.picker.value == index:
            self._on_pick()
        else:
            self.picker.value = index

    def _on_pick(self) -> None:
        h = self.selected
        if h is not None:
            lo, hi = self.window.value
            if not (lo <= h.event <= hi) or (h.other is not None and not lo <= h.other <= hi):
                a = min(h.event, h.other if h.other is not None else h.event)
                self.window.value = (max(0, a - 20), min(self.window.max, h.event + 20))
        self._draw()
        self.detail.outputs = ()
        if h is None:
            return
        self.detail.append_stdout(f"[{h.kind}] {h.message}\n")
        if h.range is not None:
            self.detail.append_stdout(f"buffer {h.buffer!r}, bytes [{h.range[0]}, {h.range[1]})\n")
        self.detail.append_display_data(HTML(self._event_html(h.event, "this dispatch", h)))
        if h.other is not None:
            self.detail.append_display_data(HTML(self._event_html(h.other, "the earlier event", h)))

    def _event_html(self, i: int, role: str, h) -> str:
        e = self.schedule.events[i]
        head = f"<b>{role}</b>: {html.escape(self.schedule.describe(i))}"
        if e.type != "dispatch":
            return head
        head += f" kernel <code>{html.escape(str(e.kernel))}</code> {abbr('cb')} {e.cb}"
        rows = []
        for kind, accs in (("read", e.reads), ("write", e.writes)):
            for a in accs:
                hit = (h.buffer == a.buffer and h.range is not None
                       and a.offset < h.range[1] and h.range[0] < a.offset + a.size)
                style = "color:#c00;font-weight:bold" if hit else ""
                rows.append((kind, a.arg, ("html", f"<span style='{style}'>{html.escape(a.buffer)}</span>"),
                             f"[{a.offset}, {a.offset + a.size})", a.value or ""))
        return head + table(rows, ("access", "arg", "buffer", "bytes", "value"))

    # ------------------------------------------------------------------ drawing
    def _draw(self) -> None:
        self.chart.value = self.svg()

    def svg(self) -> str:
        lo, hi = self.window.value
        span = max(1, hi - lo + 1)
        plot_w = self.width - self.label_w - 10
        x = lambda i: self.label_w + (i - lo) * plot_w / span
        cw = max(1.0, plot_w / span)
        rows = self._rows[: self.max_rows]
        top = 18
        H = top + self.row_h * len(rows) + 20
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{H}" '
               f'style="font-family:monospace;font-size:11px;background:white">']
        out.append(f'<text x="{self.label_w}" y="12">event {lo}</text>'
                   f'<text x="{self.width - 10}" y="12" text-anchor="end">event {hi}</text>')
        sel = self.selected
        rowy = {b: top + k * self.row_h for k, b in enumerate(rows)}
        for b, y in rowy.items():
            a, z = self._live[b]
            out.append(f'<text x="{self.label_w - 6}" y="{y + 11}" text-anchor="end">{html.escape(b[:22])}</text>')
            if z >= lo and a <= hi:
                x0, x1 = x(max(a, lo)), x(min(z, hi)) + cw
                out.append(f'<rect x="{x0:.1f}" y="{y + 3}" width="{max(1.0, x1 - x0):.1f}" height="{self.row_h - 6}" '
                           f'fill="#e4e4e4"><title>{html.escape(b)}: live events {a}..{z}</title></rect>')
            cols: dict[int, int] = {}
            for i, bit in self._marks.get(b, {}).items():
                if lo <= i <= hi:
                    c = int((i - lo) * plot_w / span)
                    cols[c] = cols.get(c, 0) | bit
            for c, bit in cols.items():
                out.append(f'<rect x="{self.label_w + c:.1f}" y="{y + 2}" width="{max(1.5, cw * 0.8):.1f}" '
                           f'height="{self.row_h - 4}" fill="{_COLORS[bit]}"/>')
        for k, h in enumerate(self.hazards):
            if not lo <= h.event <= hi:
                continue
            y = rowy.get(h.buffer, top)
            hh = self.row_h if h.buffer in rowy else self.row_h * len(rows)
            out.append(f'<rect x="{x(h.event) - 2:.1f}" y="{y}" width="{cw + 4:.1f}" height="{hh}" fill="none" '
                       f'stroke="#d00" stroke-width="2"><title>{html.escape(h.kind)} at event {h.event}: '
                       f'{html.escape(h.message)}</title></rect>')
        if sel is not None:
            for i, dash in ((sel.event, ""), (sel.other, ' stroke-dasharray="4,3"')):
                if i is not None and lo <= i <= hi:
                    out.append(f'<line x1="{x(i) + cw / 2:.1f}" x2="{x(i) + cw / 2:.1f}" y1="{top - 4}" '
                               f'y2="{H - 16}" stroke="#d00"{dash}/>')
        if len(self._rows) > len(rows):
            out.append(f'<text x="4" y="{H - 4}">... {len(self._rows) - len(rows)} more buffers</text>')
        lx = self.label_w
        for label, color in (("read", _COLORS[READ]), ("write", _COLORS[WRITE]), ("read+write", _COLORS[BOTH])):
            out.append(f'<rect x="{lx}" y="{H - 13}" width="10" height="10" fill="{color}"/>'
                       f'<text x="{lx + 14}" y="{H - 4}">{label}</text>')
            lx += 24 + 7 * len(label)
        out.append(f'<rect x="{lx}" y="{H - 13}" width="10" height="10" fill="none" stroke="#d00" stroke-width="2"/>'
                   f'<text x="{lx + 14}" y="{H - 4}">hazard</text>')
        out.append("</svg>")
        return "".join(out)
