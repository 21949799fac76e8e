"""Every view reads the Record: the debugger, the diff (API, DiffView, CLI) and generation
on a module-level trace of an architecture with no op program."""
import json

import numpy as np
import pytest

import workbench
import mlx.core as mx

from workbench import diff
from workbench.cli import main
from workbench.trace.step import TraceError
from workbench.zoo import reference as zoo_ref

IDS = [3, 17, 42, 9, 100, 7]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return zoo_ref.build("qwen2_moe", tmp_path_factory.mktemp("mv") / "q2moe")


@pytest.fixture(scope="module")
def model(ckpt):
    m = workbench.load(ckpt)
    assert m.granularity == "module"
    return m


def test_debugger_buttons_follow_the_trace(model):
    from workbench.widgets import StepDebugger

    t = workbench.trace(model, IDS, capture="full")
    d = StepDebugger(t)
    d.step()
    assert t.position == 1 and t.steps[-1].name == "embed_tokens"
    d.step_layer()
    assert t.steps[-1].name == "layers.0"
    d.run_to("layers.1.mlp")
    assert t.steps[-1].name == "layers.1.mlp"
    d.back()
    assert t.steps[-1].name == t.ops[t.position - 1]
    d.run_to(None)
    assert t.done and t.steps[-1].name == "logits"


def test_dump_and_diff_find_a_planted_engine_divergence(model, ckpt, tmp_path):
    ref = diff.run_reference(model, ids=IDS)
    assert ref.order[-1] == "logits" and "layers.1.mlp.shared_expert" in ref.order
    eng = {k: v.copy() for k, v in ref.values.items()}
    eng["layers.1.self_attn.o_proj"] = eng["layers.1.self_attn.o_proj"] * 1.5  # a wrong scale in the engine
    rep = diff.compare(model, eng, ids=IDS)
    assert rep.first_divergence.op == "layers.1.self_attn.o_proj"
    same = diff.compare(model, {k: v.copy() for k, v in ref.values.items()}, ids=IDS)
    assert same.first_divergence is None
    # the widget over that report
    from workbench.widgets import DiffView
    view = DiffView(rep)  # opened on the first divergence, its details printed below the curve
    assert "first divergence: layers.1.self_attn.o_proj" in view.summary.value and not view.first.disabled
    assert view.op.value == "layers.1.self_attn.o_proj" and len(view.plot.outputs) == 1
    assert "layers.1.self_attn.o_proj (engine " in "".join(o.get("text", "") for o in view.detail.outputs)
    # the CLI: dump the reference, save the engine, diff them (exit 1: a divergence)
    out = tmp_path / "ref.safetensors"
    assert main(["dump", str(ckpt), "--ids", ",".join(map(str, IDS)), "--out", str(out)]) == 0
    dumped = diff.Reference.load(out)
    assert dumped.order == ref.order
    np.testing.assert_array_equal(dumped.values["logits"], ref.values["logits"])
    e = tmp_path / "engine.npz"
    np.savez(e, **eng)
    code = main(["diff", str(ckpt), str(e), "--ids", ",".join(map(str, IDS)), "--json"])
    assert code == 1


def test_hunt_cli_json_on_module_level(ckpt, tmp_path, capsys):
    from workbench.notebook import planted

    W = "model.layers.0.mlp.shared_expert.down_proj.weight"

    def poison(ts):
        w = ts[W]
        ts[W] = mx.where(mx.arange(w.size).reshape(w.shape) == 3, mx.array(float("inf"), w.dtype), w)
    bad = planted(ckpt, tmp_path / "bad", poison)
    code = main(["hunt", str(bad), "--ids", ",".join(map(str, IDS)), "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 1
    assert rep["first_nonfinite"]["op"] == "layers.0.mlp.shared_expert.down_proj"
    assert rep["first_nonfinite"]["cause"] == "nonfinite-weight"
    assert main(["hunt", str(ckpt), "--ids", ",".join(map(str, IDS)), "--json"]) == 0


def test_generation_uses_the_reference_cache(model, ckpt):
    g = workbench.generate(model, IDS, max_tokens=4)
    from mlx_lm.models.cache import make_prompt_cache
    ref = zoo_ref.reference(ckpt)
    cache = make_prompt_cache(ref)
    ids, out = mx.array([IDS]), []
    for _ in range(4):
        nxt = int(mx.argmax(ref(ids, cache=cache)[0, -1]).item())
        out.append(nxt)
        ids = mx.array([[nxt]])
    assert g.tokens == out
    assert g.traces[1].ids.shape == (1, 1)


def test_interventions_inside_the_forward(model):
    from workbench.trace import patch

    base = workbench.trace(model, IDS, capture="full")
    base.run()
    t = workbench.trace(model, IDS, capture="full",
                        interventions=[patch("layers.0.self_attn.o_proj", lambda v: v * 0)])
    t.run()
    assert float(mx.abs(t.value("layers.0.self_attn.o_proj")).max()) == 0
    # downstream sees the change: the attention block's output is the zeroed projection
    assert float(mx.abs(t.value("layers.0.self_attn")).max()) == 0
    assert not mx.array_equal(t.logits, base.logits)
    # added mid-trace: the steps already taken are re-run with it
    t2 = workbench.trace(model, IDS, capture="full")
    t2.run(until="layers.1")
    t2.add_intervention(patch("layers.0.mlp", lambda v: v * 2))
    assert t2.position == t2.program.index("layers.1") + 1   # back where it was
    t2.run()
    twice = workbench.trace(model, IDS, capture="full", interventions=[patch("layers.0.mlp", lambda v: v * 2)])
    twice.run()
    assert mx.array_equal(t2.logits, twice.logits)        # as if it had been there from the start
    assert [s.name for s in t2.steps if s.intervened] == ["layers.0.mlp"]


def test_both_granularities_are_records(model, tmp_path):
    from workbench.trace import ModuleTrace, Trace, is_record
    from workbench.trace.record import MEMBERS
    from workbench import zoo

    op_model = workbench.load(zoo.build("llama", tmp_path / "llama"))
    t_op = workbench.trace(op_model, [1, 2, 3])
    t_mod = workbench.trace(model, IDS)
    assert type(t_op) is Trace and isinstance(t_mod, ModuleTrace)
    assert {"value", "stats", "inputs", "recompute", "op_tensors", "steps", "run", "back"} <= set(MEMBERS)
    assert not is_record(op_model)
    for t in (t_op, t_mod):
        assert is_record(t)
        t.run()
        assert t.ops[-1] == "logits" and t.steps[-1].name == "logits"
        name = t.ops[len(t.ops) // 2]
        assert t.stats(name)["nan"] == 0
        assert all(isinstance(v, mx.array) for _, v in t.inputs(name))


def test_plots_on_a_module_level_trace(model):
    from workbench import plots
    from workbench.plots.analysis import logit_lens, residual_norms

    t = workbench.trace(model, IDS, capture="full")
    t.run()
    rn = residual_norms(t)
    assert rn.norms.shape == (model.num_layers, len(IDS))
    np.testing.assert_allclose(rn.norms[1], np.linalg.norm(np.array(t.value("layers.1"))[0], axis=-1), rtol=1e-5)
    plots.residual_norm_plot(t)
    with pytest.raises(ValueError, match="module-level"):
        logit_lens(t)


def test_the_model_is_the_entry_point(model, tmp_path):
    from workbench import zoo

    op_model = workbench.load(zoo.build("llama", tmp_path / "llama"))
    for m, ids in ((op_model, [1, 2, 3]), (model, IDS)):
        a, b = m.trace(ids), workbench.trace(m, ids)
        a.run()
        b.run()
        assert type(a) is type(b) and a.ops == b.ops
        assert mx.array_equal(a.logits, b.logits)


def test_traces_of_the_same_module_calls_share_one_program(model, ckpt):
    # a decoding loop records the same module calls every token: its traces (and a prompt's
    # trace of the same calls) share the program instead of describing every call again
    g = workbench.generate(model, IDS, max_tokens=4, capture="stats")
    programs = {id(t.program) for t in g.traces}
    assert len(programs) == 1
    a = workbench.trace(model, IDS)
    assert a.program is g.traces[0].program and a.program.names == g.traces[1].program.names
    # another compute dtype calls other module objects: a program of its own, the same names
    # (on the CPU, this MoE's unquantized experts run float32 only: refused before recording)
    if mx.default_device() == mx.cpu:
        with pytest.raises(TraceError, match="float32 only, not float16"):
            workbench.trace(model, IDS, dtype="float16")
    else:
        b = workbench.trace(model, IDS, dtype="float16")
        assert b.program is not a.program and b.program.names == a.program.names
    # another prompt shares it when it calls the same modules (this MoE calls the experts its
    # tokens route to), and its steps still read its own recording
    a.run()
    c = workbench.trace(model, IDS[:3])
    c.run()
    assert (c.program is a.program) == (c.program.names == a.program.names)
    assert c.steps[0].output_shape[1] == 3 and a.steps[0].output_shape[1] == len(IDS)
    ref = zoo_ref.reference(ckpt)
    assert mx.array_equal(c.value("logits"), ref(mx.array([IDS[:3]]))).item()
    assert mx.array_equal(a.value("logits"), ref(mx.array([IDS]))).item()


def test_recorded_values_are_the_forwards_own_not_copies():
    # a step's value is the very array the forward computed (reading every step's value after
    # the logits computes nothing more), yet a caller updating it in place cannot rewrite it
    import mlx.nn as nn

    from workbench.reference import recorder as R

    class Child(nn.Module):
        def __call__(self, x):
            return x * 2

    class Root(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = Child()
            self.b = Child()

        def __call__(self, x):
            h = self.a(x)
            h *= 3  # in place, as mlx-lm's gemma scales its embeddings
            h[0, 0] = -1.0
            return self.b(mx.tanh(h)) + mx.ones((256, 256))

    root = Root()
    tape = R.Tape(R.instrument(root))
    x = mx.ones((256, 256))
    with tape:
        out = root(x)
    assert tape.names == ["a", "b", "logits"]
    mx.eval(out)
    before = mx.get_active_memory()
    mx.eval(tape.outputs)
    assert mx.get_active_memory() == before  # (each was a copy op of its own before)
    ptr = lambda a: np.asarray(a).__array_interface__["data"][0]  # noqa: E731
    assert ptr(tape.outputs[2]) == ptr(out)
    assert mx.array_equal(tape.outputs[0], x * 2).item()  # not x * 6, not -1 at [0, 0]
    h = x * 6
    h[0, 0] = -1.0
    assert mx.array_equal(tape.outputs[1], mx.tanh(h) * 2).item()
    assert mx.array_equal(tape.outputs[2], out).item()
