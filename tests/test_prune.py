"""``trace(..., prune=True)``: Gemma 4's KV-shared layers write no cache, so their rows reach
no other position; a pruned trace runs them from the first logit position on only (the work
mlx-lm's chunked prefill does).  The logits, the cache and every op before ``live_rows``
are the unpruned trace's; the later ops are its last rows (workbench/models/builder.py
``live_rows``; docs/trace.md, Long prompts)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import workbench
import mlx.core as mx

from workbench.demo import paths
from workbench import zoo
from workbench.trace import inject, Run, Positions
from workbench.trace.step import TraceError

IDS = [2, 17, 99, 4, 250, 31, 8, 8, 120, 64, 3, 77, 200, 5, 9, 11, 42, 1, 6, 13, 7, 90, 45, 33]


@pytest.fixture(scope="module")
def kv(tmp_path_factory):
    """A tiny Gemma 4 with KV-shared layers (zoo ``gemma4_text``: PLE, sliding windows of 16), float32."""
    return workbench.load(zoo.build("gemma4_text", tmp_path_factory.mktemp("prune") / "m", dtype="float32"))


def _f32(x):
    return np.array(x.astype(mx.float32))


def _pair(model, ids, logits=None, attention=None):
    full = model.trace(ids, capture="full", positions=Positions(logits=logits), run=Run(attention=attention))
    full.run()
    pruned = model.trace(ids, capture="full", positions=Positions(logits=logits, prune=True),
                         run=Run(attention=attention))
    pruned.run()
    return full, pruned


def test_last_logits_and_the_ops_before_the_cut_are_the_unpruned_traces(kv):
    full, pruned = _pair(kv, IDS, logits="last")
    cut = pruned.pruned.op
    k = kv.family_config.first_kv_shared
    assert cut == f"layers.{k}.live_rows" and pruned.pruned.start == len(IDS) - 1
    assert cut not in full.program and len(pruned.ops) == len(full.ops) + 1
    np.testing.assert_allclose(_f32(pruned.logits), _f32(full.logits), rtol=1e-5, atol=1e-5)
    before = pruned.ops[:pruned.ops.index(cut)]
    assert f"layers.{k - 1}" in before
    for name in before:  # the same program up to the cut: the same bits
        assert np.array_equal(_f32(pruned.value(name)), _f32(full.value(name))), name
    # after it: the last row of the unpruned values (queries rotated at their own positions)
    for name in (f"layers.{k}.self_attn.q_rope", f"layers.{k}.self_attn.context", f"layers.{k}",
                 f"layers.{kv.num_layers - 1}", "norm"):
        got, want = _f32(pruned.value(name)), _f32(full.value(name))
        axis = 2 if got.ndim == 4 else 1
        assert got.shape[axis] == 1 and pruned.positions(name) == range(len(IDS) - 1, len(IDS))
        np.testing.assert_allclose(got, np.take(want, [-1], axis=axis), rtol=1e-5, atol=1e-5, err_msg=name)
    assert pruned.positions(f"layers.{k - 1}") == range(len(IDS))
    assert pruned.positions("logits") == pruned.logit_positions == range(len(IDS) - 1, len(IDS))


def test_queries_rotated_at_the_wrong_positions_would_show(kv):
    """The check above can fail: the last row's queries against the row before it differ."""
    full, pruned = _pair(kv, IDS, logits="last")
    name = f"layers.{kv.family_config.first_kv_shared}.self_attn.q_rope"
    got, want = _f32(pruned.value(name)), _f32(full.value(name))
    assert np.abs(got[:, :, 0] - want[:, :, -2]).max() > 1e-2


@pytest.mark.parametrize("logits", [slice(-3, None), [5, 20, 23], "all"])
def test_other_logit_positions(kv, logits):
    full, pruned = _pair(kv, IDS, logits=logits)
    np.testing.assert_allclose(_f32(pruned.logits), _f32(full.logits), rtol=1e-5, atol=1e-5)
    start = 0 if logits == "all" else 21 if isinstance(logits, slice) else 5
    assert pruned.pruned.start == start and pruned.logit_positions == full.logit_positions
    name = f"layers.{kv.num_layers - 1}"
    assert pruned.value(name).shape[1] == len(IDS) - start
    if logits == "all":  # nothing left out: the unpruned values, bit for bit
        assert np.array_equal(_f32(pruned.value(name)), _f32(full.value(name)))


def test_left_padded_batch(kv):
    batch = [IDS, IDS[5:]]
    full, pruned = _pair(kv, batch, logits="last")
    np.testing.assert_allclose(_f32(pruned.logits), _f32(full.logits), rtol=1e-5, atol=1e-5)


def test_explicit_attention_in_a_pruned_layer(kv):
    full, pruned = _pair(kv, IDS, logits=slice(-2, None), attention="explicit")
    k = kv.family_config.first_kv_shared
    s = pruned.value(f"layers.{k}.self_attn.scores")
    assert s.shape[2:] == (2, len(IDS))
    np.testing.assert_allclose(_f32(s), _f32(full.value(f"layers.{k}.self_attn.scores"))[:, :, -2:],
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_f32(pruned.logits), _f32(full.logits), rtol=1e-5, atol=1e-5)


def test_a_pruned_prefill_leaves_the_cache_a_full_one_does(kv):
    """The KV-shared layers write no cache: prefill pruned, then decode, as mlx-lm's generate."""
    out = []
    for prune in (False, True):
        cache = kv.make_cache()
        t = kv.trace(IDS[:-1], capture=None, positions=Positions(logits="last", prune=prune), run=Run(cache=cache))
        t.run()
        d = kv.trace(IDS[-1:], capture=None, run=Run(cache=cache))
        d.run()
        out.append((_f32(t.logits), _f32(d.logits)))
    np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-5, atol=1e-5)


def test_the_hunt_says_a_pruned_ops_rows(kv):
    k = kv.family_config.first_kv_shared
    bad = f"layers.{k}.mlp.down_proj"
    t = kv.trace(IDS, capture="stats", positions=Positions(logits="last", prune=True), interventions=[inject(bad)])
    f = t.first_nonfinite()
    assert f.op == bad and f.positions == [len(IDS) - 1, len(IDS)]
    assert f"positions {len(IDS) - 1}..{len(IDS) - 1}" in str(f)
    assert f.to_dict()["positions"] == [len(IDS) - 1, len(IDS)]
    early = kv.trace(IDS, capture="stats", positions=Positions(logits="last", prune=True),
                     interventions=[inject(f"layers.{k - 1}.mlp.down_proj")]).first_nonfinite()
    assert early.positions is None


def test_refused_where_nothing_can_be_pruned():
    demo = workbench.load(paths.DEMO)  # no KV-shared layers
    with pytest.raises(TraceError, match="nothing to prune"):
        demo.trace("hello", positions=Positions(prune=True))


def test_cli_hunt_prune(kv):
    demo_kv = str(paths.DEMO_KV)
    run = [sys.executable, "-m", "workbench.cli", "hunt"]
    p = subprocess.run(run + [demo_kv, "--prompt", "one two three four", "--logits", "last", "--prune", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["pruned"]["op"].endswith(".live_rows") and rep["pruned"]["positions"][1] == rep["logits"]["of"]
    p = subprocess.run(run + [str(paths.DEMO), "--prompt", "hi", "--prune"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "nothing to prune" in p.stderr
    p = subprocess.run(run + [demo_kv, "--prompt", "hi", "--prune", "--crash"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2 and "--prune" in p.stderr and "Traceback" not in p.stderr


def test_streamed_model_prunes_too(kv):
    path = kv.path
    streamed = workbench.load(path, memory_budget=64 * 2**20)
    t = streamed.trace(IDS, capture="stats", positions=Positions(logits="last", prune=True))
    t.run()
    ref = kv.trace(IDS, capture=None, positions=Positions(logits="last"))
    ref.run()
    assert t.pruned is not None
    np.testing.assert_allclose(_f32(t.logits), _f32(ref.logits), rtol=1e-5, atol=1e-5)


def test_the_debugger_says_a_pruned_steps_rows(kv):
    from workbench.widgets import StepDebugger

    t = kv.trace(IDS, capture="stats", positions=Positions(logits="last", prune=True))
    d = StepDebugger(t)
    k = kv.family_config.first_kv_shared
    d.trace.run(f"layers.{k - 1}")
    d.refresh()
    assert "pruned" not in d.current.value
    d.trace.run(f"layers.{k}.input_layernorm")
    d.refresh()
    assert f"rows: pruned, from layers.{k}.live_rows on: position {len(IDS) - 1} (the last)" in d.current.value
