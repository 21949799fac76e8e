"""Compare an engine's activation dump with our reference and report the first op where they diverge.

ENGINE_DUMP is a .safetensors or .npz file or a directory of .npy files.  --map RULES.json
renames the engine's tensors onto our op names (a JSON list of [regex, replacement] pairs,
applied in order); --map auto (or no --map, where few of the engine's names are ours) matches
them by value, and --write-map FILE keeps the proposed rules.  Exit 0: no divergence; 1: a
divergence (or an op that, fed the engine's own inputs, does not reproduce its output); 2:
unusable input.
"""
from __future__ import annotations

import json
import math

from workbench.diff import cli_common as common
from workbench.diff.metrics import Tolerance
from workbench.errors import number_arg


def add_arguments(p) -> None:
    p.add_argument("path", help="checkpoint directory (or a reference dump written by `workbench dump`)")
    p.add_argument("engine_dump", metavar="ENGINE_DUMP", help=".safetensors, .npz, or a directory of .npy files")
    common.add_input_arguments(p)
    p.add_argument("--map", metavar="RULES.json", help="JSON list of [regex, replacement] pairs for engine names; "
                   "'auto': match them by value (taken anyway, and said, when few of them are ours and no --map "
                   "or --engine is given)")
    p.add_argument("--write-map", metavar="FILE", default=None,
                   help="write the rules --map auto proposes to FILE (a new file), to keep, edit and pass back with "
                        "--map FILE (implies --map auto)")
    p.add_argument("--engine", metavar="NAME", default=None,
                   help="the engine's naming and layouts, built in: transformers (module paths, as "
                        "workbench.diff.torch_hooks records them) or llama.cpp (GGML names; ENGINE_DUMP may be "
                        "llama-eval-callback's text output); no --map needed (default: what the dump's metadata says)")
    p.add_argument("--decode", action="store_true", default=None,
                   help="ENGINE_DUMP is one decode step (the last of the ids through the engine's KV cache): compare "
                        "it with our full forward's row at that position (default: what the dump's metadata says)")
    common.add_dtype_argument(p)
    common.add_logits_argument(p, "the positions at which the head's tensors (lm_head, logits) are compared "
                                  "(default: those both sides hold; against a checkpoint the reference computes all "
                                  "unless they would pass the logits budget, then last)")
    d = Tolerance()
    p.add_argument("--min-cosine", type=number_arg(-1, 1, what="a cosine similarity"), default=d.min_cosine,
                   help=f"an op diverges below this cosine similarity (default {d.min_cosine})")
    p.add_argument("--max-nmse", type=number_arg(0), default=d.max_nmse,
                   help=f"an op diverges above this MSE / var(reference) (default {d.max_nmse})")
    p.add_argument("--max-abs", type=number_arg(0), default=None, help="an op diverges above this max abs error (default: off)")
    p.add_argument("--noise-floor", choices=("bfloat16", "float16"), default=None,
                   help="the engine's compute dtype: also run our reference in it and hold every op to "
                        f"--noise-factor x that run's error instead of fixed limits (reference in float32)")
    p.add_argument("--noise-factor", type=number_arg(0, above=True), default=d.noise_factor,
                   help=f"multiple of the noise floor an op may reach (default {d.noise_factor:g})")
    p.add_argument("--engine-dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="the precision the engine computes in: each op's local error is held to its rounding "
                        "there (default: what the dump's metadata says, else what its values are exact in)")
    p.add_argument("--no-local", dest="local", action="store_false",
                   help="skip the local errors (our op on the engine's own inputs; about one more forward)")
    p.add_argument("--plot", metavar="FILE.png", help="also save the per-op error curve (a new file: "
                                                      "an existing one is not replaced)")
    p.add_argument("--plot-positions", metavar="FILE.png", help="also save the error map by op and token position "
                                                                "(a new file)")
    p.add_argument("--all", action="store_true", help="list every compared op (text output)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _same_file(a: str, b: str) -> bool:
    import os

    return os.path.abspath(a) == os.path.abspath(b)


def _carries_ids(path: str) -> bool:
    """Whether an engine's safetensors dump names its token ids (workbench.ids: torch_hooks writes them)."""
    import struct

    from workbench import fsio

    try:
        with fsio.open_regular(path) as f:
            n = struct.unpack("<Q", f.read(8))[0]
            if n > 100 * 2**20:
                return False
            head = json.loads(f.read(n))
    except Exception:  # not a safetensors file (the reader says what it is)
        return False
    return isinstance(head, dict) and "workbench.ids" in (head.get("__metadata__") or {})


def run(args) -> int:
    from workbench.diff.api import compare, is_reference_dump

    is_ref = is_reference_dump(args.path)
    ids, prompt = common.parse_input(args, required=not is_ref and not _carries_ids(args.engine_dump))
    logits = common.parse_logits(args)
    for flag, v in (("--min-cosine", args.min_cosine), ("--max-nmse", args.max_nmse), ("--max-abs", args.max_abs),
                    ("--noise-factor", args.noise_factor)):
        if v is not None and not math.isfinite(v):
            raise common.UsageError(f"{flag} must be a finite number, not {v}")
    tol = Tolerance(min_cosine=args.min_cosine, max_nmse=args.max_nmse, max_abs=args.max_abs,
                    noise_factor=args.noise_factor)
    from workbench import fsio

    if args.plot and args.plot_positions and _same_file(args.plot, args.plot_positions):
        raise common.UsageError(f"--plot and --plot-positions name the same file ({args.plot}): give each its own")
    if args.write_map and args.map not in (None, "auto"):
        raise common.UsageError(f"--write-map writes the map proposed by value: give --map auto (or no --map), "
                                f"not --map {args.map}")
    if args.write_map and args.engine:
        raise common.UsageError("--write-map writes the map proposed by value: not with --engine (its names are known)")
    for dest in (args.plot, args.plot_positions, args.write_map):  # before the work, not after; an existing file never
        if dest:
            fsio.check_destination(dest)
    with common.usage_errors():
        report = compare(args.path, args.engine_dump, prompt=prompt, ids=ids,
                         rules="auto" if args.write_map else args.map,
                         tolerance=tol, dtype=args.dtype, noise_floor=args.noise_floor, local=args.local,
                         logits=logits, engine_adapter=args.engine, decode=args.decode,
                         engine_dtype=args.engine_dtype)
    if report.compared == 0 and report.first_divergence is None and not report.weights:
        hint = ", ".join(f"{n} (closest op: {report.suggestions[n]})" if n in report.suggestions else n
                         for n in report.unmatched_engine[:5])
        raise common.UsageError(f"{args.engine_dump}: none of its {len(report.unmatched_engine)} tensors maps to an op "
                                f"(e.g. {hint}); write a --map rules file")
    if args.write_map:
        report.automap.write(args.write_map)
    if args.plot or args.plot_positions:
        from workbench.plots import error_curve, position_error_map, save

        if args.plot:
            fsio.check_destination(args.plot)  # (again: nothing appeared there during the comparison)
            save(error_curve(report), args.plot)
        if args.plot_positions and any(o.position_error is not None for o in report.ops):
            fsio.check_destination(args.plot_positions)
            save(position_error_map(report), args.plot_positions)
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        print(report.summary(max_ops=10_000 if args.all else 40))
    return 0 if report.clean else 1
