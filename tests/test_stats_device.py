"""The device (GPU) statistics path, exercised on the CPU: one compiled partial reduction
per op, every op's statistics and the logits evaluated in one ``mx.eval``; exact counts."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import workbench
import mlx.core as mx

from workbench.trace import stats as S
from workbench.trace.stats import device, host, pending

DEMO = Path(__file__).resolve().parents[1] / "assets" / "demo"


def _ref(a: np.ndarray, dtype) -> dict:
    dmax = S.dtype_max(dtype)
    a = a.astype(np.float64).reshape(-1)
    fill = a == -dmax
    ok = np.isfinite(a) & ~fill
    f = a[ok]
    return {"nan": int(np.isnan(a).sum()), "posinf": int(np.isposinf(a).sum()), "neginf": int(np.isneginf(a).sum()),
            "masked": int(fill.sum()), "zero_frac": float((a == 0).mean()),
            "min": f.min(), "max": f.max(), "mean": f.mean(), "std": f.std()}


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16])
@pytest.mark.parametrize("n", [1, 7, 128, 1000, 4099, 3 * 128 * 50])
def test_device_statistics_match_numpy(dtype, n):
    rng = np.random.default_rng(n)
    base = (rng.standard_normal(n) * 30).astype(np.float32)
    base[rng.integers(0, n, max(1, n // 9))] = 0
    variants = [base]
    if n >= 7:
        masked = base.copy()
        masked[: n // 3] = -S.dtype_max(dtype)
        bad = base.copy()
        bad[1], bad[3], bad[5] = np.nan, np.inf, -np.inf
        variants += [masked, bad]
    vals = [mx.array(v).astype(dtype) for v in variants]
    got = device.device_stats(vals)
    for v, st in zip(vals, got):
        ref = _ref(np.array(v.astype(mx.float32)), dtype)
        for k in ("nan", "posinf", "neginf", "masked"):
            assert st[k] == ref[k], k
        assert st["zero_frac"] == ref["zero_frac"]
        assert (st["min"], st["max"]) == (ref["min"], ref["max"])
        assert st["mean"] == pytest.approx(ref["mean"], rel=1e-5, abs=1e-5)
        assert st["std"] == pytest.approx(ref["std"], rel=1e-4, abs=1e-5)
        assert st["headroom"] == (math.inf if ref["posinf"] or ref["neginf"]
                                  else pytest.approx(max(abs(ref["min"]), abs(ref["max"])) / S.dtype_max(dtype)))


def test_all_masked_and_integer_outputs():
    dt = mx.float16
    allfill = mx.full((4, 256), -S.dtype_max(dt), dt)
    ints = mx.array([3, 0, -2, 0], mx.int32)
    a, b = device.device_stats([allfill, ints])
    assert a["masked"] == 1024 and a["nan"] == 0 and a["mean"] is None and a["absmax"] is None
    assert (b["min"], b["max"], b["zero_frac"], b["headroom"]) == (-2, 3, 0.5, None)


def test_device_path_trace_is_one_evaluation_and_agrees_with_host(monkeypatch):
    model = workbench.load(DEMO)
    ids = [(5 * i + 2) % model.vocab_size for i in range(40)]
    host = workbench.trace(model, ids, capture="stats", dtype="bfloat16")
    host.run()
    monkeypatch.setenv("WORKBENCH_STATS", "device")
    assert not S.use_host()
    workbench.trace(model, ids, capture="stats", dtype="bfloat16").run()  # compiles the reductions once
    calls = []
    real = mx.eval
    monkeypatch.setattr(mx, "eval", lambda *a: (calls.append(len(a)), real(*a))[1])
    dev = workbench.trace(model, ids, capture="stats", dtype="bfloat16")
    dev.run()
    assert len(calls) == 1  # logits + every op's statistics, no per-op synchronisation
    monkeypatch.setattr(mx, "eval", real)
    assert np.array_equal(np.array(dev.logits.astype(mx.float32)), np.array(host.logits.astype(mx.float32)))
    for n in host.ops:
        h, d = host.stats(n), dev.stats(n)
        for k in S.KEYS:
            if h[k] is None or (isinstance(h[k], float) and math.isnan(h[k])):
                assert d[k] is None or math.isnan(d[k]), (n, k)
            elif k in ("nan", "posinf", "neginf", "masked", "zero_frac", "min", "max", "absmax"):
                assert h[k] == d[k], (n, k)
            else:
                assert h[k] == pytest.approx(d[k], rel=1e-4, abs=1e-5), (n, k)


def test_large_outputs_are_reduced_in_pieces(monkeypatch):
    monkeypatch.setattr(device, "CHUNK", 1000)
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((3, 1001)) * 7).astype(np.float32)  # 3003 elements: 7 pieces of 429
    a[0, :5] = 0
    a[2, 7:20] = -S.dtype_max(mx.float16)
    b = a.copy()
    b[1, 2] = np.nan
    vals = [mx.array(a).astype(mx.float16), mx.array(b).astype(mx.float16), mx.array(a[:1, :900])]
    got = device.device_stats(vals)
    for v, st in zip(vals, got):
        ref = _ref(np.array(v.astype(mx.float32)), v.dtype)
        for k in ("nan", "posinf", "neginf", "masked", "zero_frac", "min", "max"):
            assert st[k] == ref[k], k
        assert st["mean"] == pytest.approx(ref["mean"], rel=1e-5) and st["std"] == pytest.approx(ref["std"], rel=1e-4)
    assert got[0]["masked"] == 13 and got[1]["nan"] == 1


def test_host_statistics_thread_calls_no_mlx(monkeypatch):
    """MLX streams belong to threads: the statistics thread must not use MLX (it gets numpy
    views and floats); its results equal numpy's, for every dtype kind."""
    import threading

    caller = threading.current_thread()
    used = []

    class WatchedMLX:  # the dispatch's and common's ``mx``, noting every name looked up off the calling thread
        def __getattr__(self, name):
            if threading.current_thread() is not caller:
                used.append((threading.current_thread().name, name))
            return getattr(mx, name)

    from workbench.trace.stats import common

    assert not hasattr(host, "mx")  # the host backend (the thread's code) has no MLX at all
    monkeypatch.setattr(pending, "mx", WatchedMLX())
    monkeypatch.setattr(common, "mx", WatchedMLX())
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((8, 300)) * 5).astype(np.float32)
    a[1, 2], a[3, 4] = np.nan, -np.inf
    vals = [mx.array(a).astype(dt) for dt in (mx.float32, mx.bfloat16, mx.float16)]
    vals.append(mx.array(rng.integers(-3, 3, 500), mx.int32))
    p = S.Pending(vals, background=True, host=True)
    got = p.result()
    assert pending.pool().submit(threading.current_thread).result() is not caller  # a thread of its own
    assert used == []
    deferred = S.Pending(vals, background=True, host=True, defer=True)  # a decoding loop's: queued,
    deferred.start()  # reduced once started
    assert list(deferred.result()) == list(got) and used == []
    for v, st in zip(vals, got):
        h = np.array(v.astype(mx.float32)) if v.dtype != mx.int32 else np.array(v).astype(np.float64)
        ref = _ref(h, v.dtype) if v.dtype != mx.int32 else None
        if ref is None:
            assert (st["min"], st["max"], st["nan"], st["headroom"]) == (h.min(), h.max(), 0, None)
            continue
        for k in ("nan", "posinf", "neginf", "min", "max", "zero_frac"):
            assert st[k] == ref[k], (v.dtype, k)
        assert st["mean"] == pytest.approx(ref["mean"], rel=1e-5)


def test_arrays_of_another_thread_fail_with_a_reason():
    """A lazy array is a node on the stream of the thread that built it; evaluating it on
    another thread fails in MLX ("There is no Stream(cpu, 0) in current thread"), and the
    statistics say why."""
    import threading

    lazy = mx.arange(4096, dtype=mx.float32) * 2  # built (not evaluated) on this thread
    err = []

    def other():
        for defer in (False, True):
            try:
                S.Pending([lazy], background=False, host=True, defer=defer)
            except RuntimeError as e:
                err.append(str(e))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(err) == 2 and all("in current thread" in e and "MLX streams belong to threads" in e for e in err)
    assert S.evaluate([lazy])[0]["max"] == 8190.0  # on its own thread it evaluates


@pytest.mark.parametrize("run", [None, 1000])
def test_small_outputs_reduced_together_equal_one_by_one(run, monkeypatch):
    """host_stats_many reduces a decoding step's hundreds of one-token outputs together (a few
    numpy calls); each output gets what it gets reduced on its own (SMALL = 0): NaN / Inf /
    mask fill / zeros, three dtypes, an empty output and ones above the size reduced together."""
    if run is not None:  # runs of 1000 elements: the small outputs split into many runs (one of
        monkeypatch.setattr(host, "RUN", run)  # 2048 alone in its own), the large ones into pieces
    small = host.SMALL
    rng = np.random.default_rng(3)
    vals = []
    for dt in (mx.float32, mx.bfloat16, mx.float16):
        for n in (1, 5, 300, 2048):
            vals.append(mx.array((rng.standard_normal(n) * 3).astype(np.float32)).astype(dt))
        b = rng.standard_normal(700).astype(np.float32)
        b[[1, 9]] = np.nan
        b[4] = np.inf
        b[100:140] = 0
        vals.append(mx.array(b).astype(dt))
        vals.append(mx.full((64,), -S.dtype_max(dt), dt))  # all mask fill
        vals.append(mx.zeros((0,), dt))
    vals.append(mx.array(rng.standard_normal(small + 7).astype(np.float32)))  # reduced on its own
    for dt in (mx.bfloat16, mx.float16):  # above SMALL, NaN and -Inf in a later piece
        c = (rng.standard_normal(small + 3001) * 5).astype(np.float32)
        c[small + 2500] = np.nan
        c[-1] = -np.inf
        vals.append(mx.array(c).astype(dt))
    mx.eval(vals)
    views = [mx.view(v, mx.uint16) if v.dtype == mx.bfloat16 else v for v in vals]
    mx.eval(views)
    jobs = [(np.asarray(w).reshape(-1), v.dtype == mx.bfloat16, S.dtype_max(v.dtype), v.size)
            for v, w in zip(vals, views)]
    many = list(host.host_stats_many(jobs))
    monkeypatch.setattr(host, "SMALL", 0)
    one = list(host.host_stats_many(jobs))
    assert many[4]["nan"] == 2 and many[4]["posinf"] == 1 and many[5]["masked"] == 64
    assert many[5]["mean"] is None and many[6] == S.empty_row()
    assert many[-1]["nan"] == 1 and many[-1]["neginf"] == 1 and many[-2]["nan"] == 1
    for v, a, b in zip(vals, one, many):
        assert set(a) == set(b) == set(S.KEYS)
        for k in ("nan", "posinf", "neginf", "masked", "zero_frac", "headroom"):
            assert b[k] == (pytest.approx(a[k], rel=1e-6) if isinstance(a[k], float) else a[k]), (k, a[k], b[k])
        if not v.size or b["masked"] == v.size or b["nan"]:
            continue
        want = _ref(np.array(v.astype(mx.float32)), v.dtype)  # float64 (one by one sums in float32)
        scale = max(abs(want["min"]), abs(want["max"]))
        for k in ("min", "max", "mean", "std"):
            assert b[k] == pytest.approx(want[k], rel=1e-6, abs=1e-6 * scale), (k, b[k], want[k])


def test_no_finite_value_is_none_in_the_trace_the_checkpoint_scan_and_json():
    """One convention (workbench/stats_schema.py): a tensor with no finite value has None for
    min, max, mean, std and absmax -- a trace's statistics on either path, a checkpoint scan's
    and their JSON alike; its counts say what it holds."""
    import json

    from workbench.checkpoint.values import Stats
    from workbench.stats_schema import SUMMARY

    a = np.array([np.nan, np.inf, -np.inf, np.nan], np.float32)
    host, dev = S.evaluate([mx.array(a)], host=True)[0], S.evaluate([mx.array(a)], host=False)[0]
    scan = Stats()
    scan.add(a.copy())
    scan = scan.to_dict()
    for d in (host, dev, scan):
        assert [d[k] for k in SUMMARY] == [None] * 5 and (d["nan"], d["posinf"], d["neginf"]) == (2, 1, 1), d
        assert json.loads(json.dumps(S.jsonable(d), allow_nan=False)) == S.jsonable(d)
    assert host["headroom"] == math.inf and S.jsonable(host)["headroom"] is None  # (JSON holds no Inf)
    fill = S.evaluate([mx.full((8,), -S.dtype_max(mx.float16), mx.float16)])[0]  # all mask fill
    assert fill["masked"] == 8 and fill["min"] is None and fill["headroom"] is None
    b = np.array([np.nan, -2.0, 3.0], np.float32)  # finite values: numbers, the same in both
    t, c = S.evaluate([mx.array(b)])[0], Stats()
    c.add(b.copy())
    c = c.to_dict()
    assert (t["min"], t["max"], t["absmax"]) == (c["min"], c["max"], c["absmax"]) == (-2.0, 3.0, 3.0)
    assert t["mean"] == pytest.approx(c["mean"]) == 0.5
