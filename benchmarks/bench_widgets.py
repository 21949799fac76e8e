"""StepDebugger responsiveness: time of one step (trace step + every view updated) on the demo model.

    python benchmarks/bench_widgets.py [--model assets/demo] [--prompt TEXT] [--capture full]
    python benchmarks/bench_widgets.py --smoke    # CI: one pass, exit 0 over the budget too

Builds ``StepDebugger(workbench.trace(model, prompt, capture=...))`` and clicks "step"
through every op of the forward pass, timing each click end to end (the op runs, its
statistics are evaluated, the current-op line, statistics table, headroom bars, value
heatmap, attention pattern and residual-norm chart are redrawn).  The same steps are also
timed on a bare Trace, so the widget's own cost shows as a ratio.  Each op is timed in
--reps passes and the best is kept (scheduler noise on shared cores).  The target is
< 50 ms per step (issue 7); the first click (imports, colour tables) is reported apart.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import workbench  # noqa: F401  (fast BLAS before mlx.core)

from workbench.widgets import StepDebugger

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROMPT = "lamp river coin tree bird moon | lamp river coin"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "assets" / "demo"))
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--capture", default="full")
    ap.add_argument("--budget-ms", type=float, default=50.0)
    ap.add_argument("--reps", type=int, default=3, help="passes over the forward (per op: the best)")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: one pass; exit 0 whatever the times (that it runs, not how fast)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.reps = 1
    if not Path(args.model, "config.json").exists():
        print(f"bench_widgets: no checkpoint at {args.model}", file=sys.stderr)
        return 2
    model = workbench.load(args.model)

    bare = workbench.trace(model, args.prompt, capture=args.capture)
    bare_ms = []
    while not bare.done:
        t0 = time.perf_counter()
        bare.step()
        bare_ms.append(1e3 * (time.perf_counter() - t0))

    first = None
    per_op: dict[str, list[float]] = {}
    for rep in range(args.reps):  # several passes: per op, the best of them (scheduler noise removed)
        w = StepDebugger(workbench.trace(model, args.prompt, capture=args.capture))
        t0 = time.perf_counter()
        w.step_button.click()
        if first is None:
            first = 1e3 * (time.perf_counter() - t0)
        while not w.trace.done:
            t0 = time.perf_counter()
            w.step_button.click()
            per_op.setdefault(w.current_step.name, []).append(1e3 * (time.perf_counter() - t0))
    best = {k: min(v) for k, v in per_op.items()}
    ms = list(best.values())
    worst = max(best.items(), key=lambda kv: kv[1])
    raw_max = max(max(v) for v in per_op.values())
    n_tok = int(w.trace.ids.shape[-1])
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
    med, p90 = statistics.median(ms), q(ms, 0.9)
    bmed = statistics.median(bare_ms[1:])
    print(f"model {args.model}: {len(w.trace.ops)} ops, {n_tok} tokens, capture={args.capture}, {args.reps} passes")
    print(f"first click (imports, colour tables): {first:.1f} ms")
    print(f"StepDebugger step (best of {args.reps} per op): median {med:.2f} ms, p90 {p90:.2f} ms, "
          f"max {worst[1]:.2f} ms ({worst[0]}); slowest single click seen {raw_max:.1f} ms")
    print(f"bare Trace.step:   median {bmed:.2f} ms  -> widget/bare ratio {med / bmed:.2f}x")
    print(f"budget {args.budget_ms:.0f} ms: median uses {med / args.budget_ms:.1%}, max uses "
          f"{worst[1] / args.budget_ms:.1%} -> {'OK' if worst[1] < args.budget_ms else 'OVER BUDGET'}")
    return 0 if args.smoke or worst[1] < args.budget_ms else 1


if __name__ == "__main__":
    sys.exit(main())
