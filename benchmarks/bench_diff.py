"""Engine diff cost: dumping every op and diffing an engine dump, vs one plain forward, in one run.

    python benchmarks/bench_diff.py [--tokens 128] [--reps 3] [--clock wall|cpu]
    python benchmarks/bench_diff.py --shape e2b [--layers 35] [--vocab 8192] [--dtype bfloat16]
    python benchmarks/bench_diff.py --smoke    # CI: bench_forward.py's 4-layer d=64 model, 8 tokens, one round

Builds a ~45M-parameter Gemma-4-shaped checkpoint with the zoo (8 layers, d=512; or, with
``--shape e2b``, a random checkpoint of Gemma 4 E2B's published widths, its first
``--layers`` layers and a ``--vocab`` cut vocabulary, in ``--dtype``), then
times (median of interleaved reps): the uncaptured forward; ``workbench dump`` of every
op to a float32 safetensors file (streamed); ``workbench.diff.compare`` of that dump (read
back from disk as an engine dump, one op perturbed) against a fresh reference run, without
and with local errors; and compare with a bfloat16 noise floor (a second reference run).
Prints each as a ratio to the forward and the dump size.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import workbench  # noqa: F401  (fast BLAS before mlx.core)
import mlx.core as mx
import numpy as np

from workbench import zoo
from workbench.diff import compare, dump, read_dump
from workbench.program import execute

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import CLOCKS, at_least, interleaved  # noqa: E402

SHAPE = dict(hidden_size=512, num_hidden_layers=8, intermediate_size=2048, num_attention_heads=8,
             head_dim=64, global_head_dim=128, num_key_value_heads=2, num_kv_shared_layers=2,
             hidden_size_per_layer_input=64, vocab_size=8192, vocab_size_per_layer_input=8192,
             sliding_window=128, sliding_window_pattern=4,
             layer_types=["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=at_least(1), default=128)
    p.add_argument("--reps", type=at_least(1), default=3)
    p.add_argument("--clock", default="wall", choices=list(CLOCKS))
    p.add_argument("--shape", default="small", choices=("small", "e2b"))
    p.add_argument("--layers", type=at_least(1), default=35, help="--shape e2b: the first N layers")
    p.add_argument("--vocab", type=at_least(16), default=8192, help="--shape e2b: the vocabulary cut to V")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--smoke", action="store_true",
                   help="CI: --shape small cut to bench_forward.py's SMOKE_SHAPE, 8 tokens, one round")
    a = p.parse_args(argv)
    shape = SHAPE
    if a.smoke:
        from bench_forward import SMOKE_SHAPE

        a.shape, a.tokens, a.reps, shape = "small", 8, 1, SMOKE_SHAPE
    with tempfile.TemporaryDirectory() as d:
        if a.shape == "e2b":
            from workbench.zoo import real_shapes

            path = real_shapes.build_random("e2b", Path(d) / "e2b", layers=a.layers, vocab_size=a.vocab,
                                            dtype=a.dtype)
            vocab = a.vocab
        else:
            path = zoo.build("gemma4_text", Path(d) / "g4", dtype=a.dtype, tokenizer=False, **shape)
            vocab = shape["vocab_size"]
        model = workbench.load(path)
        ids = [(7 * i + 3) % vocab for i in range(a.tokens)]
        ctx = model.context()
        feeds = model.feeds(mx.array([ids], mx.int32))

        out = Path(d) / "ref.safetensors"
        ref = dump(model, out=out, ids=ids)
        eng, _ = read_dump(out)
        target = f"layers.{model.num_layers // 2}.mlp.down_proj"
        eng[target] = eng[target] * np.float32(1.2)
        jobs = {
            "forward": lambda: mx.eval(execute(model.program, ctx, feeds)["logits"]),
            "dump": lambda: dump(model, out=out, ids=ids, keep_values=False),
            "compare": lambda: compare(model, eng, ids=ids),
            "compare_nolocal": lambda: compare(model, eng, ids=ids, local=False),
            "noise": lambda: compare(model, eng, ids=ids, noise_floor="bfloat16"),
        }
        results = {}

        def keep(k, f):
            return lambda: results.__setitem__(k, f())

        t = {k: v[0] for k, v in interleaved({k: keep(k, f) for k, f in jobs.items()}, a.reps,
                                             CLOCKS[a.clock], warmup=1).items()}
        t_fwd, t_dump, t_cmp, t_nl, t_noise = t["forward"], t["dump"], t["compare"], t["compare_nolocal"], t["noise"]
        rep, rep2 = results["compare"], results["noise"]
        size = out.stat().st_size
    assert rep.first_divergence.op == target
    print(f"gemma4_text ({a.shape}) {len(model.program)} ops, {a.tokens} tokens, {a.dtype}, device "
          f"{mx.default_device()}, clock {a.clock}")
    print(f"  forward (uncaptured)        {t_fwd * 1e3:8.1f} ms")
    print(f"  dump every op (streamed)    {t_dump * 1e3:8.1f} ms   {t_dump / t_fwd:5.1f}x forward   "
          f"({len(ref.values)} ops, {size / 1e6:.1f} MB)")
    print(f"  compare, no local errors    {t_nl * 1e3:8.1f} ms   {t_nl / t_fwd:5.1f}x forward   "
          f"({rep.compared} ops compared)")
    print(f"  compare with local errors   {t_cmp * 1e3:8.1f} ms   {t_cmp / t_fwd:5.1f}x forward")
    fd2 = rep2.first_divergence
    print(f"  compare with noise floor    {t_noise * 1e3:8.1f} ms   {t_noise / t_fwd:5.1f}x forward   "
          f"(first divergence: {fd2.op if fd2 else None}; bf16 noise nmse at {target}: "
          f"{rep2[target].noise_nmse:.2g}, its nmse {rep2[target].nmse:.2g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
