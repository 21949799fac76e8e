"""Not a timing: float32 on the GPU against float32 on the CPU at layer 0 (issue 28 item 3).

    python benchmarks/check_tf32.py default CHECKPOINT   # the user's MLX_ENABLE_TF32 (CUDA: TF32 on)
    python benchmarks/check_tf32.py exact CHECKPOINT     # through workbench.precision.exact_float32
    python benchmarks/check_tf32.py default assets/demo 8    # CI: no GPU here, so the CPU against itself

Prints one JSON line: a float32 forward's layer-0 output and its worst layer-0 op, GPU vs CPU
(relative max abs difference), and the hunt's path -- each layer-0 op of a bfloat16 trace
recomputed in float32 on its own inputs, GPU vs CPU -- with the precision each ran under.
Run each mode in its own process: MLX reads MLX_ENABLE_TF32 once (docs/trace.md, TF32).
"""
import contextlib
import json
import os
import sys

import workbench  # before mlx.core (the CPU BLAS)
import mlx.core as mx
import numpy as np

from workbench.precision import ENV, exact_float32, matmul_precision


def rel(g, c) -> float:
    g, c = np.array(g.astype(mx.float32)), np.array(c.astype(mx.float32))
    return float(np.abs(g - c).max() / max(np.abs(c).max(), 1e-30))


def main(mode: str, path: str, tokens: int = 128) -> dict:
    m = workbench.load(path)
    ids = np.random.default_rng(1).integers(0, min(m.vocab_size or 4096, 4096), tokens).tolist()
    layer0 = [o.name for o in m.program.ops if o.layer == 0]
    ctx = exact_float32 if mode == "exact" else contextlib.nullcontext
    res = {"mode": mode, "env_before": os.environ.get(ENV), "tokens": tokens}
    tb = workbench.trace(m, ids, capture="full", dtype="bfloat16")
    tb.run()
    worst = {}
    with ctx():
        res["recompute_precision"] = matmul_precision()
        for n in layer0:
            g = tb.recompute(n, dtype=mx.float32)
            mx.eval(g)
            with mx.stream(mx.cpu):
                c = tb.recompute(n, dtype=mx.float32)
                mx.eval(c)
            worst[n] = rel(g, c)
    res["recompute_worst_op"] = max(worst, key=worst.get)
    res["recompute_worst"] = worst[res["recompute_worst_op"]]
    with ctx():
        tg = workbench.trace(m, ids, capture="full", dtype="float32")
        tg.run()
        res["f32_trace_precision"] = tg.matmul_precision
        gv = {n: tg.value(n) for n in layer0}
        mx.eval(list(gv.values()))
    mx.set_default_device(mx.cpu)
    tc = workbench.trace(m, ids, capture="full", dtype="float32")
    tc.run()
    res["cpu_trace_precision"] = tc.matmul_precision
    res["forward_layer0_out"] = rel(gv["layers.0"], tc.value("layers.0"))
    res["forward_layer0_worst"] = max(rel(gv[n], tc.value(n)) for n in layer0)
    res["env_after"] = os.environ.get(ENV)
    return res


if __name__ == "__main__":
    if (len(sys.argv) not in (3, 4) or sys.argv[1] not in ("default", "exact")
            or not all(t.isdigit() and int(t) > 0 for t in sys.argv[3:])):
        print("usage: check_tf32.py default|exact CHECKPOINT [TOKENS]", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:4]))))
