"""Fused attention (the default) and explicit attention (scores -> softmax -> context, on
request): the same values in every family, the per-layer choice, per-head statistics,
the probabilities recomputed for a fused layer, the memory check, the hunt, and the
memory an 8k-token trace takes (docs/ops.md, Attention; docs/trace.md)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import workbench
import mlx.core as mx

import models_tiny as mt
from workbench import attention as attn_math
from workbench import zoo
from workbench.program import execute
from workbench.trace import head_stats, attention_probabilities, inject, patch, Run
from workbench.trace.entry import check_attention_memory
from workbench.device_memory import ask_device_memory
from workbench.trace.step import TraceError

IDS = mx.array([[2, 17, 99, 4, 250, 31, 8, 8, 120, 64, 3, 77, 200, 5, 9, 11, 42, 1, 6, 13, 7, 90, 45, 33]])
#: every family; gemma4_kv: KV-shared layers, gemma4_k_eq_v: GQA with its own full-layer heads;
#: gemma4_text / gemma3_text: sliding windows of 16 tokens (the prompts here pass them)
ARCHS = ["gemma4_text", "gemma4_kv", "gemma3_text", "qwen3", "llama"]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused")
    made = {}

    def get(arch, **kw):
        key = (arch, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = zoo.build(arch, root / f"{arch}{len(made)}", dtype="float32", **kw)
        return made[key]
    return get


def _kinds(program, layer):
    prefix = f"layers.{layer}.self_attn."
    return {op.name.rsplit(".", 1)[1]: op.kind for op in program.ops if op.name.startswith(prefix)}


def _contexts(model, program, ids, mask=None, cache=None):
    ctx = model.context("float32", cache)
    names = [f"layers.{i}.self_attn.context" for i in range(model.num_layers)]
    vals = execute(program, ctx, model.feeds(ids, mask, cache), keep=set(names).__contains__)
    return [vals[n] for n in names], vals["logits"]


def test_default_is_fused_and_explicit_is_asked_for(ckpts):
    model = workbench.load(ckpts("llama"))
    k = _kinds(model.program, 0)
    assert k["context"] == "attention" and "scores" not in k and "softmax" not in k
    op = model.program["layers.0.self_attn.context"]
    assert op.attrs["fused"] is True and op.attrs["mask"] == "attn_mask"
    assert op.attrs["num_heads"] == model.config["num_attention_heads"]
    assert op.attrs["num_kv_heads"] == model.config["num_key_value_heads"]
    assert op.attrs["scale"] == pytest.approx(model.family_config.head_dim ** -0.5)
    assert op.inputs == ("layers.0.self_attn.q_rope", "layers.0.self_attn.k_cache", "layers.0.self_attn.v_cache",
                         "key_valid")

    explicit = workbench.load(ckpts("llama"), attention="explicit").program
    for i in range(model.num_layers):
        assert _kinds(explicit, i)["scores"] == "scores" and _kinds(explicit, i)["context"] == "attend"
    # per layer: only those layers explicit; the same program object for the same choice
    one = model.program_for(["layers.1"])
    assert "layers.1.self_attn.softmax" in one and "layers.0.self_attn.softmax" not in one
    assert model.program_for(1) is one and model.program_for("fused") is not one
    assert model.program_for(None) is model.program
    # o_proj reads the context op by the same name either way
    assert explicit["layers.0.self_attn.o_proj"].inputs == model.program["layers.0.self_attn.o_proj"].inputs


@pytest.mark.parametrize("bad,match", [("softmax", "not 'fused', 'explicit' or a layer name"),
                                       (9, "layer 9 out of range"), ("layers.x", "not 'fused'"),
                                       ([True], "is not a layer"), (2.5, "attention must be")])
def test_bad_attention_choice_is_named(ckpts, bad, match):
    model = workbench.load(ckpts("llama"))
    with pytest.raises(ValueError, match=match):
        model.trace(IDS, run=Run(attention=bad))
    with pytest.raises(ValueError, match=match):
        workbench.load(ckpts("llama"), attention=bad)


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_equals_explicit_and_mlx_lm(ckpts, arch):
    path = ckpts(arch)
    model = workbench.load(path)
    fused, logits_f = _contexts(model, model.program, IDS)
    explicit, logits_e = _contexts(model, model.program_for("explicit"), IDS)
    for a, b in zip(fused, explicit):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(logits_f), np.array(logits_e), rtol=1e-5, atol=1e-5)
    # the same kernel call as mlx-lm's: on this CPU the logits are equal bit for bit
    assert mx.array_equal(model(IDS, dtype="float32"), mt.ref_logits(path, IDS)).item()


@pytest.mark.parametrize("arch", ["gemma3_text", "qwen3"])
def test_padding_batch_and_kv_cache(ckpts, arch):
    model = workbench.load(ckpts(arch))
    ids = mx.array([[0, 0, 0, 5, 9, 17, 3, 88, 21, 4], [7, 14, 2, 90, 33, 61, 5, 8, 12, 40]])
    mask = mx.array([[0, 0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 10]).astype(mx.bool_)
    f, lf = _contexts(model, model.program, ids, mask)
    e, le = _contexts(model, model.program_for("explicit"), ids, mask)
    np.testing.assert_allclose(np.array(lf), np.array(le), rtol=1e-5, atol=1e-5)
    # decoding through the KV cache: one token after the prompt, both ways
    outs = []
    for program in (model.program, model.program_for("explicit")):
        cache = model.make_cache()
        _contexts(model, program, ids, mask, cache)
        outs.append(_contexts(model, program, mx.array([[11], [12]]), None, cache))
    for a, b in zip(outs[0][0], outs[1][0]):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(outs[0][1]), np.array(outs[1][1]), rtol=1e-5, atol=1e-5)
    g = workbench.trace.generate(workbench.load(ckpts(arch)), IDS, max_tokens=4)
    g2 = workbench.trace.generate(workbench.load(ckpts(arch), attention="explicit"), IDS, max_tokens=4)
    assert g.tokens == g2.tokens


@pytest.mark.parametrize("arch", ["gemma3_text", "gemma4_text", "llama"])
def test_long_prompts_run_in_chunks_with_the_same_values(ckpts, arch, monkeypatch):
    """Query chunks over the keys each chunk may see (causal, sliding window): tiny chunks
    here (48 -> 3-4 rows per chunk) so every window and the cache are crossed."""
    model = workbench.load(ckpts(arch))
    ids = mx.array([[(7 * i) % 250 + 3 for i in range(48)]])
    ref_ctx, ref_logits = _contexts(model, model.program_for("explicit"), ids)
    monkeypatch.setitem(attn_math.CHUNK_BYTES, "cpu", 3 * 2 * 48 * 4)  # ~3 rows of 2 heads
    _contexts(model, model.program, ids)  # (MLX is asked once per shape whether it fuses the call)
    calls, kernel = [], mx.fast.scaled_dot_product_attention
    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", lambda q, *a, **k: calls.append(q.shape[2]) or
                        kernel(q, *a, **k))
    got_ctx, got_logits = _contexts(model, model.program, ids)
    assert max(calls) < 48 and sum(calls) == 48 * model.num_layers  # chunks that cover every query, once
    # the same terms, summed over fewer (masked) keys: float32 rounding, amplified layer by layer
    np.testing.assert_allclose(np.array(got_ctx[0]), np.array(ref_ctx[0]), rtol=1e-5, atol=1e-5)
    for a, b in zip(got_ctx, ref_ctx):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-4, atol=2e-4)
    np.testing.assert_allclose(np.array(got_logits), np.array(ref_logits), rtol=1e-4, atol=2e-4)
    cache = model.make_cache()
    _contexts(model, model.program, ids[:, :30], None, cache)
    tail, _ = _contexts(model, model.program, ids[:, 30:], None, cache)  # 18 queries over 48 keys
    for a, b in zip(tail, ref_ctx):
        np.testing.assert_allclose(np.array(a), np.array(b)[:, 30:], rtol=1e-4, atol=2e-4)


def test_trace_choice_shows_the_steps(ckpts):
    model = workbench.load(ckpts("gemma3_text"))
    t = model.trace(IDS, capture="full")
    t.run()
    assert not any(n.endswith((".scores", ".softmax")) for n in t.ops)
    e = model.trace(IDS, capture="full", run=Run(attention=["layers.2", 4]))
    e.run()
    assert [n for n in e.ops if n.endswith(".softmax")] == ["layers.2.self_attn.softmax", "layers.4.self_attn.softmax"]
    p = np.array(e.value("layers.2.self_attn.softmax"))
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.array(t.logits), np.array(e.logits), rtol=1e-5, atol=1e-5)
    # a fused layer's probabilities, recomputed, are the explicit softmax step's values
    name, q = attention_probabilities(t, 2)
    assert name == "layers.2.self_attn.context"
    np.testing.assert_allclose(np.array(q), p, atol=1e-6)
    assert attention_probabilities(e, 2)[0] == "layers.2.self_attn.softmax"
    with pytest.raises(TraceError, match="has not run yet"):
        attention_probabilities(model.trace(IDS), 1)


def test_debugger_draws_a_fused_layers_recomputed_pattern(ckpts):
    from workbench.widgets import StepDebugger

    model = workbench.load(ckpts("qwen3"))
    d = StepDebugger(model.trace(IDS, capture="stats"))
    d.run_to("layers.1.self_attn.v_cache")
    assert "appears once op #" in d.attention_note.value and "layers.1.self_attn.context" in d.attention_note.value
    d.step()
    assert d.current_step.name == "layers.1.self_attn.context"
    assert d.attention.layout.display is None and "probabilities recomputed" in d.attention.title
    e = model.trace(IDS, capture="full", run=Run(attention=[1]))
    e.run()
    want = np.array(e.value("layers.1.self_attn.softmax"))[0]
    assert d.attention.num_heads == want.shape[0]
    np.testing.assert_allclose(d.attention.values, want[d.attention.head], atol=1e-6)


def test_head_stats(ckpts):
    model = workbench.load(ckpts("gemma4_text"))
    t = model.trace(IDS, capture="stats")  # nothing kept: recomputed from the op's inputs
    t.run()
    e = model.trace(IDS, capture="full", run=Run(attention="explicit"))
    e.run()
    name = "layers.3.self_attn.context"
    s, se = head_stats(t, name), head_stats(e, name)
    H, D = model.program[name].attrs["num_heads"], model.program[name].attrs["head_dim"]
    v = np.array(e.value(name)).reshape(-1, H, D).transpose(1, 0, 2).reshape(H, -1)
    assert s["heads"] == H and s["op"] == name
    np.testing.assert_allclose(s["absmax"], np.abs(v).max(1), rtol=1e-5)
    np.testing.assert_allclose(s["mean"], v.mean(1), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(s["std"], v.std(1), rtol=1e-4)
    assert (s["nonfinite"] == 0).all()
    for k in ("absmax", "mean", "std"):
        np.testing.assert_allclose(s[k], se[k], rtol=1e-5, atol=1e-7)
    # a NaN planted in head 1's slice is counted there only
    bad = model.trace(IDS, capture="stats", interventions=[inject(name, index=(0, 3, D + 2))])
    bad.run()
    n = head_stats(bad, name)["nonfinite"]
    assert n[1] == 1 and n.sum() == 1
    with pytest.raises(TraceError, match="not an attention output"):
        head_stats(t, "layers.3.self_attn.q_proj")


def test_memory_check_refuses_explicit_scores_only(ckpts):
    model = workbench.load(ckpts("gemma4_text"))
    check_attention_memory(model.program, 1, 32768, 32768, mx.bfloat16, available=2**30)  # fused: no scores
    with pytest.raises(TraceError, match="attention='fused'"):
        check_attention_memory(model.program_for("explicit"), 1, 32768, 32768, mx.bfloat16, available=2**30)
    with pytest.raises(TraceError, match="attention='fused'"):
        check_attention_memory(model.program_for([0]), 1, 32768, 32768, mx.bfloat16, available=2**30)


def test_hunt_names_the_fused_op_and_looks_inside(ckpts):
    """Large (finite) queries and keys in float16: the scores overflow.  Explicit: the scores
    step is the first non-finite op; fused: the attention op is, and the hunt recomputes the
    layer explicitly to say the scores went first."""
    model = workbench.load(ckpts("llama"))
    blow = [patch("layers.1.self_attn.q_rope", lambda v: v * 0 + 100, label="big queries"),
            patch("layers.1.self_attn.k_rope", lambda v: v * 0 + 300, label="big keys")]
    e = workbench.trace.hunt(model, IDS, dtype="float16", interventions=blow, run=Run(attention="explicit"))
    assert e.finding.op == "layers.1.self_attn.scores" and e.finding.inside is None
    f = workbench.trace.hunt(model, IDS, dtype="float16", interventions=blow)
    assert f.finding.op == "layers.1.self_attn.context" and f.finding.kind == "attention"
    inside = f.finding.inside
    assert set(inside) == {"layers.1.self_attn.scores", "layers.1.self_attn.softmax"}
    assert sum(inside["layers.1.self_attn.scores"].values()) > 0
    assert "first non-finite inside: layers.1.self_attn.scores" in f.finding.detail
    assert json.dumps(f.report)  # the report stays JSON


MEMORY_SCRIPT = r"""
import json, resource, sys
import workbench, mlx.core as mx
from workbench import zoo
T = 8192
path = zoo.build("gemma4_text", sys.argv[1], hidden_size=256, num_hidden_layers=3, num_attention_heads=8,
                 global_head_dim=32,
                 num_key_value_heads=1, num_kv_shared_layers=0, hidden_size_per_layer_input=0, dtype="bfloat16",
                 layer_types=["sliding_attention", "sliding_attention", "full_attention"])
model = workbench.load(path)
ids = mx.array([[(7 * i) % 250 + 3 for i in range(T)]])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t = model.trace(ids, capture="stats")
t.run()
mx.eval(t.logits)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
heads = model.family_config.num_attention_heads
print(json.dumps({"grew": after - before, "scores": heads * T * T * 4, "steps": len(t.steps),
                  "logits": list(t.logits.shape)}))
"""


def test_8k_prompt_grows_memory_far_less_than_one_layers_scores(tmp_path):
    """In a fresh process: a 3-layer, d=256 gemma4_text traced with statistics on 8192 tokens
    grows the peak RSS by less than a quarter of one layer's [heads, T, T] float32 scores
    (8 heads: 2 GiB; explicit attention would hold them, in bfloat16, and their softmax)."""
    r = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(tmp_path / "g4")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["logits"][-2:] == [8192, 256]
    assert out["grew"] < out["scores"] / 4, out


def test_hunt_cli_attention_option(ckpts, capsys):
    from workbench.cli import main

    path = str(ckpts("llama"))
    rc = main(["hunt", path, "--ids", "2,17,99,4", "--attention", "explicit", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ops_checked"] == len(workbench.load(path, attention="explicit").program)
    rc = main(["hunt", path, "--ids", "2,17,99,4", "--attention", "0", "--json"])
    one = json.loads(capsys.readouterr().out)["ops_checked"]
    assert rc == 0 and one == len(workbench.load(path).program) + 2  # layer 0: scores and softmax
    rc = main(["hunt", path, "--ids", "2,17,99,4", "--attention", "softmax"])
    err = capsys.readouterr().err
    assert rc == 2 and "'softmax'" in err and len(err.strip().splitlines()) == 1
    rc = main(["hunt", path, "--ids", "2,17,99,4", "--attention", "layers.0", "--json"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["ops_checked"] == one  # the same option as distributed's
    rc = main(["hunt", path, "--ids", "2,17,99,4", "--attention", " , "])
    err = capsys.readouterr().err
    assert rc == 2 and "--attention is empty" in err and len(err.strip().splitlines()) == 1


def test_a_call_mlx_fuses_never_runs_in_chunks(ckpts, monkeypatch):
    """Chunks change the values' last bits (fewer keys a sum) and mlx-lm never chunks: where
    MLX runs the call in one kernel, a prompt past the chunk size still runs in one call,
    and its logits equal the unchunked run's bit for bit."""
    model = workbench.load(ckpts("gemma4_text"))
    ids = mx.array([[(7 * i) % 250 + 3 for i in range(48)]])
    _, want = _contexts(model, model.program, ids)
    monkeypatch.setitem(attn_math.CHUNK_BYTES, "cpu", 3 * 2 * 48 * 4)
    monkeypatch.setattr(attn_math, "fused_kernel", lambda q, k, v, mask: True)
    calls, kernel = [], mx.fast.scaled_dot_product_attention
    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", lambda q, *a, **k: calls.append(q.shape[2]) or
                        kernel(q, *a, **k))
    _, got = _contexts(model, model.program, ids)
    assert calls == [48] * model.num_layers
    assert mx.array_equal(got, want).item()


@pytest.mark.parametrize("arch", ["gemma4_text", "gemma3_text"])
def test_sliding_layers_attend_in_blocks_over_their_window(ckpts, arch, monkeypatch):
    """A long prompt (from WINDOW_FROM keys) through a sliding window (16 tokens here) runs in
    blocks of WINDOW_ROWS queries (8 here), each over the keys its window reaches (at most 16 + 8 - 1), even where
    MLX fuses the one call; full layers keep one call.  The values are the explicit steps'
    (float32 rounding), with and without a cache, and the cut-off is data: None turns it off."""
    model = workbench.load(ckpts(arch))
    ids = mx.array([[(7 * i) % 250 + 3 for i in range(48)]])
    ref_ctx, ref_logits = _contexts(model, model.program_for("explicit"), ids)
    monkeypatch.setattr(attn_math, "fused_kernel", lambda q, k, v, mask: True)
    monkeypatch.setattr(attn_math, "WINDOW_ROWS", 8)
    assert not attn_math.window_blocks(48, 48, 16)  # below WINDOW_FROM keys: one call, mlx-lm's bits
    monkeypatch.setattr(attn_math, "WINDOW_FROM", 40)
    sliding = [op.attrs.get("window") is not None for op in model.program.ops if op.kind == "attention"]
    assert any(sliding) and not all(sliding)
    calls, kernel = [], mx.fast.scaled_dot_product_attention
    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", lambda q, k, *a, **kw: calls.append(
        (q.shape[2], k.shape[2])) or kernel(q, k, *a, **kw))
    got_ctx, got_logits = _contexts(model, model.program, ids)
    per_layer = iter(calls)
    for window in sliding:
        if window:
            blocks = [next(per_layer) for _ in range(6)]
            assert [r for r, _ in blocks] == [8] * 6 and max(k for _, k in blocks) <= 16 + 8 - 1
        else:
            assert next(per_layer) == (48, 48)
    assert next(per_layer, None) is None
    for a, b in zip(got_ctx, ref_ctx):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-4, atol=2e-4)
    np.testing.assert_allclose(np.array(got_logits), np.array(ref_logits), rtol=1e-4, atol=2e-4)
    cache = model.make_cache()
    _contexts(model, model.program, ids[:, :20], None, cache)
    tail, _ = _contexts(model, model.program, ids[:, 20:], None, cache)  # 28 queries over 48 keys, in blocks
    for a, b in zip(tail, ref_ctx):
        np.testing.assert_allclose(np.array(a), np.array(b)[:, 20:], rtol=1e-4, atol=2e-4)
    monkeypatch.setattr(attn_math, "WINDOW_ROWS", None)
    calls.clear()
    _contexts(model, model.program, ids)
    assert calls == [(48, 48)] * model.num_layers


def test_mlx_cpu_backend_has_no_fused_kernel_so_long_prompts_chunk():
    """The probe asks MLX itself (a graph of zeros, nothing computed): its CPU backend
    composes the call (scores inside), so the memory bound applies there."""
    q = mx.zeros((1, 4, 40, 8))
    k = mx.zeros((1, 2, 40, 8))
    assert attn_math.fused_kernel(q, k, k, "causal") is False
    assert attn_math.fused_kernel(q[:, :, :1], k, k, None) is False
    assert attn_math.fused_kernel(q, k, k, mx.ones((40, 40), mx.bool_)) is False


def test_the_gpu_chunk_size_follows_the_device_memory(monkeypatch):
    """None (a GPU's default): a 32nd of the device's memory, never under 1 GiB."""
    monkeypatch.setitem(attn_math.CHUNK_BYTES, "cpu", None)
    monkeypatch.setattr(attn_math, "device_memory", ask_device_memory)  # uncached here
    monkeypatch.setattr(mx, "device_info", lambda: {"memory_size": 141 * 2**30})  # Metal's name
    assert attn_math.chunk_bytes() == 141 * 2**30 // 32
    monkeypatch.setattr(mx, "device_info", lambda: {"total_memory": 150 * 10**9, "free_memory": 1})  # CUDA's
    assert attn_math.chunk_bytes() == 150 * 10**9 // 32
    monkeypatch.setattr(mx, "device_info", lambda: {"memory_size": 8 * 2**30})
    assert attn_math.chunk_bytes() == 2**30
    monkeypatch.setitem(attn_math.CHUNK_BYTES, "cpu", 12345)
    assert attn_math.chunk_bytes() == 12345


def test_module_level_models_refuse_explicit_attention(tmp_path):
    from workbench.zoo import reference as zoo_ref

    path = zoo_ref.build("qwen2_moe", tmp_path / "q2moe")
    with pytest.raises(ValueError, match="module-level model runs its own attention"):
        workbench.load(path, attention="explicit")
    m = workbench.load(path)
    with pytest.raises(TraceError, match="module-level model runs its own attention"):
        m.trace([3, 17, 42], run=Run(attention=[0]))


@pytest.mark.parametrize("T,S,window,chunk", [(9, 9, None, None), (1, 9, None, None), (9, 9, 4, None), (9, 9, 16, None),
                                              (5, 12, None, None), (40, 40, None, 3), (40, 40, 8, 3), (20, 40, 8, 5)])
def test_mlx_lms_plain_masks_mean_the_array_mask(T, S, window, chunk, monkeypatch):
    """Without padding the kernel gets mlx-lm's own mask (None / "causal") where it is plain:
    the values are those of the boolean mask of every key (``key_valid`` all True)."""
    if chunk:
        monkeypatch.setitem(attn_math.CHUNK_BYTES, "cpu", chunk * 4 * S * 4)
    mx.random.seed(T * S)
    q, k, v = mx.random.normal((1, 4, T, 8)), mx.random.normal((1, 2, S, 8)), mx.random.normal((1, 2, S, 8))
    plain = attn_math.fused_attention(q, k, v, mx.zeros((1, 0), mx.bool_), 0.3, window)
    array = attn_math.fused_attention(q, k, v, mx.ones((1, S), mx.bool_), 0.3, window)
    np.testing.assert_allclose(np.array(plain), np.array(array), rtol=1e-6, atol=1e-6)
    ref = attn_math.probabilities(q, k, attn_math.attention_mask(S - T, T, 0, S, window), 0.3)
    want = (ref.reshape(1, 2, 2, T, S) @ mx.expand_dims(v, 2)).reshape(1, 4, T, 8)
    np.testing.assert_allclose(np.array(plain), np.array(want), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- a range of queries
@pytest.mark.parametrize("arch", ["gemma4_text", "gemma3_text", "qwen3"])
def test_explicit_for_a_range_of_queries(ckpts, arch):
    """``{"layers": ..., "queries": (a, b)}``: scores / softmax hold those rows only (sliding
    windows, GQA and KV-shared layers included), equal to the explicit steps' rows; the
    context and logits equal the fused program's; the steps appear only for those layers."""
    model = workbench.load(ckpts(arch))
    spec = {"layers": "explicit", "queries": (5, 19)}
    f, lf = _contexts(model, model.program, IDS)
    q, lq = _contexts(model, model.program_for(spec), IDS)
    for a, b in zip(f, q):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(lf), np.array(lq), rtol=1e-5, atol=1e-5)
    te = model.trace(IDS, capture="full", run=Run(attention="explicit"))
    te.run()
    tq = model.trace(IDS, capture="full", run=Run(attention=spec))
    tq.run()
    for i in range(model.num_layers):
        s = tq.value(f"layers.{i}.self_attn.softmax")
        assert s.shape[2] == 14 and s.shape[3] == IDS.shape[1]
        np.testing.assert_allclose(np.array(s), np.array(te.value(f"layers.{i}.self_attn.softmax")[:, :, 5:19]),
                                   rtol=1e-5, atol=1e-6)
    # a view gets the whole pattern: these rows from the step, the others recomputed
    name, p = attention_probabilities(tq, 1)
    assert name == "layers.1.self_attn.softmax"
    np.testing.assert_allclose(np.array(p), np.array(te.value(name)), rtol=1e-5, atol=1e-6)
    only = model.program_for({"layers": [1], "queries": slice(0, 4)})
    assert _kinds(only, 1)["scores"] == "scores" and "scores" not in _kinds(only, 0)


def test_an_intervention_on_the_range_reaches_the_context_rows(ckpts):
    model = workbench.load(ckpts("llama"))
    spec = {"layers": [1], "queries": (6, 10)}
    base = model.trace(IDS, capture="full", run=Run(attention=spec))
    base.run()

    def uniform(p, op):  # every query in the range attends equally to every key it may see
        return mx.where(p > 0, 1.0, 0.0) / mx.sum(p > 0, axis=-1, keepdims=True)
    t = model.trace(IDS, capture="full", run=Run(attention=spec), interventions={"layers.1.self_attn.softmax": uniform})
    t.run()
    d = np.abs(np.array(t.value("layers.1.self_attn.context")) - np.array(base.value("layers.1.self_attn.context")))
    changed = d.max(axis=-1)[0] > 1e-6  # per query position
    assert changed[6:10].all() and not changed[:6].any() and not changed[10:].any()


def test_the_range_follows_positions_through_the_cache_and_bounds_the_memory_check(ckpts):
    model = workbench.load(ckpts("gemma3_text"))
    spec = {"layers": "explicit", "queries": (20, 30)}
    toks = workbench.trace.generate(model, IDS, max_tokens=2).tokens[0]  # fused
    cache = model.make_cache()
    t = model.trace(IDS, capture="full", run=Run(attention=spec, cache=cache))
    t.run()
    assert t.value("layers.0.self_attn.softmax").shape[2] == 4  # positions 20..23 of a 24-token prompt
    t2 = model.trace(mx.array([[toks[0]]]), capture="full", run=Run(attention=spec, cache=cache))
    t2.run()
    assert t2.value("layers.0.self_attn.softmax").shape[2] == 1  # position 24: inside the range
    assert int(mx.argmax(t2.logits[0, -1]).item()) == toks[1]  # the same next token as the fused run
    prog = model.program_for({"layers": [0], "queries": (0, 64)})
    check_attention_memory(prog, 1, 32768, 32768, mx.bfloat16, available=2**30)  # 64 rows: fits
    with pytest.raises(TraceError, match="32768-token prompt needs .* attention scores"):  # every row: refused
        check_attention_memory(model.program_for([0]), 1, 32768, 32768, mx.bfloat16, available=2**30)


@pytest.mark.parametrize("bad,match", [({"queries": (0, 4)}, "'layers' \\(required\\)"),
                                       ({"layers": "explicit", "queries": (5, 5)}, "0 <= start < stop"),
                                       ({"layers": "explicit", "queries": (-1, 3)}, "0 <= start < stop"),
                                       ({"layers": "explicit", "queries": slice(0, 8, 2)}, "no step"),
                                       ({"layers": "explicit", "queries": "0:4"}, "\\(start, stop\\)"),
                                       ({"layers": [0], "rows": (0, 4)}, "'layers' \\(required\\) and 'queries'")])
def test_bad_query_ranges_are_named(ckpts, bad, match):
    model = workbench.load(ckpts("llama"))
    with pytest.raises(ValueError, match=match):
        model.program_for(bad)


def test_device_memory_is_asked_once_per_device(monkeypatch):
    """MLX makes a new Device object per ``mx.default_device()`` (hashed by identity): the
    memory is still asked once per device, not once per attention op."""
    from workbench import device_memory as dm

    calls = []
    monkeypatch.setattr(dm, "_KNOWN", {})
    monkeypatch.setattr(mx, "device_info", lambda: calls.append(1) or {"total_memory": 123})
    assert mx.default_device() is not mx.default_device()
    assert [dm.device_memory(mx.default_device()) for _ in range(5)] == [123] * 5
    assert len(calls) == 1
