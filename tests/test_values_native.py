"""The native --values kernels (workbench.checkpoint.values_native, through values.Stats) against the straightforward
computation: counts, min / max exact element by element, mean / std to float precision;
NaN, +Inf, -Inf, all-zero, signed zeros, denormals, far-from-zero data; quantized weights
against mx.dequantize itself."""
import numpy as np
import pytest

import workbench
from workbench import zoo
from workbench.checkpoint import values as V
from workbench.checkpoint import values_native as N
from workbench.checkpoint.quant import QuantSpec

import mlx.core as mx  # noqa: E402  (after workbench)

EXACT = ("nan", "posinf", "neginf", "count", "zero_frac", "min", "max", "absmax")


def reference(x) -> dict:
    f = np.asarray(x, np.float64).ravel()
    fin = f[np.isfinite(f)]
    d = {"nan": int(np.isnan(f).sum()), "posinf": int((f == np.inf).sum()), "neginf": int((f == -np.inf).sum()),
         "count": f.size, "zero_frac": float((f == 0).sum() / f.size) if f.size else 0.0}
    if fin.size:
        d.update(min=fin.min(), max=fin.max(), absmax=np.abs(fin).max(), mean=fin.mean(), std=fin.std())
    else:
        d.update(min=None, max=None, absmax=None, mean=None, std=None)
    return d


def check(got: dict, want: dict, rel=1e-6):
    for k in EXACT:
        assert got[k] == want[k], (k, got[k], want[k])
    if want["mean"] is None:
        assert got["mean"] is None and got["std"] is None
    else:
        scale = max(want["std"], abs(want["mean"]), 1e-300)
        assert abs(got["mean"] - want["mean"]) <= rel * scale + 1e-300, (got["mean"], want["mean"])
        assert got["std"] == pytest.approx(want["std"], rel=rel, abs=1e-300)


def data(case, n=5003, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 0.02).astype(np.float32)
    if case == "nonfinite":
        x[[3, 17, 4000]] = np.inf
        x[[5, 5002]] = -np.inf
        x[[0, 100, 101]] = np.nan
    elif case == "all-nonfinite":
        x[:] = np.nan
        x[::3] = np.inf
        x[1::3] = -np.inf
    elif case == "zeros":
        x[:] = 0
        x[::2] = -0.0
    elif case == "some-zeros":
        x[::7] = 0
    elif case == "denormals":
        x = x * np.float32(1e-38) * np.float32(1e-2)  # below float32's smallest normal
        x[::5] = 0
    elif case == "offset":
        x = x + np.float32(1000.0)  # mean far from zero: shifted sums keep std exact
    elif case == "negative":
        x = -np.abs(x) - 1
    elif case == "short":
        x = x[:7]
    elif case == "nan-first":
        x[:40] = np.nan
    return x


CASES = ["normal", "nonfinite", "all-nonfinite", "zeros", "some-zeros", "denormals", "offset", "negative",
         "short", "nan-first"]


def test_native_kernels_are_built():
    # the machine running the tests has a C compiler: the fast path must be the one tested
    assert V.native() is not None


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("pieces", [1, 3])
def test_float32_native_matches_reference_and_numpy(case, pieces, monkeypatch):
    x = data(case)
    want = reference(x)
    fast = V.Stats()
    for part in np.array_split(x, pieces):
        fast.add(part)
    check(fast.to_dict(), want)
    monkeypatch.setattr(N, "NATIVE", False)
    slow = V.Stats()
    for part in np.array_split(x, pieces):
        slow.add(part.copy())
    check(slow.to_dict(), want, rel=1e-5)


@pytest.mark.parametrize("case", CASES)
def test_bf16_native_matches_reference_and_numpy(case, monkeypatch):
    x = data(case, n=9001)
    u = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncated to BF16 bit patterns
    want = reference(V._bf16_to_f32(u).copy())
    fast = V.Stats()
    for part in np.array_split(u, 4):
        fast.add_bf16(part)
    check(fast.to_dict(), want)
    monkeypatch.setattr(N, "NATIVE", False)
    slow = V.Stats()
    for part in np.array_split(u, 4):
        slow.add_bf16(part)
    check(slow.to_dict(), want, rel=1e-5)


def _quantized(bits, gs, sdt, case, rows=6, cols=512, seed=1):
    rng = np.random.default_rng(seed)
    w = mx.array((rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)).astype(sdt)
    wq, s, b = mx.quantize(w, group_size=gs, bits=bits)
    s = np.array(s.astype(mx.float32))
    b = np.array(b.astype(mx.float32))
    if case == "random":  # arbitrary scales and biases: every rounding of (s * q) + b exercised
        s = (rng.standard_normal(s.shape) * 0.3).astype(np.float32)
        b = (rng.standard_normal(b.shape) * 3).astype(np.float32)
    elif case == "zero-levels":  # some level of each group is exactly zero; zero-scale groups
        s = np.abs(s) + np.float32(2 ** -7)
        b = -s * rng.integers(0, 2 ** bits, s.shape).astype(np.float32)
        s[0, :2] = 0
        b[0, 0] = 0
    elif case == "offset":  # values far from zero: mean >> spread, the sums must not cancel
        s = np.abs(s) * np.float32(0.01)
        b = np.float32(100) + b * np.float32(0.01)
    elif case == "nonfinite":  # NaN / Inf scales or biases, and levels that overflow to Inf
        s[0, 0], b[1, 0], s[2, 1], b[3, 0] = np.nan, np.inf, -np.inf, -np.inf
        s[4, 0], b[4, 0] = 3e38, 1e38
        s[5, 1] = 0
        b[5, 1] = np.nan
    s, b = mx.array(s).astype(sdt), mx.array(b).astype(sdt)
    ref = np.array(mx.dequantize(wq, s, b, group_size=gs, bits=bits).astype(mx.float32))

    def raw(a):
        return np.array(a.view(mx.uint16) if a.dtype != mx.float32 else a).tobytes()

    return np.array(wq).tobytes(), raw(s), raw(b), ref, wq.shape


SDT = {mx.bfloat16: "BF16", mx.float16: "F16", mx.float32: "F32"}


@pytest.mark.parametrize("scalar", [False, True], ids=["simd", "scalar"])
@pytest.mark.parametrize("case", ["quantize", "random", "zero-levels", "offset", "nonfinite"])
@pytest.mark.parametrize("bits,gs", [(4, 64), (4, 32), (4, 128), (2, 64), (8, 64)])
@pytest.mark.parametrize("sdt", [mx.bfloat16, mx.float16, mx.float32], ids=["bf16", "f16", "f32"])
def test_affine_native_matches_mx_dequantize(sdt, bits, gs, case, scalar, monkeypatch):
    if scalar:
        monkeypatch.setenv("WB_SCALAR", "1")  # the element-by-element path (no AVX-512)
    wb, sb, bb, ref, shape = _quantized(bits, gs, sdt, case)
    want = reference(ref)
    rows = shape[0]
    # whole tensor, then in two row ranges merged (as chunks are)
    st = V.affine_stats(wb, sb, bb, rows, shape[1], QuantSpec("affine", bits, gs), SDT[sdt])
    assert st is not None
    check(st.to_dict(), want)
    h = rows // 2
    rb, srb = shape[1] * 4, len(sb) // rows
    parts = V.Stats()
    for lo, hi in ((0, h), (h, rows)):
        p = V.affine_stats(wb[lo * rb: hi * rb], sb[lo * srb: hi * srb], bb[lo * srb: hi * srb], hi - lo, shape[1],
                           QuantSpec("affine", bits, gs), SDT[sdt])
        parts.merge(p)
    check(parts.to_dict(), want)


def test_inspect_native_equals_fallback(tmp_path, monkeypatch):
    p = zoo.build("llama", tmp_path / "ck", quant="affine4", broken="nonfinite-values")
    fast = {t["name"]: t["stats"] for t in workbench.inspect(p, values=True, progress=False, chunk_bytes=4096).tensors}
    monkeypatch.setattr(N, "NATIVE", False)
    slow = {t["name"]: t["stats"] for t in workbench.inspect(p, values=True, progress=False, chunk_bytes=4096).tensors}
    assert fast.keys() == slow.keys() and len(fast) > 20
    for name in fast:
        a, b = fast[name], slow[name]
        for k in EXACT:
            assert a[k] == b[k], (name, k)
        if b["mean"] is not None:
            assert a["mean"] == pytest.approx(b["mean"], rel=1e-4, abs=1e-6 * (b["std"] or 1))
            assert a["std"] == pytest.approx(b["std"], rel=1e-4)


def test_affine_native_refuses_short_scales():
    # scales or biases shorter than the packed rows need: no out-of-bounds read, the caller's path instead
    wb, sb, bb, ref, shape = _quantized(4, 64, mx.bfloat16, "quantize")
    spec = QuantSpec("affine", 4, 64)
    assert V.affine_stats(wb, sb[:-2], bb, shape[0], shape[1], spec, "BF16") is None
    assert V.affine_stats(wb, sb, bb[:-2], shape[0], shape[1], spec, "BF16") is None
    assert V.affine_stats(wb[:-4], sb, bb, shape[0], shape[1], spec, "BF16") is None
    assert V.affine_stats(wb, sb, bb, shape[0], shape[1], spec, "BF16") is not None
