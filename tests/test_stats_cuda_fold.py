"""The CUDA statistics path's host side: each output's 12-word slot (float64 sums, the max
and negated min as order-preserving keys, five counts; the blocks add into it with atomics)
folds into the same stats dicts as the host path; the plans, the chunks, the dispatch.

The kernel itself (workbench/trace/stats/stats_kernel.cu) runs only on MLX's CUDA backend:
``benchmarks/check_cuda_stats.py`` runs the real kernel on the device against float64 numpy.
Here slots written by a numpy stand-in drive the fold, so a wrong combination (a count in the
wrong word, min taken as max, a key decoded wrongly, the fill or the non-finite elements kept
in the sums) fails on the CPU too; the stand-in checks nothing of the kernel itself."""
import math

import mlx.core as mx
import numpy as np
import pytest

from workbench.trace import stats as S
from workbench.trace.stats import cuda, host
from workbench.trace.stats.common import as_meta


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
    out = cuda.fold_slots(meta, _words([vals[i] for i in order]), order)
    assert out[0]["nan"] == 3 and out[0]["posinf"] == 2 and out[0]["neginf"] == 1
    assert out[2]["masked"] == 300 and out[2]["mean"] is None and out[2]["absmax"] is None
    assert out[5]["min"] == out[5]["max"] == -3.5  # a negative max and min through the keys
    _close(want, out)


def test_keys_keep_order():
    xs = np.array([-np.inf, -3e38, -1.5, -1e-30, -0.0, 0.0, 1e-30, 2.0, 3e38, np.inf], np.float32)
    keys = [_key(x) for x in xs]
    assert keys == sorted(keys) and min(keys) > 0  # 0 is "no value"
    back = cuda.unkey(np.array(keys, np.uint32))
    assert np.array_equal(back, xs.astype(np.float64))
    assert cuda.unkey(np.zeros(1, np.uint32))[0] == -np.inf


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


def _finish_one(n, dmax, zeros, fill, nan, pinf, ninf, lo, hi, s, ss) -> dict:
    """The statistics of one output's partials, by the schema's definitions, in plain Python."""
    if n == 0:
        return S.empty_row()
    c = n - nan - pinf - ninf - fill
    if c > 0:
        mean = s / c
        summ = dict(min=lo, max=hi, mean=mean, std=math.sqrt(max(ss / c - mean * mean, 0.0)),
                    absmax=max(abs(lo), abs(hi)))
    else:
        summ = dict.fromkeys(("min", "max", "mean", "std", "absmax"))
    head = math.inf if pinf or ninf else (None if dmax is None or summ["absmax"] is None else summ["absmax"] / dmax)
    return {**summ, "nan": nan, "posinf": pinf, "neginf": ninf, "zero_frac": zeros / n, "headroom": head,
            "masked": fill}


@pytest.mark.parametrize("dt", [mx.float32, mx.bfloat16, mx.float16, mx.int32])
def test_finish_follows_the_schema_row_by_row(dt):
    # the one finishing arithmetic (on columns) gives each row what the schema's definitions
    # give it: rows with no finite element (every summary None), infinities (headroom inf), no
    # dtype max (headroom None), magnitudes past the dtype's max, and empty outputs
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
    got = S.finish(meta, hi, lo, sums, cnt)
    assert len(got) == 300 and got[0] == S.empty_row() and got[7]["mean"] is None and got[7]["min"] is None
    for (n, _), r, g in zip(meta, rows, got):
        want = _finish_one(n, S.dtype_max(dt), *r)
        assert list(g) == list(want) == list(S.KEYS)
        for k in want:
            a, b = want[k], g[k]
            assert (a is None) == (b is None), (k, a, b)
            if a is not None:
                assert type(a) is type(b) or isinstance(a, float), (k, a, b)
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


def test_kernel_constants_come_from_the_dtype_facts():
    # the kernel names mask fill and its fast path's thresholds by constants (a template takes
    # no float): each dtype's fill is its lowest finite value as the host says, its threshold
    # catches the fill and Inf (the element path counts them), and a float32 sum of squares of
    # 8 values below it stays finite; the kernel's text holds none of them as literals
    consts = cuda.kernel_constants()
    assert set(consts) == set(cuda.FILL_KIND) == {mx.float32, mx.float16, mx.bfloat16}
    for dt, (fill, th) in consts.items():
        assert fill == -S.dtype_max(dt) == -float(mx.finfo(dt).max), dt
        assert -fill >= th and 8 * th * th < np.finfo(np.float32).max, (dt, th)
    header, body = cuda.kernel_source()
    for name in ("WB_FILL_F32", "WB_FILL_F16", "WB_FILL_BF16", "WB_TH_F16", "WB_TH_WIDE"):
        assert header.count(f"#define {name} (") == 1 and name in body
    assert "65504" not in body and "e38" not in body and "@CASES@" in body


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
        assert mod.check_trace() == 0  # (its trace comparison runs here with the host path on both sides)
    # a reference that counted fill as finite would be caught
    x = mx.array([1.0, -S.dtype_max(mx.float32), 2.0])
    r = mod.reference(x)
    assert r["masked"] == 1 and r["min"] == 1.0 and r["mean"] == 1.5


@pytest.mark.parametrize("sizes", [
    [], [5], [1] * 300, [10] * 129 + [host.SMALL + 1] * 70, [host.SMALL] * 3 + [10**7] * 33,
    sorted([1, 17, host.SMALL, host.SMALL + 1, 2**24] * 40),
])
def test_chunks_cover_every_output_once_within_the_kernel_limits(sizes):
    bounds = cuda.chunk_bounds(sizes)
    covered = [i for lo, hi in bounds for i in range(lo, hi)]
    assert covered == list(range(len(sizes)))
    for k, (lo, hi) in enumerate(bounds):
        chunk = sizes[lo:hi]
        assert cuda.K_MAX >= len(chunk) > 0
        if len(chunk) > cuda.K:  # past 32 outputs only while the elements stay within the limit
            assert sum(chunk) <= cuda.CHUNK_ELEMS
        if hi < len(sizes):  # a chunk ends at the count limit, or where the next would pass the elements'
            assert len(chunk) == cuda.K_MAX or (len(chunk) >= cuda.K and sum(chunk) + sizes[hi] > cuda.CHUNK_ELEMS)
    # a decoding step's small outputs fill their kernels; 4096-token ones (6M elements) keep 32
    assert [hi - lo for lo, hi in cuda.chunk_bounds([2048] * 300)] == [128, 128, 44]
    assert [hi - lo for lo, hi in cuda.chunk_bounds([6 << 20] * 70)] == [32, 32, 6]


def test_rows_make_each_dict_once_and_views_share_them():
    vals = _vals(mx.float32)
    mx.eval(vals)
    meta = [(v.size, v.dtype) for v in vals]
    order = [i for i, v in enumerate(vals) if v.size]
    rows = cuda.fold_slots(meta, _words([vals[i] for i in order]), order)
    assert isinstance(rows, S.Rows) and len(rows) == len(vals)
    _close(S.evaluate(vals, host=True), list(rows))
    assert rows[1] is rows[1] and rows[-1] is rows[len(vals) - 1]
    view = rows.view(2, 3)
    assert len(view) == 3 and view[0] is rows[2] and view[2] is rows[4] and view[1:] == [rows[3], rows[4]]
    assert rows[4] == S.empty_row()  # the empty output
    with pytest.raises(IndexError):
        view[3]


def test_steps_take_their_rows_when_first_read(monkeypatch):
    """A trace whose statistics take the CUDA path (the slots written by the stand-in): each
    step gets its row of the folded batch, the dict made on first read, and setting stats
    afterwards replaces it."""
    from workbench.program import Op, Program
    from workbench.trace import Trace

    monkeypatch.setattr(cuda, "kernel", _fake_kernel)
    monkeypatch.setattr(cuda, "PLANS", {})
    monkeypatch.setattr(cuda, "on_cuda", lambda: True)
    monkeypatch.setenv("WORKBENCH_STATS", "device")
    vals = [v for v in _vals(mx.bfloat16) if v.size]
    mx.eval(vals)
    ops = [Op(f"v{i}", "const", (lambda v: lambda c, x: v)(v), ("x",)) for i, v in enumerate(vals)]
    t = Trace(Program(ops, inputs=("x",)), None, {"x": mx.zeros(1)}, capture="stats")
    t.run()
    assert len(cuda.PLANS) == 1  # the batch went through the (stand-in) kernel
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
        assert len(inputs) == k and grid[1] == k and output_shapes == [(k * cuda.SLOT,)]
        assert {x.dtype for x in inputs} == {dict(template)["T"]} and dict(template)["T"] in cuda.FILL_KIND
        assert all(x.ndim >= 1 for x in inputs) and grid[0] % cuda.THREADS == 0
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
    monkeypatch.setattr(cuda, "kernel", _fake_kernel)
    monkeypatch.setattr(cuda, "PLANS", {})
    rng = np.random.default_rng(3)
    plans = []
    for cache in (40, 41, 63, 64):  # 64 x 16 x 4 elements: another power of two, another plan
        vals = _decoding_outputs(rng, cache)
        mx.eval(vals)
        plan, meta = cuda.cuda_plan(vals)
        want = as_meta([(v.size, v.dtype) for v in vals])
        assert meta.sizes.tolist() == want.sizes.tolist() and np.array_equal(meta.dmax, want.dmax, equal_nan=True)
        assert np.isnan(meta.dmax[300]) and meta.dmax[0] == S.dtype_max(mx.bfloat16)  # int32: no float max
        # what a trace passes (its recorded shapes and dtypes) gives the same plan and sizes
        plan2, meta2 = cuda.cuda_plan(vals, [v.shape for v in vals], [v.dtype for v in vals])
        assert plan2 is plan and meta2.sizes.tolist() == want.sizes.tolist()
        parts, order = S.cuda_parts(vals, plan)
        assert sorted(order) == [i for i, v in enumerate(vals) if v.size] and len(parts) == len(plan.kernels)
        _close(S.evaluate(vals, host=True), list(cuda.fold_slots(meta, np.concatenate([np.array(p) for p in parts]),
                                                              order)))
        plans.append(plan)
    assert plans[0] is plans[1] is plans[2] and plans[3] is not plans[0] and len(cuda.PLANS) == 2
    assert plans[0].cast == [300] and plans[0].flat == [301]
    assert S.cuda_parts(vals)[1] == plans[3].order  # no plan given: looked up


def test_cuda_plan_table_is_bounded(monkeypatch):
    monkeypatch.setattr(cuda, "PLANS", {})
    x = mx.zeros((2,))
    for n in range(cuda.PLANS_MAX + 5):  # batches of n + 1 outputs: a signature each
        cuda.cuda_plan([x] * (n + 1))
    assert len(cuda.PLANS) == 5  # emptied once full


def test_a_trace_on_the_cuda_path_gives_the_host_paths_stats(monkeypatch, tmp_path):
    """A generation whose statistics take the CUDA path (the kernel faked in numpy): the
    trace hands its recorded shapes and dtypes to the plan, and every op of every forward
    gets the host path's statistics."""
    import workbench
    from workbench import zoo

    m = workbench.load(zoo.build("gemma4_text", tmp_path / "g4", dtype="float32"))
    want = workbench.generate(m, [2, 15, 16], max_tokens=4, capture="stats")
    monkeypatch.setattr(cuda, "kernel", _fake_kernel)
    monkeypatch.setattr(cuda, "PLANS", {})
    monkeypatch.setattr(cuda, "on_cuda", lambda: True)
    monkeypatch.setenv("WORKBENCH_STATS", "device")
    got = workbench.generate(m, [2, 15, 16], max_tokens=4, capture="stats")
    assert got.tokens == want.tokens and len(cuda.PLANS) == 2  # the prompt's plan, and the decoding steps' one
    for tw, tg in zip(want.traces, got.traces):
        sw, sg = tw.steps, tg.steps
        assert [s.name for s in sw] == [s.name for s in sg]
        _close([s.stats for s in sw], [s.stats for s in sg])
