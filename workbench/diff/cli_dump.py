"""Run the reference and write its activations (float32, keyed by op name) to a safetensors file.

The file's metadata holds the op order (``workbench.op_order``, a JSON list), the token ids
(``workbench.ids``), the model path, the dtype and the matmul precision it ran under
(``workbench.matmul_precision``: TF32 is off for it on CUDA) and the positions its ``logits`` (and
``lm_head``) tensors hold rows for (``workbench.logit_positions``: ``"all"`` or a list; ``--logits``),
so the dump can be diffed with any tool.
"""
from __future__ import annotations

import json
import os

from workbench.diff import cli_common as common


def add_arguments(p) -> None:
    p.add_argument("path", help="checkpoint directory (or file)")
    common.add_input_arguments(p)
    p.add_argument("--out", required=True, help="the .safetensors file to write")
    p.add_argument("--ops", action="append", metavar="PATTERN",
                   help="only ops matching this glob (or re:REGEX, taken whole); repeatable, or comma-separated globs")
    common.add_dtype_argument(p)
    common.add_logits_argument(p, "the positions whose logits the head computes and the dump holds (default: all "
                                  "unless they would pass the logits budget, WORKBENCH_LOGITS_BUDGET, then last)")
    p.add_argument("--json", action="store_true", help="print a JSON summary")


def run(args) -> int:
    from workbench.diff.api import dump

    ids, prompt = common.parse_input(args)
    logits = common.parse_logits(args)
    ops = None
    if args.ops:
        # globs may be comma-separated; a re: pattern is taken whole (its commas are its own: a{1,3})
        ops = [s.strip() for arg in args.ops for s in ([arg] if arg.startswith("re:") else arg.split(","))
               if s.strip()]
    out = args.out
    if not out.endswith(".safetensors"):
        raise common.UsageError(f"--out {out}: the dump is written as safetensors; name it *.safetensors")
    from workbench import fsio
    from workbench.diff.api import is_reference_dump

    # before the work, not after it; an existing file only if it is a dump of ours
    fsio.check_destination(out, replaceable=is_reference_dump, kind="a workbench dump")
    with common.usage_errors():
        ref = dump(args.path, out=out, prompt=prompt, ids=ids, ops=ops, dtype=args.dtype, keep_values=False,
                   logits=logits)
    size = os.path.getsize(out)
    summary = {"out": out, "ops": len(ref.dtypes), "program_ops": len(ref.order), "bytes": size,
               "ids": ref.ids, "dtype": ref.dtype or "float32", "names": list(ref.dtypes),
               "matmul_precision": ref.matmul_precision,
               "logit_positions": None if ref.positions is None else
               ("all" if len(ref.positions) == len(ref.ids or ()) else [int(p) for p in ref.positions]),
               "logits_note": ref.logits_note}
    if args.json:
        print(json.dumps(summary))
    else:
        from workbench.trace.logits import describe

        where = "" if ref.positions is None else f"; logits: {describe(ref.positions, len(ref.ids))}"
        print(f"wrote {len(ref.dtypes)} of {len(ref.order)} ops ({size / 1e6:.1f} MB, float32) to {out}"
              f" (matmuls: {ref.matmul_precision}{where})")
        if ref.logits_note:
            print(ref.logits_note)
    return 0
