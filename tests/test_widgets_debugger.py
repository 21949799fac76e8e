"""StepDebugger without a browser: click its buttons on real traces of a zoo checkpoint and
read what it shows (HTML, images, the log Output widget)."""
import numpy as np
import pytest

import workbench
from workbench import zoo
from workbench.trace import inject
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
    assert "<b>embed_tokens</b>" in w.current.value and "op 1 / " in w.current.value
    assert "step → #0 embed_tokens [1, 6, 64]" in log_text(w)
    assert bytes(w.heatmap.value).startswith(b"\x89PNG")
    st = tr.stats("embed_tokens")
    assert f"{st['absmax']:.4g}" in w.stats_html.value
    assert "fp16" in w.stats_html.value and "bf16" in w.stats_html.value
    w.step_button.click()
    assert tr.position == 2 and tr.ops[1] in w.current.value
    w.back_button.click()
    assert tr.position == 1 and "back ← undid " + tr.ops[1] in log_text(w)
    assert "<b>embed_tokens</b>" in w.current.value


def test_stepping_through_the_widget_equals_running(model):
    tr_ref = workbench.trace(model, IDS, capture="full")
    tr_ref.run()
    tr = workbench.trace(model, IDS, capture="full")
    w = StepDebugger(tr)
    for _ in range(20):
        w.step()
    w.step_layer()
    assert w.current_step.name == "layers.0"
    assert "layers.0" in w.norms_html.value and "<rect" in w.norms_html.value
    w.run_to("layers.1.self_attn.softmax")
    assert w.current_step.name == "layers.1.self_attn.softmax"
    assert w.attention_box.layout.display is None and bytes(w.attention.value).startswith(b"\x89PNG")
    assert "head 0 of" in w.attention_note.value
    w.head.value = 1
    assert "head 1 of" in w.attention_note.value
    w.target.value = "layers.2"
    w.run_to_button.click()
    assert w.current_step.name == "layers.2"
    assert w.attention_box.layout.display == "none"  # not an attention op
    w.end_button.click()
    assert tr.done and w.step_button.disabled and w.progress.value == len(tr.ops)
    np.testing.assert_array_equal(np.array(tr.logits), np.array(tr_ref.logits))
    assert sorted(w._norms) == list(range(model.num_layers))


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
    assert "layers.0 already ran" in log_text(w) and w.current_step.name == "layers.1"


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
