"""The CUDA statistics kernel against a float64 numpy reference, on awkward arrays (run
where MLX has a CUDA device; exits 0 when every statistic agrees, 1 naming the first that
does not, 2 without a CUDA device).

    python benchmarks/check_cuda_stats.py [--big 12600000]
    python benchmarks/check_cuda_stats.py --host    # the host path instead (any machine)

The arrays: NaN, +-Inf, mask fill (each dtype's lowest finite value), float32, float16,
bfloat16, int and bool, transposed, strided, broadcast and misaligned views, a scalar, an
empty array, 300 small arrays (a decoding step's: many a kernel), large arrays (the 16-byte
vector path with its unrolled loop and tail), values past 1e18 and 1e25, float16's largest
finite values beside its fill.  Counts, min and max
must be equal; the standard deviation within 1e-6 relative and the mean within 1e-6 of the
larger of itself and the standard deviation (the kernel sums 8 elements in float32, then in
float64 with atomics, so the last bits depend on the order the blocks finish in, and a mean
near 0 keeps the sums' error, not a relative one); ``--host`` checks the host path (numpy
views, float32 BLAS sums: 1e-4) the same way.

The kernel is the package's (``workbench/trace/stats/stats_kernel.cu``, loaded as text by
``workbench.trace.stats.cuda``), reached three ways: straight (``cuda_parts`` /
``cuda_finish``), through the dispatch (``stats.evaluate``: ``Pending`` on the CUDA path),
and through a trace of ``assets/demo`` (bfloat16, every value captured: every op's statistics
from the kernel, folded per batch) held to the host path's statistics of the same values:
counts, min and max equal, the rest within 1e-4.
"""
from __future__ import annotations

import argparse
import math
import sys

from pathlib import Path

import workbench  # noqa: F401  (fast BLAS before mlx.core)
import mlx.core as mx
import numpy as np

from workbench.trace import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import at_least  # noqa: E402


def reference(x: mx.array) -> dict:
    """Float64 numpy statistics with the kernel's definitions (see workbench.trace.stats)."""
    a = np.array(x.astype(mx.float32) if x.dtype == mx.bfloat16 else x).astype(np.float64).reshape(-1)
    dmax = stats.dtype_max(x.dtype)
    fill = (a == -dmax) if dmax is not None else np.zeros(a.shape, bool)
    nan, pinf, ninf = np.isnan(a), np.isposinf(a), np.isneginf(a)
    ok = ~(nan | pinf | ninf | fill)
    v = a[ok]
    n = a.size
    if v.size:
        mean = float(v.mean())
        std = float(np.sqrt(max(float((v * v).mean()) - mean * mean, 0.0)))
        mn, mxv = float(v.min()), float(v.max())
        absmax = max(abs(mn), abs(mxv))
    else:  # no finite value: every summary None (workbench/stats_schema.py)
        mean = std = mn = mxv = absmax = None
    head = math.inf if (pinf.any() or ninf.any()) else (absmax / dmax if dmax and v.size else None)
    return {"min": mn, "max": mxv, "mean": mean, "std": std, "absmax": absmax, "nan": int(nan.sum()),
            "posinf": int(pinf.sum()), "neginf": int(ninf.sum()), "zero_frac": float((a == 0).sum()) / n if n else None,
            "masked": int(fill.sum()), "headroom": head}


def close(a, b, exact: bool, tol: float, scale: float = 0.0) -> bool:
    """``a`` equals ``b`` (``exact``), else within ``tol`` of the larger of them and ``scale``."""
    if a is None or b is None:
        return a is None and b is None
    if exact:
        return a == b
    return abs(a - b) <= tol * max(abs(a), abs(b), scale, 1e-30) or (a == b)


def cases(big: int) -> dict:
    rng = np.random.default_rng(0)
    out = {}
    for dt in (mx.float32, mx.float16, mx.bfloat16):
        name = str(dt).split(".")[-1]
        base = mx.array(rng.standard_normal(big).astype(np.float32)).astype(dt)
        out[f"{name} big"] = base
        out[f"{name} big + 3 (misaligned slice)"] = base[3:]
        out[f"{name} big tail 5"] = base[: big - big % 64 + 5] if big > 64 else base
        m = mx.array(rng.standard_normal((513, 1031)).astype(np.float32)).astype(dt)
        out[f"{name} transposed"] = m.T
        out[f"{name} strided"] = m[::3, 1::2]
        out[f"{name} broadcast"] = mx.broadcast_to(m[:1], (77, 1031))
        dmax = stats.dtype_max(dt)
        sp = np.array(rng.standard_normal(100_003).astype(np.float32))
        sp[::997] = np.nan
        sp[5::1999] = np.inf
        sp[7::2003] = -np.inf
        sp[11::101] = 0.0
        sp[13::89] = -dmax  # mask fill
        sp[17::4001] = dmax  # the largest finite value: counted, not fill
        out[f"{name} nan/inf/fill/zeros"] = mx.array(sp).astype(dt)
        out[f"{name} all fill"] = mx.full((4099,), -dmax, dt)
        out[f"{name} all nan"] = mx.full((300,), float("nan"), dt)
        out[f"{name} scalar"] = mx.array(2.5, dt)
        out[f"{name} empty"] = mx.zeros((0, 8), dt)
    with np.errstate(over="ignore"):  # (3e38: some overflow to +-Inf, on purpose)
        for mag in (1e18, 1e25, 3e38):
            out[f"float32 around {mag:g}"] = mx.array((rng.standard_normal(70_001) * mag).astype(np.float32))
    out["bfloat16 around 1e25"] = mx.array((rng.standard_normal(70_001) * 1e25).astype(np.float32)).astype(mx.bfloat16)
    # many small outputs (a decoding step's): chunks of up to cuda.K_MAX a kernel
    for i in range(300):
        dt = (mx.float32, mx.float16, mx.bfloat16)[i % 3]
        r = rng.standard_normal(17 + 37 * i).astype(np.float32)
        r[i % 13] = (np.nan, np.inf, -np.inf, 0.0)[i % 4]
        x = mx.array(r).astype(dt)
        out[f"small {i} {str(dt).split('.')[-1]}"] = x[::2] if i % 5 == 0 else x
    out["int32"] = mx.array(rng.integers(-1000, 1000, 50_001).astype(np.int32))
    out["bool"] = mx.array(rng.random(50_001) < 0.3)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--big", type=at_least(1024), default=12_600_000,
                   help="elements of the large arrays (at least 1024; each is held in three dtypes)")
    p.add_argument("--host", action="store_true", help="check the host path (numpy views) instead")
    a = p.parse_args(argv)
    if not a.host and not stats.on_cuda():
        print("check_cuda_stats: no CUDA device (MLX's CUDA backend): nothing checked")
        return 2
    arrs = cases(a.big)
    mx.eval(list(arrs.values()))
    vals = [v for v in arrs.values()]
    if a.host:
        ways = {"host path": stats.evaluate(vals, host=True)}
    else:
        parts, order = stats.cuda_parts(vals)
        ways = {"CUDA kernel": stats.cuda_finish([(v.size, v.dtype) for v in vals], parts, order),
                "CUDA kernel through Pending": stats.evaluate(vals)}
    bad = sum(compare(arrs, got, 1e-4 if a.host else 1e-6, way) for way, got in ways.items())
    if not a.host:
        bad += check_trace()
    print(f"check_cuda_stats ({', '.join(ways)}{'' if a.host else ', a trace'}): {len(arrs)} arrays, "
          f"{bad} mismatching")
    return 1 if bad else 0


def check_trace() -> int:
    """A bfloat16 trace of assets/demo, every value captured, its statistics made by the kernel
    (through the trace's batches and ``Pending``), against the host path's statistics of the
    very same values: the number of ops whose statistics differ (each printed)."""
    demo = Path(__file__).resolve().parent.parent / "assets" / "demo"
    model = workbench.load(demo)
    ids = [(5 * i + 2) % model.vocab_size for i in range(40)]
    t = workbench.trace(model, ids, capture="full", dtype="bfloat16")
    t.run()
    host = stats.evaluate([t.value(n) for n in t.ops], host=True)
    bad = 0
    for name, h in zip(t.ops, host):
        k = t.stats(name)
        for key, w in h.items():
            exact = key in ("nan", "posinf", "neginf", "masked", "min", "max", "absmax", "zero_frac")
            if not close(k[key], w, exact, 1e-4, (h["std"] or 0.0) if key == "mean" else 0.0):
                print(f"MISMATCH trace op {name}: {key} kernel {k[key]!r} host {w!r}")
                bad += 1
                break
    return bad


def compare(arrs: dict, got, tol: float, way: str) -> int:
    """The number of arrays whose statistics ``got`` differ from :func:`reference` (each printed)."""
    bad = 0
    for (name, x), g in zip(arrs.items(), got):
        if x.size == 0:
            if g != stats.empty_row():
                print(f"MISMATCH {name} ({way}): an empty array gave {g}")
                bad += 1
            continue
        want = reference(x)
        # a mean is held to the values' spread: its error is that of sums of elements of that
        # size (float32 sums of 8 in the kernel), whatever the mean itself (near 0 it cancels)
        spread = want["std"] if want["std"] is not None else 0.0
        for k, w in want.items():
            if not close(g.get(k), w, k not in ("mean", "std", "zero_frac", "headroom"), tol,
                         spread if k == "mean" else 0.0):
                print(f"MISMATCH {name} ({way}): {k} got {g.get(k)!r} numpy {w!r}")
                bad += 1
                break
    return bad


if __name__ == "__main__":
    sys.exit(main())
