"""The CUDA statistics kernel's host side: each output's 12-word slot (float64 sums, the max
and negated min as order-preserving keys, five counts; the blocks add into it with atomics)
folds into the same stats dicts as the host path.

The kernel itself runs only on MLX's CUDA backend (benchmarks/ and the H200 figures check it
against the host path on every op); here a numpy model of the slots drives the fold, so a
wrong combination (a count in the wrong word, min taken as max, a key decoded wrongly, the
fill or the non-finite elements kept in the sums) fails on the CPU too."""
import math

import mlx.core as mx
import numpy as np
import pytest

from workbench.trace import stats as S


def _key(v: np.float32) -> int:
    """The kernel's wb_key: an order-preserving uint32 of a float32."""
    b = int(np.float32(v).view(np.uint32))
    return (~b & 0xFFFFFFFF) if b & 0x80000000 else (b | 0x80000000)


def _slot(a: np.ndarray, fill: float, blocks: int = 3) -> np.ndarray:
    """The 12 words the kernel leaves for one output: each of ``blocks`` blocks folds its
    slice and adds into the slot with atomics (max of keys, sums, counts)."""
    slot = np.zeros(12, np.uint32)
    sums = np.zeros(2)
    for part in np.array_split(a.astype(np.float32), blocks):
        nan, pinf, ninf = np.isnan(part), np.isposinf(part), np.isneginf(part)
        fl = (part == np.float32(fill)) & ~nan
        ok = ~(nan | pinf | ninf | fl)
        f = part[ok].astype(np.float64)
        sums += (f.sum(), (f * f).sum())
        if f.size:
            slot[4] = max(int(slot[4]), _key(np.float32(f.max())))
            slot[5] = max(int(slot[5]), _key(np.float32(-f.min())))
        slot[6:11] += np.array([(part == 0).sum(), fl.sum(), nan.sum(), pinf.sum(), ninf.sum()], np.uint32)
    slot[0:4] = sums.view(np.uint32)
    return slot


def _awkward(dt):
    rng = np.random.default_rng(1)
    b = (rng.standard_normal(20000) * 4).astype(np.float32)
    b[[3, 70, 999]] = np.nan
    b[[5, 6]] = np.inf
    b[7] = -np.inf
    b[100:300] = 0
    x = mx.array(b).astype(dt)
    return mx.where(mx.arange(b.size) % 13 == 0, mx.array(-S.dtype_max(dt), dt), x)


def _vals(dt):
    return [_awkward(dt), (mx.arange(5000, dtype=mx.float32) - 2500).astype(dt), mx.full((300,), -S.dtype_max(dt), dt),
            mx.full((40,), float("nan"), dt), mx.full((0,), 1.0, dt), mx.full((9,), -3.5, dt)]


def _words(vals):
    return np.concatenate([_slot(np.array(v.astype(mx.float32)), -S.dtype_max(v.dtype)) for v in vals if v.size])


@pytest.mark.parametrize("dt", [mx.float32, mx.bfloat16, mx.float16])
def test_fold_equals_host_path(dt):
    vals = _vals(dt)
    mx.eval(vals)
    want = S.evaluate(vals, host=True)
    meta = [(v.size, v.dtype) for v in vals]
    # slots in the kernel's order (sorted by size), not the outputs' order
    order = sorted((i for i, v in enumerate(vals) if v.size), key=lambda i: vals[i].size)
    out = S.fold_slots(meta, _words([vals[i] for i in order]), order)
    assert out[0]["nan"] == 3 and out[0]["posinf"] == 2 and out[0]["neginf"] == 1
    assert out[2]["masked"] == 300 and math.isnan(out[2]["mean"])
    assert out[5]["min"] == out[5]["max"] == -3.5  # a negative max and min through the keys
    _close(want, out)


def test_keys_keep_order():
    xs = np.array([-np.inf, -3e38, -1.5, -1e-30, -0.0, 0.0, 1e-30, 2.0, 3e38, np.inf], np.float32)
    keys = [_key(x) for x in xs]
    assert keys == sorted(keys) and min(keys) > 0  # 0 is "no value"
    back = S._unkey(np.array(keys, np.uint32))
    assert np.array_equal(back, xs.astype(np.float64))
    assert S._unkey(np.zeros(1, np.uint32))[0] == -np.inf


def _close(want, out):
    for w, g in zip(want, out):
        assert set(w) == set(g)
        for k in w:
            a, b = w[k], g[k]
            if a is None or (isinstance(a, float) and math.isnan(a)):
                assert b is None or (isinstance(b, float) and math.isnan(b)), (k, a, b)
            else:
                assert b == pytest.approx(a, rel=1e-5, abs=1e-6), (k, a, b)


def test_results_fold_many_batches_together():
    # a trace's batches (one per layer on a GPU) are copied back and folded in one pass:
    # each batch gets its own outputs' stats, in order, whatever its chunks
    batches = [_vals(mx.bfloat16)[:2], [mx.full((0,), 1.0, mx.float16)], _vals(mx.float16)[1:]]
    pend, want = [], []
    for vals in batches:
        mx.eval(vals)
        want.append(S.evaluate(vals, host=True))
        meta = [(v.size, v.dtype) for v in vals]
        order = [i for i, v in enumerate(vals) if v.size][::-1]
        halves = [order[:1], order[1:]] if len(order) > 1 else [order] if order else []
        parts = [mx.array(_words([vals[i] for i in h])) for h in halves]
        pend.append(S.Pending.slots(meta, parts, order))
    got = S.results(pend)
    assert [len(g) for g in got] == [2, 1, 5]
    assert got[2][2]["nan"] == 40 and got[2][1]["masked"] == 300
    for w, g in zip(want, got):
        _close(w, g)


def _rows_case(rng, n):
    """A packed row and an exact row, as the host path makes them, for an output of n elements."""
    lo, hi = sorted(rng.standard_normal(2) * 10.0 ** rng.integers(-3, 40))
    nan, pinf, ninf, fill = (int(rng.integers(0, 3)) * int(rng.random() < 0.3) for _ in range(4))
    s = rng.standard_normal() * n
    ss = abs(rng.standard_normal()) * n * max(abs(lo), abs(hi)) ** 2
    zeros = int(rng.integers(0, n + 1))
    return zeros, fill, nan, pinf, ninf, lo, hi, s, ss


@pytest.mark.parametrize("dt", [mx.float32, mx.bfloat16, mx.float16, mx.int32])
def test_finish_many_equals_finish(dt):
    # the column-wise finish gives, row for row, what the one-output finish gives: including
    # rows with no finite element, infinities (headroom inf), no dtype max (headroom None),
    # magnitudes past the dtype's max, and empty outputs
    rng = np.random.default_rng(7)
    meta, rows = [], []
    for i in range(300):
        n = 0 if i % 50 == 0 else int(rng.integers(1, 10 ** 6))
        zeros, fill, nan, pinf, ninf, lo, hi, s, ss = _rows_case(rng, max(n, 1))
        if i % 7 == 0:  # every element non-finite or fill
            fill = max(n - nan - pinf - ninf, 0)
            lo, hi, s, ss = np.inf, -np.inf, 0.0, 0.0
        meta.append((n, dt))
        rows.append((zeros if n else 0, fill, nan, pinf, ninf, lo, hi, s, ss))
    cnt = np.array([r[:5] for r in rows], np.int64)
    lo = np.array([r[5] for r in rows]); hi = np.array([r[6] for r in rows])
    sums = np.array([r[7:9] for r in rows])
    got = S.finish_many(meta, hi, lo, sums, cnt)
    for (n, _), r, g in zip(meta, rows, got):
        zeros, fill, nan, pinf, ninf, l, h, s, ss = r
        e = np.array([nan, pinf, ninf, l, h, s, ss, fill], np.float64)
        want = S.finish(np.array([0, 0, 0, 0, zeros], np.float64) if n else None, n, dt, e)
        assert list(g) == list(want)
        for k in want:
            a, b = want[k], g[k]
            assert type(a) is type(b) or (a is None) == (b is None), (k, a, b)
            if isinstance(a, float) and math.isnan(a):
                assert math.isnan(b), (k, a, b)
            else:
                assert a == b or a == pytest.approx(b, rel=1e-12), (k, a, b)


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


def test_kernel_fill_constants_are_each_dtypes_lowest_value():
    # the kernel names mask fill by literal constants (a template takes no float): each must be
    # the lowest finite value of the dtype _FILL_KIND maps to it, as dtype_max says on the host
    import re

    line = next(l for l in S._CUDA_BODY.splitlines() if "const float fv = FK == 0" in l)
    consts = [float(np.float32(c)) for c in re.findall(r"(-[0-9.e+]+)f", line)]
    assert len(consts) == 3
    for dt, k in S._FILL_KIND.items():
        assert consts[k] == -S.dtype_max(dt), (dt, consts[k])


def test_kernel_fast_path_threshold_catches_fill_and_non_finite():
    # wb_vec sums 8 elements in float32 unless one is at or past the threshold ``th``; the
    # element path is what counts fill, NaN and Inf, so for every dtype the fill's magnitude
    # and Inf must reach the threshold, and the sum of 8 values below it must stay finite
    import re

    line = next(l for l in S._CUDA_BODY.splitlines() if "const float th = FK == 1" in l)
    th_f16, th_other = (float(np.float32(c)) for c in re.findall(r"\? ([0-9.e+]+)f : ([0-9.e+]+)f", line)[0])
    for dt, k in S._FILL_KIND.items():
        th = th_f16 if k == 1 else th_other
        assert S.dtype_max(dt) >= th, (dt, th)  # fill, -dtype_max, goes the element path
        assert 8 * th * th < np.finfo(np.float32).max, (dt, th)  # a float32 sum of squares of 8 stays finite
    assert S._FILL_KIND[mx.float16] == 1 and list(S._FILL_KIND.values()).count(1) == 1


def test_the_gpu_check_script_holds_the_host_path_to_its_reference(capsys):
    # benchmarks/check_cuda_stats.py checks the CUDA kernel on a GPU against a float64 numpy
    # reference; here its reference is held to the host path on the same awkward arrays (so
    # a wrong reference cannot pass the kernel), and without CUDA it says so with exit 2
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "check_cuda_stats.py"
    spec = importlib.util.spec_from_file_location("check_cuda_stats", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--host", "--big", "20011"]) == 0
    assert "0 mismatching" in capsys.readouterr().out
    if not S.on_cuda():
        assert mod.main([]) == 2
    # a reference that counted fill as finite would be caught
    x = mx.array([1.0, -S.dtype_max(mx.float32), 2.0])
    r = mod.reference(x)
    assert r["masked"] == 1 and r["min"] == 1.0 and r["mean"] == 1.5


@pytest.mark.parametrize("sizes", [
    [], [5], [1] * 300, [10] * 129 + [S._SMALL + 1] * 70, [S._SMALL] * 3 + [10**7] * 33,
    sorted([1, 17, S._SMALL, S._SMALL + 1, 2**24] * 40),
])
def test_chunks_cover_every_output_once_within_the_kernel_limits(sizes):
    bounds = S.chunk_bounds(sizes)
    covered = [i for lo, hi in bounds for i in range(lo, hi)]
    assert covered == list(range(len(sizes)))
    for k, (lo, hi) in enumerate(bounds):
        chunk = sizes[lo:hi]
        assert S._K_MAX >= len(chunk) > 0
        if len(chunk) > S._K:  # past 32 outputs only while the elements stay within the limit
            assert sum(chunk) <= S._CHUNK_ELEMS
        if hi < len(sizes):  # a chunk ends at the count limit, or where the next would pass the elements'
            assert len(chunk) == S._K_MAX or (len(chunk) >= S._K and sum(chunk) + sizes[hi] > S._CHUNK_ELEMS)
    # a decoding step's small outputs fill their kernels; 4096-token ones (6M elements) keep 32
    assert [hi - lo for lo, hi in S.chunk_bounds([2048] * 300)] == [128, 128, 44]
    assert [hi - lo for lo, hi in S.chunk_bounds([6 << 20] * 70)] == [32, 32, 6]


def test_rows_make_each_dict_once_and_views_share_them():
    vals = _vals(mx.float32)
    mx.eval(vals)
    meta = [(v.size, v.dtype) for v in vals]
    order = [i for i, v in enumerate(vals) if v.size]
    rows = S.fold_slots(meta, _words([vals[i] for i in order]), order)
    assert isinstance(rows, S.Rows) and len(rows) == len(vals)
    _close(S.evaluate(vals, host=True), list(rows))
    assert rows[1] is rows[1] and rows[-1] is rows[len(vals) - 1]
    view = rows.view(2, 3)
    assert len(view) == 3 and view[0] is rows[2] and view[2] is rows[4] and view[1:] == [rows[3], rows[4]]
    assert rows[4] == S.finish(None, 0, mx.float32)  # the empty output
    with pytest.raises(IndexError):
        view[3]


def test_steps_take_their_rows_when_first_read():
    """A trace's CUDA-made batch: wait_for_stats hands each step its row; the dict is the
    folded one, made on first read, and setting stats afterwards replaces it."""
    from workbench.program import Op, Program
    from workbench.trace import Trace
    from workbench.trace.tracer import wait_for_stats

    vals = _vals(mx.bfloat16)
    vals = [v for v in vals if v.size]
    mx.eval(vals)
    ops = [Op(f"v{i}", "const", (lambda v: lambda c, x: v)(v), ("x",)) for i, v in enumerate(vals)]
    t = Trace(Program(ops, inputs=("x",)), None, {"x": mx.zeros(1)}, capture=None)
    t.run()
    meta = [(v.size, v.dtype) for v in vals]
    order = list(range(len(vals)))[::-1]
    parts = [mx.array(_words([vals[i] for i in order]))]
    t._inflight.append((0, len(vals), S.Pending.slots(meta, parts, order)))
    wait_for_stats([t])
    want = S.evaluate(vals, host=True)
    steps = t.steps
    _close(want, [s.stats for s in steps])
    assert steps[0].stats["nan"] == 3 and steps[0] == steps[0]
    steps[1].stats = {"max": 1.0}
    assert steps[1].stats == {"max": 1.0}


def _fake_kernel(k):
    """A numpy model of the CUDA kernel (its slots, :func:`_words`), checking what
    cuda_parts hands it: k inputs of one float dtype, each of rank >= 1, the template's T."""
    def run(inputs, template, grid, threadgroup, output_shapes, output_dtypes, init_value):
        assert len(inputs) == k and grid[1] == k and output_shapes == [(k * S._SLOT,)]
        assert {x.dtype for x in inputs} == {dict(template)["T"]} and dict(template)["T"] in S._FILL_KIND
        assert all(x.ndim >= 1 for x in inputs) and grid[0] % S._THREADS == 0
        return [mx.array(_words(inputs))]
    return run


def _decoding_outputs(rng, cache: int):
    """A decoding step's outputs: 300 small ones in three float dtypes, an int32 one (the
    kernel reads it as float32), a scalar, an empty one, and two that grow with the KV cache."""
    out = []
    for i in range(300):
        dt = (mx.bfloat16, mx.float16, mx.float32)[i % 3]
        out.append(mx.array(rng.standard_normal((1, 1, 64 + i % 7)).astype(np.float32)).astype(dt))
    out += [mx.array(rng.integers(-5, 5, (1, 9)).astype(np.int32)), mx.array(np.float32(2.5)),
            mx.zeros((1, 0, 4), mx.bfloat16),
            mx.array(rng.standard_normal((1, 4, cache, 16)).astype(np.float32)).astype(mx.bfloat16),
            mx.array(rng.standard_normal((1, 4, 1, cache)).astype(np.float32))]
    out[5] = mx.where(mx.arange(out[5].size).reshape(out[5].shape) == 3, mx.array(float("nan"), mx.float32), out[5])
    return out


def test_cuda_parts_plans_are_shared_across_decoding_steps(monkeypatch):
    """cuda_parts through a fake kernel: every output's stats equal the host path's, and a
    decoding loop's steps, whose KV-cache outputs grow by a token, reuse one grouping plan
    (made once per dtypes, ranks and sizes' power of two), with each step's exact sizes."""
    monkeypatch.setattr(S, "_cuda_kernel", _fake_kernel)
    monkeypatch.setattr(S, "_PLANS", {})
    rng = np.random.default_rng(3)
    plans = []
    for cache in (40, 41, 63, 64):  # 64 x 16 x 4 elements: another power of two, another plan
        vals = _decoding_outputs(rng, cache)
        mx.eval(vals)
        plan, meta = S.cuda_plan(vals)
        want = S.as_meta([(v.size, v.dtype) for v in vals])
        assert meta.sizes.tolist() == want.sizes.tolist() and np.array_equal(meta.dmax, want.dmax, equal_nan=True)
        assert np.isnan(meta.dmax[300]) and meta.dmax[0] == S.dtype_max(mx.bfloat16)  # int32: no float max
        # what a trace passes (its recorded shapes and dtypes) gives the same plan and sizes
        plan2, meta2 = S.cuda_plan(vals, [v.shape for v in vals], [v.dtype for v in vals])
        assert plan2 is plan and meta2.sizes.tolist() == want.sizes.tolist()
        parts, order = S.cuda_parts(vals, plan)
        assert sorted(order) == [i for i, v in enumerate(vals) if v.size] and len(parts) == len(plan.kernels)
        _close(S.evaluate(vals, host=True), list(S.fold_slots(meta, np.concatenate([np.array(p) for p in parts]),
                                                              order)))
        plans.append(plan)
    assert plans[0] is plans[1] is plans[2] and plans[3] is not plans[0] and len(S._PLANS) == 2
    assert plans[0].cast == [300] and plans[0].flat == [301]
    assert S.cuda_parts(vals)[1] == plans[3].order  # no plan given: looked up


def test_cuda_plan_table_is_bounded(monkeypatch):
    monkeypatch.setattr(S, "_PLANS", {})
    x = mx.zeros((2,))
    for n in range(S._PLANS_MAX + 5):  # batches of n + 1 outputs: a signature each
        S.cuda_plan([x] * (n + 1))
    assert len(S._PLANS) == 5  # emptied once full


def test_a_trace_on_the_cuda_path_gives_the_host_paths_stats(monkeypatch, tmp_path):
    """A generation whose statistics take the CUDA path (the kernel faked in numpy): the
    trace hands its recorded shapes and dtypes to the plan, and every op of every forward
    gets the host path's statistics."""
    import workbench
    from workbench import zoo

    m = workbench.load(zoo.build("gemma4_text", tmp_path / "g4", dtype="float32"))
    want = workbench.generate(m, [2, 15, 16], max_tokens=4, capture="stats")
    monkeypatch.setattr(S, "_cuda_kernel", _fake_kernel)
    monkeypatch.setattr(S, "_PLANS", {})
    monkeypatch.setattr(S, "on_cuda", lambda: True)
    monkeypatch.setenv("WORKBENCH_STATS", "device")
    got = workbench.generate(m, [2, 15, 16], max_tokens=4, capture="stats")
    assert got.tokens == want.tokens and len(S._PLANS) == 2  # the prompt's plan, and the decoding steps' one
    for tw, tg in zip(want.traces, got.traces):
        sw, sg = tw.steps, tg.steps
        assert [s.name for s in sw] == [s.name for s in sg]
        _close([s.stats for s in sw], [s.stats for s in sg])
