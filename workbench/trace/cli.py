"""Find the first op whose output holds NaN or Inf, and why.

    workbench hunt PATH (--prompt TEXT | --ids 1,2,3) [--dtype float16|bfloat16|float32]
                   [--memory-budget SIZE] [--granularity auto|op|module] [--json]
    workbench hunt PATH ... --crash [--timeout SECONDS]

Runs the checkpoint's forward op by op with statistics of every op, stops at the first
op with a NaN, +Inf or -Inf element (counted per element) and names its cause:
overflow, invalid, nonfinite-weight or nonfinite-input.  Exit status: 1 found, 0 clean,
2 unusable input.  ``--json`` prints
``{"first_nonfinite": {"op", "layer", "cause", "nan", "posinf", "neginf", ...} | null,
"ops_checked": int}``.

``--crash``: the forward runs in a child process, one synchronized step at a time, and the
step that kills it (a signal, an MLX abort, an exit, a hang past ``--timeout``) is reported
with its inputs, its output's shape and a suggested cause (workbench/trace/crash.py).
Exit 1 crashed, 0 no crash, 2 unusable input; ``--json`` prints
``{"crash": {"op", "index", "kind", "stage", "inputs", "output", "signal", ...} | null,
"steps_completed": int, "steps": int, ...}``.
"""
from __future__ import annotations

import json
import math


def add_arguments(p):
    from workbench.errors import number_arg

    p.add_argument("path", help="checkpoint directory (config.json + safetensors)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="text to run (needs the checkpoint's tokenizer.json)")
    src.add_argument("--ids", help="comma-separated token ids, e.g. 2,15,16")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="compute dtype (default: the checkpoint's storage dtype)")
    p.add_argument("--memory-budget", metavar="SIZE",
                   help="stream the weights layer by layer within SIZE (bytes, '8GB', '512MiB'): "
                        "checkpoints larger than memory")
    from workbench.sizes import accept_negative_sizes

    accept_negative_sizes(p)  # (--memory-budget -5GB: refused by its value, not "expected one argument")
    p.add_argument("--attention", default="fused", metavar="fused|explicit|LAYERS",
                   help="attention as one fused op a layer (default), as explicit scores/softmax/context "
                        "steps, or explicit in the listed layers only (e.g. 0,3)")
    p.add_argument("--top", type=number_arg(0, integer=True), default=5, help="ops closest to overflow to list (default 5)")
    p.add_argument("--granularity", choices=("auto", "op", "module"), default="auto",
                   help="op program (op) or the reference's module calls (module); auto: op where a program exists")
    p.add_argument("--crash", action="store_true",
                   help="find the step that kills the process (signal, abort, hang): the forward runs in a child "
                        "process, one synchronized op or module call at a time")
    p.add_argument("--timeout", type=number_arg(0, above=True), default=None, metavar="SECONDS",
                   help="with --crash: seconds one step (or loading) may take before it counts as a hang "
                        "(default 600)")
    p.add_argument("--logits", default=None, metavar="all|last|START:STOP|P,P,...",
                   help="the positions whose logits the head computes (default: all unless they would pass the "
                        "logits budget, WORKBENCH_LOGITS_BUDGET, then last)")
    p.add_argument("--prune", action="store_true",
                   help="compute layers whose rows reach no other position (Gemma 4's KV-shared layers) from the "
                        "first logit position on only, as mlx-lm's chunked prefill does: a long prompt's hunt "
                        "at about its speed (with --logits last); those ops' statistics cover the kept positions")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return str(v)


def _print(line: str) -> None:
    """One line of the text report; names from the checkpoint are escaped (no forged lines)."""
    from workbench.errors import printable
    print(printable(line))


def print_headroom(rows) -> None:
    """The ops closest to overflow, one a line (nothing when there are none)."""
    if rows:
        _print("closest to overflow (absmax / largest finite value):")
        for name, h in rows:
            _print(f"  {h:10.3g}  {name}")


def load_with_ids(args, memory_budget=None):
    """(model, token ids) for a command taking PATH, ``--prompt`` / ``--ids`` and
    ``--granularity``: ``--ids`` parsed before loading, any failure to open the checkpoint,
    encode the prompt or an id past the vocabulary one line (UsageError)."""
    from workbench.device_memory import NotEnoughMemory
    from workbench.errors import UsageError, parse_ids
    from workbench.models import load

    ids = parse_ids(args.ids) if args.ids is not None else None
    try:
        model = load(args.path, memory_budget=memory_budget, granularity=args.granularity)
    except NotEnoughMemory as e:  # (names the checkpoint, the bytes, the memory and a budget that works)
        raise UsageError(str(e)) from None
    except Exception as e:  # any failure to open is unusable input, reported in one line
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"cannot load {args.path}: {msg}") from None
    if ids is None:
        if getattr(model, "tokenizer", None) is None:
            why = getattr(getattr(model, "checkpoint", None), "tokenizer_error", None)
            raise UsageError(f"{args.path}: {why}; pass --ids instead of --prompt" if why else
                             f"{args.path} has no tokenizer.json: pass --ids instead of --prompt")
        ids = model.encode(args.prompt)
        if not ids:
            raise UsageError("the prompt encodes to no tokens")
    vocab = getattr(model, "vocab_size", None)
    if vocab is not None:
        bad = [i for i in ids if i >= vocab]
        if bad:
            raise UsageError(f"token id {bad[0]} is out of range for a vocabulary of {vocab}")
    return model, ids


def run(args) -> int:
    from workbench.errors import UsageError
    from workbench.dtypes import dtype_name
    from workbench.attention import parse_option
    from workbench.trace.hunt import hunt
    from workbench.trace.step import TraceError
    from workbench.sizes import parse_bytes

    try:
        budget = None if args.memory_budget is None else parse_bytes(args.memory_budget, "--memory-budget")
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.crash and args.prune:
        raise UsageError("--prune: the crash hunt steps every op on every row (give one of --crash, --prune)")
    if args.crash:
        return run_crash(args, budget)
    if args.timeout is not None:
        raise UsageError("--timeout bounds the child of --crash: give --crash too")
    model, ids = load_with_ids(args, memory_budget=budget)
    run, positions = {}, {}
    if args.attention != "fused":
        if model.granularity == "module":
            raise UsageError("--attention: a module-level model runs its own attention modules (no scores step)")
        try:
            run["attention"] = parse_option(args.attention)
        except ValueError as e:
            raise UsageError(str(e)) from None
    if args.logits is not None:
        positions["logits"] = parse_logits(args.logits)
    if args.prune:
        positions["prune"] = True
    try:
        result = hunt(model, ids, dtype=args.dtype, run=run, positions=positions)
    except (ValueError, KeyError, TraceError) as e:
        raise UsageError(str(e).strip("'\"")) from None
    report = result.report
    if args.json:
        print(json.dumps(report, indent=2, allow_nan=False, default=str))
        return 1 if result.found else 0

    t = result.trace
    dt = dtype_name(t.dtype)
    f = result.finding
    if t.logit_rows is not None and not t.logit_rows.all:
        _print(f"logits: {t.logit_rows.describe()}" + (f" ({t.logits_note})" if t.logits_note else ""))
    if t.pruned is not None:
        _print(f"pruned: {t.pruned.describe()}")
    if f is None:
        _print(f"clean: no NaN or Inf in any of {report['ops_checked']} ops ({dt}, {len(ids)} tokens)")
        print_headroom(t.headroom(args.top))
        return 0
    where = f"layer {f.layer}, " if f.layer is not None else ""
    _print(f"first non-finite op: {f.op} ({where}{f.kind}, op {f.index} of {len(t.ops)})")
    _print(f"  cause: {f.cause}")
    _print(f"  {f.detail}")
    at = f", first at index {list(f.first_index)}" if f.first_index is not None else ""
    _print(f"  output {list(f.shape)} {f.dtype}: nan {f.nan}, +inf {f.posinf}, -inf {f.neginf} of {f.size} elements{at}")
    for d in f.inputs:
        _print(f"  input  {d['name']}: {d['dtype']} {d['shape']} absmax {_fmt(d.get('absmax'))}"
              f"  nan {d['nan']} +inf {d['posinf']} -inf {d['neginf']}")
    for d in f.weights:
        _print(f"  tensor {d['name']}: {d['dtype']} {d['shape']} absmax {_fmt(d.get('absmax'))}"
              f"  nan {d['nan']} +inf {d['posinf']} -inf {d['neginf']}")
    if f.closest_before:
        _print("  closest to overflow before it:")
        for name, h in f.closest_before:
            _print(f"    {h:10.3g}  {name}")
    _print(f"checked {report['ops_checked']} of {len(t.ops)} ops ({dt})")
    return 1


def parse_logits(text: str):
    """``--logits``: ``all``, ``last``, ``START:STOP`` (either may be empty or negative) or
    comma-separated positions; anything else is unusable input, in one line."""
    from workbench.errors import UsageError

    t = text.strip()
    if t in ("all", "last"):
        return t
    try:
        if ":" in t:
            parts = [int(x) if x.strip() else None for x in t.split(":")]
            if len(parts) in (2, 3):
                return slice(*parts)
        else:
            return [int(x) for x in t.split(",")]
    except ValueError:
        pass
    raise UsageError(f"--logits {text!r}: give all, last, START:STOP or comma-separated positions")


def run_crash(args, budget) -> int:
    """``hunt --crash``: the step that kills the process (workbench/trace/crash.py)."""
    import os

    from workbench.attention import parse_option
    from workbench.errors import UsageError, parse_ids
    from workbench.trace.crash import DEFAULT_TIMEOUT, crash_hunt

    if not os.path.exists(args.path):
        raise UsageError(f"cannot load {args.path}: no such file or directory")
    src = args.prompt if args.prompt is not None else parse_ids(args.ids)
    attention = None
    if args.attention != "fused":
        try:
            attention = parse_option(args.attention)
        except ValueError as e:
            raise UsageError(str(e)) from None
    try:
        result = crash_hunt(args.path, src, dtype=args.dtype, granularity=args.granularity, attention=attention,
                            memory_budget=budget, timeout=args.timeout if args.timeout is not None else DEFAULT_TIMEOUT,
                            logits=parse_logits(args.logits) if args.logits is not None else None)
    except (ValueError, TypeError) as e:  # the child could not open its input: one line
        raise UsageError(str(e).strip("'\"")) from None
    report = result.report
    if args.json:
        print(json.dumps(report, indent=2, allow_nan=False, default=str))
        return 1 if result.found else 0
    where = f"({report['granularity']}, {report['device']}, {report['dtype']}, {report['tokens']} tokens, " \
            f"{report['seconds']:.2f} s)"
    if report.get("planted"):
        from workbench.trace.crash import CRASH_AT_ENV

        _print(f"note: {CRASH_AT_ENV}={report['planted']} is set: a planted crash (a testing aid), not the model's")
    f = result.finding
    if f is None:
        _print(f"no crash: the forward completed, {report['steps_completed']} steps each run and synchronized {where}")
        return 0
    if f.op is None:
        _print(f"crash before the first step, while {f.stage}: {f.how}")
    else:
        lay = f"layer {f.layer}, " if f.layer is not None else ""
        _print(f"crash: {f.how} in {f.op} ({lay}{f.kind}, step {f.index} of {report['steps']}, {f.stage})")
    for d in f.inputs:
        _print(f"  input  {d['name']}: {d['dtype']} {d['shape']} ({d['size']} elements)")
    if f.output is not None:
        _print(f"  output {f.output['dtype']} {f.output['shape']} ({f.output['size']} elements, "
               f"{f.output['nbytes']} bytes)")
    for c in f.causes:
        _print(f"  suggested cause: {c}")
    if f.stderr:
        _print(f"  last line it printed: {f.stderr.splitlines()[-1]}")
    _print(f"{report['steps_completed']} steps completed before it {where}")
    return 1
