"""Trace a checkpoint split by layers across the processes mlx.launch started.

    mlx.launch --backend ring -n 2 -- python -m workbench.cli distributed PATH
        (--prompt TEXT | --ids 1,2,3) [--layers 3,3] [--dtype D] [--capture stats|full|none|PATTERN]
        [--attention fused|explicit|LAYERS] [--logits OUT.npy] [--json]

Every rank runs the same command; each steps its own layers (rank 0 also the embeddings,
the last rank the final norm, lm_head and logits) and only rank 0 prints: the ranks (host,
layers, ops, seconds) and the ops closest to overflow, or with ``--json``
``{"ranks": [...], "steps": [one record per op, in program order], "logits": {"shape",
"dtype", "last_argmax"}}``.  ``--logits`` writes the logits (float32 .npy, [1, T, vocab]) on rank 0,
to a new file (an existing one is refused, as at every output path: fsio.check_destination).
Exit 0; 2 for unusable input (one line, ``rank R:`` in front when there are several
ranks; mlx.launch itself exits 0 whatever its ranks did, so read stderr).
"""
from __future__ import annotations

import io
import json


def add_arguments(p):
    from workbench.errors import number_arg

    p.add_argument("path", help="checkpoint directory (config.json + safetensors), the same on every host")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="text to run (rank 0 encodes it with the checkpoint's tokenizer.json)")
    src.add_argument("--ids", help="comma-separated token ids, e.g. 2,15,16")
    p.add_argument("--layers", help="layer counts per rank, e.g. 3,3 (default: balanced by weight bytes)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="compute dtype (default: the checkpoint's storage dtype)")
    p.add_argument("--capture", action="append",
                   help="stats (default) | full | none | an op name pattern (repeatable)")
    p.add_argument("--attention", help="fused (default) | explicit | layers to make explicit, e.g. 3,5 "
                                       "(their scores and softmax become steps)")
    p.add_argument("--logits", help="write the logits to this .npy file (float32, rank 0; a new file: "
                                    "an existing one is not replaced)")
    p.add_argument("--top", type=number_arg(0, integer=True), default=5, help="ops closest to overflow to list (default 5)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _capture(values):
    if not values:
        return "stats"
    if len(values) == 1 and values[0] in ("stats", "full", "none"):
        return None if values[0] == "none" else values[0]
    if any(v in ("stats", "full", "none") for v in values):
        from workbench.errors import UsageError
        raise UsageError("--capture: stats, full and none stand alone (patterns may repeat)")
    return list(values)


def run(args) -> int:
    import mlx.core as mx
    import numpy as np

    from workbench import fsio
    from workbench.distributed.plan import parse_split
    from workbench.distributed.run import trace_distributed
    from workbench.distributed.wire import WireError
    from workbench.errors import UsageError, parse_ids
    from workbench.attention import parse_option
    from workbench.trace.cli import print_headroom

    group = mx.distributed.init()
    rank, size = group.rank(), group.size()
    try:
        if args.logits and rank == 0:
            fsio.check_destination(args.logits)
        split = parse_split(args.layers) if args.layers else None
        what = args.prompt if args.prompt is not None else parse_ids(args.ids)
        if args.prompt is not None and not args.prompt:
            raise UsageError("--prompt is empty")
        t = trace_distributed(args.path, what, capture=_capture(args.capture), dtype=args.dtype,
                              split=split, group=group,
                              attention=parse_option(args.attention) if args.attention is not None else None)
    except (UsageError, WireError, ValueError, KeyError) as e:
        msg = str(e).strip().strip("'\"").splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"rank {rank}: {msg}" if size > 1 and not msg.startswith("rank ") else msg) from None
    if t is None:  # not rank 0: rank 0 reports
        return 0
    logits = t.logits.astype(mx.float32)
    last = logits.reshape(-1, logits.shape[-1])[-1]
    top = int(mx.argmax(last).item())
    if args.logits:
        buf = io.BytesIO()
        np.save(buf, np.array(logits), allow_pickle=False)
        fsio.check_destination(args.logits)  # (again: nothing appeared there while the ranks ran)
        fsio.write_bytes(args.logits, buf.getvalue())
    if args.json:
        doc = {"ranks": t.ranks, "steps": t.records(),
               "logits": {"shape": list(t.logits.shape), "dtype": str(t.logits.dtype).replace("mlx.core.", ""),
                          "last_argmax": top}}
        print(json.dumps(doc, allow_nan=False))
        return 0
    for r in t.ranks:
        rss = "" if r.get("peak_rss") is None else f", peak RSS {r['peak_rss'] / 2**20:.0f} MiB"
        print(f"rank {r['rank']} on {r['host']}: layers {r['layers'][0]}-{r['layers'][1]}, {r['ops']} ops, "
              f"{len(r['tensors'])} tensors read, {r['seconds']:.3f} s (waited {r['waited']:.3f} s), "
              f"sent {r['sent_bytes']} bytes onward{rss}")
    print(f"{len(t.steps)} ops traced in program order; logits {list(t.logits.shape)}, "
          f"last position's top token {top}")
    print_headroom(t.headroom(args.top))
    return 0
