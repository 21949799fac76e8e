"""Plots from real data (a zoo checkpoint's forward pass): the right artists, labels and numbers."""
import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

import workbench
from workbench import zoo
from workbench.diff import compare, run_reference
from workbench.plots import (activation_heatmap, attention_pattern, error_curve, logit_lens, logit_lens_plot,
                             project, residual_norm_plot, residual_norms, save, weight_histogram)

IDS = [5, 17, 3, 42, 8, 99, 23]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return workbench.load(zoo.build("gemma3_text", tmp_path_factory.mktemp("g3") / "g3", dtype="float32"),
                          attention="explicit")  # the attention-pattern figure reads the softmax


@pytest.fixture(scope="module")
def ref(model):
    return run_reference(model, ids=IDS)


def _png(fig, tmp_path, name):
    p = save(fig, str(tmp_path / f"{name}.png"))
    assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_error_curve(model, ref, tmp_path):
    eng = dict(ref.values)
    eng["layers.2.mlp.down_proj"] = eng["layers.2.mlp.down_proj"] * 1.5
    report = compare(ref, eng)
    fig = error_curve(report)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    labels = [l.get_label() for l in ax.get_lines()]
    assert "nmse" in labels and "1-cosine" in labels
    assert "first divergence: layers.2.mlp.down_proj" in labels
    marker = ax.get_lines()[labels.index("first divergence: layers.2.mlp.down_proj")]
    assert marker.get_xdata()[0] == report.first_divergence.index
    assert "layers.2.mlp.down_proj" in ax.get_title()
    # one boundary per layer, labelled on the top axis
    sec = [c for c in ax.child_axes]
    ticks = [t.get_text() for t in sec[0].get_xticklabels()]
    assert ticks == [f"L{i}" for i in range(model.num_layers)]
    nmse_line = ax.get_lines()[labels.index("nmse")]
    i = list(nmse_line.get_xdata()).index(report.first_divergence.index)
    assert nmse_line.get_ydata()[i] == pytest.approx(report.first_divergence.nmse)
    _png(fig, tmp_path, "err")
    clean = error_curve(compare(ref, ref.values))
    assert "no divergence" in clean.axes[0].get_title()
    ticks = [l for l in clean.axes[0].get_lines() if l.get_label() == "exact (error 0)"][0]
    assert len(ticks.get_xdata()) == len(ref.values)  # every op exact: each gets a tick, no curve


def test_activation_heatmap(model, ref, tmp_path):
    x = ref.values["layers.1.mlp.act"].copy()
    toks = [f"t{i}" for i in IDS]
    fig = activation_heatmap(x, title="layers.1.mlp.act", tokens=toks)
    ax = fig.axes[0]
    im = ax.get_images()[0]
    np.testing.assert_array_equal(np.asarray(im.get_array()), x[0])
    assert [t.get_text() for t in ax.get_yticklabels()] == toks
    assert "layers.1.mlp.act" in ax.get_title() and f"absmax {np.abs(x).max():.3g}" in ax.get_title()
    x[0, 2, 5] = np.nan
    x[0, 4, 7] = np.inf
    fig = activation_heatmap(x)
    labels = [l.get_label() for l in fig.axes[0].get_lines()]
    assert labels == ["nan (1)", "+inf (1)"] and "non-finite 2" in fig.axes[0].get_title()
    _png(fig, tmp_path, "heat")


def test_attention_pattern(model, ref, tmp_path):
    w = ref.values["layers.1.self_attn.softmax"]
    fig = attention_pattern(w, head=1, tokens=[str(i) for i in IDS])
    ax = fig.axes[0]
    data = np.asarray(ax.get_images()[0].get_array())
    np.testing.assert_allclose(data, w[0, 1])
    np.testing.assert_allclose(data.sum(-1), 1.0, rtol=1e-5)
    assert np.all(np.triu(data, 1) == 0)  # causal
    assert ax.get_xlabel().startswith("key") and ax.get_ylabel().startswith("query")
    assert f"head 1 of {w.shape[1]}" in ax.get_title()
    with pytest.raises(ValueError, match="head 9 out of range"):
        attention_pattern(w, head=9)
    _png(fig, tmp_path, "attn")


def test_residual_norms(model, ref, tmp_path):
    rn = residual_norms(ref.values)
    assert rn.layers == list(range(model.num_layers))
    for i in rn.layers:
        np.testing.assert_allclose(rn.norms[i], np.linalg.norm(ref.values[f"layers.{i}"][0], axis=-1), rtol=1e-5)
    # the stream entering layer 0 is the scaled embedding (Gemma), not the raw lookup
    np.testing.assert_allclose(rn.embed, np.linalg.norm(ref.values["embed_scale"][0], axis=-1), rtol=1e-5)
    fig = residual_norm_plot(ref.values)
    ax = fig.axes[0]
    mean = [l for l in ax.get_lines() if l.get_label() == "mean over tokens"][0]
    np.testing.assert_allclose(mean.get_ydata()[1:], rn.norms.mean(1))
    assert [t.get_text() for t in ax.get_xticklabels()][:2] == ["emb", "0"]
    _png(fig, tmp_path, "resid")


def test_weight_histogram(model, tmp_path):
    w = np.array(model.op_tensors("layers.0.mlp.up_proj")["layers.0.mlp.up_proj.weight"])
    fig = weight_histogram(w, "layers.0.mlp.up_proj.weight", bins=50)
    ax = fig.axes[0]
    bars = ax.containers[0]
    assert len(bars) == 50
    assert sum(p.get_height() for p in bars) == w.size  # every value lands in a bin
    box = [t.get_text() for t in ax.texts][0]
    assert f"n = {w.size:,}" in box and "float16" not in box
    w2 = w.copy()
    w2.flat[0] = 1e5
    w2.flat[1] = np.nan
    box = " ".join(t.get_text() for t in weight_histogram(w2, "w").axes[0].texts)
    assert "exceeds float16 range" in box and "non-finite 1" in box and "1 outlier(s) above" in box
    _png(fig, tmp_path, "hist")


def test_logit_lens(model, ref, tmp_path):
    # the tail replay is exact: projecting the last residual reproduces the logits
    import mlx.core as mx
    last = f"layers.{model.num_layers - 1}"
    logits = project(model.program, model.context(), mx.array(ref.values[last]))
    np.testing.assert_allclose(np.array(logits), ref.values["logits"], rtol=1e-5, atol=1e-5)
    lens = logit_lens(model, ref.values, ids=IDS, k=3)
    assert lens.layers == list(range(model.num_layers)) and lens.positions == list(range(len(IDS)))
    assert lens.top_ids.shape == (model.num_layers, len(IDS), 3)
    np.testing.assert_array_equal(lens.final_ids, ref.values["logits"][0].argmax(-1))
    assert np.all(lens.final_rank[-1] == 0)
    assert np.all(np.diff(lens.top_probs, axis=-1) <= 0)  # sorted
    fig = logit_lens_plot(lens)
    ax = fig.axes[0]
    assert len(ax.texts) == model.num_layers * len(IDS)
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"layers.{i}" for i in lens.layers]
    assert sum(1 for p in ax.patches) >= len(IDS)  # the last layer always matches the final prediction
    _png(fig, tmp_path, "lens")


def test_plots_take_a_trace(model, ref):
    tr = workbench.trace(model, IDS, capture="full")
    tr.run()
    lens = logit_lens(tr, k=2)  # program, context, values and ids all from the trace
    assert lens.layers == list(range(model.num_layers))
    np.testing.assert_array_equal(lens.final_ids, ref.values["logits"][0].argmax(-1))
    assert len(lens.tokens) == len(IDS)
    rn = residual_norms(tr)
    np.testing.assert_allclose(rn.norms, residual_norms(ref.values).norms, rtol=1e-5)
    np.testing.assert_allclose(rn.embed, np.linalg.norm(ref.values["embed_scale"][0], axis=-1), rtol=1e-5)
    stats_only = workbench.trace(model, IDS, capture="stats")
    stats_only.run()
    with pytest.raises(ValueError, match="capture them"):
        residual_norms(stats_only)


def test_error_curve_marks_the_first_local_divergence(model):
    import mlx.core as mx
    from workbench.trace.interventions import patch
    tr = workbench.trace(model, IDS, capture="full", dtype="bfloat16",
                         interventions=[patch("layers.1.mlp.gate_proj", lambda v, op: v * 1.05)])
    tr.run()
    eng = {n: np.array(tr.value(n).astype(mx.float32)) for n in model.program.names}
    report = compare(model, eng, ids=IDS, dtype="float32")
    ax = error_curve(report).axes[0]
    labels = [l.get_label() for l in ax.get_lines()]
    assert "first local divergence: layers.1.mlp.gate_proj" in labels
    local = ax.get_lines()[labels.index("local nmse (our op on the engine's inputs)")]
    ys = np.asarray(local.get_ydata(), dtype=float)
    assert np.nanargmax(ys) == [o.op for o in report.ops].index("layers.1.mlp.gate_proj")
    assert "layers.1.mlp.gate_proj" in ax.get_title()


@pytest.mark.parametrize("quant", ["affine4", "mxfp4"])
def test_weight_values_dequantize(tmp_path, quant):
    from workbench.plots import weight_values
    plain = workbench.load(zoo.build("qwen3", tmp_path / "f", dtype="float32"))
    packed = workbench.load(zoo.build("qwen3", tmp_path / quant, quant=quant))
    w0 = weight_values(plain, "layers.0.mlp.up_proj")
    w = weight_values(packed, "layers.0.mlp.up_proj.weight")
    assert w.shape == w0.shape and w.dtype == np.float32
    assert np.corrcoef(w.ravel(), w0.ravel())[0, 1] > 0.98  # the same values, up to 4-bit rounding
    with pytest.raises(KeyError, match="no tensor"):
        weight_values(packed, "layers.0.mlp.nothing")


def test_position_error_map(model, ref):
    from workbench.plots import position_error_map
    eng = dict(ref.values)
    x = eng["layers.2.mlp.down_proj"].copy()
    x[:, 4:] *= 1.5  # wrong from token 4 on
    eng["layers.2.mlp.down_proj"] = x
    report = compare(model, eng, ids=IDS)
    ax = position_error_map(report, tokens=[str(i) for i in IDS]).axes[0]
    data = np.asarray(ax.get_images()[0].get_array())
    rows = [o for o in report.ops if o.position_error is not None]
    i = [o.op for o in rows].index("layers.2.mlp.down_proj")
    assert data.shape == (len(rows), len(IDS))
    assert data[i, 4:].min() > 100 * data[i, :4].max()  # the block starts at column 4
    labels = {t.get_text(): t.get_color() for t in ax.get_yticklabels()}
    assert labels["layers.2.mlp.down_proj"] == "red"
    assert "starts at position 4" in ax.get_title().replace("\n", " ")
    with pytest.raises(ValueError, match="per-position"):
        from workbench.diff import compare_arrays
        position_error_map(compare_arrays(ref.values, {"layers.0": ref.values["layers.0"]}))  # no token count
