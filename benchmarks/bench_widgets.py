"""StepDebugger responsiveness: time of one step (trace step + every view updated) on the demo model.

    python benchmarks/bench_widgets.py [--model assets/demo] [--prompt TEXT] [--capture full]

Builds ``StepDebugger(workbench.trace(model, prompt, capture=...))`` and clicks "step"
through every op of the forward pass, timing each click end to end (the op runs, its
statistics are evaluated, the current-op line, statistics table, headroom bars, value
heatmap, attention pattern and residual-norm chart are redrawn).  The same steps are also
timed on a bare Trace, so the widget's own cost shows as a ratio.  The target is
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
    args = ap.parse_args(argv)
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

    w = StepDebugger(workbench.trace(model, args.prompt, capture=args.capture))
    t0 = time.perf_counter()
    w.step_button.click()
    first = 1e3 * (time.perf_counter() - t0)
    ms = []
    worst = ("", 0.0)
    while not w.trace.done:
        t0 = time.perf_counter()
        w.step_button.click()
        dt = 1e3 * (time.perf_counter() - t0)
        ms.append(dt)
        if dt > worst[1]:
            worst = (w.current_step.name, dt)
    n_tok = int(w.trace.ids.shape[-1])
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
    med, p90 = statistics.median(ms), q(ms, 0.9)
    bmed = statistics.median(bare_ms[1:])
    print(f"model {args.model}: {len(w.trace.ops)} ops, {n_tok} tokens, capture={args.capture}")
    print(f"first click (imports, colour tables): {first:.1f} ms")
    print(f"StepDebugger step: median {med:.2f} ms, p90 {p90:.2f} ms, max {max(ms):.2f} ms ({worst[0]})")
    print(f"bare Trace.step:   median {bmed:.2f} ms  -> widget/bare ratio {med / bmed:.2f}x")
    print(f"budget {args.budget_ms:.0f} ms: median uses {med / args.budget_ms:.1%}, max uses "
          f"{max(ms) / args.budget_ms:.1%} -> {'OK' if max(ms) < args.budget_ms else 'OVER BUDGET'}")
    return 0 if max(ms) < args.budget_ms else 1


if __name__ == "__main__":
    sys.exit(main())
