"""StepDebugger without a browser: click its buttons on real traces of a zoo checkpoint and
read what it shows (HTML, images, the log Output widget)."""
import asyncio
import re
import threading

import numpy as np
import pytest

import workbench
from workbench import zoo
from workbench.trace import inject, Run
from workbench.widgets import StepDebugger


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = zoo.build("gemma4_text", tmp_path_factory.mktemp("zoo") / "g4", dtype="float32")
    return workbench.load(path)


IDS = [1, 5, 9, 3, 7, 2]


def log_text(w) -> str:
    return "".join(o.get("text", "") for o in w.output.outputs)


def test_step_button_advances_and_shows_the_op(model):
    tr = workbench.trace(model, IDS, capture="full")
    w = StepDebugger(tr)
    assert "ready" in w.current.value and "embed_tokens" in w.current.value
    assert w.back_button.disabled and not w.step_button.disabled
    w.step_button.click()
    assert tr.position == 1
    assert "<b>embed_tokens</b>" in w.current.value and "<b>op #0</b>" in w.current.value
    assert f"1 of {len(tr.ops)} ops run" in w.current.value and f"numbered #0 to #{len(tr.ops) - 1}" in w.current.value
    assert "step → op #0 embed_tokens [1, 6, 64]" in log_text(w)
    assert bytes(w.heatmap.value).startswith(b"\x89PNG")
    st = tr.stats("embed_tokens")
    assert f"{st['absmax']:.4g}" in w.stats_html.value
    assert "fp16" in w.stats_html.value and "bf16" in w.stats_html.value
    w.step_button.click()
    assert tr.position == 2 and tr.ops[1] in w.current.value
    w.back_button.click()
    assert tr.position == 1 and "back ← undid op #1 " + tr.ops[1] in log_text(w)
    assert "<b>embed_tokens</b>" in w.current.value


def test_stepping_through_the_widget_equals_running(model):
    tr_ref = workbench.trace(model, IDS, capture="full", run=Run(attention="explicit"))
    tr_ref.run()
    tr = workbench.trace(model, IDS, capture="full", run=Run(attention="explicit"))
    w = StepDebugger(tr)
    for _ in range(20):
        w.step()
    w.step_layer()
    assert w.current_step.name == "layers.0"
    assert "layers.0" in w.norms_html.value and "<rect" in w.norms_html.value
    w.run_to("layers.1.self_attn.softmax")
    assert w.current_step.name == "layers.1.self_attn.softmax"
    assert w.attention_box.layout.display is None and w.attention.layout.display is None
    soft = np.array(tr.value("layers.1.self_attn.softmax"))[0]
    assert w.attention.title == "layers.1.self_attn.softmax" and w.attention.num_heads == soft.shape[0]
    np.testing.assert_array_equal(w.attention.values, soft[0])
    w.attention.head = 1
    np.testing.assert_array_equal(w.attention.values, soft[1])
    w.target.value = "layers.2"
    w.run_to_button.click()
    assert w.current_step.name == "layers.2"
    assert w.attention_box.layout.display == "none"  # not an attention op
    w.end_button.click()
    assert tr.done and w.step_button.disabled and w.progress.value == len(tr.ops)
    np.testing.assert_array_equal(np.array(tr.logits), np.array(tr_ref.logits))
    assert sorted(w._residual_norms()) == list(range(model.num_layers))


def test_next_nonfinite_stops_and_explains(model):
    bad = "layers.2.mlp.down_proj"
    tr = workbench.trace(model, IDS, capture="full", interventions=[inject(bad, float("nan"), index=3)])
    w = StepDebugger(tr)
    w.step()
    w.nonfinite_button.click()
    assert w.current_step.name == bad
    assert "non-finite!" in w.current.value
    assert "1 / 0 / 0" in w.stats_html.value  # one NaN, no inf
    text = log_text(w)
    assert "stopped: non-finite output" in text
    assert f"first non-finite value of this forward pass: {bad}" in text
    # the next click runs to the next op that is still non-finite (NaN propagates)
    w.next_nonfinite()
    assert w.current_step.index == tr.program.index(bad) + 1


def test_clean_forward_and_errors_are_reported_in_the_log(model):
    tr = workbench.trace(model, IDS, capture="stats")
    w = StepDebugger(tr)
    w.run_to("no.such.op")
    assert "no op named 'no.such.op'" in log_text(w) and tr.position == 0
    w.next_nonfinite()
    assert tr.done and "the forward pass is clean" in log_text(w)
    w.run_to("layers.0")
    assert "the trace is done" in log_text(w)
    # stats capture: values of past ops are gone; the widget says so instead of failing
    assert w.current_step.name == "logits"


def test_run_to_an_op_that_already_ran(model):
    tr = workbench.trace(model, IDS, capture="full")
    w = StepDebugger(tr)
    w.run_to("layers.1")
    w.run_to("layers.0")
    i = tr.program.index("layers.0")
    assert f"layers.0 (op #{i}) already ran" in log_text(w) and w.current_step.name == "layers.1"


def test_float16_infinity_shows_overflow_and_unknown_bf16_headroom(model):
    tr = workbench.trace(model, IDS, capture="full", dtype="float16",
                         interventions=[inject("layers.1.mlp.up_proj", float("inf"), index=5)])
    w = StepDebugger(tr)
    w.next_nonfinite()
    assert w.current_step.name == "layers.1.mlp.up_proj"
    html = w.stats_html.value
    assert "0 / 1 / 0" in html  # one +inf
    assert "overflow" in html and "unknown: infinite in this float16 run" in html
    # the heatmap draws the finite values and marks the infinity (colours clipped at a percentile)
    assert "99.5th percentile" in w.heatmap_note.value
    assert bytes(w.heatmap.value).startswith(b"\x89PNG")


def _header(w):
    """(op index, op name) the header shows, or None when nothing ran yet."""
    m = re.search(r"<b>op #(\d+)</b>: <code[^>]*><b>([^<]+)</b>", w.current.value)
    return (int(m.group(1)), m.group(2)) if m else None


def test_one_op_numbering_in_header_log_and_hunt(model):
    bad = "layers.1.mlp.down_proj"
    tr = workbench.trace(model, IDS, capture="full", interventions=[inject(bad, float("nan"), index=2)])
    w = StepDebugger(tr)
    w.nonfinite_button.click()
    i = tr.program.index(bad)
    assert tr.steps[-1].index == i and _header(w) == (i, bad)
    text = log_text(w)
    assert f"→ op #{i} {bad}" in text  # the log
    assert f"op {i})" in text  # the hunt's explanation (Finding) names the same number
    w.step_button.click()
    assert _header(w) == (i + 1, tr.ops[i + 1]) and f"step → op #{i + 1} {tr.ops[i + 1]}" in log_text(w)


def _click_from(thread_name, btn):
    """Click as ipykernel does for JupyterLab: on a subshell's own thread."""
    t = threading.Thread(target=btn.click, name=thread_name)
    t.start()
    t.join()


async def _handled(w, n, timeout=60.0):
    """Let the widget's thread (this event loop) run the handed-over callbacks."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while w.actions.count < n:
        assert loop.time() < end, f"callback not run ({w.actions.count} of {n} handled)"
        await asyncio.sleep(0.01)


def test_clicks_from_a_subshell_thread_run_on_the_widget_thread(model):
    """The freeze: JupyterLab sends widget messages to a kernel subshell, handled on another
    thread than the cells'.  The trace's lazy feeds and the model's lazily loaded weights
    are MLX graph nodes on the main thread's stream, which that thread cannot evaluate
    ("There is no Stream(cpu, 0) in current thread").  The clicks are handed to the widget's
    thread; every one ends with the view on the trace's state and no error."""
    fresh = workbench.load(model.path, dtype="float32")  # weights still lazy, as in a notebook
    bad = "layers.2.mlp.down_proj"
    ran_on = []

    async def main():
        tr = workbench.trace(fresh, IDS, capture="full", interventions=[inject(bad, float("nan"), index=3)],
                             run=Run(attention="explicit"))
        w = StepDebugger(tr)
        real_run = tr.run
        tr.run = lambda *a, **k: (ran_on.append(threading.current_thread().name), real_run(*a, **k))[1]
        w.run_to("layers.0.self_attn.softmax")  # a cell ran this on the main thread
        n = 0
        for btn, want in [(w.layer_button, "layers.0"), (w.nonfinite_button, bad), (w.end_button, "logits"),
                          (w.back_button, tr.ops[-2])]:
            _click_from("subshell-test", btn)
            n += 1
            await _handled(w, n)
            assert w.actions.error is None, w.actions.error
            s = tr.steps[-1]
            assert s.name == want and _header(w) == (s.index, s.name)
            assert w.progress.value == tr.position
        w.target.value = "layers.3"
        _click_from("subshell-test", w.run_to_button)
        await _handled(w, n + 1)
        assert w.actions.error is None and "layers.3 (op #" in log_text(w)
        return tr

    tr = asyncio.run(main())
    assert set(ran_on) == {"MainThread"} and len(ran_on) > 4
    assert tr.position == len(tr.ops) - 1


def test_an_error_in_a_button_is_shown_in_the_widget(model):
    def boom(v):
        raise ValueError("planted failure")

    tr = workbench.trace(model, IDS, capture="full", interventions={"layers.1.self_attn.o_proj": boom})
    w = StepDebugger(tr)
    assert "wb-error-none" in w.actions.area.value
    w.end_button.click()  # no exception escapes the callback (ipywidgets would only log it)
    err = w.actions.area.value
    assert "end failed" in err and "planted failure" in err and "traceback" in err
    assert w.actions.error is not None and 'data-actions=\'1\'' in err
    # the view shows where the trace stopped, its buttons usable again
    s = tr.steps[-1]
    assert _header(w) == (s.index, s.name) and not w.back_button.disabled and not w.step_button.disabled
    w.back_button.click()  # the next action that works clears the error
    assert w.actions.error is None and "wb-error-none" in w.actions.area.value
    assert _header(w) == (tr.steps[-1].index, tr.steps[-1].name)


# ---------------------------------------------------------------- forgiving: names, start, end, layers

def test_run_to_a_typo_runs_nothing_and_suggests_the_closest_names(model):
    tr = workbench.trace(model, IDS, capture="stats", run=Run(attention="explicit"))  # softmax steps
    w = StepDebugger(tr)
    assert w.target.ensure_option is False  # the typed text reaches Python, not the last valid prefix
    w.run_to("layers.1")
    at = tr.position
    for typo, want in (("layers.2.self_atn.softmax", "layers.2.self_attn.softmax"),
                       ("lyers.2", "layers.2"), ("layers.2.mlp.dwn_proj", "layers.2.mlp.down_proj")):
        w.target.value = typo
        w.run_to_button.click()
        assert tr.position == at and w.actions.error is None, typo  # nothing ran (no prefix, no logits)
        assert f"no op named {typo!r}; did you mean {want}" in w.target_hint.value.replace("&#x27;", "'"), \
            w.target_hint.value
        assert "nothing ran" in log_text(w).splitlines()[-1]
    w.target.value = "  "
    w.run_to_button.click()
    assert tr.position == at and "type an op name" in w.target_hint.value
    w.target.value = " layers.2 "  # a full name with stray spaces is that name
    w.run_to_button.click()
    assert w.current_step.name == "layers.2" and w.target_hint.value == ""


def test_start_and_end_buttons(model):
    tr = workbench.trace(model, IDS, capture="full")
    w = StepDebugger(tr)
    assert w.start_button.disabled and w.end_button.description == "end"
    w.run_to("layers.1.mlp.act")
    assert not w.start_button.disabled
    w.start_button.click()
    assert tr.position == 0 and not tr.steps and "ready" in w.current.value and w.start_button.disabled
    assert w.progress.value == 0 and log_text(w).splitlines()[-1].startswith("start: undid ")
    w.end_button.click()
    assert tr.done and w.current_step.name == tr.ops[-1] and w.end_button.disabled
    w.start_button.click()
    w.step_button.click()
    assert tr.position == 1 and w.current_step.name == tr.ops[0]


def test_step_over_layer_goes_from_boundary_to_boundary_from_anywhere(model):
    tr = workbench.trace(model, IDS, capture="stats")
    w = StepDebugger(tr)
    names = []
    while not tr.done:
        w.layer_button.click()
        names.append(w.current_step.name)
    first_layer = next(i for i, op in enumerate(tr.program.ops) if op.layer == 0)
    # from the start: one click over the embedding ops, then one per layer, then the head
    assert names[0] == tr.ops[first_layer - 1] and tr.program.ops[first_layer - 1].layer is None
    assert names[1:-1] == [f"layers.{i}" for i in range(model.num_layers)]
    assert names[-1] == tr.ops[-1] and len(names) == model.num_layers + 2
    w.start_button.click()
    w.run_to("layers.3.self_attn.q_proj")  # from inside a layer: to its end
    w.layer_button.click()
    assert w.current_step.name == "layers.3"


def test_navigate_find_op_is_exact_and_suggests():
    from workbench.trace.navigate import NoSuchOp, closest_ops, find_op

    ops = ["embed_tokens", "layers.0.self_attn.softmax", "layers.0", "layers.1.self_attn.softmax", "layers.1",
           "norm", "logits"]
    assert find_op(ops, "layers.1") == 4 and find_op(ops, " norm\n") == 5
    with pytest.raises(NoSuchOp) as e:
        find_op(ops, "layers.1.self_atn.softmax")
    assert e.value.suggestions[0] == "layers.1.self_attn.softmax"
    assert "did you mean layers.1.self_attn.softmax" in str(e.value)
    with pytest.raises(NoSuchOp) as e:
        find_op(ops, "layers.1.self")  # a prefix is not a name
    with pytest.raises(NoSuchOp) as e:
        find_op(ops, "zzzzzz")
    assert e.value.suggestions == [] and "see trace.ops" in str(e.value)
    assert closest_ops(ops, "softmax") == ["layers.0.self_attn.softmax", "layers.1.self_attn.softmax"]
    with pytest.raises(TypeError):
        find_op(ops, 3)


def test_saved_views_are_disabled_and_say_run_the_cell(model):
    from ipywidgets.embed import dependency_state

    from workbench.widgets.saved import UNRUN, WIDGET_STATE, WIDGET_VIEW, mark_unrun

    tr = workbench.trace(model, IDS, capture="stats")
    w = StepDebugger(tr)
    w.step()
    state = dependency_state(w)
    nb = {"metadata": {"widgets": {WIDGET_STATE: {"state": state}}},
          "cells": [{"outputs": [{"data": {WIDGET_VIEW: {"model_id": w.model_id}}}]}, {"outputs": []}]}
    buttons = [m for m, s in state.items() if s["model_name"] == "ButtonModel"]
    assert len(buttons) == 7 and not all(state[m]["state"].get("disabled", False) for m in buttons)
    assert mark_unrun(nb) == 1
    assert all(state[m]["state"]["disabled"] for m in buttons)
    assert state[w.target.model_id]["state"]["disabled"]
    assert UNRUN in state[w.actions.area.model_id]["state"]["value"]
    assert not w.step_button.disabled and UNRUN not in w.actions.area.value  # the live widget: untouched
    assert UNRUN in repr(w) and "children=" not in repr(w)
    assert mark_unrun({"cells": []}) == 0  # no saved state: nothing to do
