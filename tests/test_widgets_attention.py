"""AttentionView without a browser: its state (labels, values, head) from known patterns and
from a trace; the StepDebugger's attention panel (the view on an op-program trace, a note at
module granularity); sequential colour maps for probabilities in the figures and the debugger."""
import io

import numpy as np
import pytest
import traitlets

import workbench
from workbench.demo.paths import DEMO
from workbench.widgets import AttentionView, StepDebugger
from workbench.trace import Run

PROMPT = "apple river stone | apple river"


def causal(h, t, seed=0):
    """A known pattern: random causal rows that sum to 1 (exact zeros above the diagonal)."""
    rng = np.random.default_rng(seed)
    a = np.tril(rng.random((h, t, t)) + 0.01).astype(np.float32)
    return a / a.sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def demo():
    return workbench.load(DEMO, dtype="float32")


@pytest.fixture(scope="module")
def tr(demo):
    t = workbench.trace(demo, PROMPT, capture="full", run=Run(attention="explicit"))
    t.run()
    return t


def test_state_holds_labels_values_and_the_picked_head():
    p = causal(3, 5)
    toks = ["<bos>", " the", " cat", " sat", "\n"]
    w = AttentionView(p, toks, toks, head=2, title="t")
    assert w.shape == [3, 5, 5] and w.num_heads == 3 and w.head == 2
    assert w.tokens_q == toks and w.tokens_k == toks and w.title == "t"
    np.testing.assert_array_equal(w.patterns, p)          # every head travels (bytes, float32)
    np.testing.assert_array_equal(w.values, p[2])
    assert w.values[0, 1] == 0.0                            # masked cells stay exactly 0
    w.head = 0
    np.testing.assert_array_equal(w.values, p[0])
    with pytest.raises(traitlets.TraitError, match="head 3 out of range"):
        w.head = 3
    # the palette is sequential: white-ish at 0, dark blue at 1, lightness falling all the way
    rgb = np.array([[int(c[i:i + 2], 16) for i in (1, 3, 5)] for c in w.palette])
    assert len(rgb) == 256 and rgb[0].min() > 240 and rgb[-1][2] > rgb[-1][0] and rgb[-1].sum() < 200
    assert np.all(np.diff(rgb.sum(1)) <= 0)
    # a [T, S] pattern is one head; keys may outnumber queries (a KV cache)
    w.show(p[1, 3:], toks[3:], toks)
    assert w.shape == [1, 2, 5] and w.head == 0 and w.tokens_q == toks[3:]
    np.testing.assert_array_equal(w.values, p[1, 3:])


@pytest.mark.parametrize("args, msg", [
    ((np.zeros((2, 3, 3)), ["a", "b"], None), "2 query tokens for 3 query positions"),
    ((np.zeros((2, 3, 3)), None, ["a"]), "1 key tokens for 3 key positions"),
    ((np.zeros(3), None, None), r"expected \[H, T, S\] or \[T, S\], got shape \[3\]"),
])
def test_bad_patterns_are_refused_by_name(args, msg):
    with pytest.raises(ValueError, match=msg):
        AttentionView(*args)
    with pytest.raises(ValueError, match="head 4 out of range"):
        AttentionView(np.zeros((2, 3, 3)), head=4)


def test_from_trace_reads_the_softmax_and_the_tokens(demo, tr):
    w = AttentionView.from_trace(tr, layer=1, head=2)
    soft = np.array(tr.value("layers.1.self_attn.softmax"))[0]
    toks = [demo.decode([i]) for i in tr.ids[0].tolist()]
    assert w.title == "layers.1.self_attn.softmax" and w.head == 2
    assert w.tokens_q == toks == w.tokens_k and toks[1] == " apple"
    np.testing.assert_array_equal(w.values, soft[2])
    np.testing.assert_allclose(w.values.sum(-1), 1.0, rtol=1e-5)
    assert np.all(np.triu(w.values, 1) == 0)
    # fused attention (the default), nothing kept: the probabilities recomputed for the layer
    stats = workbench.trace(demo, PROMPT, capture="stats")
    stats.run()
    f = AttentionView.from_trace(stats, layer=1, head=2)
    assert f.title == "layers.1.self_attn.context"
    np.testing.assert_allclose(f.values, soft[2], atol=1e-6)
    with pytest.raises(ValueError, match="layers.9.self_attn.softmax: no such op"):
        AttentionView.from_trace(tr, layer=9)


def test_debugger_shows_the_view_on_a_softmax_step(demo):
    t = workbench.trace(demo, PROMPT, capture="full", run=Run(attention="explicit"))
    d = StepDebugger(t, head=3)
    d.run_to("layers.1.self_attn.scores")                # before the softmax: a note, no view
    assert d.attention_box.layout.display is None and d.attention.layout.display == "none"
    assert "appears once op #" in d.attention_note.value and "layers.1.self_attn.softmax" in d.attention_note.value
    d.step()
    assert d.current_step.name == "layers.1.self_attn.softmax"
    assert d.attention.layout.display is None and d.attention.title == "layers.1.self_attn.softmax"
    soft = np.array(t.value("layers.1.self_attn.softmax"))[0]
    assert d.attention.head == 3                          # the head asked for
    np.testing.assert_array_equal(d.attention.values, soft[3])
    assert d.attention.tokens_q[1] == " apple" and len(d.attention.tokens_k) == soft.shape[-1]
    # the value heatmap of the softmax: a sequential map, not red/blue
    assert "non-negative values: white = 0 to dark blue" in d.heatmap_note.value
    from matplotlib.image import imread
    img = imread(io.BytesIO(bytes(d.heatmap.value)))[..., :3]
    red = (img[..., 0] > img[..., 2] + 0.15).mean()
    assert red == 0.0 and img.min() < 0.5                # no red cells; some dark blue ones
    d.step()                                              # the next attention op keeps the pattern
    assert d.attention.layout.display is None and d.attention.head == 3
    d.run_to("layers.1")                                  # not an attention op
    assert d.attention_box.layout.display == "none"
    d.run_to("layers.2.self_attn.o_proj")                 # an attention op again, with a tiny size limit
    from workbench.widgets import debugger as dbg_mod
    limit, dbg_mod.ATTENTION_MAX_BYTES = dbg_mod.ATTENTION_MAX_BYTES, 64
    try:
        d.refresh()
        assert d.attention.layout.display == "none" and "too large to send" in d.attention_note.value
    finally:
        dbg_mod.ATTENTION_MAX_BYTES = limit


def test_debugger_notes_that_module_granularity_has_no_pattern(tmp_path):
    from workbench.zoo import reference as zoo_ref

    m = workbench.load(zoo_ref.build("qwen2_moe", tmp_path / "q2moe"))
    assert m.granularity == "module"
    t = workbench.trace(m, [3, 17, 42, 9], capture="full")
    d = StepDebugger(t)
    d.run_to("layers.0.self_attn.q_proj")
    assert d.attention_box.layout.display is None and d.attention.layout.display == "none"
    assert "module granularity" in d.attention_note.value and "no softmax step" in d.attention_note.value
    assert d.attention_note.value.count("<br") == 0       # one line
    with pytest.raises(ValueError, match="module granularity"):
        AttentionView.from_trace(t, layer=0)


def ax_hatched(ax) -> bool:
    return bool(ax.patch.get_hatch())


def test_figures_draw_probabilities_with_a_sequential_map(tr):
    from matplotlib.colors import TwoSlopeNorm

    from workbench.plots import activation_heatmap, attention_pattern

    soft = np.array(tr.value("layers.1.self_attn.softmax"))
    fig = attention_pattern(soft, head=1)
    im = fig.axes[0].images[0]
    assert im.get_cmap().name == "Blues" and not isinstance(im.norm, TwoSlopeNorm)
    assert (im.norm.vmin, im.norm.vmax) == (0.0, 1.0)
    shown = im.get_array()
    assert shown.mask[0, 1] and shown.data[0, 1] == 0     # masked cells left blank (hatched), not coloured
    assert not shown.mask[1, 0] and ax_hatched(fig.axes[0])
    white, dark = im.get_cmap()(0.0), im.get_cmap()(1.0)
    assert min(white[:3]) > 0.9 and dark[2] > dark[0] and sum(dark[:3]) < 1.0
    # an activation that is a probability (no negative value): sequential from 0
    im = activation_heatmap(soft).axes[0].images[0]
    assert not isinstance(im.norm, TwoSlopeNorm) and im.norm.vmin == 0.0 and im.get_cmap().name == "Blues"
    # a signed one keeps the diverging map, centred on 0
    im = activation_heatmap(np.array(tr.value("layers.1"))).axes[0].images[0]
    assert isinstance(im.norm, TwoSlopeNorm) and im.norm.vcenter == 0.0


def test_debugger_explains_its_abbreviations(tr, demo):
    t = workbench.trace(demo, PROMPT, capture="full")
    d = StepDebugger(t)
    d.run_to("layers.0")
    html = d.stats_html.value + d.norms_html.value + d.heatmap_note.value
    for term in ("std", "absmax", "NaN", "+inf", "headroom", "fp16", "bf16", "RMS"):
        assert f">{term}</abbr>" in html.replace("&#x27;", "'"), term
    assert 'title="standard deviation' in html and 'title="absolute maximum' in html


def test_every_widget_explains_its_abbreviations(tmp_path):
    """WeightBrowser, DiffView and HazardTimeline: each abbreviation they show carries its
    explanation (a tooltip where it is HTML, a legend line where it is text)."""
    from workbench import zoo
    from workbench.buffers import Emulator
    from workbench.diff import compare_arrays
    from workbench.widgets import DiffView, HazardTimeline, WeightBrowser
    from workbench.widgets._render import GLOSSARY

    def tip(term):
        return f'title="{GLOSSARY[term]}'.replace("'", "&#x27;")

    def out_text(out):
        return "".join(o.get("text", "") or o.get("data", {}).get("text/html", "") for o in out.outputs)

    rep = workbench.inspect(zoo.build("gemma4_text", tmp_path / "m", broken="misnamed"), values=True)
    wb = WeightBrowser(rep)
    wb.select("model.layers.1.mlp.down_prj.weight")   # present, with statistics
    html = out_text(wb.detail) + wb.grid.value + wb.legend.value
    for term in ("std", "absmax", "NaN", "+inf", "zeros", "✗", "!", "attn"):
        assert tip(term) in html, term
    assert f"std = {GLOSSARY['std']}" in wb.grid.value   # the statistic drawn, said in words

    rng = np.random.default_rng(0)
    ref = {n: rng.standard_normal((4, 8)).astype(np.float32) for n in ("a", "b")}
    eng = {n: v.copy() for n, v in ref.items()}
    eng["b"][1, 2] = np.nan
    dv = DiffView(compare_arrays(ref, eng, order=["a", "b"]))
    for m in ("nmse", "1-cosine", "max_abs", "max_rel"):
        assert tip(m) in dv.legend.value and m in dv.metrics.tooltip
    dv.show("b")
    text = out_text(dv.detail)
    assert f"cosine = {GLOSSARY['cosine']}" in text and f"nmse = {GLOSSARY['nmse']}" in text
    assert tip("NaN") in text and tip("ref") in text

    model = workbench.load(DEMO, dtype="float32")
    emu = Emulator(model, model.encode(PROMPT))
    plan = emu.plan().place("layers.1.self_attn.o_proj", like="layers.1.self_attn.context")
    ht = HazardTimeline(emu.run(plan).schedule)
    for k in ("raw", "war", "waw", "cb"):
        assert tip(k) in ht.legend.value, k
    assert ht.hazards and tip("cb") in out_text(ht.detail)
