"""Logits where they are needed (issue 28 item 2): ``trace(..., logits="all" | "last" | slice |
positions)`` at both granularities, the default under a logits budget, and what the hunt, the
lens and the debugger say about the positions they have."""
from __future__ import annotations

import json

import numpy as np
import pytest

import workbench
from workbench.trace.hunt import hunt
from workbench.trace import Positions

IDS = [2, 15, 16, 17, 18, 19, 20, 21, 22]
T = len(IDS)


@pytest.fixture(scope="module", params=["op", "module"])
def model(request):
    return workbench.load("assets/demo", granularity=request.param)


def _logits(m, logits=None):
    t = workbench.trace(m, IDS, dtype="float32", positions=Positions(logits=logits))
    t.run()
    return t, np.array(t.logits)[0]  # [P, vocab]: the one sequence of [1, P, vocab]


def test_last_and_slices_are_rows_of_all_bit_for_bit(model):
    t_all, full = _logits(model, logits="all")
    assert full.shape == (T, model.vocab_size) and t_all.logit_positions == range(T)
    t_last, last = _logits(model, logits="last")
    assert last.shape == (1, model.vocab_size) and t_last.logit_positions == range(T - 1, T)
    assert np.array_equal(last, full[-1:])
    t_sl, sl = _logits(model, logits=slice(2, 5))
    assert t_sl.logit_positions == range(2, 5) and np.array_equal(sl, full[2:5])
    t_ps, ps = _logits(model, logits=[-1, 0, 4])  # sorted, negatives from the end
    assert list(t_ps.logit_positions) == [0, 4, 8] and np.array_equal(ps, full[[0, 4, 8]])
    t_st, st = _logits(model, logits=slice(None, None, 3))
    assert t_st.logit_positions == range(0, 9, 3) and np.array_equal(st, full[0:9:3])


def test_only_the_rows_go_through_the_head(model, monkeypatch):
    """Past the exactness threshold the head itself computes only the selected rows."""
    monkeypatch.setenv("WORKBENCH_LOGITS_EXACT", "0")
    _, full = _logits(model, logits="all")
    t, last = _logits(model, logits="last")
    head = "lm_head" if "lm_head" in t.ops else "logits"
    assert tuple(t.step_info(head).output_shape)[-2:] == (1, model.vocab_size)
    np.testing.assert_allclose(last, full[-1:], rtol=0, atol=1e-5 * np.abs(full).max())


def test_default_is_all_at_a_small_prompt_and_last_past_the_budget(model, monkeypatch):
    t, full = _logits(model)
    assert t.logit_positions == range(T) and t.logits_note is None and full.shape[0] == T
    monkeypatch.setenv("WORKBENCH_LOGITS_BUDGET", "1kB")  # [9, 522] float32 is 18.8 kB
    t2, last = _logits(model)
    assert t2.logit_positions == range(T - 1, T) and last.shape == (1, model.vocab_size)
    assert "logits budget" in t2.logits_note and "WORKBENCH_LOGITS_BUDGET" in t2.logits_note
    assert "\n" not in t2.logits_note
    assert np.array_equal(last, full[-1:])
    monkeypatch.setenv("WORKBENCH_LOGITS_BUDGET", "1MB")
    t3, _ = _logits(model)
    assert t3.logit_positions == range(T)


@pytest.mark.parametrize("bad, err, words", [
    ("first", ValueError, "not one of 'all', 'last'"),
    ([9], ValueError, "position 9 out of range for a 9-token forward"),
    ([-10], ValueError, "position -10 out of range"),
    ([1, 1], ValueError, "position 1 given twice"),
    ([], ValueError, "no positions"),
    (slice(20, 30), ValueError, "selects no position"),
    (slice(0, 5, 0), ValueError, "step cannot be zero"),
    (3, TypeError, "not a bare integer"),
    ([1.5], TypeError, "is not an integer"),
    ([True], TypeError, "is not an integer"),
])
def test_bad_values_are_one_line_errors(model, bad, err, words):
    with pytest.raises(err) as e:
        workbench.trace(model, IDS, positions=Positions(logits=bad))
    msg = str(e.value)
    assert words in msg and "\n" not in msg and msg.startswith("logits=")


def test_the_hunt_carries_the_positions(model):
    r = hunt(model, IDS, positions=Positions(logits=slice(-2, None)))
    assert r.report["logits"] == {"positions": [7, 8], "of": T, "note": None}
    assert r.trace.logits.shape == (1, 2, model.vocab_size)
    assert hunt(model, IDS).report["logits"] == {"positions": "all", "of": T, "note": None}


def test_hunt_cli_logits(capsys):
    from workbench.cli import main

    rc = main(["hunt", "assets/demo", "--ids", ",".join(map(str, IDS)), "--logits", "last", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["logits"] == {"positions": [T - 1], "of": T, "note": None}
    rc = main(["hunt", "assets/demo", "--ids", ",".join(map(str, IDS)), "--logits", "first"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--logits 'first'" in err and len(err.splitlines()) == 1
    rc = main(["hunt", "assets/demo", "--ids", ",".join(map(str, IDS)), "--logits", "2:4"])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("logits: positions 2..3 of 9")


def test_the_lens_projects_its_own_positions_whatever_the_trace_kept():
    from workbench.plots import logit_lens

    m = workbench.load("assets/demo")
    lenses = []
    for logits in ("all", "last"):
        t = workbench.trace(m, IDS, capture="full", dtype="float32", positions=Positions(logits=logits))
        t.run()
        lenses.append(logit_lens(t, positions=[0, 4, 8]))
    a, b = lenses
    assert a.positions == b.positions == [0, 4, 8]
    assert np.array_equal(a.top_ids, b.top_ids) and np.array_equal(a.top_probs, b.top_probs)


def test_the_debugger_says_which_rows_the_head_has():
    from workbench.widgets import StepDebugger

    m = workbench.load("assets/demo")
    t = workbench.trace(m, IDS, capture="full", positions=Positions(logits=[0, -1]))
    t.run()
    d = StepDebugger(t)
    assert "the logits at 2 positions (0, 8) of 9" in d.current.value
    t.reset()
    t.run(until="layers.0")
    d.refresh()
    assert "the logits at" not in d.current.value


def test_module_level_refuses_when_the_head_cannot_be_separated(monkeypatch):
    m = workbench.load("assets/demo", granularity="module")
    monkeypatch.setattr(type(m), "head_input", lambda self, module: None)
    with pytest.raises(workbench.trace.TraceError) as e:
        workbench.trace(m, IDS, positions=Positions(logits="last"))
    assert "use logits='all'" in str(e.value) and "\n" not in str(e.value)
    t = workbench.trace(m, IDS)  # the default stays "all" there
    assert t.logit_positions == range(T)
