"""Generation tokens/s: mlx-lm's ``generate_step`` vs ``workbench.generate`` (stats / no capture).

    python benchmarks/bench_generate.py [--tokens 64] [--prompt 16] [--reps 5] [--clock cpu]
                                        [--which op,module] [--temperature 0] [--top-p 1]
    python benchmarks/bench_generate.py --which op --path CKPT   # e.g. bench_real.py's E2B --path
    python benchmarks/bench_generate.py --smoke    # CI: tiny models, 4-token prompt + 4 generated, one round

Two ~45M-parameter checkpoints: the Gemma-4-shaped op-program model of
benchmarks/bench_forward.py (8 layers, d=512, vocab 8192, PLE, KV sharing) and a phi3
(module level: mlx-lm's own classes recorded module by module, workbench.zoo.reference).
For each, interleaved in one run (median of reps), every variant generating ``--tokens``
tokens after the same ``--prompt``-token prompt, prefill included:

* mlx-lm: ``generate_step`` (its sampler from ``make_sampler``, its own KV cache);
* ``workbench.generate(..., capture="stats")``: statistics of every op of every forward;
* ``workbench.generate(..., capture=None)``: the trace without capture.

Prints tokens/s and each variant's tokens/s as a fraction of mlx-lm's (issue 11.5 target:
stats >= 0.85), and checks that every variant produced the same tokens.  ``--clock cpu``
times this process's CPU time (all threads: steadier on a shared machine, and it counts
the background statistics thread in full, so it is pessimistic for stats).  On a shared
machine also set ``OPENBLAS_NUM_THREADS=1``: a contended multi-threaded BLAS spins, and
its spinning is counted as CPU time (it made every variant 3-10x slower and noisier here).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import workbench  # noqa: F401  (fast BLAS before mlx.core)
import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import CLOCKS, at_least, interleaved  # noqa: E402

PHI3 = dict(model_type="phi3", hidden_size=512, num_hidden_layers=8, intermediate_size=2048,
            num_attention_heads=8, num_key_value_heads=8, vocab_size=12000, rms_norm_eps=1e-5,
            rope_theta=10000.0, max_position_embeddings=4096, tie_word_embeddings=False)
#: --smoke (CI): a tiny phi3.  It names partial_rotary_factor (phi3's default, 1.0) because the
#: module-level reader refuses a phi3 config without it (issue 40); PHI3 above does not.
PHI3_SMOKE = dict(PHI3, hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2,
                  num_key_value_heads=2, vocab_size=512, partial_rotary_factor=1.0)


def build(kind: str, dest: Path, smoke: bool = False) -> Path:
    if kind == "op":
        from bench_forward import SHAPE, SMOKE_SHAPE  # the same Gemma-4 shape as the forward benchmark
        from workbench import zoo
        return zoo.build("gemma4_text", dest, dtype="float32", tokenizer=False, **(SMOKE_SHAPE if smoke else SHAPE))
    from workbench.zoo import reference as zr
    return zr.write(dest, PHI3_SMOKE if smoke else PHI3)


def bench(path: Path, kind: str, tokens: int, prompt_len: int, reps: int, clock, sampling: dict,
          split: bool = False):
    from mlx.utils import tree_flatten
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler
    from mlx_lm.utils import load_model

    ref, _ = load_model(path)
    model = workbench.load(path, granularity="module") if kind == "module" else workbench.load(path)
    nparams = sum(v.size for _, v in tree_flatten(ref.parameters()))
    vocab = model.vocab_size
    prompt = [(7 * i + 3) % vocab for i in range(prompt_len)]
    seed = 7
    out: dict[str, list[int]] = {}

    def theirs():
        mx.random.seed(seed)
        sampler = make_sampler(sampling["temperature"], top_p=sampling["top_p"], top_k=sampling["top_k"])
        toks = [t for t, _ in generate_step(mx.array(prompt), ref, max_tokens=tokens, sampler=sampler)]
        out["mlx-lm"] = toks

    def ours(capture, key=None, env=None):
        def f():
            saved = {k: os.environ.get(k) for k in env or {}}
            os.environ.update(env or {})
            try:
                g = workbench.generate(model, prompt, max_tokens=tokens, capture=capture, seed=seed, past_eos=True,
                                       **sampling)  # as generate_step: every token, <eos> or not
            finally:
                for k, v in saved.items():
                    os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
            out[key or f"capture={capture}"] = g.tokens
        return f

    variants = {"mlx-lm": theirs, "capture=stats": ours("stats"), "capture=None": ours(None)}
    if split:  # where the statistics' cost goes: every output kept with no statistics; lazy MLX reductions
        variants["capture=full"] = ours("full")
        variants["stats, lazy"] = ours("stats", "stats, lazy", {"WORKBENCH_STATS_CUDA": "0"})
    med = interleaved(variants, reps, clock, warmup=1)
    same = {k: v == out["mlx-lm"] for k, v in out.items()}
    return nparams, med, same


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--reps", type=at_least(1), default=5)
    p.add_argument("--which", default="op,module", help="comma list of: op (gemma4_text), module (phi3)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--clock", default="wall", choices=list(CLOCKS),
                   help="wall: elapsed time (default); cpu: this process's CPU time, all threads")
    p.add_argument("--path", type=Path, default=None,
                   help="generate from this checkpoint instead (an op-program family, e.g. bench_real.py's "
                        "real-shaped --path): --which must be op")
    p.add_argument("--split", action="store_true",
                   help="also capture=full (every output kept, no statistics) and statistics through lazy MLX "
                        "reductions (WORKBENCH_STATS_CUDA=0): where the statistics' cost goes")
    p.add_argument("--smoke", action="store_true",
                   help="CI: tiny models (bench_forward.py's SMOKE_SHAPE, PHI3_SMOKE), 4-token prompt + 4 generated, "
                        "one round: that it runs, not how fast")
    a = p.parse_args(argv)
    if a.smoke:
        a.tokens, a.prompt, a.reps = 4, 4, 1
    if a.path is not None and (a.which != "op" or not (a.path / "config.json").is_file()):
        p.error(f"--path needs --which op and a checkpoint folder with a config.json, got {a.path}")
    clock = CLOCKS[a.clock]
    sampling = dict(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k)
    for kind in a.which.split(","):
        name = {"op": "gemma4_text (op program)", "module": "phi3 (module level)"}[kind]
        with tempfile.TemporaryDirectory() as d:
            path = a.path or build(kind, Path(d) / kind, a.smoke)
            if a.path:
                name = f"{path.name} (op program)"
            n, med, same = bench(path, kind, a.tokens, a.prompt, a.reps, clock, sampling, a.split)
        print(f"{name}: {n / 1e6:.1f}M params, {a.prompt}-token prompt + {a.tokens} generated, {sampling}, "
              f"device {mx.default_device()}, median of {a.reps}, {a.clock} clock")
        ref, ref_min = med["mlx-lm"]
        for k, (v, vmin) in med.items():
            ratio = "" if k == "mlx-lm" else (f"   {ref / v:.3f} of mlx-lm's tokens/s (of best times "
                                              f"{ref_min / vmin:.3f}){'; target >= 0.85' if k == 'capture=stats' else ''}")
            print(f"  {k:14s} {v * 1e3:8.1f} ms  {a.tokens / v:8.1f} tok/s{ratio}"
                  f"{'' if same[k] else '   TOKENS DIFFER from mlx-lm'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
