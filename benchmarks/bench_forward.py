"""Our forward (uncaptured, and traced with stats / full capture) vs mlx-lm's, side by side.

    python benchmarks/bench_forward.py [--tokens 256] [--reps 7] [--dtype float32]
    python benchmarks/bench_forward.py --smoke    # CI: a 4-layer d=64 model, 8 tokens, one round

Builds a ~45M-parameter Gemma-4-shaped checkpoint (8 layers, d=512, vocab 8192, PLE,
KV sharing) with the zoo, then times, interleaved in one run (median of reps, every
variant evaluated to its logits):

* mlx-lm's forward (the reference);
* ``execute(program)`` (the uncaptured op program);
* ``workbench.trace(..., capture=None).run()`` (the tracer without capture);
* ``capture="stats"``: statistics of every op (min/max/mean/std/absmax, NaN/+Inf/-Inf
  counts, zero fraction, headroom);
* ``capture="full"``: every op's output kept (plus its statistics);

and prints each one's ratio to mlx-lm's forward (and, in half precision, how far each
forward's logits are from its own float32 logits).  ``WORKBENCH_STATS=device`` forces the
device (GPU) statistics path on the CPU.  Targets (issue 3): uncaptured <= 1.10x,
stats <= 1.15x, full <= 1.5x.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import workbench  # noqa: F401  (fast BLAS before mlx.core)
import mlx.core as mx

from workbench import zoo
from workbench.program import execute

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import CLOCKS, at_least, interleaved  # noqa: E402

SHAPE = dict(hidden_size=512, num_hidden_layers=8, intermediate_size=2048, num_attention_heads=8,
             head_dim=64, global_head_dim=128, num_key_value_heads=2, num_kv_shared_layers=2,
             hidden_size_per_layer_input=64, vocab_size=8192, vocab_size_per_layer_input=8192,
             sliding_window=128, sliding_window_pattern=4,
             layer_types=["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"])
#: --smoke (CI: the benchmarks cannot rot, issue 40.5): the same kinds of layers, tiny
SMOKE_SHAPE = dict(hidden_size=64, num_hidden_layers=4, intermediate_size=128, num_attention_heads=2,
                   head_dim=32, global_head_dim=64, num_key_value_heads=1, num_kv_shared_layers=2,
                   hidden_size_per_layer_input=16, vocab_size=512, vocab_size_per_layer_input=512,
                   sliding_window=16, sliding_window_pattern=2,
                   layer_types=["sliding_attention", "full_attention"] * 2)


def build(dest: Path, dtype: str, quant=None, shape: dict = SHAPE) -> Path:
    return zoo.build("gemma4_text", dest, dtype=dtype, quant=quant, tokenizer=False, **shape)


def bench(path: Path, tokens: int, reps: int, clock=time.perf_counter):
    from mlx_lm.utils import load_model

    ref, _ = load_model(path)
    model = workbench.load(path)
    nparams = sum(model._raw[n].size for n in model.tensor_names)
    ids = mx.array([[(7 * i + 3) % model.vocab_size for i in range(tokens)]], mx.int32)
    ctx = model.context()

    def ours():
        mx.eval(execute(model.program, ctx, model.feeds(ids))["logits"])

    def theirs():
        mx.eval(ref(ids))

    def traced(capture):
        def f():
            t = workbench.trace(model, ids[0], capture=capture)
            t.run()
            mx.eval(t.logits)
        return f

    variants = {"mlx-lm": theirs, "execute": ours, "trace-none": traced(None),
                "trace-stats": traced("stats"), "trace-full": traced("full")}
    med = interleaved(variants, reps, clock, warmup=2)
    full = workbench.trace(model, ids[0], capture="full")
    full.run()
    extra = {"ops": len(model.program), "full_bytes": full.store.memory_bytes + 0,
             "spilled": len(full.store.spilled)}
    check = float(mx.abs(full.logits - ref(ids)[0]).max())
    extra["max_abs_diff_vs_mlx_lm"] = check
    if model.default_dtype != mx.float32:  # half-precision fidelity: each forward vs its own float32
        from mlx.utils import tree_map
        params = ref.parameters()
        half = ref(ids).astype(mx.float32)
        ref.update(tree_map(lambda p: p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) else p, params))
        r32 = ref(ids).astype(mx.float32)
        ref.update(params)
        o32 = model(ids, dtype="float32").astype(mx.float32)
        extra["half_err_ours"] = float(mx.abs(full.logits.astype(mx.float32) - o32[0]).max())
        extra["half_err_mlx_lm"] = float(mx.abs(half - r32).max())
    return nparams, med, extra


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--reps", type=at_least(1), default=7)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--quant", default=None, choices=[None, "affine4", "mxfp4"])
    p.add_argument("--clock", default="wall", choices=list(CLOCKS),
                   help="wall: elapsed time (default); cpu: this process's CPU time, all threads (steadier on a "
                        "shared machine; counts the background statistics thread in full, so it is pessimistic)")
    p.add_argument("--smoke", action="store_true",
                   help="CI: a tiny model (SMOKE_SHAPE), 8 tokens, one round: that it runs, not how fast")
    a = p.parse_args(argv)
    if a.smoke:
        a.tokens, a.reps = 8, 1
    with tempfile.TemporaryDirectory() as d:
        path = build(Path(d) / "g4", a.dtype, a.quant, SMOKE_SHAPE if a.smoke else SHAPE)
        clock = CLOCKS[a.clock]
        n, med, extra = bench(path, a.tokens, a.reps, clock)
    print(f"gemma4_text {n / 1e6:.1f}M params, {extra['ops']} ops, {a.tokens} tokens, {a.dtype}"
          f"{', ' + a.quant if a.quant else ''}, device {mx.default_device()}, median of {a.reps}, {a.clock} clock")
    ref, ref_min = med["mlx-lm"]
    targets = {"execute": 1.10, "trace-none": 1.10, "trace-stats": 1.15, "trace-full": 1.5}
    labels = {"mlx-lm": "mlx-lm forward", "execute": "workbench uncaptured (execute)",
              "trace-none": "trace, capture=None", "trace-stats": "trace, capture='stats'",
              "trace-full": "trace, capture='full'"}
    print(f"  {'':32s} {'median':>8s}    {'min':>8s}")
    for k, (v, vmin) in med.items():
        tgt = (f"   ratio {v / ref:.3f}x (of mins {vmin / ref_min:.3f}x; target <= {targets[k]:.2f}x)"
               if k in targets else "")
        print(f"  {labels[k]:32s} {v * 1e3:8.1f} ms {vmin * 1e3:8.1f} ms{tgt}")
    print(f"  full capture holds {extra['full_bytes'] / 2**20:.1f} MiB in memory ({extra['spilled']} values spilled); "
          f"logits max |ours - mlx-lm| = {extra['max_abs_diff_vs_mlx_lm']:.2e}")
    if "half_err_ours" in extra:
        print(f"  {a.dtype} logits vs the same forward in float32: ours max abs {extra['half_err_ours']:.3g}, "
              f"mlx-lm max abs {extra['half_err_mlx_lm']:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
