"""Benchmarks cannot rot (issue 40 item 5): every script in benchmarks/ runs here at a smoke
size, as a user runs it (``python benchmarks/X.py --smoke``, a subprocess), on the CPU in
seconds, and must exit 0 and print its ratio / result line.  The figures are not judged: at
these sizes they mean nothing (benchmarks/README.md has the real ones).  The CUDA-only check
(check_cuda_stats.py without ``--host``) must refuse in one line, exit 2, where there is no
CUDA device; check_tf32.py has no device to compare here, so it runs the CPU against itself."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlx_lm")

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
NUMBER = r"\d+\.\d+"

#: id -> (arguments after the script, regular expressions every one of which must match a line)
CASES = {
    "bench_forward": (["bench_forward.py", "--smoke"],
                      [rf"trace, capture='stats'\s.* ratio {NUMBER}x",
                       rf"trace, capture='full'\s.* ratio {NUMBER}x", r"logits max \|ours - mlx-lm\| = "]),
    "bench_modules-phi3": (["bench_modules.py", "--smoke"],
                           [r"^phi3 .* module steps", rf"trace-stats .* ratio {NUMBER}x",
                            r"logits max \|trace - mlx-lm\|"]),
    "bench_modules-qwen2": (["bench_modules.py", "--smoke", "--arch", "qwen2"],
                            [r"^qwen2 .* module steps", rf"trace-full .* ratio {NUMBER}x"]),
    "bench_generate": (["bench_generate.py", "--smoke"],
                       [r"^gemma4_text \(op program\):", r"^phi3 \(module level\):",
                        rf"capture=stats .* {NUMBER} of mlx-lm's tokens/s", rf"capture=None .* {NUMBER} of mlx-lm's"]),
    "bench_diff": (["bench_diff.py", "--smoke"],
                   [rf"dump every op \(streamed\) .* {NUMBER}x forward",
                    rf"compare with noise floor .* {NUMBER}x forward"]),
    "bench_real": (["bench_real.py", "e2b", "--smoke"],
                   [rf"trace-stats .* {NUMBER}x mlx-lm \(target", rf"hunt-f16 .* {NUMBER}x stats-f16",
                    r"stepping \(8 tokens, stats\)", r"profile \(8 tokens"]),
    "bench_streaming": (["bench_streaming.py", "--smoke"],
                        [r"peak RSS growth: streamed .* bound", rf"load \+ forward: .* ratio {NUMBER}x"]),
    "bench_inspect": (["bench_inspect.py", "--smoke"],
                      [r"header-only inspect.*target < 0.5 s .*ratio target/measured",
                       rf"cold: .* --values .* -> ratio {NUMBER}", r"^4-bit affine checkpoint"]),
    "bench_hazards": (["bench_hazards.py", "--smoke"], [r"events .* found 1 hazard\(s\): alias-in-dispatch"]),
    "bench_hazards-hostile": (["bench_hazards.py", "--smoke", "--hostile"],
                              [r"^concurrent_pieces .* events: validate", r"^stale_fan ", r"^stale_interleaved "]),
    "bench_widgets": (["bench_widgets.py", "--smoke"],
                      [rf"StepDebugger step .* median {NUMBER} ms", rf"widget/bare ratio {NUMBER}x"]),
    "check_budget": (["check_budget.py"],  # the whole calibration: it takes seconds as it is
                     [r"^precision +named", r"^float32 +\d+", r"^bfloat16 +\d+", r"^float16 +\d+"]),
    "check_cuda_stats-host": (["check_cuda_stats.py", "--host", "--big", "4096"],
                              [r"check_cuda_stats \(host path\): \d+ arrays, 0 mismatching"]),
    "check_long_logits": (["check_long_logits.py", "e2b", "--path", "{tmp}/e2b", "--layers", "1", "--vocab", "256",
                           "--tokens", "16", "--prefill-chunk", "4"],
                          [r'^\{"tokens": 16, .*"trace_vs_one_call": .*"trace_vs_chunked"']),
    "check_tf32-default": (["check_tf32.py", "default", str(ROOT / "assets" / "demo"), "8"],
                           [r'^\{"mode": "default".*"forward_layer0_worst"']),
    "check_tf32-exact": (["check_tf32.py", "exact", str(ROOT / "assets" / "demo"), "8"],
                         [r'^\{"mode": "exact".*"recompute_worst"']),
}


def run(args, tmp_path, timeout=120):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    return subprocess.run([sys.executable, str(BENCH / args[0]), *args[1:]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_every_script_has_a_smoke_case():
    scripts = {p.name for p in BENCH.glob("*.py")} - {"timing.py"}
    covered = {args[0] for args, _ in CASES.values()} | {"check_cuda_stats.py"}
    assert scripts <= covered, f"benchmarks without a smoke run here: {sorted(scripts - covered)}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_benchmark_smoke(name, tmp_path):
    args, expected = CASES[name]
    r = run(args, tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{' '.join(args)} exited {r.returncode}:\n{out[-4000:]}"
    assert "Traceback" not in out, out[-4000:]
    assert "TOKENS DIFFER" not in out, out
    for pat in expected:
        assert re.search(pat, r.stdout, re.M), f"{' '.join(args)}: no line matches {pat!r} in:\n{r.stdout[-4000:]}"
    if name.startswith("check_long_logits") or name.startswith("check_tf32"):
        json.loads(r.stdout.strip().splitlines()[-1])  # one JSON line, whole


def test_check_cuda_stats_refuses_in_one_line_without_cuda(tmp_path):
    from workbench.trace import stats

    if stats.on_cuda():
        pytest.skip("a CUDA device is here: check_cuda_stats.py runs the kernel (benchmarks/README.md)")
    r = run(["check_cuda_stats.py", "--big", "4096"], tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == "" and r.stdout.strip().splitlines() == [
        "check_cuda_stats: no CUDA device (MLX's CUDA backend): nothing checked"]


def test_check_tf32_usage_is_one_line(tmp_path):
    r = run(["check_tf32.py"], tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == "usage: check_tf32.py default|exact CHECKPOINT [TOKENS]"
