"""The Trace on real model programs (zoo checkpoints written on the fly)."""
import numpy as np
import pytest

import workbench
import mlx.core as mx

from workbench import zoo
from workbench.program import execute
from workbench.trace import TraceError, inject, patch, replace, zero_head, Run

IDS = [2, 15, 16, 17, 18, 19, 20, 21, 22, 23]


@pytest.fixture(scope="module")
def g4(tmp_path_factory):
    return workbench.load(zoo.build("gemma4_text", tmp_path_factory.mktemp("g4"), dtype="float32"))


@pytest.fixture(scope="module")
def g4_bf16(tmp_path_factory):
    return workbench.load(zoo.build("gemma4_text", tmp_path_factory.mktemp("g4b"), seed=1))


def ref_logits(model, ids, dtype=None):
    return execute(model.program, model.context(dtype), model.feeds(mx.array([ids])))["logits"][0]


def test_workbench_trace_is_callable_and_shapes(g4):
    t = workbench.trace(g4, IDS)
    assert t.ops == g4.program.names and t.ops[-1] == "logits" and not t.done
    s = t.step()
    assert (s.name, s.index, s.kind) == ("embed_tokens", 0, "embedding")
    assert s.input_shapes == ((1, len(IDS)),) and s.output_shape == (1, len(IDS), 64)
    assert set(workbench.trace.STATS_KEYS) <= set(s.stats)
    t.run()
    assert t.done and t.logits.shape == (1, len(IDS), 256)  # the batch axis kept, as value() keeps it


def test_step_by_step_equals_run_and_reference(g4):
    ref = np.array(ref_logits(g4, IDS))
    t = workbench.trace(g4, IDS, capture="stats")
    n = 0
    while not t.done:
        t.step()
        n += 1
    assert n == len(g4.program)
    stepped = np.array(t.logits)
    r = workbench.trace(g4, IDS, capture="full")
    r.run()
    assert np.array_equal(stepped, np.array(r.logits)) and np.array_equal(stepped, np.array(r.value("logits")))
    assert np.array_equal(stepped[0], ref)


def test_full_capture_values_and_stats_agree(g4):
    t = workbench.trace(g4, IDS, capture="full", run=Run(attention="explicit"))
    t.run()
    for name in ["embed_tokens", "layers.1.self_attn.q_rope", "layers.2.mlp.down_proj", "layers.3", "logits"]:
        v = np.array(t.value(name), dtype=np.float64)
        s = t.stats(name)
        assert s["absmax"] == pytest.approx(np.abs(v).max(), rel=1e-6)
        assert s["mean"] == pytest.approx(v.mean(), rel=1e-3, abs=1e-6)
        assert s["std"] == pytest.approx(v.std(), rel=1e-3)
    # attention scores: masked positions hold the dtype's lowest value and are counted apart
    s = t.stats("layers.0.self_attn.scores")
    T = len(IDS)
    assert s["masked"] == 2 * T * (T - 1) // 2  # 2 heads, causal
    assert s["headroom"] < 1e-30 and s["min"] > -1e6


def test_run_until_and_back_and_breakpoints(g4):
    t = workbench.trace(g4, IDS, capture="full", breakpoints=["layers.2.mlp.*"])
    s = t.run()
    assert s.name == "layers.2.mlp.gate_proj"
    s = t.run(until="layers.3.input_layernorm")
    assert s.name == "layers.2.mlp.up_proj"  # next match of the name breakpoint comes first
    t.clear_breakpoints()
    s = t.run(until="layers.3.input_layernorm")
    assert s.name == "layers.3.input_layernorm" and t.position == g4.program.index(s.name) + 1
    v = np.array(t.value("layers.3.input_layernorm"))
    prev = t.back()
    assert prev.name == g4.program.names[t.position - 1] and t.position == g4.program.index("layers.3.input_layernorm")
    again = t.step()
    assert again.name == "layers.3.input_layernorm"
    assert np.array_equal(np.array(t.value("layers.3.input_layernorm")), v)
    t.run()
    assert np.array_equal(np.array(t.logits[0]), np.array(ref_logits(g4, IDS)))


def test_predicate_breakpoint_stops_at_first_match(g4):
    full = workbench.trace(g4, IDS, capture="stats")
    full.run()
    thr = 5.0
    first = next(s.name for s in full.steps if s.stats["absmax"] > thr)
    t = workbench.trace(g4, IDS, breakpoints=[lambda st: st.stats["absmax"] > thr])
    s = t.run()
    assert s.name == first and t.steps[-1].name == first
    t.clear_breakpoints()
    t.run()
    assert np.array_equal(np.array(t.logits), np.array(full.logits))


def test_interventions(g4):
    base = workbench.trace(g4, IDS, capture="full")
    base.run()
    name = "layers.1.self_attn.context"
    t = workbench.trace(g4, IDS, capture="full", interventions=[zero_head(name, head=0)])
    t.run()
    v, b = np.array(t.value(name)), np.array(base.value(name))
    D = v.shape[-1] // 2
    assert np.all(v[..., :D] == 0) and np.abs(b[..., :D]).max() > 0
    assert np.array_equal(v[..., D:], b[..., D:])
    assert t.step_info(name).intervened
    assert not np.allclose(np.array(t.logits), np.array(base.logits))
    # zero a head in a heads-first tensor
    t = workbench.trace(g4, IDS, capture="full", interventions=[zero_head("layers.0.self_attn.softmax", head=1)],
                        run=Run(attention="explicit"))
    t.run()
    p = np.array(t.value("layers.0.self_attn.softmax"))
    assert np.all(p[:, 1] == 0) and np.allclose(p[:, 0].sum(-1), 1, atol=1e-5)
    # replace an op's output (by pattern) and patch with a function
    t = workbench.trace(g4, IDS, capture="full", interventions={"layers.2.mlp.down_proj": lambda x: x * 0})
    t.run()
    assert np.abs(np.array(t.value("layers.2.mlp.down_proj"))).max() == 0
    t = workbench.trace(g4, IDS, capture="full", interventions=[replace("layers.0", mx.zeros((64,)))])
    t.run()
    assert np.abs(np.array(t.value("layers.0"))).max() == 0
    # inject NaN: the hunt stops there and names the intervention
    t = workbench.trace(g4, IDS, interventions=[inject("layers.2.mlp.up_proj", float("nan"), index=(0, 3, 5))])
    f = t.first_nonfinite()
    assert f.op == "layers.2.mlp.up_proj" and f.cause == "injected" and f.nan == 1
    with pytest.raises(TraceError, match="matches no op"):
        workbench.trace(g4, IDS, interventions=[patch("no.such.op", lambda x: x)])


def test_batches_are_left_padded_and_masked(g4):
    a, b = IDS, IDS[:6]
    t = workbench.trace(g4, [a, b], capture="stats")
    t.run()
    L = np.array(t.logits)
    assert L.shape == (2, len(a), 256)
    np.testing.assert_allclose(L[0], np.array(ref_logits(g4, a)), atol=1e-4)
    # the shorter prompt is left padded: its real positions are the last 6
    np.testing.assert_allclose(L[1, -6:], np.array(ref_logits(g4, b)), atol=1e-4)
    assert t.attention_mask is not None and not bool(t.attention_mask[1, 0])
    # text batches go through the tokenizer
    tt = workbench.trace(g4, ["the cat sat", "hello"])
    tt.run()
    assert tt.logits.shape[0] == 2


def test_generation_with_cache_matches_full_reforwards(g4):
    g = workbench.generate(g4, IDS[:5], max_tokens=5, capture="stats")
    assert len(g.tokens) == 5 and len(g.traces) == 5
    seq = list(IDS[:5])
    for k in range(5):
        nxt = int(mx.argmax(ref_logits(g4, seq)[-1]).item())
        assert g.tokens[k] == nxt, k
        seq.append(nxt)
    # the per-token forwards ran on one token each, through the cache
    assert g.traces[0].logits.shape == (1, 5, 256) and g.traces[1].logits.shape == (1, 1, 256)
    st = g.stats("logits")
    assert len(st) == 5 and all(s["nan"] == 0 for s in st)
    assert g.first_nonfinite() is None
    # back() in a forward that reads the cache replays it: same logits again
    t = g.traces[-1]
    ref = np.array(t.logits)
    t.back()
    t.back()
    t.run()
    np.testing.assert_array_equal(np.array(t.logits), ref)
    # a batch generates per sequence
    gb = workbench.generate(g4, [IDS[:5], IDS[:3]], max_tokens=3)
    assert len(gb.tokens) == 2 and gb.tokens[0] == g.tokens[:3]


def test_dtype_control(g4_bf16):
    m = g4_bf16
    assert m.dtype == mx.bfloat16
    t16 = workbench.trace(m, IDS, dtype="float16")
    t16.run()
    t32 = workbench.trace(m, IDS, dtype="float32")
    t32.run()
    assert t16.steps[5].dtype == "float16" and t32.steps[5].dtype == "float32"
    assert t16.logits.dtype == mx.float16
    hr16 = t16.stats("layers.0.mlp.up_proj")["headroom"]
    hr32 = t32.stats("layers.0.mlp.up_proj")["headroom"]
    assert hr16 > 1e30 * hr32  # the same absmax against 65504 vs 3.4e38
    np.testing.assert_allclose(np.array(t16.logits.astype(mx.float32)), np.array(t32.logits), atol=2e-2)
    with pytest.raises(ValueError, match="unknown dtype"):
        workbench.trace(m, IDS, dtype="int8")


def test_bad_inputs_are_clear(g4):
    with pytest.raises(ValueError, match="out of range"):
        workbench.trace(g4, [1, 5000])
    with pytest.raises(ValueError):
        workbench.trace(g4, [])
    t = workbench.trace(g4, IDS)
    with pytest.raises(KeyError, match="no op named"):
        t.stats("layers.99.nothing")
    with pytest.raises(TraceError, match="has not reached"):
        t.logits


def test_per_token_view(g4):
    t = workbench.trace(g4, IDS, capture="stats", run=Run(attention=[0]),
                        interventions=[inject("layers.1.mlp.up_proj", float("inf"), index=(0, 4, 2))])
    t.run()
    pt = t.per_token("layers.1.mlp.up_proj")  # not captured: recomputed, with the intervention
    assert pt["nonfinite"].shape == (1, len(IDS)) and pt["nonfinite"].tolist()[0] == [0, 0, 0, 0, 1] + [0] * 5
    sc = t.per_token("layers.0.self_attn.scores")  # heads-first: token axis 2
    assert sc["absmax"].shape == (1, len(IDS)) and np.all(sc["nonfinite"] == 0)
    full = workbench.trace(g4, IDS, capture="full")
    full.run()
    v = np.abs(np.array(full.value("layers.2")))[0].max(-1)
    np.testing.assert_allclose(full.per_token("layers.2")["absmax"][0], v, rtol=1e-6)


def test_layer_queueing_gives_the_same_trace(g4, monkeypatch):
    # on a GPU, run() without capture queues the graph (mx.async_eval) at layer ends, every
    # QUEUE_BYTES of outputs; forced on here (MLX's CPU stream runs async_eval too), for every
    # capture, a name breakpoint and run(until=): the same trace as the batched run, queued
    # at each layer end with no threshold and at some of them with one
    import math

    from workbench.trace import tracer as tracer_mod
    from workbench.trace.tracer import Trace

    def traced(cap, **kw):
        t = workbench.trace(g4, IDS, capture=cap, **kw)
        stop = t.run()
        return t, stop

    want = {cap: traced(cap) for cap in (None, "stats", "full")}
    flushes = []
    real = Trace._flush

    def counting(self, *a, **kw):
        flushes.append(kw.get("block", True))
        return real(self, *a, **kw)

    monkeypatch.setattr(Trace, "_queue_layers", lambda self: True)
    monkeypatch.setattr(Trace, "_flush", counting)
    monkeypatch.setattr(tracer_mod, "QUEUE_BYTES", 0)
    layers = len(g4.program.layer_ends())
    assert layers >= 4
    # a threshold of about two layers' outputs: queued at every second layer end or so
    layer_bytes = sum(math.prod(s.output_shape) * 4 for s in want[None][0].steps) / (layers + 1)
    for cap, (w, _) in want.items():
        for qb, lo, hi in ((0, layers, layers), (2 * layer_bytes, 1, layers - 1)):
            monkeypatch.setattr(tracer_mod, "QUEUE_BYTES", qb)
            flushes.clear()
            g, _ = traced(cap)
            assert np.array_equal(np.array(g.logits), np.array(w.logits))
            assert lo <= flushes.count(False) <= hi, (qb, flushes.count(False))  # queued at layer ends
        for a, b in zip(w.steps, g.steps):
            assert (a.name, a.output_shape) == (b.name, b.output_shape)
            assert a.stats == b.stats
        if cap == "full":
            for n in ("layers.1.mlp.down_proj", "layers.3"):
                assert np.array_equal(np.array(g.value(n)), np.array(w.value(n)))
    t, stop = traced("stats", breakpoints=["layers.2.mlp.up_proj"])
    assert stop.name == "layers.2.mlp.up_proj" and t.position == g4.program.index(stop.name) + 1
    assert all(s.stats is not None for s in t.steps)
    s = t.run(until="layers.3.input_layernorm")
    assert s.name == "layers.3.input_layernorm"
    t.clear_breakpoints()
    t.run()
    assert np.array_equal(np.array(t.logits), np.array(want["stats"][0].logits))


def test_run_queued_without_blocking_gives_the_same_trace(g4):
    want = workbench.trace(g4, IDS, capture="stats")
    want.run()
    t = workbench.trace(g4, IDS, capture="stats")
    with pytest.raises(TraceError, match="block=False"):
        t.run(block=False)  # waiting for the statistics would block
    assert t.position == 0
    t.run(wait=False, block=False)
    assert t.done
    assert np.array_equal(np.array(t.logits), np.array(want.logits))
    assert [s.stats for s in t.steps] == [s.stats for s in want.steps]
