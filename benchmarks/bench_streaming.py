"""Streaming (``workbench.load(path, memory_budget=...)``): peak memory against the bound,
and time against the same model holding its weights.

    python benchmarks/bench_streaming.py [--layers 8] [--hidden 1024] [--ffn 4096]
                                         [--budget 200MiB] [--tokens 64] [--capture stats]
                                         [--reps 3] [--path CHECKPOINT]
    python benchmarks/bench_streaming.py --smoke    # CI: 4 layers d=128 in 1 MiB, 8 tokens, one rep, exit 0

Writes a float32 llama checkpoint of that shape (or uses ``--path``), then runs, in fresh
processes alternated ``--reps`` times (medians): one forward traced with ``--capture``
(``stats``, ``full`` or ``none``) streamed within ``--budget`` and held.  Each process
warms up on a tiny model, resets its peak RSS (``/proc/self/clear_refs``; ru_maxrss would
carry the parent's peak over fork and exec) and reports VmHWM - VmRSS, the load and
forward's peak RSS growth, and the load + forward wall time.  Prints the growth of both,
the bound (largest segment's weights, from the checkpoint's tensor sizes, + activations,
+ 20%; with ``--capture full`` + the captured values the budget leaves room for), and the
time ratio streamed / held (the streamed run reads every layer from the file: the page
cache makes the reads cheap after the first run).  Linux only (reads /proc).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import workbench  # noqa: F401  (fast BLAS before mlx.core)

CHILD = textwrap.dedent("""
    import json, sys, time
    import workbench
    import mlx.core as mx

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

    path, tiny, budget, tokens, capture = sys.argv[1:6]
    budget = None if budget == "none" else budget
    capture = None if capture == "none" else capture
    ids = mx.array([[(7 * i) % 200 + 3 for i in range(int(tokens))]])
    w = workbench.load(tiny, memory_budget=budget, progress=False)
    t = w.trace(ids, capture=capture); t.run(); del t, w
    mx.clear_cache()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status("VmRSS")
    t0 = time.perf_counter()
    m = workbench.load(path, memory_budget=budget, progress=False)
    t = m.trace(ids, capture=capture)
    t.run()
    mx.eval(t.value("logits"))
    wall = time.perf_counter() - t0
    print(json.dumps({"growth": status("VmHWM") - base, "wall": wall,
                      "spilled": len(t.store.spilled)}))
""")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--budget", default="200MiB")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--capture", default="stats", choices=("stats", "full", "none"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--path", help="an existing checkpoint instead of the generated llama")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: 4 layers, d=128, ffn 256 streamed in 1 MiB, 8 tokens, one rep; exit 0 whatever the "
                         "peak (at this size RSS noise outweighs the bound): that it runs")
    a = ap.parse_args(argv)
    if a.smoke:
        a.layers, a.hidden, a.ffn, a.budget, a.tokens, a.reps = 4, 128, 256, "1MiB", 8, 1
    if not sys.platform.startswith("linux"):
        print("bench_streaming reads /proc/self: Linux only", file=sys.stderr)
        return 2
    from workbench import zoo
    from workbench.dtypes import dtype_name
    from workbench.sizes import fmt_bytes, parse_bytes

    budget = parse_bytes(a.budget, "--budget")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        path = Path(a.path) if a.path else zoo.build(
            "llama", tmp / "big", dtype="float32", hidden_size=a.hidden, intermediate_size=a.ffn,
            num_hidden_layers=a.layers, num_attention_heads=max(a.hidden // 128, 1),
            num_key_value_heads=max(a.hidden // 128, 1))
        tiny = zoo.build("llama", tmp / "tiny", dtype="float32")
        child = tmp / "child.py"
        child.write_text(CHILD)
        on_disk = sum(os.path.getsize(path / f) for f in os.listdir(path) if f.endswith(".safetensors"))
        model = workbench.load(path, memory_budget=budget)
        seg = model.largest_segment
        cfg = model.family_config
        hidden, ffn = int(cfg.hidden_size), int(getattr(cfg, "intermediate_size", 4 * cfg.hidden_size))
        itemsize = model.default_dtype.size
        shape = (f"{model.family}, {model.num_layers} layers, d={hidden}, ffn={ffn}, "
                 f"{dtype_name(model.default_dtype)}{', quantized' if model.checkpoint.quant_config.default else ''}")
        activations = a.tokens * (16 * max(hidden, ffn) + int(cfg.vocab_size)) * itemsize
        kept = model.capture_budget if a.capture == "full" else 0  # captured values held before spilling
        bound = (seg.nbytes + kept + activations) * 1.2
        del model
        runs = {"streamed": [], "held": []}
        for _ in range(a.reps):
            for kind, b in (("streamed", str(budget)), ("held", "none")):
                r = subprocess.run([sys.executable, str(child), str(path), str(tiny), b, str(a.tokens), a.capture],
                                   capture_output=True, text=True)
                if r.returncode:
                    print(r.stderr[-3000:], file=sys.stderr)
                    return 1
                runs[kind].append(json.loads(r.stdout.strip().splitlines()[-1]))
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("growth", "wall", "spilled")} for k, v in runs.items()}
    s, h = med["streamed"], med["held"]
    print(f"checkpoint {fmt_bytes(on_disk)} ({shape}), budget "
          f"{fmt_bytes(budget)} ({on_disk / budget:.2f}x smaller), {a.tokens} tokens, capture={a.capture}, "
          f"{a.reps} reps (medians)")
    print(f"peak RSS growth: streamed {fmt_bytes(s['growth'])}, held {fmt_bytes(h['growth'])}; bound "
          f"{fmt_bytes(bound)} (largest segment {seg.label} {fmt_bytes(seg.nbytes)}"
          f"{f' + captured values kept {fmt_bytes(kept)}' if kept else ''} + activations "
          f"{fmt_bytes(activations)}, + 20%): {'within' if s['growth'] <= bound else 'OVER'}")
    print(f"load + forward: streamed {s['wall'] * 1e3:.0f} ms, held {h['wall'] * 1e3:.0f} ms, "
          f"ratio {s['wall'] / h['wall']:.2f}x; captured values spilled: {int(s['spilled'])}")
    return 0 if a.smoke or s["growth"] <= bound else 1


if __name__ == "__main__":
    sys.exit(main())
