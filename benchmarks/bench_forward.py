"""Uncaptured forward of the op program vs mlx-lm's forward, side by side in one run.

    python benchmarks/bench_forward.py [--tokens 256] [--reps 7] [--dtype float32]

Builds a ~45M-parameter Gemma-4-shaped checkpoint (8 layers, d=512, vocab 8192, PLE,
KV sharing) with the zoo, then times ``execute(program)`` and ``mlx_lm`` forward
(both evaluated, interleaved, median of reps) and prints the ratio.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import workbench  # noqa: F401  (fast BLAS before mlx.core)
import mlx.core as mx

from workbench import zoo
from workbench.program import execute

SHAPE = dict(hidden_size=512, num_hidden_layers=8, intermediate_size=2048, num_attention_heads=8,
             head_dim=64, global_head_dim=128, num_key_value_heads=2, num_kv_shared_layers=2,
             hidden_size_per_layer_input=64, vocab_size=8192, vocab_size_per_layer_input=8192,
             sliding_window=128, sliding_window_pattern=4,
             layer_types=["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"])


def build(dest: Path, dtype: str, quant=None) -> Path:
    return zoo.build("gemma4_text", dest, dtype=dtype, quant=quant, tokenizer=False, **SHAPE)


def bench(path: Path, tokens: int, reps: int):
    from mlx_lm.utils import load_model

    ref, _ = load_model(path)
    model = workbench.load(path)
    nparams = sum(model._raw[n].size for n in model.tensor_names)
    ids = mx.array([[(7 * i + 3) % 8192 for i in range(tokens)]], mx.int32)
    ctx = model.context()

    def ours():
        mx.eval(execute(model.program, ctx, model.feeds(ids))["logits"])

    def theirs():
        mx.eval(ref(ids))

    for f in (ours, theirs, ours, theirs):  # warm up (weights paged in, kernels compiled)
        f()
    t_ours, t_ref = [], []
    for _ in range(reps):
        for f, acc in ((ours, t_ours), (theirs, t_ref)):
            t0 = time.perf_counter()
            f()
            acc.append(time.perf_counter() - t0)
    return nparams, statistics.median(t_ours), statistics.median(t_ref)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--quant", default=None, choices=[None, "affine4", "mxfp4"])
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        path = build(Path(d) / "g4", a.dtype, a.quant)
        n, ours, ref = bench(path, a.tokens, a.reps)
    print(f"gemma4_text {n / 1e6:.1f}M params, {a.tokens} tokens, {a.dtype}"
          f"{', ' + a.quant if a.quant else ''}, device {mx.default_device()}")
    print(f"  mlx-lm forward        {ref * 1e3:8.1f} ms")
    print(f"  workbench uncaptured  {ours * 1e3:8.1f} ms   ratio {ours / ref:.3f}x (target <= 1.10x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
