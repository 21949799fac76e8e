"""DiffView: an engine-vs-reference diff as a per-op error curve with the first divergence marked.

A view over a :class:`workbench.diff.DiffReport`::

    report = workbench.diff.compare(model, "engine.safetensors", prompt="...")
    DiffView(report)

The curve is :func:`workbench.plots.error_curve`; pick the metrics to draw, and pick an op
(the first divergence is picked at the start) to see its numbers, its layout
reconciliation, and the status of the ops it reads.
"""
from __future__ import annotations

import html

import ipywidgets as W
from IPython.display import HTML, Image

from workbench.widgets._actions import Actions
from workbench.widgets.saved import text_form
from workbench.widgets._render import GLOSSARY, abbr, figure_png, fmt, glossary, table

METRICS = ("nmse", "1-cosine", "max_abs", "max_rel", "local-nmse")


class DiffView(W.VBox):
    """Per-op error curve of a DiffReport, the first divergence marked, per-op details."""

    def __repr__(self) -> str:  # the text a page without the widget manager shows
        return text_form(self)

    def __init__(self, report):
        self.report = report
        fd = report.first_divergence
        low = getattr(report, "low_coverage", None)
        if fd is None and report.found:  # an op wrong on the engine's own inputs, or a weight unlike the checkpoint's
            head = f"<b style='color:#c00'>found</b>: {html.escape(report.verdict() or '')}"
        elif fd is None and low:  # too little of the dump compared: no verdict, and no "no divergence"
            head = f"<b style='color:#b60'>{html.escape(low.split(':', 1)[0])}</b>:{html.escape(low.split(':', 1)[1])}"
        elif fd is None:
            head = (f"<b style='color:#393'>no divergence</b>: {report.compared} ops compared within tolerance")
        else:
            head = (f"<b style='color:#c00'>first divergence: {html.escape(fd.op)}</b> "
                    f"(engine tensor <code>{html.escape(fd.engine_name)}</code>, op #{fd.index}"
                    + (f", layer {fd.layer}" if fd.layer is not None else "") + f"); {report.compared} ops compared")
        if hasattr(report, "coverage_text") and not (fd is None and low):
            head += "<br>coverage: " + html.escape(report.coverage_text()) + (
                "" if not low else " <b style='color:#b60'>(too little of the dump to vouch for the rest)</b>")
        precision = getattr(report, "engine_precision", None)
        if precision is not None:
            head += "<br>" + html.escape(precision.text())
        if report.unmatched_engine:
            head += f"<br>{len(report.unmatched_engine)} engine tensors match no op: " + html.escape(
                ", ".join(report.unmatched_engine[:8]) + (" ..." if len(report.unmatched_engine) > 8 else ""))
        if report.unmatched_reference:
            head += f"<br>{len(report.unmatched_reference)} of our ops have no engine tensor"
        self.summary = W.HTML(head)
        self.summary.add_class("wb-diff-summary")
        budgeted = any(getattr(o, "local_rule", None) == "budget" for o in report.ops)
        self.metrics = W.SelectMultiple(options=METRICS, value=("nmse", "1-cosine") + (("local-nmse",) if budgeted else ()),
                                        rows=5, description="metrics",
                                        tooltip="; ".join(f"{m}: {GLOSSARY[m]}" for m in METRICS))
        self.legend = W.HTML("<div style='color:#555;font-size:90%'>" + "<br>".join(
            f"{abbr(m)}: {html.escape(GLOSSARY[m])}" for m in METRICS) + "</div>")
        self.legend.add_class("wb-diff-legend")
        self.metrics.add_class("wb-diff-metrics")
        self.op = W.Dropdown(options=[(f"#{o.index} {o.op} [{o.status}]", o.op) for o in report.ops],
                             value=(fd.op if fd is not None else (report.ops[0].op if report.ops else None)),
                             description="op", layout=W.Layout(width="440px"))
        self.op.add_class("wb-diff-op")
        self.first = W.Button(description="first divergence", disabled=fd is None, icon="crosshairs")
        self.first.add_class("wb-diff-first")
        self.actions = act = Actions()
        self.first.on_click(act("first divergence", lambda _: self.show(fd.op)))
        self.plot = W.Output()
        self.plot.add_class("wb-diff-plot")
        self.detail = W.Output()
        self.detail.add_class("wb-diff-detail")
        self.metrics.observe(act("pick metrics", lambda ch: self._draw()), names="value")
        self.op.observe(act("pick an op", lambda ch: self._detail()), names="value")
        super().__init__([self.summary, act.area, W.HBox([self.metrics, W.VBox([self.op, self.first]), self.legend]),
                          self.plot, self.detail])
        self.add_class("wb-diff-view")
        self._draw()
        self._detail()

    def show(self, op: str) -> None:
        """Pick an op (its details are printed below the curve)."""
        self.op.value = op

    def _draw(self) -> None:
        from workbench.plots import error_curve

        self.plot.outputs = ()
        if not self.metrics.value:
            self.plot.append_stdout("pick at least one metric\n")
            return
        fig = error_curve(self.report, metrics=tuple(self.metrics.value))
        self.plot.append_display_data(Image(figure_png(fig)))

    def _detail(self) -> None:
        self.detail.outputs = ()
        if self.op.value is None:
            return
        o = self.report[self.op.value]
        self.detail.append_stdout(
            f"{o.op} (engine {o.engine_name!r}): {o.status}"
            f"  cosine {fmt(o.cosine, '.6f')}  nmse {fmt(o.nmse, '.3g')}  max_abs {fmt(o.max_abs, '.3g')}"
            f"  max_rel {fmt(o.max_rel, '.3g')}\n"
            f"({glossary(('cosine', 'nmse', 'max_abs', 'max_rel'))})\n")
        rows = [("shape (ours)", list(o.shape)), ("shape (engine)", list(o.engine_shape)),
                ("layout", o.layout or "as is")]
        if o.nonfinite_ref or o.nonfinite_engine:
            rows.append((("html", f"non-finite ({abbr('NaN')}, {abbr('+inf', '±inf')}) {abbr('ref')} / engine"),
                         f"{o.nonfinite_ref} / {o.nonfinite_engine}"))
        if getattr(o, "local_rule", None) is not None:
            rows.append((("html", abbr("local nmse")), fmt(o.local_nmse, ".3g")))
            if o.local_rule == "budget":
                rows.append((("html", abbr("budget", "rounding budget")),
                             f"{fmt(o.budget_power, '.3g')} at {o.precision} (local error power {fmt(o.local_power, '.3g')})"))
            rows.append((("html", abbr("x budget")), f"{fmt(o.ratio, '.3g')} ({o.local_rule} rule: "
                         + ("beyond" if o.local_diverged else "within") + ")"))
            if o.recomputed:
                rows.append(("recomputed", ", ".join(o.recomputed)))
        for r in o.reasons:
            rows.append(("why", r))
        ins = self.report.inputs.get(o.op, ())
        if ins:
            by = {x.op: x.status for x in self.report.ops}
            rows.append(("its inputs", ", ".join(f"{s} ({by.get(s, 'not compared')})" for s in ins)))
        self.detail.append_display_data(HTML(table(rows)))
