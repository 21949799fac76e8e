"""Strings wherever a person types a token (issue 30 item 3): the model's string helpers,
the causal metrics and tools, the logit lens; a text of several tokens is one error naming
its pieces unless first_token=True; labels show tokens as text, with the ids they became."""
from __future__ import annotations

import re

import workbench  # noqa: F401  (fast BLAS before mlx.core)

import mlx.core as mx
import numpy as np
import pytest

from workbench.causal.attribution import direct_logit_attribution
from workbench.causal.common import as_metric, logit_diff, token_prob
from workbench.causal.patching import activation_patching
from workbench.demo.paths import DEMO
from workbench.plots.analysis import logit_lens

PROMPT = "tom blue cup . anna red ball . tom"


@pytest.fixture(scope="module")
def model():
    return workbench.load(DEMO, dtype="float32")


def one(model, text):
    ids = model.tokenizer.encode(text, add_special_tokens=False).ids
    assert len(ids) == 1, (text, ids)
    return ids[0]


def test_model_string_helpers(model):
    ids = model.encode(PROMPT)
    strs = model.to_str_tokens(PROMPT)
    assert strs == [model.decode([i]) for i in ids] and len(strs) == len(ids) and "".join(strs[1:]).strip() == PROMPT
    assert model.to_str_tokens(ids) == strs == model.to_str_tokens(mx.array([ids]))  # ids, or [1, T] as tr.ids
    blue = model.to_single_token(" blue")
    assert model.decode([blue]) == " blue" and blue == one(model, " blue")
    two = model.tokenizer.encode("blue red", add_special_tokens=False).ids
    with pytest.raises(ValueError) as e:
        model.to_single_token("blue red")
    msg = str(e.value)
    assert "'blue red' is 2 tokens, not one" in msg and "first_token=True" in msg
    assert all(f"{model.decode([i])!r} ({i})" in msg for i in two), msg
    assert model.to_single_token("blue red", first_token=True) == two[0]
    with pytest.raises(ValueError, match="encodes to no token"):
        model.to_single_token("")


def test_metrics_take_strings_label_them_and_say_their_ids(model):
    blue, red = one(model, " blue"), one(model, " red")
    tr = workbench.trace(model, PROMPT, dtype="float32")
    tr.run()
    last = np.array(tr.logits[0, -1])
    m = as_metric(logit_diff(" blue", " red"), model)
    assert m.label == "logit[' blue'] - logit[' red'] @ -1"
    assert m.tokens == ((" blue", blue), (" red", red)) and m.token_ids == f"' blue' = {blue}, ' red' = {red}"
    assert float(m(tr.logits)[0]) == pytest.approx(float(last[blue] - last[red]), abs=1e-5)
    by_id = as_metric(logit_diff(blue, red), model)  # ids are labelled by their text too
    assert by_id.label == m.label and by_id.tokens == m.tokens
    p = as_metric(token_prob(" red"), model)
    assert p.label == "p(' red') @ -1" and p.tokens == ((" red", red),)
    with pytest.raises(ValueError, match=r"answer 'blue red' is 2 tokens, not one: ' blue' \(\d+\), ' red' \(\d+\)"):
        as_metric(logit_diff("blue red", " red"), model)
    first = as_metric(logit_diff("blue red", " red", first_token=True), model)
    assert first.tokens[0] == (" blue", blue)


def test_tools_take_strings_and_label_with_text(model):
    blue, red = one(model, " blue"), one(model, " red")
    d = direct_logit_attribution(model, PROMPT, answer=" blue", wrong=" red")
    assert (d.answer, d.wrong, d.answer_token, d.wrong_token) == (blue, red, " blue", " red")
    assert d.metric == f"logit[' blue'] - logit[' red'] @ {len(model.encode(PROMPT)) - 1}"
    with pytest.raises(ValueError, match="'blue red' is 2 tokens"):
        direct_logit_attribution(model, PROMPT, answer="blue red")
    # the default metric of patching (the two runs' own top tokens) is labelled with their text
    r = activation_patching(model, PROMPT, "tom blue cup . anna red ball . anna")
    assert re.fullmatch(r"logit\['[^']+'\] - logit\['[^']+'\] @ -1", r.metric), r.metric
    from workbench.plots.causal import patching_heatmap
    fig = patching_heatmap(r, normalized=False)
    assert r.metric in fig.axes[0].get_title() and not re.search(r"logit\[\d", fig.axes[0].get_title())


def test_the_lens_tracks_a_token_given_as_text(model):
    blue = one(model, " blue")
    tr = workbench.trace(model, PROMPT, capture="full", dtype="float32")
    tr.run()
    lens = logit_lens(tr, track=" blue")
    t = lens.tracked
    assert t["token"] == " blue" and t["id"] == blue
    assert t["prob"].shape == t["rank"].shape == (len(lens.layers), len(lens.positions))
    # the last layer's projection is the model's own head: its probability of ' blue' there
    p = np.array(mx.softmax(tr.logits[0, lens.positions[-1]].astype(mx.float32), precise=True))
    assert t["prob"][-1, -1] == pytest.approx(float(p[blue]), rel=1e-4)
    assert t["rank"][-1, -1] == int((p > p[blue]).sum())
    assert np.array_equal(logit_lens(tr, track=blue).tracked["prob"], t["prob"])
    with pytest.raises(ValueError, match="'blue red' is 2 tokens"):
        logit_lens(tr, track="blue red")
    with pytest.raises(TypeError, match="track is a token id"):
        logit_lens(tr, track=True)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        logit_lens(tr, track=10**6)
