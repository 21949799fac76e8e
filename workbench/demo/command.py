"""Show the embedded demo model: where it is, and a short greedy generation.

``workbench demo`` prints the demo checkpoints' paths and completes a prompt;
``--eval`` measures exact-match accuracy on the held-out set (exit 1 below the 90%
threshold); ``--heads`` measures the previous-token / induction / recall heads.
"""
from __future__ import annotations

import json
from pathlib import Path


from workbench.errors import UsageError

DEFAULT_PROMPT = "apple river stone cloud tree | apple"


def add_arguments(p):
    from workbench.errors import number_arg

    p.add_argument("--model", choices=("demo", "4bit", "moe", "experts", "kv"), default="demo",
                   help="which demo checkpoint (default: demo, the trained bfloat16 model; experts: MoE with "
                        "task-specialised experts; kv: KV-shared layers, 8-token window)")
    p.add_argument("--path", type=Path, default=None, help="a checkpoint directory to use instead")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"text to complete (default: {DEFAULT_PROMPT!r})")
    p.add_argument("--max-tokens", type=number_arg(1, integer=True), default=12)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="compute dtype (default: the checkpoint's; float32 runs the 4-bit copy ~10x faster on CPU)")
    p.add_argument("--eval", action="store_true", help="held-out exact-match accuracy per task")
    p.add_argument("--n", type=number_arg(1, integer=True), default=100, help="--eval: held-out examples per task (default 100)")
    p.add_argument("--heads", action="store_true", help="measure previous-token / induction / recall heads")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args) -> int:
    from workbench.demo import paths
    from workbench.demo.loading import load_demo

    path = args.path or paths.VARIANTS[args.model]
    if args.max_tokens < 0:
        raise UsageError("--max-tokens must be >= 0")
    demo = load_demo(path, dtype=args.dtype)  # raises UsageError naming the missing/broken file
    out: dict = {"path": str(path), "files": {f.name: f.stat().st_size for f in sorted(Path(path).iterdir())},
                 "model_type": demo.config.get("model_type"), "loader": demo.loader,
                 "variants": {k: str(v) for k, v in paths.VARIANTS.items()}}
    status = 0
    if not (args.eval or args.heads):
        ids = demo.tokenizer.encode(args.prompt).ids
        gen = demo.generate(ids, args.max_tokens)
        out.update({"prompt": args.prompt, "prompt_tokens": len(ids), "completion": demo.tokenizer.decode(gen),
                    "completion_ids": gen})
    if args.eval:
        from workbench.demo.evaluate import evaluate
        from workbench.demo import corpus
        if args.n < 1:
            raise UsageError("--n must be at least 1")
        res = evaluate(demo.forward, demo.tokenizer, corpus.heldout(args.n))
        out["eval"] = res.to_dict()
        status = 0 if res.passed else 1
    if args.heads:
        from workbench.demo.heads import best_heads, head_scores
        if demo.mlx_lm_model is None:
            raise UsageError(f"{path}: --heads needs a model mlx-lm can run")
        out["heads"] = best_heads(head_scores(demo.mlx_lm_model, demo.tokenizer))
    if args.json:
        print(json.dumps(out, indent=2))
        return status
    print(f"demo model: {path}  ({out['model_type']}, loaded by {demo.loader})")
    print("  files: " + ", ".join(f"{k} ({v / 1e6:.2f} MB)" if v > 1e5 else k for k, v in out["files"].items()))
    print("  variants: " + ", ".join(f"{k}={v}" for k, v in out["variants"].items()))
    if "completion" in out:
        print(f"prompt:     {args.prompt!r}")
        print(f"completion: {out['completion']!r}  (greedy, {len(out['completion_ids'])} tokens)")
    if "eval" in out:
        e = out["eval"]
        print(f"held-out exact-match accuracy (threshold {e['threshold']:.0%}):")
        for t, a in e["accuracy"].items():
            print(f"  {t:8s} {a:7.1%}  of {e['n'][t]}")
        print(f"  overall  {e['overall']:7.1%}  -> {'PASS' if e['passed'] else 'FAIL'}")
        for f in e["failures"][:3]:
            print(f"  miss: {f['prompt']!r} expected {f['expected']!r} got {f['got']!r}")
    if "heads" in out:
        for name, h in out["heads"].items():
            print(f"best {name} head: layer {h['layer']} head {h['head']}  score {h['score']:.3f}")
    return status
