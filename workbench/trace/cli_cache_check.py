"""Check the KV cache: prefill(T-1) + decode(1) against one forward, per layer.

    workbench cache-check PATH (--prompt TEXT | --ids 1,2,3) [--dtype float16|bfloat16|float32]
                          [--granularity auto|op|module] [--json]

Prefills the first T-1 tokens through the model's KV cache (op programs: ours, as
``workbench.generate`` uses it; module level: the reference's own ``make_cache()``),
decodes the last token, and compares ``layers.{i}`` and ``logits`` at the last position
with one forward over all T tokens.  Reports the first name beyond its dtype's relative
tolerance (float32 1e-4, float16 1e-2, bfloat16 3.125e-2) and whether TF32 could explain
it (CUDA, float32, TF32 on).  Exit status: 0 consistent, 1 a difference, 2 unusable input.
``--json`` prints ``{"consistent", "first", "layer", "rows": [{"name", "dtype", "max_abs",
"rel", "tolerance", "ok"}], "argmax", "tf32", ...}`` (workbench/trace/cache_check.py).
"""
from __future__ import annotations

import json


def add_arguments(p):
    p.add_argument("path", help="checkpoint directory (config.json + safetensors)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="text to run, at least 2 tokens (needs the checkpoint's tokenizer.json)")
    src.add_argument("--ids", help="comma-separated token ids, at least 2, e.g. 2,15,16")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="compute dtype (default: the checkpoint's storage dtype)")
    p.add_argument("--granularity", choices=("auto", "op", "module"), default="auto",
                   help="op program with our KV cache (op) or the reference's modules with its own cache "
                        "(module); auto: op where a program exists")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args) -> int:
    import os

    from workbench.errors import UsageError, printable
    from workbench.trace.cache_check import cache_check
    from workbench.trace.cli import load_with_ids
    from workbench.trace.step import TraceError

    if not os.path.exists(args.path):
        raise UsageError(f"cannot load {args.path}: no such file or directory")
    model, ids = load_with_ids(args)
    if len(ids) < 2:
        raise UsageError(f"cache-check needs at least 2 tokens (prefill T-1, decode 1); "
                         f"{'the prompt encodes to' if args.ids is None else '--ids gives'} {len(ids)}")
    try:
        result = cache_check(model, ids, dtype=args.dtype)
    except (ValueError, TypeError, KeyError, TraceError) as e:
        raise UsageError(str(e).strip("'\"")) from None
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, allow_nan=False))
    else:
        for line in result.lines():
            print(printable(line))
    return 0 if result.consistent else 1
