"""The engine emulator: default plan exact and hazard-free; aliased plans corrupt the
numbers deterministically while the analyzer names the dispatch."""
from __future__ import annotations

import json

import numpy as np
import pytest

import workbench
import workbench.zoo
import mlx.core as mx
from workbench.buffers import Emulator, analyze, validate
from workbench.buffers.emulator import role_of
from workbench.cli import main as cli_main
from workbench.program import Op, Program, execute

IDS = [3, 17, 42, 5, 99, 7, 1, 64]


# ------------------------------------------------------------------ a hand-written program

def tiny_program():
    rng = np.random.default_rng(0)
    W = mx.array(rng.standard_normal((8, 8)).astype(np.float32))
    V = mx.array(rng.standard_normal((8, 8)).astype(np.float32))
    ops = [Op("proj", "linear", lambda ctx, x: x @ W, ("x",)),
           Op("act", "silu", lambda ctx, h: h * mx.sigmoid(h), ("proj",)),
           Op("mix", "linear", lambda ctx, h: h @ V, ("act",)),
           Op("res", "add", lambda ctx, a, b: a + b, ("x", "mix")),
           Op("logits", "linear", lambda ctx, h: h @ W, ("res",))]
    x = mx.array(rng.standard_normal((1, 2, 8)).astype(np.float32))
    return Program(ops, inputs=("x",)), {"x": x}, W, V


def test_hand_written_program_default_plan_exact():
    prog, feeds, _, _ = tiny_program()
    emu = Emulator(prog, context=None, feeds=feeds)
    run = emu.run()
    ref = np.array(execute(prog, None, feeds)["logits"])
    assert run.exact and np.array_equal(run.logits, ref)
    assert run.hazards == [] and run.first_divergence() is None
    validate(run.schedule.to_dict())  # the recording is a valid workbench.schedule/1 document


def test_alias_is_computed_tile_by_tile_deterministically():
    prog, feeds, _, V = tiny_program()
    emu = Emulator(prog, context=None, feeds=feeds, tiles=4)
    plan = emu.plan().place("mix", like="act")          # mix = act @ V written over act
    run = emu.run(plan)
    # independent re-statement of what a tiled kernel does: 8 columns / 4 = 2 per tile
    act = np.array(execute(prog, None, feeds, keep=lambda n: n == "act")["act"])
    buf = act.copy().reshape(-1)
    for t in range(0, buf.size, 2):
        full = np.array(mx.array(buf.reshape(1, 2, 8)) @ V).reshape(-1)
        buf[t:t + 2] = full[t:t + 2]
    assert np.array_equal(run.outputs["mix"].reshape(-1), buf)
    assert not np.array_equal(run.outputs["mix"], run.reference["mix"])   # corrupted
    assert run.first_divergence() == "mix" and not run.exact
    assert [(h.kind, h.event, h.other, h.buffer) for h in run.hazards] == [("alias-in-dispatch", 2, None, "act")]
    assert "Give mix its own output buffer" in run.hazards[0].message
    # the same edit twice gives the very same bytes
    assert emu.run(plan).logits.tobytes() == run.logits.tobytes()
    # its own buffer: exact again
    fixed = emu.run(plan.place("mix", buffer="mixH"))
    assert fixed.exact and fixed.hazards == []


def test_elementwise_inplace_is_exact_and_not_flagged():
    prog, feeds, _, _ = tiny_program()
    emu = Emulator(prog, context=None, feeds=feeds)
    run = emu.run(emu.plan().place("res", like="mix"))   # res = x + mix written over mix: declared in-place
    assert run.exact and run.hazards == []
    strict = Emulator(prog, context=None, feeds=feeds, inplace={})
    run2 = strict.run(strict.plan().place("res", like="mix"))
    assert run2.exact  # element-wise really is safe tile by tile ...
    assert [h.kind for h in run2.hazards] == ["alias-in-dispatch"]  # ... but undeclared, so flagged


def test_overwriting_a_live_value_gives_stale_read_at_its_reader():
    prog, feeds, _, _ = tiny_program()
    emu = Emulator(prog, context=None, feeds=feeds)
    run = emu.run(emu.plan().place("act", like="x"))      # act clobbers the input x, still needed by res
    hz = [(h.kind, h.event, h.other, h.buffer) for h in run.hazards]
    assert hz == [("stale-read", 3, 1, "x")]
    assert run.first_divergence() == "res" and not run.exact


def test_resize_gives_out_of_bounds_and_partial_overlap_by_offset():
    prog, feeds, _, _ = tiny_program()
    emu = Emulator(prog, context=None, feeds=feeds)
    plan = emu.plan()
    run = emu.run(plan.resize(plan["mix"].buffer, 32))
    assert [(h.kind, h.event) for h in run.hazards] == [("out-of-bounds", 2), ("out-of-bounds", 3)]  # writer, reader
    run2 = emu.run(plan.place("mix", plan["act"].buffer, offset=16))   # shifted by 4 floats
    assert [(h.kind, h.event, h.range) for h in run2.hazards] == [("partial-overlap", 2, (16, 64))]
    assert not run2.exact
    with pytest.raises(KeyError, match="did you mean 'mix'"):
        plan.place("mixx", buffer="a")


def test_roles():
    assert role_of("layers.12.self_attn.o_proj") == "self_attn.o_proj"
    assert role_of("layers.3") == "residual"
    assert role_of("lm_head") == "lm_head"


# ------------------------------------------------------------------ real model programs

@pytest.fixture(scope="module", params=["gemma4_text", "llama"])
def model(request, tmp_path_factory):
    path = workbench.zoo.build(request.param, tmp_path_factory.mktemp(request.param))
    return workbench.load(path)


def test_default_plan_reproduces_reference_logits_exactly(model):
    emu = Emulator(model, IDS)
    run = emu.run()
    ref = np.array(model(IDS).astype(mx.float32))
    assert run.logits.dtype == np.float32 and np.array_equal(run.logits, ref)
    assert run.exact and run.hazards == []
    # values alive at the same time never share bytes (checked on the plan itself)
    plan, prog = run.plan, model.program
    last = prog.last_use()
    life = {op.name: (i, last.get(op.name, i)) for i, op in enumerate(prog.ops)}
    by_buf = {}
    for n, (a, b) in life.items():
        by_buf.setdefault(plan[n].buffer, []).append((a, b, n))
    for lst in by_buf.values():
        lst.sort()
        for (a1, b1, n1), (a2, b2, n2) in zip(lst, lst[1:]):
            assert b1 < a2, f"{n1} (alive {a1}..{b1}) and {n2} share a buffer"


def test_seed_case_attention_output_aliasing(model, tmp_path, capsys):
    emu = Emulator(model, IDS)
    o_proj, ctx = "layers.1.self_attn.o_proj", "layers.1.self_attn.context"
    # the bug: o_proj writes its output into the buffer holding its input, the attention output
    bad = emu.run(emu.plan().place(o_proj, like=ctx))
    assert not bad.exact and bad.first_divergence() == o_proj
    h = bad.hazards[0]
    assert (h.kind, h.event, h.buffer) == ("alias-in-dispatch", bad.dispatch_of(o_proj), emu.plan()[ctx].buffer)
    assert f"Give {o_proj} its own output buffer" in h.message
    # the fix from the reports: a separate attnH scratch buffer
    fixed = emu.run(emu.plan().place(o_proj, like=ctx).place(o_proj, buffer="attnH"))
    assert fixed.exact and fixed.hazards == []
    # the other form: attention output written over the residual still to be read
    stale = emu.run(emu.plan().place(ctx, like="layers.0"))
    assert not stale.exact
    sh = stale.hazards[0]
    assert (sh.kind, sh.event, sh.other) == ("stale-read", stale.dispatch_of("layers.1.attn_residual"),
                                             stale.dispatch_of(ctx))
    # the recorded schedule through the CLI: exit 1, names the dispatch; the clean one exits 0
    p = tmp_path / "bad.schedule.json"
    bad.schedule.save(p)
    assert cli_main(["hazards", str(p), "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert rep["hazards"][0]["event"] == bad.dispatch_of(o_proj) and o_proj in rep["hazards"][0]["message"]
    fixed.schedule.save(p)
    assert cli_main(["hazards", str(p)]) == 0
    assert analyze(str(p)) == []


def test_concurrent_recording_barriers_and_command_buffers(model):
    emu = Emulator(model, IDS)
    auto = emu.run(mode="concurrent")
    ev = auto.schedule.events
    n_disp = sum(e.type == "dispatch" for e in ev)
    n_bar = sum(e.type == "barrier" for e in ev)
    assert auto.schedule.mode == "concurrent" and auto.exact
    assert auto.hazards == [] and 0 < n_bar < n_disp   # barriers only where needed, and some overlap allowed
    # k and v projections read the same norm output and write separate buffers: one region
    i = auto.dispatch_of("layers.0.self_attn.k_proj")
    j = auto.dispatch_of("layers.0.self_attn.v_proj")
    assert j == i + 1
    assert all(e.type == "dispatch" for e in ev[i:j + 1])
    none = emu.run(mode="concurrent", barriers="none")
    first = none.hazards[0]
    assert (first.kind, first.event, first.other) == ("raw", 1, 0)   # op 1 reads what op 0 writes
    assert {h.kind for h in none.hazards} == {"raw", "war", "waw"}
    assert emu.run(mode="concurrent", barriers="all").hazards == []
    # command buffers: a commit after layer 0; reusing the committed one is the seed's crash
    split = emu.run(commit_after=["layers.0"])
    assert split.hazards == [] and {e.cb for e in split.schedule.events if e.type == "dispatch"} == {0, 1}
    reuse = emu.run(commit_after=["layers.0"], reuse_committed=True)
    h = reuse.hazards[0]
    commit = next(k for k, e in enumerate(reuse.schedule.events) if e.type == "commit")
    assert (h.kind, h.event, h.other) == ("cb-reuse", reuse.dispatch_of("layers.1.input_layernorm"), commit)
    assert {x.kind for x in reuse.hazards} == {"cb-reuse"}


def test_missing_barriers_corrupt_the_numbers_and_are_found(model):
    emu = Emulator(model, IDS)
    none = emu.run(mode="concurrent", barriers="none")
    assert np.isnan(none.logits).all()        # everything read scratch before it was written
    o_proj, ctx = "layers.1.self_attn.o_proj", "layers.1.self_attn.context"
    one = emu.run(mode="concurrent", skip_barriers=[o_proj])   # one forgotten memoryBarrier
    assert not one.exact and one.first_divergence() == o_proj
    assert np.isfinite(one.logits).all()      # o_proj read layer 0's attention output: wrong, not NaN
    h = one.hazards[0]
    assert (h.kind, h.event, h.other) == ("raw", one.dispatch_of(o_proj), one.dispatch_of(ctx))
    assert {x.kind for x in one.hazards} == {"raw"}
    with pytest.raises(KeyError, match="did you mean"):
        emu.run(mode="concurrent", skip_barriers=["layers.1.self_attn.o_prj"])


@pytest.mark.parametrize("arch", workbench.zoo.ARCHS)
def test_every_zoo_architecture_default_plan_exact(arch, tmp_path):
    kw = {"dtype": "float32"} if "moe" in arch else {}   # MLX's CPU gather_mm needs float32
    model = workbench.load(workbench.zoo.build(arch, tmp_path / arch, **kw))
    run = Emulator(model, IDS[:5]).run()
    assert run.exact and run.hazards == [] and len(run.outputs) == len(model.program)


def test_decode_step_with_kv_cache(tmp_path):
    model = workbench.load(workbench.zoo.build("llama", tmp_path / "llama"))
    ref_cache, cache = model.make_cache(), model.make_cache()
    mx.eval(model(IDS, cache=ref_cache), model(IDS, cache=cache))   # prefill, twice
    ref = model([11], cache=ref_cache)                     # the reference decode step
    emu = Emulator(model, [11], cache=cache)               # the same step, emulated
    ok = emu.run()
    assert ok.exact and ok.hazards == [] and ok.logits.shape == (1, 1, model.vocab_size)
    assert np.array_equal(ok.logits, np.array(ref.astype(mx.float32)))
    o_proj = "layers.0.self_attn.o_proj"
    bad = emu.run(emu.plan().place(o_proj, like="layers.0.self_attn.context"))
    assert not bad.exact and bad.hazards[0].event == bad.dispatch_of(o_proj)
