"""Is a long trace right?  The last position's logits of a long prompt three ways, on a random
Gemma 4 checkpoint in float32 with TF32 off (``MLX_ENABLE_TF32=0``, set here before MLX loads):
the trace (window blocks on, its default), the trace with ``prune=True`` (where the model has
KV-shared layers), mlx-lm's one-call forward (its head on the last row only,
:func:`bench_real.one_call_last`) and mlx-lm's chunked prefill (its generate path).

In bfloat16 a random 35-layer model turns any difference in the last bits (another kernel,
another summation order) into logits apart by about their own size, so bfloat16 can say
"equal" (bit for bit) but never "right"; float32 without TF32 can.  Exit 0 when every pair is
within ``--tol`` of the logits' largest magnitude, 1 otherwise.

    python benchmarks/check_long_logits.py e2b --path /tmp/e2b32 --tokens 16384,32768
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ["MLX_ENABLE_TF32"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import workbench  # noqa: E402,F401
import mlx.core as mx  # noqa: E402

import bench_real as br  # noqa: E402
from workbench.zoo import real_shapes as rs  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shape", choices=rs.NAMES)
    p.add_argument("--path", type=Path, required=True, help="the float32 checkpoint (written here when missing)")
    p.add_argument("--tokens", default="16384")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--prefill-chunk", type=int, default=2048)
    p.add_argument("--tol", type=float, default=1e-3, help="relative to the largest |logit| (default 1e-3)")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    if not (a.path / "config.json").is_file():
        rs.build_random(a.shape, a.path, dtype="float32", layers=a.layers, vocab_size=a.vocab)
    _, ref = br.reference(a.path)
    model = workbench.load(a.path)
    rows, bad = [], 0
    for T in [int(t) for t in a.tokens.split(",")]:
        ids = br.prompt_ids(T, model.vocab_size)
        tr = workbench.trace(model, ids[0], capture=None, positions={"logits": "last"})
        tr.run()
        got = {"trace": tr.logits.reshape(-1, tr.logits.shape[-1])[-1].astype(mx.float32)}
        del tr
        if br.prunable(model):  # KV-shared layers at the last position only (trace(..., prune=True))
            tr = workbench.trace(model, ids[0], capture=None, positions={"logits": "last", "prune": True})
            tr.run()
            got["pruned"] = tr.logits.reshape(-1, tr.logits.shape[-1])[-1].astype(mx.float32)
            del tr
        row = {"tokens": T}
        for name, f in (("one_call", lambda: br.one_call_last(ref, ids)),
                        ("chunked", lambda: br.chunked_prefill(ref, ids, a.prefill_chunk))):
            try:
                got[name] = f().astype(mx.float32)
            except RuntimeError as e:  # mlx-lm's one call in float32 at 32k: its scores past the memory
                row[f"{name}_error"] = str(e).splitlines()[0][:200]
            mx.clear_cache()
        scale = float(mx.abs(got["trace"]).max())
        row.update(absmax=scale, argmax={k: int(mx.argmax(v).item()) for k, v in got.items()})
        for x, y in (("trace", "one_call"), ("trace", "chunked"), ("chunked", "one_call"), ("pruned", "trace"),
                     ("pruned", "one_call"), ("pruned", "chunked")):
            if x not in got or y not in got:
                continue
            d = float(mx.abs(got[x] - got[y]).max())
            row[f"{x}_vs_{y}"] = d
            bad += d > a.tol * scale
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        a.json.write_text(json.dumps({"mlx": mx.__version__, "device": str(mx.default_device()), "tol": a.tol,
                                      "rows": rows}, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
