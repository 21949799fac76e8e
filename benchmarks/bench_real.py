"""Real shapes: mlx-lm's forward vs our trace (no capture / stats / full), stepping, and a
float16 hunt, side by side on a random checkpoint of a published Gemma shape.

    python benchmarks/bench_real.py e2b --dtype bf16 --tokens 256,4096
    python benchmarks/bench_real.py 26b-a4b --dtype 4bit --tokens 256 --json out.json
    python benchmarks/bench_real.py e2b --dtype 4bit --layers 4 --tokens 64 --reps 2   # CPU-sized
    python benchmarks/bench_real.py e2b --tokens 8192,16384,32768 --steps 0 --crash-hunt 16384   # long rows
    python benchmarks/bench_real.py e2b --smoke    # CI: 1 layer, vocabulary 256, 8 tokens, one round

Shapes (workbench/zoo/real_shapes.py): e2b, e4b, 26b-a4b, 31b, gemma3-12b; dtype: bf16,
4bit (affine, groups of 64, as mlx-community converts) or mxfp4.  The checkpoint is written
from mlx-lm's own classes (random values) into a temporary folder, or into ``--path`` (kept;
a ``--path`` holding a config.json is reused as it is).  ``--layers N`` / ``--vocab V`` cut the
depth / vocabulary at real widths.  For each prompt length, interleaved in one run (median of
``--reps``, every variant evaluated to its logits):

* mlx-lm's forward (or mlx-vlm's language model, whichever loads the checkpoint): the reference;
* ``workbench.trace(model, ids, capture=None / "stats" / "full").run()`` (full only where its
  values fit in half the memory available; the attention the model defaults to, fused;
  ``--attention explicit`` adds a stats trace with explicit attention);
* a float16 ``hunt`` vs a float16 stats trace (issue 11.4: hunt <= 2x the stats trace);
* ``trace-stats-pruned``: a stats trace with ``logits="last", prune=True`` (Gemma 4 with
  KV-shared layers: those layers at the last position only, the work the chunked prefill
  does); its last logits against the stats trace's in ``last_position.pruned_vs_trace``;

* mlx-lm's chunked prefill (``--prefill-chunk``, default 2048; 0: off): the prompt through
  its KV cache (``make_prompt_cache``) in chunks, each chunk's cache evaluated and MLX's cache
  cleared, then the last token's logits -- ``mlx_lm.generate.generate_step``'s prefill.  It
  evaluates only the caches, so MLX never computes what no cache reads (the last layer's MLP;
  on Gemma 4 E2B the 20 KV-shared layers) except for the last token; ``-chunked-all`` is the
  same chunks each evaluated to its logits, every layer at every position as a trace runs;

**Long rows**: where a trace computes only the last position's logits by default (the
[T, vocab] logits past the logits budget, 4 GiB / 2^31 elements: E2B bf16 from 16,384
tokens; ``WORKBENCH_LOGITS_BUDGET`` moves it, so a CPU run can take the path), the one-call
reference forward is not run (its [T, vocab] logits killed MLX's CUDA backend with SIGFPE at
2^32 elements), nor full capture, the hunt and the kernel-alone line: the row is chunked
prefill vs trace none / stats, logits compared at the last position.  ``--profile`` steps
one capture=None forward at the longest length, each op synchronized, and sums the time by
op (the layer index dropped).  ``--crash-hunt T`` times the whole ``workbench hunt PATH --ids
... --crash --json`` command at T tokens, with ``--logits all`` (every position's logits, as
the crash was found) and with the default logits.

then stepping one op at a time (``Trace.step()``, stats capture, mean and worst ms over
``--steps`` steps; issue 11.4: < 50 ms a step on E2B), and the logits' max abs difference to
the reference.  Prints absolute times, tokens/s and ratios; ``--json`` writes them.
Runs unchanged on the CPU (small --layers) and on a GPU through MLX's CUDA backend.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import workbench  # noqa: F401  (fast BLAS before mlx.core)
import mlx.core as mx

from workbench import attention as attn_math
from workbench import fsio
from workbench.child import popen_options, python_argv
from workbench.device_memory import device_memory
from workbench.trace import stats
from workbench.trace.logits import default as default_logits
from workbench.zoo import real_shapes as rs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import CLOCKS, at_least, interleaved  # noqa: E402

DTYPES = {"bf16": None, "4bit": "affine4", "mxfp4": "mxfp4"}
TARGETS = {"trace-none": 1.10, "trace-stats": 1.15, "trace-full": 1.5}


def log(msg: str) -> None:
    print(f"[bench_real {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def reference(path: Path):
    """The reference forward: mlx-lm's model, or mlx-vlm's language model."""
    try:
        from mlx_lm.utils import load_model

        model, _ = load_model(path, strict=True)
        return "mlx-lm", model
    except Exception as e_lm:  # noqa: BLE001 - any failure: try the other reference, then report both
        try:
            from mlx_vlm.utils import load_model as vlm_load

            model = vlm_load(path)
            return "mlx-vlm", model.language_model
        except Exception as e_vlm:  # noqa: BLE001
            raise SystemExit(f"bench_real: neither mlx-lm ({e_lm}) nor mlx-vlm ({e_vlm}) loads {path}") from None


def ref_logits(ref, ids, **kw):
    out = ref(ids, **kw)
    return getattr(out, "logits", out)


def prompt_ids(tokens: int, vocab: int) -> mx.array:
    return mx.array([[(7 * i + 3) % vocab for i in range(tokens)]], mx.int32)


def chunked_prefill(ref, ids, chunk: int):
    """mlx-lm's ``generate_step`` prefill: every token but the last through the prompt cache
    in chunks of ``chunk`` (each chunk's cache evaluated, MLX's buffer cache cleared), then
    the last token's logits, [vocab]."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(ref)
    T = ids.shape[1]
    i = 0
    while T - i > 1:
        n = min(chunk, T - 1 - i)
        ref(ids[:, i:i + n], cache=cache)
        mx.eval([c.state for c in cache])
        mx.clear_cache()
        i += n
    out = ref_logits(ref, ids[:, i:], cache=cache)[0, -1]
    mx.eval(out)
    return out


def chunked_forward(ref, ids, chunk: int):
    """The same chunks through the same cache, each chunk evaluated to its logits: every layer
    at every position, the work a trace does (generate_step's prefill evaluates only the
    caches, so MLX skips what no cache reads: the last layers, and Gemma 4's KV-shared layers
    for every position but the last)."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(ref)
    T = ids.shape[1]
    for i in range(0, T, chunk):
        out = ref_logits(ref, ids[:, i:i + chunk], cache=cache)
        mx.eval(out, [c.state for c in cache])
        mx.clear_cache()
    return out[0, -1]


def one_call_last(ref, ids):
    """mlx-lm's one-call forward, its head applied to the last position only (its model's
    ``model`` returns every position's hidden state; the head and softcap are per position),
    [vocab]: what its forward computes there, without the [T, vocab] logits that die at 2^32."""
    lm = getattr(ref, "language_model", ref)
    inner = lm.model

    class Last:
        def __call__(self, *a, **kw):
            return inner(*a, **kw)[:, -1:]

        def __getattr__(self, name):
            return getattr(inner, name)

    object.__setattr__(lm, "model", Last())
    try:
        out = ref_logits(ref, ids)[0, -1]
        mx.eval(out)
    finally:
        vars(lm).pop("model", None)
    return out


def one_call_windows(f):
    """``f`` with sliding layers attending in one call (workbench.attention.WINDOW_ROWS None)."""
    def g():
        keep, attn_math.WINDOW_ROWS = attn_math.WINDOW_ROWS, None
        try:
            return f()
        finally:
            attn_math.WINDOW_ROWS = keep
    return g


def long_row(model, tokens: int) -> bool:
    """True where a trace keeps only the last position's logits by default."""
    return not default_logits(tokens, 1, model.vocab_size, model.default_dtype).all


def memory_available() -> int:
    from workbench.device_memory import available_memory

    host = available_memory()[0] or 0
    dev = device_memory(mx.default_device()) if mx.default_device().type == mx.gpu else 0
    return min(x for x in (host, dev) if x) if (host or dev) else 0


def bench_tokens(model, ref, ref_name: str, tokens: int, reps: int, clock, attention: str, full: str,
                 hunt: bool = True, chunk: int = 2048) -> dict:
    ids = prompt_ids(tokens, model.vocab_size)
    long = long_row(model, tokens)
    chunked = f"{ref_name}-chunked"
    if long:  # the one-call forward would compute [T, vocab] logits: compare the last position
        want = chunked_prefill(ref, ids, chunk or 2048)
    else:
        want = ref_logits(ref, ids)[0]
    mx.eval(want)

    def theirs():
        mx.eval(ref_logits(ref, ids))

    def theirs_chunked():
        chunked_prefill(ref, ids, chunk)

    def theirs_chunked_all():
        chunked_forward(ref, ids, chunk)

    def traced(capture, **kw):
        def f():
            t = workbench.trace(model, ids[0], capture=capture, **kw)
            t.run()
            mx.eval(t.logits)
            return t
        return f

    def hunted():
        from workbench.trace.hunt import hunt

        r = hunt(model, ids[0], dtype="float16")
        hunt_ops[0] = r.report["ops_checked"]

    hunt_ops = [None]
    t0 = time.perf_counter()
    probe = traced("stats")()  # one stats trace: its logits and the size of every op's output
    first_s = time.perf_counter() - t0
    got = probe.logits if not long else probe.logits.reshape(-1, probe.logits.shape[-1])[-1]
    diff = float(mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max())
    n_ops = len(probe.ops)
    last = {}  # the last position against mlx-lm's one-call forward there, with and without window blocks
    if long:
        exact = one_call_last(ref, ids)
        unblocked = one_call_windows(traced(None))()
        row = lambda t: t.logits.reshape(-1, t.logits.shape[-1])[-1].astype(mx.float32)  # noqa: E731
        last = {"one_call_absmax": float(mx.abs(exact.astype(mx.float32)).max()),
                "trace_vs_one_call": float(mx.abs(got.astype(mx.float32) - exact.astype(mx.float32)).max()),
                "trace_one_call_windows_vs_one_call": float(mx.abs(row(unblocked) - exact.astype(mx.float32)).max()),
                "chunked_vs_one_call": float(mx.abs(want.astype(mx.float32) - exact.astype(mx.float32)).max())}
        del unblocked
        log(f"{tokens} tokens, last position: {last}")
    logits_kept = probe.logit_rows.describe() if probe.logit_rows is not None else None
    full_bytes = sum(math.prod(s.output_shape) * model.default_dtype.size for s in probe.steps
                     if s.output_shape)
    del probe
    avail = memory_available()
    notes = []
    if long:
        run_full = False
        variants = {}
        notes.append(f"long row: the trace keeps {logits_kept}; {ref_name}'s one-call forward (every "
                     f"position's logits) not run; logits compared at the last position with the chunked "
                     f"prefill's; full capture and the hunt not run")
    else:
        run_full = full == "on" or (full == "auto" and (not avail or full_bytes < avail / 2))
        variants = {ref_name: theirs}
        if not run_full:
            notes.append(f"full capture skipped: its values need {full_bytes / 2**30:.1f} GiB, "
                         f"{avail / 2**30:.1f} GiB available")
    if chunk:
        variants[chunked] = theirs_chunked
        variants[f"{chunked}-all"] = theirs_chunked_all
    variants.update({"trace-none": traced(None), "trace-stats": traced("stats")})
    if attn_math.window_blocks(tokens, tokens, 1) and any(op.attrs.get("window") for op in model.program.ops):
        variants["trace-stats-one-call-windows"] = one_call_windows(traced("stats"))
    if prunable(model):  # layers writing no cache at the last position only, as the chunked prefill runs them
        pruned = traced("stats", positions={"logits": "last", "prune": True})()
        last["pruned_vs_trace"] = float(mx.abs(pruned.logits.reshape(-1, pruned.logits.shape[-1])[-1].astype(mx.float32)
                                               - got.reshape(-1, got.shape[-1])[-1].astype(mx.float32)).max())
        last["pruned"] = pruned.pruned.describe()
        log(f"{tokens} tokens, pruned: {last['pruned']}, last logits vs the stats trace {last['pruned_vs_trace']:.3g}")
        del pruned
        variants["trace-stats-pruned"] = traced("stats", positions={"logits": "last", "prune": True})
    if run_full:
        variants["trace-full"] = traced("full")
    if attention == "explicit":
        try:
            traced("stats", run={"attention": "explicit"})()
            variants["trace-stats-explicit-attn"] = traced("stats", run={"attention": "explicit"})
        except Exception as e:  # noqa: BLE001 - report why the column is missing, measure the rest
            notes.append(f"explicit attention not measured: {str(e).splitlines()[0][:160]}")
    if hunt and not long:
        variants["stats-f16"] = traced("stats", dtype="float16")
        variants["hunt-f16"] = hunted
    elif not long:
        notes.append("float16 hunt not measured (--hunt off)")
    med = interleaved(variants, reps, clock, warmup=1)
    return {"tokens": tokens, "ops": n_ops, "long": long, "logits_kept": logits_kept,
            "first_stats_trace_s": first_s, "max_abs_diff_vs_reference": diff,
            "compared_with": chunked if long else ref_name, "full_capture_bytes": full_bytes,
            "hunt_ops_checked": hunt_ops[0], "notes": notes, "last_position": last,
            "stats_kernel": stats_kernel(model, ids, reps) if run_full and stats.on_cuda() else None,
            "times": {k: {"median_s": v[0], "min_s": v[1], "tokens_per_s": tokens / v[0]} for k, v in med.items()}}


def prunable(model) -> bool:
    """Whether ``trace(..., prune=True)`` leaves anything out on ``model`` (Gemma 4's KV-shared layers)."""
    try:
        return any(op.kind == "rows" for op in model.program_for(None, prune=True).ops)
    except ValueError:
        return False


def profile(model, tokens: int, top: int = 10) -> dict:
    """One capture=None forward stepped op by op (each evaluated and synchronized): seconds
    summed by op name with the layer index dropped, the largest first."""
    ids = prompt_ids(tokens, model.vocab_size)
    t = workbench.trace(model, ids[0], capture=None)
    by, total = {}, 0.0
    mx.synchronize()
    t_all = time.perf_counter()
    while not t.done:
        t0 = time.perf_counter()
        s = t.step()
        mx.synchronize()
        dt = time.perf_counter() - t0
        total += dt
        key = re.sub(r"(^|\.)\d+(\.|$)", r"\1*\2", s.name)
        n, sec = by.get(key, (0, 0.0))
        by[key] = (n + 1, sec + dt)
    wall = time.perf_counter() - t_all
    rows = sorted(by.items(), key=lambda kv: -kv[1][1])
    return {"tokens": tokens, "steps": len(t.ops), "stepped_s": total, "wall_s": wall,
            "top": [{"op": k, "count": n, "seconds": sec, "share": sec / total if total else 0.0}
                    for k, (n, sec) in rows[:top]]}


def crash_hunt_cost(path: Path, vocab: int, tokens: int, timeout: int) -> list[dict]:
    """The whole ``workbench hunt PATH --ids ... --crash --json`` command at ``tokens`` tokens,
    with ``--logits all`` and with the default logits: wall seconds, exit code, the finding."""
    ids = ",".join(str((7 * i + 3) % vocab) for i in range(tokens))
    out = []
    for logits in ("all", None):
        cmd = python_argv("workbench.cli", "hunt", str(path), "--ids", ids, "--crash", "--json",
                          "--timeout", str(timeout))  # (isolated from the working directory)
        if logits:
            cmd += ["--logits", logits]
        log(f"crash hunt, {tokens} tokens, logits {logits or 'default'}")
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 120, env=os.environ.copy(),
                           **popen_options())
        sec = time.perf_counter() - t0
        row = {"tokens": tokens, "logits": logits or "default", "seconds": sec, "exit_code": p.returncode}
        try:
            rep = json.loads(p.stdout)
            crash = rep.get("crash") or {}
            row.update({"crash_op": crash.get("op"), "signal": crash.get("signal"),
                        "causes": crash.get("causes"), "steps_completed": rep.get("steps_completed"),
                        "steps": rep.get("steps"), "reported_seconds": rep.get("seconds"),
                        "stepping_seconds": rep.get("stepping_seconds")})
        except (ValueError, AttributeError):
            row["output"] = (p.stdout + p.stderr)[-400:]
        log(f"crash hunt: {sec:.1f} s, exit {p.returncode}, {row.get('crash_op')}")
        out.append(row)
    return out


def stats_kernel(model, ids, reps: int) -> dict:
    """The CUDA statistics kernel alone on one forward's evaluated outputs (a full capture's
    values): median ms to queue it, to run it, and to copy back and fold, and the read rate."""
    t = workbench.trace(model, ids[0], capture="full")
    t.run()
    outs = [t.value(n) for n in t.ops]
    meta = [(o.size, o.dtype) for o in outs]
    times = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        parts, order = stats.cuda_parts(outs)
        t1 = time.perf_counter()
        mx.eval(parts)
        t2 = time.perf_counter()
        stats.cuda_finish(meta, parts, order)
        times.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
    q, k, f = (sorted(c)[len(c) // 2] for c in zip(*times[1:]))
    nbytes = sum(o.nbytes for o in outs)
    return {"outputs": len(outs), "bytes": nbytes, "queue_ms": q * 1e3, "kernel_ms": k * 1e3, "fold_ms": f * 1e3,
            "read_gb_per_s": nbytes / k / 1e9}


def bench_steps(model, tokens: int, steps: int) -> dict:
    ids = prompt_ids(tokens, model.vocab_size)[0]
    t = workbench.trace(model, ids, capture="stats")
    times, names = [], []
    for _ in range(min(steps, len(t.ops))):
        t0 = time.perf_counter()
        s = t.step()
        times.append(time.perf_counter() - t0)
        names.append(s.name)
    worst = max(range(len(times)), key=times.__getitem__)
    return {"tokens": tokens, "steps": len(times), "mean_ms": 1e3 * sum(times) / len(times),
            "max_ms": 1e3 * times[worst], "slowest_op": names[worst]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shape", choices=rs.NAMES)
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    p.add_argument("--tokens", default="256", help="comma list of prompt lengths (default 256)")
    p.add_argument("--layers", type=int, default=None, help="cut to N layers (real widths)")
    p.add_argument("--vocab", type=int, default=None, help="cut the vocabulary to V tokens")
    p.add_argument("--path", type=Path, default=None, help="write the checkpoint here and keep it (reused if it "
                                                          "holds a config.json)")
    p.add_argument("--reps", type=at_least(1), default=3)
    p.add_argument("--steps", type=at_least(0), default=50, help="ops stepped one at a time (0: skip)")
    p.add_argument("--full", default="auto", choices=["auto", "on", "off"],
                   help="full capture: auto (where its values fit in half the memory), on, off")
    p.add_argument("--hunt", default="on", choices=["on", "off"],
                   help="off: no float16 stats trace and hunt (MLX's quantized expert matmul in float16 is "
                        "40x slower than float32 on the CPU: a 4-bit MoE hunts for minutes)")
    p.add_argument("--attention", default="default", choices=["default", "explicit"],
                   help="explicit: also a stats trace with explicit attention (scores/softmax steps)")
    p.add_argument("--prefill-chunk", type=at_least(0), default=2048,
                   help="also time mlx-lm's chunked prefill through its KV cache in chunks of N tokens "
                        "(generate_step's; default 2048, 0: off; long rows always compare with it)")
    p.add_argument("--profile", action="store_true",
                   help="step one capture=None forward at the longest length, each op synchronized, and "
                        "sum the time by op")
    p.add_argument("--crash-hunt", type=at_least(1), default=None, metavar="T",
                   help="time the whole 'workbench hunt --crash' command at T tokens (--logits all, then "
                        "the default logits)")
    p.add_argument("--crash-timeout", type=at_least(1), default=600, help="--timeout for --crash-hunt")
    p.add_argument("--clock", default="wall", choices=list(CLOCKS))
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.add_argument("--smoke", action="store_true",
                   help="CI: 1 layer, vocabulary 256, 8 tokens, one round, 2 steps, chunks of 4 (that it runs)")
    a = p.parse_args(argv)
    if a.smoke:
        a.layers, a.vocab, a.tokens, a.reps, a.steps, a.prefill_chunk, a.profile = 1, 256, "8", 1, 2, 4, True
    try:
        tokens = [int(x) for x in a.tokens.split(",")]
        if any(t < 1 for t in tokens):
            raise ValueError
    except ValueError:
        p.error(f"--tokens must be a comma list of positive integers, got {a.tokens!r}")
    quant = DTYPES[a.dtype]
    try:
        rs.config(a.shape, layers=a.layers, vocab_size=a.vocab)
    except ValueError as e:
        p.error(str(e))
    with tempfile.TemporaryDirectory(prefix="bench_real_") as tmp:
        path = a.path or Path(tmp) / a.shape
        if (path / "config.json").is_file():
            log(f"reusing {path}")
        else:
            size = rs.nbytes(a.shape, quant=quant, layers=a.layers, vocab_size=a.vocab)
            log(f"writing a random {a.shape} ({a.dtype}, {size / 1e9:.1f} GB) to {path}")
            rs.build_random(a.shape, path, quant=quant, layers=a.layers, vocab_size=a.vocab)
        ckpt_bytes = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        log("loading the reference and our model")
        ref_name, ref = reference(path)
        model = workbench.load(path)
        rows = []
        for t in tokens:
            log(f"{t} tokens: timing {a.reps} interleaved rounds")
            rows.append(bench_tokens(model, ref, ref_name, t, a.reps, CLOCKS[a.clock], a.attention, a.full,
                                     a.hunt == "on", a.prefill_chunk))
            times = rows[-1]["times"]  # logged at once: a later, longer row may not finish
            log(f"{t} tokens: " + ", ".join(f"{k} {v['median_s'] * 1e3:.1f} ms" for k, v in times.items()))
        step = bench_steps(model, tokens[0], a.steps) if a.steps else None
        prof = None
        if a.profile:
            log(f"profile: {tokens[-1]} tokens stepped op by op")
            prof = profile(model, tokens[-1])
        crash = None
        if a.crash_hunt:
            del model, ref  # the child loads its own
            mx.clear_cache()
            crash = crash_hunt_cost(path, rs.config(a.shape, layers=a.layers, vocab_size=a.vocab)["text_config"][
                "vocab_size"], a.crash_hunt, a.crash_timeout)
    result = {"shape": a.shape, "dtype": a.dtype, "layers": a.layers or rs.config(a.shape)["text_config"][
        "num_hidden_layers"], "vocab": a.vocab, "checkpoint_bytes": ckpt_bytes, "reference": ref_name,
              "device": str(mx.default_device()), "reps": a.reps, "clock": a.clock, "mlx": mx.__version__, "prefill_chunk": a.prefill_chunk,
              "rows": rows, "stepping": step, "profile": prof, "crash_hunt": crash}
    report(result)
    if a.json:
        fsio.write_text(a.json, json.dumps(result, indent=2))
    return 0


def report(r: dict) -> None:
    ref = r["reference"]
    chunked = f"{ref}-chunked"
    print(f"{r['shape']}-shaped {r['dtype']} ({r['checkpoint_bytes'] / 1e9:.2f} GB, {r['layers']} layers"
          f"{', vocab ' + str(r['vocab']) if r['vocab'] else ''}), device {r['device']}, MLX {r['mlx']}, "
          f"median of {r['reps']}, {r['clock']} clock")
    for row in r["rows"]:
        times = row["times"]
        bases = [b for b in (ref, chunked) if b in times]
        print(f"  {row['tokens']} tokens, {row['ops']} ops, logits: {row['logits_kept']}; max |trace - "
              f"{row['compared_with']}| = {row['max_abs_diff_vs_reference']:.3g}; first stats trace "
              f"{row['first_stats_trace_s']:.2f} s")
        print(f"    {'':28s} {'median':>10s} {'min':>10s} {'tokens/s':>10s}   ratio")
        for k, v in times.items():
            ratio = ""
            if k == "hunt-f16":
                ratio = (f"{v['median_s'] / times['stats-f16']['median_s']:6.2f}x stats-f16 (target <= 2x; "
                         f"{row['hunt_ops_checked']} of {row['ops']} ops checked)")
            elif k not in bases and k != "stats-f16":
                parts = []
                for b in bases:
                    tgt = ""
                    if b == ref and k in TARGETS:
                        tgt = f" (target <= {TARGETS[k]:.2f}x)"
                    elif b == chunked and k in ("trace-stats", "trace-stats-pruned"):
                        tgt = " (issue 28: <= 1.25x at 32k)"
                    parts.append(f"{v['median_s'] / times[b]['median_s']:6.2f}x {b}{tgt}")
                ratio = "; ".join(parts)
            elif k == ref and chunked in times:
                ratio = f"{v['median_s'] / times[chunked]['median_s']:6.2f}x {chunked}"
            print(f"    {k:28s} {v['median_s'] * 1e3:8.1f}ms {v['min_s'] * 1e3:8.1f}ms {v['tokens_per_s']:10.0f}   "
                  f"{ratio}")
        k = row.get("stats_kernel")
        if k:
            print(f"    statistics kernel alone on {k['outputs']} outputs ({k['bytes'] / 1e9:.2f} GB): queue "
                  f"{k['queue_ms']:.1f} ms, kernel {k['kernel_ms']:.1f} ms ({k['read_gb_per_s']:.0f} GB/s), "
                  f"copy back and fold {k['fold_ms']:.1f} ms")
        for n in row["notes"]:
            print(f"    note: {n}")
    s = r["stepping"]
    if s:
        print(f"  stepping ({s['tokens']} tokens, stats): {s['mean_ms']:.1f} ms a step on average over "
              f"{s['steps']} steps, slowest {s['max_ms']:.1f} ms ({s['slowest_op']}); target < 50 ms")
    p = r.get("profile")
    if p:
        print(f"  profile ({p['tokens']} tokens, capture=None, {p['steps']} ops each synchronized): "
              f"{p['stepped_s'] * 1e3:.1f} ms in the ops, {p['wall_s'] * 1e3:.1f} ms in all")
        for o in p["top"]:
            print(f"    {o['op']:40s} x{o['count']:<4d} {o['seconds'] * 1e3:9.1f} ms {o['share'] * 100:5.1f}%")
    for c in r.get("crash_hunt") or []:
        found = (f"crash in {c['crash_op']} ({c['signal'] or c.get('causes')})" if c.get("crash_op")
                 else "no crash" if c["exit_code"] == 0 else f"exit {c['exit_code']}: {c.get('output', '')}")
        print(f"  hunt --crash, {c['tokens']} tokens, logits {c['logits']}: {c['seconds']:.1f} s the whole "
              f"command, exit {c['exit_code']}, {found}"
              + (f"; steps {c['steps_completed']} of {c['steps']}, stepping {c['stepping_seconds']:.1f} s"
                 if c.get("stepping_seconds") is not None else ""))


if __name__ == "__main__":
    sys.exit(main())
