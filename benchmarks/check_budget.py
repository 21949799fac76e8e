"""Not a timing: the rounding budget's calibration (workbench/diff/budget.py, issue 39).

    python benchmarks/check_budget.py [--json OUT]

Diffs every dump of tests/data/engines/precision (transformers as the engine in float32,
bfloat16 and float16, clean and with one planted bug each; scripts/make_precision_dumps.py)
against its checkpoint with the default options, and prints per case where the diff names
the bug (the earlier of the first divergence and the first op beyond its rounding) against
the op where it enters, and per precision the largest ratio (local error / budget) on clean
runs, which :data:`workbench.diff.budget.FACTOR` must stay well above, and the smallest ratio at
a bug's entry op, which it must stay below.  Then the table the closing note quotes:
detected / named one op late / missed / false alarms per precision.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import workbench  # noqa: F401  (fast BLAS before mlx.core)

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "engines" / "precision"
sys.path.insert(0, str(ROOT / "tests" / "data"))


def named(report) -> tuple[str | None, str | None]:
    """(the op the diff names first, how): the earlier of the first divergence and the first
    op wrong on its own inputs."""
    fd, fl = report.first_divergence, report.first_local_divergence
    cands = [(o.index, o.op, how) for o, how in ((fd, "divergence"), (fl, f"local ({fl.local_rule})" if fl else ""))
             if o is not None]
    if not cands:
        return None, None
    _, op, how = min(cands)
    return op, how


def run_case(case: dict, ckpt: str, ids):
    from workbench.diff import compare

    return compare(ckpt, str(DATA / case["file"]), ids=ids)


def main(argv=None) -> int:
    from make_arch_refs import HERE as ARCHS, write_checkpoint

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="also write the rows as JSON here")
    a = p.parse_args(argv)
    manifest = json.loads((DATA / "manifest.json").read_text())
    rows, clean_max, bug_min = [], {}, {}
    with tempfile.TemporaryDirectory() as d:
        ckpts = {}
        for case in manifest["cases"]:
            arch = case["checkpoint"]
            if arch not in ckpts:
                ckpts[arch] = str(write_checkpoint(Path(d) / arch, ARCHS / arch))
            r = run_case(case, ckpts[arch], manifest["ids"])
            op, how = named(r)
            dt = case["engine_dtype"]
            judged = [o for o in r.ops if o.ratio is not None and o.local_rule == "budget"]
            top = max(judged, key=lambda o: o.ratio, default=None)
            entry = case["entry_op"]
            at_entry = next((o for o in r.ops if o.op == entry), None) if entry else None
            if case["bug"] in ("clean", "decode_clean"):
                verdict = "clean" if r.clean else "FALSE ALARM"
                if top is not None and top.ratio > clean_max.get(dt, (0, ""))[0]:
                    clean_max[dt] = (top.ratio, f"{case['file']}:{top.op}")
            else:
                order = [o.op for o in r.ops]
                if op == entry:
                    verdict = "named"
                elif op is None:
                    verdict = "missed"
                elif entry in order and op in order and order.index(op) > order.index(entry):
                    verdict = "late"
                else:
                    verdict = "elsewhere"
                if at_entry is not None and at_entry.ratio is not None and at_entry.local_rule == "budget":
                    if at_entry.ratio < bug_min.get(dt, (float("inf"), ""))[0]:
                        bug_min[dt] = (at_entry.ratio, case["file"])
            rows.append({"file": case["file"], "dtype": dt, "bug": case["bug"], "entry": entry, "named": op,
                         "how": how, "verdict": verdict, "precision": r.engine_precision.engine
                         if r.engine_precision else None,
                         "ratio_at_entry": None if at_entry is None else at_entry.ratio,
                         "rule_at_entry": None if at_entry is None else at_entry.local_rule,
                         "largest_ratio": None if top is None else top.ratio})
            print(f"{case['file']:<40} {verdict:<11} named {op or '-':<34} entry {entry or '-':<34} "
                  f"ratio@entry {rows[-1]['ratio_at_entry'] or 0:9.3g}  precision {rows[-1]['precision']}", flush=True)
    print()
    print(f"{'precision':<10} {'named':>6} {'late':>5} {'elsewhere':>9} {'missed':>7} {'clean ok':>9} {'false alarms':>13}"
          f"  largest clean ratio / smallest ratio at a bug's entry")
    for dt in ("float32", "bfloat16", "float16"):
        rs = [x for x in rows if x["dtype"] == dt]
        c = {v: sum(x["verdict"] == v for x in rs) for v in ("named", "late", "elsewhere", "missed", "clean",
                                                             "FALSE ALARM")}
        cm, bm = clean_max.get(dt, (0, "")), bug_min.get(dt, (float("nan"), ""))
        print(f"{dt:<10} {c['named']:>6} {c['late']:>5} {c['elsewhere']:>9} {c['missed']:>7} {c['clean']:>9} "
              f"{c['FALSE ALARM']:>13}  {cm[0]:.3g} ({cm[1]}) / {bm[0]:.3g} ({bm[1]})")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
