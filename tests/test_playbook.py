"""The claims of notebook 10 (the engineer's NaN playbook), asserted programmatically so
they cannot silently rot: the demo checkpoint is sound and its reference forward finite;
the engine emulated with the scores written into the keys' buffer gives NaN logits; the
diff of its dump names ``layers.0.self_attn.scores`` with the non-finite count, tokens and
channels the notebook reads; the hazard analyzer names the four score dispatches, buffer
``self_attn.k_cache``, bytes [0, 1568); a scratch buffer of their own makes it exact and
clean.  Also the exercises' answers (a lucky hazard, a missing barrier's block of NaN, a
stale read), and the CLI's exit statuses for each step.
"""
from __future__ import annotations

import numpy as np
import pytest

import workbench
from workbench.buffers import Emulator, analyze, load_schedule
from workbench.cli import main as cli
from workbench.demo.paths import DEMO
from workbench.diff import compare, compare_arrays, dump
from workbench.trace import hunt

PROMPT = "mia red kite . tom blue cup . anna green hat . mia"   # the notebook's prompt
LAYERS = range(4)
SCORES = "layers.{}.self_attn.scores"


@pytest.fixture(scope="module")
def demo():
    model = workbench.load(DEMO, attention="explicit")  # the engine's scores and softmax are steps
    ids = model.encode(PROMPT)
    emu = Emulator(model, ids)
    plan = emu.plan()
    engine_plan = plan
    for i in LAYERS:  # the engine's bug: the scores written into the keys' buffer
        engine_plan = engine_plan.place(SCORES.format(i), like=f"layers.{i}.self_attn.k_cache")
    fixed_plan = engine_plan
    for i in LAYERS:  # the fix: a scratch buffer of their own
        fixed_plan = fixed_plan.place(SCORES.format(i), buffer="attn_scores")
    return {"model": model, "ids": ids, "emu": emu, "plan": plan, "bad": emu.run(engine_plan),
            "fixed": emu.run(fixed_plan)}


def _engine_dump(path, run):
    """The engine's debug dump: each op's output as its dispatch wrote it, by op name."""
    np.savez(path, **run.outputs)
    return path


@pytest.fixture(scope="module")
def files(demo, tmp_path_factory):
    d = tmp_path_factory.mktemp("playbook")
    ref = d / "ref.safetensors"
    dump(DEMO, out=ref, ids=demo["ids"])
    demo["bad"].schedule.save(d / "bad.schedule.json")
    demo["fixed"].schedule.save(d / "fixed.schedule.json")
    return {"dir": d, "ref": ref, "bad": _engine_dump(d / "engine.npz", demo["bad"]),
            "fixed": _engine_dump(d / "fixed.npz", demo["fixed"])}


def test_steps_1_and_2_checkpoint_sound_and_reference_finite(demo):
    report = workbench.inspect(DEMO, values=True)
    assert report.ok and report.problems == [] and report.model_type == "gemma4_text"
    h = hunt(demo["model"], demo["ids"])
    assert not h.found and h.report["ops_checked"] == len(demo["model"].program.ops)
    ref_next = int(np.argmax(demo["emu"].reference["logits"][0, -1]))
    assert demo["model"].decode([ref_next]) == " red"


def test_buggy_engine_gives_nan_logits(demo):
    bad = demo["bad"]
    assert np.isnan(bad.logits).all()
    assert bad.first_divergence() == "layers.0.self_attn.scores"
    # the inputs of the first bad op were written right: the dump of k_cache is the reference's
    for name in ("layers.0.self_attn.q_rope", "layers.0.self_attn.k_cache"):
        assert bad.outputs[name].tobytes() == bad.reference[name].tobytes()


def test_diff_names_the_scores_with_their_nan(demo, files):
    report = compare(files["ref"], files["bad"])
    assert not report.unmatched_engine and not report.unmatched_reference
    fd = report.first_divergence
    assert fd.op == "layers.0.self_attn.scores" and fd.index == 22
    nf = fd.nonfinite
    assert nf["count"] == 267 and nf["engine"] == 267 and nf["reference"] == 0
    assert fd.nonfinite_engine == {"nan": 264, "posinf": 1, "neginf": 2}
    assert nf["axis"] == "token" and nf["rows"] == [[0, 13]]
    # channel = head x 14 + key: keys 0-5 of head 0, 0-12 of head 1, 0-3 of head 2, 0-10 of head 3
    assert nf["channels"] == [[0, 5], [14, 26], [28, 31], [42, 52]] and nf["n_channels"] == 34
    assert nf["pattern"] == "staircase" and nf["tile"] is True   # memory-shaped: points to hazards
    assert np.isnan(fd.cosine) and fd.finite["cosine"] == 1.0 and fd.finite["nmse"] == 0.0
    assert fd.local_diverged and "is computed differently" in report.verdict()
    by = {o.op: o.status for o in report.ops}
    assert by["layers.0.self_attn.q_rope"] == by["layers.0.self_attn.k_cache"] == "ok"
    # the notebook's reading of the picture: in every row the NaN are the leading keys, more
    # of them the later the row (head 0: query 1 has key 0, query 13 keys 0-5); head 1 is worse
    scores = demo["bad"].outputs["layers.0.self_attn.scores"][0]
    bad = ~np.isfinite(scores)
    for head in range(4):
        n = bad[head].sum(axis=1)
        assert all(bad[head, t, :n[t]].all() for t in range(len(n))), head   # a prefix of the keys
        assert (np.diff(n) >= 0).all(), head                                # never shrinking
    assert list(np.nonzero(bad[0, 1])[0]) == [0] and list(np.nonzero(bad[0, 13])[0]) == list(range(6))
    assert bad[1].sum() > bad[0].sum()
    ref = demo["bad"].reference["layers.0.self_attn.scores"][0]
    fine = ~bad
    assert scores[fine].tobytes() == ref[fine].tobytes()                    # every number exact


def test_hazards_name_the_score_dispatches(demo, files):
    bad = demo["bad"]
    hazards = analyze(load_schedule(files["dir"] / "bad.schedule.json"))
    assert [h.kind for h in hazards] == ["partial-overlap"] * 4
    assert [h.event for h in hazards] == [bad.dispatch_of(SCORES.format(i)) for i in LAYERS]
    assert hazards[0].event == 22
    assert {h.buffer for h in hazards} == {"self_attn.k_cache"}
    assert {tuple(h.range) for h in hazards} == {(0, 1568)}
    assert "[0, 1792)" in hazards[0].message and "own output buffer" in hazards[0].message


def test_fix_is_exact_and_clean(demo, files):
    fixed = demo["fixed"]
    assert fixed.exact and fixed.hazards == [] and fixed.first_divergence() is None
    assert demo["model"].decode([int(np.argmax(fixed.logits[0, -1]))]) == " red"
    assert fixed.plan.buffers()["attn_scores"] == 1568
    report = compare(files["ref"], files["fixed"])
    assert report.first_divergence is None and not report.found and report.compared == 143


def test_cli_exit_statuses(demo, files, capsys):
    ids = ",".join(map(str, demo["ids"]))
    d = files["dir"]
    assert cli(["inspect", str(DEMO), "--values"]) == 0
    assert cli(["hunt", str(DEMO), "--ids", ids]) == 0
    assert cli(["diff", str(files["ref"]), str(files["bad"])]) == 1
    out = capsys.readouterr().out
    assert "first divergence: layers.0.self_attn.scores" in out
    assert "267 non-finite element(s) (267 in the engine) at tokens 0-13 (14 of 14) x channels 0-5, 14-26, 28-31, 42-52" in out
    assert "(34 of 56); staircase: per token a run of leading channels that grows" in out
    assert "`workbench hazards SCHEDULE.json`" in out
    assert cli(["hazards", str(d / "bad.schedule.json")]) == 1
    assert "4 hazards (4 partial-overlap)" in capsys.readouterr().out
    assert cli(["diff", str(files["ref"]), str(files["fixed"])]) == 0
    assert cli(["hazards", str(d / "fixed.schedule.json")]) == 0


def test_exercise_1_scores_over_queries_exact_but_flagged(demo):
    emu, plan = demo["emu"], demo["plan"]
    run = emu.run(plan.place(SCORES.format(0), like="layers.0.self_attn.q_rope"))
    assert run.exact
    assert [(h.kind, h.event, h.buffer) for h in run.hazards] == [("partial-overlap", 22, "self_attn.q_rope")]
    emu33 = Emulator(demo["model"], (demo["ids"] * 3)[:33])
    run33 = emu33.run(emu33.plan().place(SCORES.format(0), like="layers.0.self_attn.q_rope"))
    assert np.isnan(run33.logits).any() and run33.first_divergence() == SCORES.format(0)


def test_exercise_2_missing_barrier_leaves_a_block(demo):
    emu, plan, model, ids = demo["emu"], demo["plan"], demo["model"], demo["ids"]
    late = emu.run(plan, mode="concurrent", skip_barriers=["layers.3.self_attn.o_proj"])
    report = compare_arrays(late.reference, late.outputs, order=model.program.names, tokens=len(ids))
    fd = report.first_divergence
    assert fd.op == "layers.3.self_attn.o_proj"
    nf = fd.nonfinite
    assert nf["rows"] == [[7, 13]] and nf["channels"] == [[0, 127]] and nf["tile"] is True
    assert "workbench hazards" in fd.reasons[-1]
    out = late.outputs["layers.3.self_attn.o_proj"][0]
    assert np.isfinite(out[:7]).all() and np.isnan(out[7:]).all()
    assert [(h.kind, h.buffer, tuple(h.range)) for h in late.hazards] == [("raw", "self_attn.context", (0, 7168))]
    assert late.schedule.events[late.hazards[0].event].name == "layers.3.self_attn.o_proj"
    # on a sliding layer the same missing barrier reads stale numbers, no NaN
    stale = emu.run(plan, mode="concurrent", skip_barriers=["layers.1.self_attn.o_proj"])
    assert not stale.exact and not np.isnan(stale.logits).any()
    assert stale.first_divergence() == "layers.1.self_attn.o_proj"


def test_exercise_3_scores_over_values_is_a_stale_read(demo):
    emu, plan, model, ids = demo["emu"], demo["plan"], demo["model"], demo["ids"]
    run = emu.run(plan.place(SCORES.format(0), like="layers.0.self_attn.v_cache"))
    report = compare_arrays(run.reference, run.outputs, order=model.program.names, tokens=len(ids))
    fd = report.first_divergence
    assert fd.op == "layers.0.self_attn.context" and fd.nonfinite is None
    assert next(o.op for o in report.ops if o.nonfinite) == "layers.0.self_attn.o_proj"
    [h] = run.hazards
    assert (h.kind, h.event, h.other) == ("stale-read", 24, 22)
    assert run.schedule.events[h.event].name == "layers.0.self_attn.context"
    assert run.schedule.events[h.other].name == SCORES.format(0)
