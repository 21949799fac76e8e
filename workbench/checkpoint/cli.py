"""Check a checkpoint against its config: completeness, shapes, dtypes, quantization, files.

    workbench inspect PATH [--values] [--tensors] [--json]
    workbench inspect PATH --diff OTHER [--values] [--json]

Exit status: 0 no errors, 1 errors found (with --diff: the checkpoints differ, a side has
errors, or not every tensor could be compared), 2 the path cannot be read as a checkpoint.
"""
from __future__ import annotations

import json
import sys


def add_arguments(p):
    p.add_argument("path", help="checkpoint directory (config.json + safetensors) or a .safetensors file")
    p.add_argument("--values", action="store_true",
                   help="stream every tensor: min/max/mean/std/absmax, NaN/+Inf/-Inf counts, zero fraction")
    p.add_argument("--tensors", action="store_true", help="list every tensor (name, file, offset, dtype, shape)")
    p.add_argument("--diff", metavar="OTHER", help="show what differs from another checkpoint")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar, even on a terminal")


def run(args) -> int:
    from workbench.errors import UsageError
    from workbench.checkpoint.inspect import diff, inspect, render_diff
    from workbench.checkpoint.reader import CheckpointError
    from workbench.registry import MissingExtra

    progress = False if (args.no_progress or args.json) else None
    try:
        if args.diff:
            d = diff(args.path, args.diff, values=args.values, progress=progress)
            if args.json:
                print(json.dumps(d, indent=2, allow_nan=False, default=str))
            else:
                print(render_diff(d))
            return 0 if d["verdict"] in ("same", "headers-match") else 1
        r = inspect(args.path, values=args.values, tensors=args.tensors, progress=progress)
    except (CheckpointError, MissingExtra) as e:
        raise UsageError(str(e)) from None
    if args.json:
        print(json.dumps(r.to_dict(), indent=2, allow_nan=False, default=str))
    else:
        print(r.render(color=sys.stdout.isatty()))
    return 0 if r.ok else 1
