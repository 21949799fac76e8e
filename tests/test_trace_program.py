"""The Trace as a generic stepper over any op program (no model, no checkpoint)."""
import math

import numpy as np
import pytest

import workbench  # noqa: F401
import mlx.core as mx

from workbench.program import Op, Program, execute
from workbench.trace import NONFINITE, Trace, TraceError, inject, patch
from workbench.trace import stats as S
from workbench.device_memory import ask_device_memory


class Ctx:
    def __init__(self, dtype, weights):
        self.dtype = dtype
        self.w = {k: v.astype(dtype) for k, v in weights.items()}
        self.cache = None


def make(extra_ops=(), dtype=mx.float32, seed=0):
    rng = np.random.default_rng(seed)
    weights = {"w_in": mx.array(rng.standard_normal((16, 8)).astype(np.float32) * 0.5),
               "w0": mx.array(rng.standard_normal((16, 16)).astype(np.float32) * 0.3),
               "w1": mx.array(rng.standard_normal((16, 16)).astype(np.float32) * 0.3),
               "w_out": mx.array(rng.standard_normal((5, 16)).astype(np.float32) * 0.3)}
    ops = [Op("embed", "linear", lambda c, x: x.astype(c.dtype) @ c.w["w_in"].T, ("x",), ("w_in",), None)]
    prev = "embed"
    for i in range(2):
        ops += [
            Op(f"layers.{i}.act", "relu", lambda c, h: mx.maximum(h, 0), (prev,), (), i),
            Op(f"layers.{i}.proj", "linear", (lambda k: lambda c, h: h @ c.w[k].T)(f"w{i}"),
               (f"layers.{i}.act",), (f"w{i}",), i),
            Op(f"layers.{i}", "add", lambda c, a, b: a + b, (prev, f"layers.{i}.proj"), (), i),
        ]
        prev = f"layers.{i}"
    ops += list(extra_ops)
    last = ops[-1].name
    ops.append(Op("logits", "linear", lambda c, h: h @ c.w["w_out"].T, (last,), ("w_out",), None))
    prog = Program(ops, inputs=("x",))
    x = mx.array(rng.standard_normal((3, 8)).astype(np.float32))
    ctx = Ctx(dtype, weights)

    def tensors(name):
        return {p: weights[p] for p in prog[name].params}
    return prog, ctx, {"x": x}, (lambda d, c: Ctx(d, weights)), tensors, weights


def new_trace(extra_ops=(), dtype=mx.float32, **kw):
    prog, ctx, feeds, context, tensors, weights = make(extra_ops, dtype)
    return Trace(prog, ctx, feeds, context=context, tensors=tensors, **kw), weights


def test_stepping_equals_run_and_execute():
    t, _ = new_trace(capture="full")
    ref = execute(t.program, t.ctx, {"x": t.value("x")})["logits"]
    names = []
    while not t.done:
        names.append(t.step().name)
    assert names == t.ops == t.program.names
    stepped = t.logits
    t2, _ = new_trace(capture="stats")
    t2.run()
    assert np.array_equal(np.array(stepped), np.array(ref))
    assert np.array_equal(np.array(t2.logits), np.array(ref))


def test_stats_match_numpy_and_are_batched():
    t, _ = new_trace(capture="full")
    t.run()
    for name in t.ops:
        v = np.array(t.value(name), dtype=np.float64)
        s = t.stats(name)
        assert s["min"] == pytest.approx(v.min(), rel=1e-6, abs=1e-6)
        assert s["max"] == pytest.approx(v.max(), rel=1e-6, abs=1e-6)
        assert s["mean"] == pytest.approx(v.mean(), rel=1e-4, abs=1e-5)
        assert s["std"] == pytest.approx(v.std(), rel=1e-3, abs=1e-5)
        assert s["absmax"] == pytest.approx(np.abs(v).max(), rel=1e-6)
        assert s["zero_frac"] == pytest.approx((v == 0).mean())
        assert s["headroom"] == pytest.approx(np.abs(v).max() / float(np.finfo(np.float32).max), rel=1e-6)
        assert (s["nan"], s["posinf"], s["neginf"]) == (0, 0, 0)
    # relu zeroes about half its inputs: zero_frac is real, not a constant
    assert 0.1 < t.stats("layers.0.act")["zero_frac"] < 0.9


def test_nonfinite_counted_per_element_not_from_a_sum():
    # +Inf and -Inf in one tensor sum to NaN; a lone +Inf sums to +Inf: counts must still be exact
    def plant(v):
        flat = v.reshape(-1)
        idx = mx.arange(flat.size)
        flat = mx.where(idx == 1, mx.inf, flat)
        flat = mx.where(idx == 2, -mx.inf, flat)
        flat = mx.where((idx == 5) | (idx == 7), mx.nan, flat)
        return flat.reshape(v.shape)
    t, _ = new_trace(capture="stats", interventions=[patch("layers.0.proj", plant)])
    t.run()
    s = t.stats("layers.0.proj")
    assert (s["nan"], s["posinf"], s["neginf"]) == (2, 1, 1)
    assert math.isfinite(s["min"]) and math.isfinite(s["max"]) and math.isfinite(s["mean"])
    assert s["headroom"] == math.inf
    # downstream: row 0 of layers.0 holds NaN, so row 0 of the next matmul is all NaN
    assert t.stats("layers.1.proj")["nan"] == 16
    t1, _ = new_trace(capture="stats", interventions=[inject("layers.1.proj", float("inf"), index=(0, 3))])
    t1.run()
    s1 = t1.stats("layers.1.proj")
    assert (s1["nan"], s1["posinf"], s1["neginf"]) == (0, 1, 0)
    assert t1.stats("layers.0.proj")["posinf"] == 0


def test_stats_helpers_mask_fill_and_lone_values():
    x = mx.array([[1.0, -2.0, 0.0, -65504.0]], dtype=mx.float16)
    (s,) = S.evaluate([x])
    assert s["masked"] == 1 and s["min"] == -2.0 and s["absmax"] == 2.0
    assert s["headroom"] == pytest.approx(2.0 / 65504)
    y = mx.array([0.0, float("nan"), 3.0])
    (s,) = S.evaluate([y])
    assert s["nan"] == 1 and s["max"] == 3.0 and s["zero_frac"] == pytest.approx(1 / 3)
    assert S.nonfinite_counts(mx.array([mx.inf, -mx.inf, mx.nan, mx.nan])) == (2, 1, 1)


def test_run_until_breakpoints_and_back():
    t, _ = new_trace(capture="stats", breakpoints=["layers.1.*"])
    s = t.run()
    assert s.name == "layers.1.act" and t.position == t.program.index("layers.1.act") + 1
    s = t.run(until="layers.1")  # the name breakpoint layers.1.* also matches layers.1.proj
    assert s.name == "layers.1.proj"
    t.clear_breakpoints()
    assert t.run(until="layers.1").name == "layers.1"
    with pytest.raises(TraceError, match="already ran"):
        t.run(until="embed")
    t.run()
    ref = np.array(t.logits)
    # back over several ops (undo records), then forward again: same values
    for _ in range(3):
        t.back()
    assert t.position == len(t.ops) - 3 and not t.done
    with pytest.raises(KeyError, match="has not run yet"):
        t.value("logits")
    t.run()
    assert np.array_equal(np.array(t.logits), ref)
    # all the way back to the start, then step again
    while t.back() is not None:
        pass
    assert t.position == 0 and t.steps == []
    t.run()
    assert np.array_equal(np.array(t.logits), ref)


def test_predicate_breakpoint_rewinds_to_the_hit():
    t_full, _ = new_trace(capture="full")
    t_full.run()
    thr = 1.5
    first = next(n for n in t_full.ops if t_full.stats(n)["absmax"] > thr)
    t, _ = new_trace(capture="stats", breakpoints=[lambda st: st.stats["absmax"] > thr])
    s = t.run()
    assert s.name == first and t.position == t.program.index(first) + 1
    assert len(t.steps) == t.position
    # the live values after the rewind are the right ones: finishing gives the same logits
    t.clear_breakpoints()
    t.run()
    assert np.array_equal(np.array(t.logits), np.array(t_full.logits))


def test_nonfinite_breakpoint_and_injected_cause():
    t, _ = new_trace(capture="stats", breakpoints=[NONFINITE],
                     interventions=[inject("layers.0.proj", float("nan"), index=4)])
    s = t.run()
    assert s.name == "layers.0.proj" and s.nonfinite and s.stats["nan"] == 1
    f = t.first_nonfinite()
    assert f.op == "layers.0.proj" and f.cause == "injected"


def _with(op):
    return new_trace(extra_ops=[op], capture="stats")[0]


def test_cause_invalid_and_overflow_and_input_and_weight():
    # invalid: sqrt of a negative number from finite inputs, float32 does not help
    t = _with(Op("bad.sqrt", "sqrt", lambda c, h: mx.sqrt(h - 1e3), ("layers.1",), (), None))
    f = t.first_nonfinite()
    assert f.op == "bad.sqrt" and f.cause == "invalid" and f.nan > 0 and f.posinf == 0
    # overflow in float32 itself: exp of a large number
    t = _with(Op("bad.exp", "exp", lambda c, h: mx.exp(h * 1e3), ("layers.1",), (), None))
    f = t.first_nonfinite()
    assert f.op == "bad.exp" and f.cause == "overflow" and f.posinf > 0
    # overflow in float16 only: finite when recomputed in float32
    prog, ctx, feeds, context, tensors, _ = make([Op("big", "scale", lambda c, h: h * 3e4, ("layers.1",), (), None)],
                                                 dtype=mx.float16)
    t = Trace(prog, ctx, feeds, context=context, tensors=tensors)
    f = t.first_nonfinite()
    assert f.op == "big" and f.cause == "overflow" and f.float32_absmax > 65504
    # a non-finite program input
    prog, ctx, feeds, context, tensors, _ = make()
    x = np.array(feeds["x"])
    x[1, 2] = np.nan
    t = Trace(prog, ctx, {"x": mx.array(x)}, context=context, tensors=tensors)
    f = t.first_nonfinite()
    assert f.op == "embed" and f.cause == "nonfinite-input" and f.inputs[0]["nan"] == 1
    # a NaN weight
    prog, ctx, feeds, context, tensors, weights = make()
    w = np.array(weights["w1"])
    w[3, 4] = np.nan
    weights["w1"] = mx.array(w)
    ctx = context(mx.float32, None)
    t = Trace(prog, ctx, feeds, context=context, tensors=tensors)
    f = t.first_nonfinite()
    assert f.op == "layers.1.proj" and f.cause == "nonfinite-weight"
    assert f.weights[0]["name"] == "w1" and f.weights[0]["nan"] == 1


def test_clean_program_has_no_finding():
    t, _ = new_trace(capture=None)
    assert t.first_nonfinite() is None and t.done


def test_capture_patterns_none_and_spill(tmp_path):
    t, _ = new_trace(capture=["layers.*.proj"])
    t.run()
    assert t.value("layers.0.proj").shape == (3, 16)
    with pytest.raises(KeyError, match="not captured"):
        t.value("layers.0.act")
    assert t.stats("layers.0.act")["nan"] == 0  # stats of every op regardless
    with pytest.raises(TraceError, match="match no op"):
        new_trace(capture=["nothing.here"])

    t0, _ = new_trace(capture=None)
    s = t0.run()
    assert s.stats is None and t0.logits.shape == (3, 5)

    full, _ = new_trace(capture="full")
    full.run()
    spill = tmp_path / "spill"
    small, _ = new_trace(capture="full", memory_budget=600, spill_dir=str(spill))
    small.run()
    assert small.store.memory_bytes <= 600
    assert len(small.store.spilled) > 0
    files = list(spill.rglob("*.safetensors"))
    assert len(files) == len(small.store.spilled)
    for name in full.ops:
        assert np.array_equal(np.array(small.value(name)), np.array(full.value(name))), name
    d = small.store.directory
    assert d is not None and str(spill) in d
    small.store.close()
    assert not any(spill.rglob("*.safetensors"))


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_host_and_device_statistics_agree(dtype):
    rng = np.random.default_rng(3)
    base = rng.standard_normal((4, 300)).astype(np.float32) * 50
    base[0, :7] = 0
    with_bad = base.copy()
    with_bad[1, 3], with_bad[2, 5], with_bad[3, 7] = np.nan, np.inf, -np.inf
    masked = base.copy()
    masked[:, :10] = -float(S.dtype_max(dtype))
    vals = [mx.array(a).astype(dtype) for a in (base, with_bad, masked)] + [mx.array([1, 0, 3], dtype=mx.int32)]
    host = S.evaluate(vals, host=True)
    dev = S.evaluate(vals, host=False)
    for h, d in zip(host, dev):
        assert set(h) == set(d) == set(S.KEYS)
        for k in S.KEYS:
            if h[k] is None or (isinstance(h[k], float) and math.isnan(h[k])):
                assert d[k] is None or math.isnan(d[k]), k
            else:
                assert h[k] == pytest.approx(d[k], rel=1e-4, abs=1e-4), k
    assert (host[1]["nan"], host[1]["posinf"], host[1]["neginf"]) == (1, 1, 1)
    assert host[0]["zero_frac"] == pytest.approx(7 / 1200)
    assert host[2]["masked"] == 40 and host[2]["headroom"] < 0.5
    ref = np.array(vals[0].astype(mx.float32), dtype=np.float64)
    assert host[0]["max"] == pytest.approx(ref.max()) and host[0]["std"] == pytest.approx(ref.std(), rel=1e-4)


def test_first_nonfinite_after_an_uncaptured_run_checks_again():
    op = Op("bad.sqrt", "sqrt", lambda c, h: mx.sqrt(h - 1e3), ("layers.1",), (), None)
    t = new_trace(extra_ops=[op], capture=None)[0]
    t.run()
    assert t.done and t.steps[-1].stats is None
    f = t.first_nonfinite()
    assert f is not None and f.op == "bad.sqrt" and f.cause == "invalid"


def test_many_small_evaluation_batches_give_the_same_trace():
    # flush_bytes=1: every op is its own batch (stats still complete, breakpoints still exact)
    one, _ = new_trace(capture="full")
    one.run()
    t, _ = new_trace(capture="stats", flush_bytes=1, breakpoints=[lambda s: s.stats["absmax"] > 1.5])
    hit = t.run()
    first = next(n for n in one.ops if one.stats(n)["absmax"] > 1.5)
    assert hit.name == first
    t.clear_breakpoints()
    t.run()
    assert np.array_equal(np.array(t.logits), np.array(one.logits))
    for n in one.ops:
        assert t.stats(n) == one.stats(n)


def test_statistics_of_strided_and_broadcast_outputs():
    x = mx.arange(24, dtype=mx.float32).reshape(2, 3, 4) - 5
    cases = [x.transpose(0, 2, 1), mx.broadcast_to(mx.array([1.0, 0.0, -3.0]), (4, 3)), x[:, 1:, ::2],
             x.astype(mx.bfloat16).transpose(2, 1, 0)]
    for c in cases:
        ref = np.array(c.astype(mx.float32), dtype=np.float64)
        for st in (S.evaluate([c], host=True)[0], S.evaluate([c], host=False)[0]):
            assert (st["min"], st["max"]) == (ref.min(), ref.max())
            assert st["mean"] == pytest.approx(ref.mean()) and st["std"] == pytest.approx(ref.std())
            assert st["zero_frac"] == pytest.approx((ref == 0).mean())


def test_a_failing_op_is_named():
    bad = Op("layers.1.bad", "linear", lambda c, h: h @ mx.zeros((7, 3)), ("layers.1",), ("w_bad",), 1)
    t = _with(bad)
    with pytest.raises(TraceError, match=r"op 'layers.1.bad' \(linear, op 7\) failed on layers.1 \[3, 16\] float32 "
                                         r"reading w_bad"):
        t.run()


def test_default_capture_budget_follows_the_device(monkeypatch):
    from workbench.trace import store as store_mod

    monkeypatch.delenv("WORKBENCH_CAPTURE_BUDGET", raising=False)
    monkeypatch.setattr(store_mod, "device_memory", ask_device_memory)  # uncached here
    monkeypatch.setattr(store_mod.mx, "device_info", lambda: {"memory_size": 141 * 2**30})
    assert store_mod.ValueStore().budget == 141 * 2**30 // 4  # a GPU: a quarter of its memory
    monkeypatch.setattr(store_mod.mx, "device_info", lambda: {"total_memory": 80 * 2**30, "free_memory": 1})
    assert store_mod.ValueStore().budget == 20 * 2**30  # MLX's CUDA backend names it total_memory
    monkeypatch.setattr(store_mod.mx, "device_info", lambda: {"memory_size": 4 * 2**30})
    assert store_mod.ValueStore().budget == store_mod.DEFAULT_BUDGET  # never below the fixed default
    monkeypatch.setattr(store_mod.mx, "device_info", lambda: {"architecture": "x86_64"})
    assert store_mod.ValueStore().budget == store_mod.DEFAULT_BUDGET  # the CPU reports no size
    monkeypatch.setenv("WORKBENCH_CAPTURE_BUDGET", "3GiB")
    assert store_mod.ValueStore().budget == 3 * 2**30
    assert store_mod.ValueStore(12345).budget == 12345  # an explicit budget wins
    monkeypatch.setenv("WORKBENCH_CAPTURE_BUDGET", "lots")
    with pytest.raises(ValueError, match="WORKBENCH_CAPTURE_BUDGET"):
        store_mod.ValueStore()


def test_step_records_are_made_when_read(monkeypatch):
    """run() records shapes and dtypes; a Step is made when something reads it, with the
    statistics of its batch whenever they arrive, and equals the one stepping makes."""
    import workbench.trace.tracer as tracer_mod

    made = []

    class Counting(tracer_mod.Step):
        __slots__ = ()

        def __init__(self, *a, **k):
            made.append(a[0])
            super().__init__(*a, **k)

    monkeypatch.setattr(tracer_mod, "Step", Counting)
    t, _ = new_trace(capture="stats")
    last = t.run(wait=False)  # the statistics may still be computing
    assert made == ["logits"] and last.name == "logits" and last.index == len(t) - 1
    st = t.stats("layers.0.proj")
    assert made == ["logits", "layers.0.proj"] and st["nan"] == 0
    steps = t.steps
    assert sorted(made) == sorted(t.ops) and steps[-1] is last and last.stats is not None
    ref, _ = new_trace(capture="stats")
    stepped = [ref.step() for _ in range(len(ref))]
    assert steps == stepped  # names, kinds, layers, input and output shapes, dtypes, stats
    assert steps[3].input_shapes == ((3, 16), (3, 16)) and steps[0].input_shapes == ((3, 8),)
    # going back forgets the records past the point, and running again makes them anew
    t.back()
    t.back()
    assert len(t.steps) == len(t) - 2 and t.position == len(t) - 2
    assert t.run().name == "logits" and t.steps == stepped


def test_back_after_run_past_the_undo_depth():
    # run() keeps the values each op freed for its last _UNDO_DEPTH ops only (the hot loop
    # skips the rest); going back further replays from the feeds: every position gives the
    # live values it had on the way forward, whichever path restored it
    from workbench.trace import tracer

    n = tracer._UNDO_DEPTH + 9
    ops = [Op("op0", "scale", lambda c, x: x * 1.5, ("x",), (), None)]
    for i in range(1, n):  # each op reads the two before it: values freed two ops later
        ins = (f"op{i - 1}",) if i == 1 else (f"op{i - 1}", f"op{i - 2}")
        ops.append(Op(f"op{i}", "mix", (lambda k: lambda c, a, b=None: a * 0.5 + (0 if b is None else b) + k)(i),
                      ins, (), None))
    prog = Program(ops, inputs=("x",))
    feeds = {"x": mx.array(np.arange(6, dtype=np.float32))}
    ref = {k: np.array(v) for k, v in execute(prog, Ctx(mx.float32, {}), feeds, keep=lambda _: True).items()}
    t = Trace(prog, Ctx(mx.float32, {}), feeds, capture=None,
              context=lambda d, c: Ctx(d, {}))
    t.run()
    assert sorted(t._undo) == list(range(n - tracer._UNDO_DEPTH, n))  # the last ops' only
    while t.position > 1:
        t.back()
        p = t.position
        assert np.array_equal(np.array(t.value(f"op{p - 1}")), ref[f"op{p - 1}"]), p
        if p >= 2:  # the value op p still needs, freed on the way forward only after it
            assert np.array_equal(np.array(t.value(f"op{p - 2}")), ref[f"op{p - 2}"]), p
    t.run()
    assert np.array_equal(np.array(t.value(f"op{n - 1}")), ref[f"op{n - 1}"])
