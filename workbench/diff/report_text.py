"""A DiffReport in words: the text summary (``report.summary()``, ``str(report)``, the CLI's output).

:func:`summary_text` puts together :func:`finding_lines` (what was found and why: the first
divergence, where its non-finite elements are, the verdict, the coverage), :func:`table_lines`
(one row per compared op, around the first divergence when there are many) and
:func:`rest_lines` (the engine's weights, our ops with no engine tensor).  It reads the
report's public fields and properties alone; the report and its verdicts are built in
workbench/diff/report.py and workbench/diff/report_data.py.
"""
from __future__ import annotations

import math
from typing import Any

from workbench.diff.where import describe_nonfinite
from workbench.errors import printable_lines


def summary_text(report: Any, max_ops: int = 40) -> str:
    """Text report: the finding, a table of ops (around the first divergence when long), unmatched names;
    every line printable (names from the dump escaped: one line each)."""
    return printable_lines(finding_lines(report) + table_lines(report, max_ops) + rest_lines(report))


def finding_lines(report: Any) -> list[str]:
    """The lines above the table: warnings, the names taken by value, the finding, the verdict, the coverage."""
    lines = [f"warning: {report.precision_warning}"] if report.precision_warning else []
    if report.automap is not None:  # first: what the names were taken to mean
        lines += report.automap.text()
    if report.unmatched_engine:  # first: names that matched nothing are the first thing to fix
        shown = report.unmatched_engine[:6]
        lines.append(f"engine tensors matching no op ({len(report.unmatched_engine)}): "
                     + ", ".join(n + (f" ({report.unmatched_nonfinite[n][0]} NaN / +Inf)"
                                      if n in report.unmatched_nonfinite else "")
                                 + (f" (closest: {report.suggestions[n]})" if n in report.suggestions else "")
                                 for n in shown)
                     + (f" ... (+{len(report.unmatched_engine) - len(shown)}; --json lists them)"
                        if len(report.unmatched_engine) > len(shown) else ""))
    if report.engine or report.decode:
        lines.append("engine: " + (report.engine or "as named") + (" (one decode step, against our full "
                                                                  "forward's last position)" if report.decode else "")
                     + (f"; {report.decode_note}" if report.decode_note else ""))
    fd = report.first_divergence
    fl = report.first_local_divergence
    low = report.low_coverage
    if fd is None and low:
        lines.append(low)
    elif fd is None:
        if report.noise_dtype:
            lines.append(f"no divergence: {report.compared} ops compared within {report.tolerance.noise_factor:g} x "
                         f"the error of our own {report.noise_dtype} run")
        else:
            lines.append(f"no divergence: {report.compared} ops compared within tolerance "
                         f"(cosine >= {report.tolerance.min_cosine:g}, nmse <= {report.tolerance.max_nmse:g})")
    else:
        where = describe_nonfinite(fd.nonfinite) if fd.nonfinite is not None else None
        lines.append(f"first divergence: {fd.op} (engine {fd.engine_name!r}, op #{fd.index}): "
                     + "; ".join(r for r in fd.reasons if r != where))
        if where is not None:
            lines.append("  where: " + where)
            fin = fd.finite or {}
            if fin.get("elements"):
                lines.append(f"  over the {fin['elements']} element(s) finite in both: cosine "
                             f"{fin['cosine']:.6f}, nmse {fin['nmse']:.3g}, max_abs {fin['max_abs']:.3g}")
        fdd = report.first_divergence_dict() or {}
        ins = fdd.get("inputs")
        if ins:
            lines.append("  its inputs: " + ", ".join(f"{i['op']} ({i['status']})" for i in ins))
        pat = (fdd.get("positions") or {}).get("pattern")
        if pat:
            lines.append("  by position: " + pat)
    v = report.verdict()
    if v and v != low:
        lines.append("  " + v)
    if report.engine_precision is not None:
        lines.append("  " + report.engine_precision.text())
    if report.pattern:
        lines.append(f"  pattern ({report.pattern['op']}): {report.pattern['pattern']}: {report.pattern['text']}")
    lines += [f"  caution: {c}" for c in report.cautions]
    if not (fd is None and low):
        under = "" if low is None else \
            f" (under the {report.coverage['min_fraction']:.0%} needed to vouch for the rest)"
        lines.append("  coverage: " + report.coverage_text() + under)
    return lines


def _cell(x, spec, nan="-"):
    """One metric in the table: "nan" where it is NaN because of non-finite values, "-" where not computed."""
    if x is None:
        return "-"
    return nan if isinstance(x, float) and math.isnan(x) else format(x, spec)


def table_lines(report: Any, max_ops: int = 40) -> list[str]:
    """The table of compared ops, at most ``max_ops`` rows around the first divergence (marked ``<``)."""
    fd = report.first_divergence
    fl = report.first_local_divergence
    lines = [f"{'#':>5}  {'op':<40} {'status':<9} {'cosine':>10} {'nmse':>10} {'max_abs':>10} "
             f"{'local nmse':>10} {'budget':>8} {'x budget':>8} {'non-finite':>10}"]
    ops = report.ops
    start = 0
    if len(ops) > max_ops:
        focus = fd or fl
        if focus is not None:
            at = next(i for i, o in enumerate(ops) if o is focus)
            start = max(0, min(at - max_ops // 4, len(ops) - max_ops))
    if start:
        lines.append(f"       ... {start} ops before")
    for o in ops[start:start + max_ops]:
        mark = " <" if o is fd or o is fl else ""
        bad = "-" if o.nonfinite is None else "nan"
        nf = "" if o.nonfinite is None else str(o.nonfinite["count"])
        lines.append(f"{o.index:>5}  {o.op:<40} {o.status:<9} {_cell(o.cosine, '.6f', bad):>10} "
                     f"{_cell(o.nmse, '.3g', bad):>10} {_cell(o.max_abs, '.3g', bad):>10} "
                     f"{_cell(o.local_nmse, '.3g', 'nan'):>10} {_cell(o.budget_power, '.2g'):>8} "
                     f"{_cell(o.ratio, '.3g', 'nan'):>8} {nf:>10}{mark}")
    rest = len(ops) - start - max_ops
    if rest > 0:
        lines.append(f"       ... {rest} more ops")
    return lines


def rest_lines(report: Any) -> list[str]:
    """The lines below the table: the engine's weights that differ, our ops with no engine tensor."""
    lines = []
    if report.weights:
        bad = [w for w in report.weights if w.status != "ok"]
        lines.append(f"engine weights against the checkpoint: {len(report.weights)} compared, "
                     + (f"{len(bad)} differ:" if bad else "all match"))
        for w in bad[:10]:
            lines.append(f"  {w.name} (engine {w.engine_name!r}): {w.status}; " + "; ".join(w.reasons))
    if report.unmatched_reference:
        lines.append(f"our ops with no engine tensor ({len(report.unmatched_reference)}): "
                     + ", ".join(report.unmatched_reference[:20])
                     + (" ..." if len(report.unmatched_reference) > 20 else ""))
    return lines
