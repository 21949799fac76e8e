"""The CUDA statistics kernel's host side: per-block partials (as the kernel lays them out:
grid-stride slices of 256 threads per block) fold into the same stats dicts as the host path.

The kernel itself runs only on MLX's CUDA backend (benchmarks/ and the H200 figures check it
against the host path on every op); here a numpy model of its per-block partials drives the
fold, so a wrong combination (a count summed twice, min taken as max, the fill or the
non-finite elements kept in the sums) fails on the CPU too."""
import math

import mlx.core as mx
import numpy as np
import pytest

from workbench.trace import stats as S


def _block_partials(a: np.ndarray, nb: int, fill: float):
    """What the kernel writes for one input: F [nb, 2], D [nb, 2], U [nb, 5]."""
    blk = (np.arange(a.size) % (nb * S._THREADS)) // S._THREADS
    F = np.empty((nb, 2)); D = np.zeros((nb, 2)); U = np.zeros((nb, 5), np.int64)
    for b in range(nb):
        v = a[blk == b].astype(np.float32)
        nan, pinf, ninf = np.isnan(v), np.isposinf(v), np.isneginf(v)
        fl = (v == np.float32(fill)) & ~nan
        ok = ~(nan | pinf | ninf | fl)
        f = v[ok].astype(np.float64)
        F[b] = (f.max() if f.size else -np.inf, f.min() if f.size else np.inf)
        D[b] = (f.sum(), (f * f).sum())
        U[b] = ((v == 0).sum(), fl.sum(), nan.sum(), pinf.sum(), ninf.sum())
    return F, D, U


def _awkward(dt):
    rng = np.random.default_rng(1)
    b = (rng.standard_normal(20000) * 4).astype(np.float32)
    b[[3, 70, 999]] = np.nan
    b[[5, 6]] = np.inf
    b[7] = -np.inf
    b[100:300] = 0
    x = mx.array(b).astype(dt)
    return mx.where(mx.arange(b.size) % 13 == 0, mx.array(-S.dtype_max(dt), dt), x)


@pytest.mark.parametrize("dt", [mx.float32, mx.bfloat16, mx.float16])
def test_fold_equals_host_path(dt):
    vals = [_awkward(dt), (mx.arange(5000, dtype=mx.float32) - 2500).astype(dt),
            mx.full((300,), -S.dtype_max(dt), dt), mx.full((40,), float("nan"), dt)]
    mx.eval(vals)
    want = S.evaluate(vals, host=True)
    meta = [(v.size, v.dtype) for v in vals]
    out = [None] * len(vals)
    nb = S._blocks(max(v.size for v in vals)) + 2  # one block count per kernel, as in cuda_parts
    parts = [_block_partials(np.array(v.astype(mx.float32)), nb, -S.dtype_max(dt)) for v in vals]
    F, D, U = (np.stack([p[k] for p in parts]) for k in range(3))
    S.combine_partials(meta, list(range(len(vals))), F, D, U, out)
    assert out[0]["nan"] == 3 and out[0]["posinf"] == 2 and out[0]["neginf"] == 1
    assert out[2]["masked"] == 300 and math.isnan(out[2]["mean"])
    for w, g in zip(want, out):
        assert set(w) == set(g)
        for k in w:
            a, b = w[k], g[k]
            if a is None or (isinstance(a, float) and math.isnan(a)):
                assert b is None or (isinstance(b, float) and math.isnan(b)), (k, a, b)
            else:
                assert b == pytest.approx(a, rel=1e-5, abs=1e-6), (k, a, b)


def test_cuda_path_only_on_cuda():
    # on this CPU machine the kernel path must not be chosen (the host path computes)
    assert not S.on_cuda() or mx.default_device().type == mx.DeviceType.gpu
    prev = mx.default_device()
    mx.set_default_device(mx.cpu)
    try:
        assert S.on_cuda() is False  # computing on the CPU: never the kernel, CUDA or not
    finally:
        mx.set_default_device(prev)


def test_cuda_switch_is_read_strictly(monkeypatch):
    monkeypatch.setenv("WORKBENCH_STATS_CUDA", "0")
    assert S.on_cuda() is False
    monkeypatch.setenv("WORKBENCH_STATS_CUDA", "off")
    with pytest.raises(ValueError, match="WORKBENCH_STATS_CUDA='off'"):
        S.on_cuda()
