"""Text views of the inspector: ``render(report)`` (``workbench inspect``) and
``render_diff(d)`` (``workbench inspect --diff``). Plain data in, lines out."""
from __future__ import annotations

import re
import secrets
from collections import Counter

from workbench.errors import printable_lines

from workbench.stats_schema import nonfinite_count


def _fmt_bytes(n):
    for u in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or u == "TB":
            return f"{n:.0f} {u}" if u == "B" else f"{n:.1f} {u}"
        n /= 1024


def render(r, color: bool = False) -> str:
    """The readable report of an inspection (a :class:`~workbench.checkpoint.inspect.Report`).

    Every line is made printable (a tensor name holding a newline or a terminal escape is
    shown escaped, never as a line of its own); the colours are put in after that, through
    markers a name cannot guess."""
    mark = f"@{secrets.token_hex(8)}:"

    def c(s, code):
        return f"{mark}{code}m{s}{mark}0m" if color else s

    out = []
    nf = len(r.files)
    out.append(f"{r.path}")
    out.append(f"  model: {r.model_type}, {r.num_layers} layers, {r.layout.upper() if r.layout == 'hf' else r.layout} "
               f"name layout, {nf} file{'s' if nf != 1 else ''}, {_fmt_bytes(r.total_bytes)}")
    out.append("  components: " + ", ".join(f"{k} {v}" for k, v in r.components.items()))
    q = r.quantization or {}
    if q.get("specs"):
        parts = ", ".join(f"{k} x{v}" for k, v in q["specs"].items())
        cfgq = f"config: {q['mode']} {q['bits']}-bit g{q['group_size']}" if q.get("mode") else "config: none"
        out.append(f"  quantization: {q.get('quantized_modules', 0)} modules quantized ({parts}), "
                   f"{q.get('float_modules', 0)} float; {cfgq}")
        ov = (q.get("config") or {}).get("overrides") or {}
        if ov:
            kinds = Counter(_override_label(k, v) for k, v in ov.items())
            out.append("    overrides: " + "; ".join(f"{k} ({n})" for k, n in kinds.items()))
    else:
        out.append("  quantization: none" + (f" (config says {q['mode']} {q['bits']}-bit)" if q.get("mode") else ""))
    if r.moe:
        m = r.moe
        out.append(f"  MoE: {m['num_experts']} experts, top-{m.get('top_k')}, moe_intermediate_size "
                   f"{m['moe_intermediate_size']}, {m['layers']} layers, experts as {m['layout']}"
                   + (f", experts {m['expert_quantization']}" if m.get("expert_quantization") else "")
                   + (f", router {m['router_quantization']}" if m.get("router_quantization") else ""))
    if r.grid and r.grid["rows"]:
        cols = r.grid["columns"]
        sym = {"ok": c("✓", "32"), "missing": c("✗", "31;1"), "bad": c("!", "33;1"), "absent-ok": "·", None: " "}
        w = [max(len(x), 1) for x in cols]
        out.append("  layers x tensors (✓ present, · not needed, ✗ missing, ! wrong):")
        out.append("    " + " " * 12 + " ".join(x.rjust(wi) for x, wi in zip(cols, w)))
        rows = r.grid["rows"]
        keys = sorted(rows)
        i = 0
        while i < len(keys):
            j = i
            sig = tuple(rows[keys[i]].get(x) for x in cols)
            while j + 1 < len(keys) and tuple(rows[keys[j + 1]].get(x) for x in cols) == sig and \
                    keys[j + 1] == keys[j] + 1:
                j += 1
            lab = f"layer {keys[i]}" if i == j else f"layers {keys[i]}-{keys[j]}"
            out.append("    " + lab.ljust(12) + " ".join(sym[s].rjust(wi + (len(sym[s]) - 1 if color and s not in
                                                                             ("absent-ok", None) else 0))
                                                     for s, wi in zip(sig, w)))
            i = j + 1
    for n in r.notes[:5]:
        out.append(f"  note: {n}")
    if r.list_tensors and r.tensors:
        out.append(f"  tensors ({len(r.tensors)}):")
        for t in r.tensors:
            q = t.get("quantization")
            qs = f" {q['mode']} {q['bits']}-bit g{q['group_size']}" if q else ""
            line = f"    {t['name']}  {t['dtype']} {t['shape']}{qs}  {t['file']} @ {t['offset']}"
            st = t.get("stats")
            if st and st["min"] is not None:
                line += (f"  min {st['min']:.4g} max {st['max']:.4g} mean {st['mean']:.4g} std {st['std']:.4g}"
                         f" NaN {st['nan']} +Inf {st['posinf']} -Inf {st['neginf']} zeros {100 * st['zero_frac']:.1f}%")
            elif st:
                line += f"  no finite values: NaN {st['nan']} +Inf {st['posinf']} -Inf {st['neginf']}"
            out.append(line)
    if r.tensors and any("stats" in t for t in r.tensors):
        scanned = [t for t in r.tensors if t.get("stats")]
        bad = [t for t in scanned if nonfinite_count(t["stats"])]
        out.append(f"  values: {len(scanned)} tensors scanned, {len(bad)} with NaN/Inf"
                   + (" (quantized weights dequantized)" if any(t.get("dequantized") for t in scanned) else ""))
        fin = [t for t in scanned if t["stats"]["absmax"] is not None]
        show = bad[:20] + [t for t in sorted(fin, key=lambda t: -t["stats"]["absmax"]) if t not in bad][:3]
        if fin:
            zs = max(fin, key=lambda t: t["stats"]["zero_frac"])
            if zs["stats"]["zero_frac"] > 0.5 and zs not in show:
                show.append(zs)
        for t in show:
            s = t["stats"]
            rng = "no finite values" if s["min"] is None else \
                f"min {s['min']:.4g} max {s['max']:.4g} mean {s['mean']:.4g} std {s['std']:.4g}"
            out.append(f"    {t['name']}: {rng}; NaN {s['nan']}, +Inf {s['posinf']}, -Inf {s['neginf']}, "
                       f"zeros {100 * s['zero_frac']:.1f}%")
        out.append("    (largest |values| shown; --json lists every tensor's statistics)")
    errs = [p for p in r.problems if p.severity == "error"]
    warns = [p for p in r.problems if p.severity != "error"]
    if r.problems:
        out.append(f"  problems: {len(errs)} error{'s' if len(errs) != 1 else ''}, "
                   f"{len(warns)} warning{'s' if len(warns) != 1 else ''}")
        per_kind = {}  # at most 10 lines per (severity, code), then a count: every kind stays visible
        for p in r.problems:
            per_kind.setdefault((p.severity, p.code), []).append(p)
        for (sev, code), ps in per_kind.items():
            tag = c("error  ", "31;1") if sev == "error" else c("warning", "33")
            for p in ps[:10]:
                out.append(f"    {tag} {code:<22} {p.message}")
                if p.suggestion and p.suggestion not in p.message:
                    out.append(f"            suggestion: {p.suggestion}")
            if len(ps) > 10:
                lays = sorted({p.layer for p in ps if p.layer is not None})
                where = f" (layers {lays[0]}-{lays[-1]})" if lays else ""
                out.append(f"    {tag} {code:<22} ... and {len(ps) - 10} more{where} (--json lists all)")
    out.append("  " + (c("OK: no errors", "32;1") if r.ok else c(f"FAILED: {len(errs)} error(s)", "31;1")))
    text = printable_lines(out)
    return text.replace(mark, "\x1b[") if color else text


def render_diff(d: dict) -> str:
    """The readable form of :func:`~workbench.checkpoint.compare.compare`'s document."""
    out = [f"a: {d['a']}", f"b: {d['b']}"]
    if d["model_type"][0] != d["model_type"][1]:
        out.append(f"  model_type: {d['model_type'][0]} vs {d['model_type'][1]}")
    probs = d.get("problems") or {}
    for side in ("a", "b"):
        ps = probs.get(side) or []
        if ps:
            out.append(f"  {side} is damaged: {len(ps)} error{'s' if len(ps) != 1 else ''} "
                       f"(`workbench inspect {d[side]}` lists them)")
            by_code = {}
            for p in ps:
                by_code.setdefault(p["code"], []).append(p)
            for code, group in by_code.items():
                for p in group[:5]:
                    out.append(f"    error   {code:<22} {p['message']}")
                if len(group) > 5:
                    out.append(f"    error   {code:<22} ... and {len(group) - 5} more (--json lists all)")
    for key, lab in (("only_a", "only in a"), ("only_b", "only in b")):
        if d[key]:
            out.append(f"  {lab} ({len(d[key])}):")
            out += [f"    {n}" for n in d[key][:50]]
            if len(d[key]) > 50:
                out.append(f"    ... {len(d[key]) - 50} more")
    for key in ("shape", "dtype", "quantization"):
        if d[key]:
            out.append(f"  {key} differs ({len(d[key])}):")
            out += [f"    {x['tensor']}: {x['a']} vs {x['b']}" for x in d[key][:50]]
    if d.get("values"):
        out.append(f"  values differ ({len(d['values'])}):")
        for x in d["values"][:50]:
            ch = ", ".join(f"{k} {_g(v[0])} -> {_g(v[1])}" for k, v in x["changed"].items())
            b = x.get("bytes")
            if b is not None:
                ch = (ch + "; " if ch else "statistics agree, ") + (
                    f"{b['bytes']} of {b['of']} bytes differ, the first at byte {b['first_byte']} of the tensor"
                    if b["bytes"] is not None else "the byte sizes differ")
            out.append(f"    {x['tensor']}: {ch}")
    cov = d.get("coverage")
    if cov:
        out.append(f"  compared: {cov['compared']} of {cov['tensors']} tensors by name, shape, dtype and quantization"
                   + ("" if cov["compared"] == cov["tensors"] else
                      f" ({cov['tensors'] - cov['compared']} are on one side only)"))
        if cov.get("values_compared") is not None:
            nc = cov.get("not_compared") or []
            out.append(f"  values: {cov['values_compared']} of {cov['in_both']} tensors compared byte for byte"
                       + (f"; {len(nc)} could not be read:" if nc else ""))
            for x in nc[:10]:
                out.append(f"    {x['tensor']}: {x['why']}")
            if len(nc) > 10:
                out.append(f"    ... {len(nc) - 10} more (--json lists all)")
        else:
            out.append("  values: not compared (--values reads and compares every tensor byte for byte)")
    verdict = d.get("verdict") or ("same" if d["same"] else "differ")
    if verdict == "same":
        out.append("  same")
    elif verdict == "headers-match":
        out.append("  headers match (names, shapes, dtypes, quantization); values not compared: --values")
    elif verdict == "damaged":
        sides = " and ".join(s for s in ("a", "b") if probs.get(s))
        out.append(f"  not vouched for: {sides} {'is' if len(sides) == 1 else 'are'} damaged"
                   + ("; they also differ" if any(d[k] for k in ("only_a", "only_b", "shape", "dtype", "quantization"))
                      or d.get("values") else ""))
    elif verdict == "incomplete":
        out.append("  not vouched for: not every tensor could be compared")
    else:
        out.append("  differ")
    return printable_lines(out)


def _override_label(k, v):
    k = re.sub(r"layers\.\d+\.", "layers.*.", k)
    if not v:
        return f"{k} -> float"
    return f"{k} -> {v.get('mode') or 'affine'} {v['bits']}-bit g{v['group_size']}"


def _g(v):
    return "None" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))

