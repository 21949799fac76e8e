"""The causal tools (workbench.causal) against hand computations on the demo model.

Every check recomputes the expected number another way: a manual intervention, a
numpy matmul over the checkpoint's own tensors, causality (positions before the first
differing token cannot change), or the demo's measured heads (workbench.demo.NAMED_HEADS).
"""
import json

import matplotlib

matplotlib.use("Agg")

import mlx.core as mx
import numpy as np
import pytest

import workbench
from workbench import causal as C
from workbench import zoo
from workbench.demo import NAMED_HEADS, corpus, paths
from workbench.plots import causal as P
from workbench.plots import save
from workbench.trace import Run, patch, replace

CLEAN = "apple river stone cloud tree | stone"      # -> cloud
CORRUPT = "apple river stone cloud tree | cloud"    # -> tree
COPY = "apple river stone cloud tree | apple river stone"  # -> cloud


@pytest.fixture(scope="module")
def demo():
    return workbench.load(paths.DEMO)


@pytest.fixture(scope="module")
def moe():
    return workbench.load(paths.DEMO_MOE)


def _logits(model, text, interventions=None, capture=None, attention=None):
    tr = workbench.trace(model, text, capture=capture, dtype="float32", interventions=interventions,
                         run=Run(attention=attention))
    tr.run()
    return tr


def _head_keep(model, layer, h):
    op = model.program[f"layers.{layer}.self_attn.context"]
    H, d = op.attrs["num_heads"], op.attrs["head_dim"]
    keep = np.ones(H * d, np.float32)
    keep[h * d:(h + 1) * d] = 0
    return keep, d


# --------------------------------------------------------------------------- patching

def test_patching_the_clean_run_into_itself_changes_nothing(demo):
    a, b = demo.encode(" cloud")[-1], demo.encode(" tree")[-1]
    metric = C.logit_diff(a, b)
    clean = float(metric(_logits(demo, CLEAN).logits).mean())
    for site in ("resid", "attn", "mlp"):
        r = C.activation_patching(demo, CLEAN, CLEAN, metric=metric, site=site)
        assert r.values.shape == (len(r.rows), 8)
        assert r.clean == pytest.approx(clean, abs=1e-5) and r.corrupted == pytest.approx(clean, abs=1e-5)
        np.testing.assert_allclose(r.values, clean, atol=1e-4)
        assert np.isnan(r.effect).all()  # clean == corrupted: no scale to normalise by
    r = C.patch_heads(demo, CLEAN, CLEAN, metric=metric)
    np.testing.assert_allclose(r.values, clean, atol=1e-4)


def test_residual_patching_follows_causality_and_recovers_clean_at_the_last_layer(demo):
    r = C.activation_patching(demo, CLEAN, CORRUPT)
    cloud, tree = demo.encode(" cloud")[-1], demo.encode(" tree")[-1]
    assert r.metric.startswith("logit[' cloud'] - logit[' tree']")  # the runs' own top tokens, as text
    assert r.clean > 0 > r.corrupted
    assert r.rows == ["embed", "L0", "L1", "L2", "L3"] and r.ops[-1] == "layers.3"
    # the prompts differ only in the last token: every earlier position holds the same
    # activations in both runs (causal attention), so patching it changes nothing
    np.testing.assert_allclose(r.values[:, :-1], r.corrupted, atol=1e-4)
    # the last layer's residual at the last position is all the last logits read
    assert r.values[-1, -1] == pytest.approx(r.clean, abs=1e-4)
    assert r.effect[-1, -1] == pytest.approx(1.0, abs=1e-5)
    # the same by hand: the whole last-layer residual of the clean run put into the corrupted one
    clean_resid = _logits(demo, CLEAN, capture=["layers.3"]).value("layers.3")
    patched = _logits(demo, CORRUPT, interventions=[replace("layers.3", clean_resid)])
    m = C.logit_diff(cloud, tree)
    assert float(m(patched.logits)[0]) == pytest.approx(r.clean, abs=1e-4)


def test_head_patching_equals_a_manual_slice_replacement(demo):
    r = C.patch_heads(demo, CLEAN, CORRUPT)
    assert r.values.shape == (4, 4) and r.rows == ["L0", "L1", "L2", "L3"]
    layer, h = NAMED_HEADS["induction"][:2]
    op = f"layers.{layer}.self_attn.context"
    keep, d = _head_keep(demo, layer, h)
    src = np.array(_logits(demo, CLEAN, capture=[op]).value(op))
    cur = np.array(_logits(demo, CORRUPT, capture=[op]).value(op))
    manual = cur * keep + src * (1 - keep)
    tr = _logits(demo, CORRUPT, interventions=[replace(op, mx.array(manual))])
    m = C.logit_diff(demo.encode(" cloud")[-1], demo.encode(" tree")[-1])
    assert r.values[layer, h] == pytest.approx(float(m(tr.logits)[0]), abs=1e-4)
    # the induction heads carry the cue: patching either moves the answer back a good part
    assert r.effect[layer, h] > 0.2 and r.effect[layer, h + 1] > 0.2
    assert abs(r.effect[2]).max() < 0.05  # layer 2's heads do not


def test_patching_rejects_prompts_of_different_lengths(demo):
    with pytest.raises(ValueError, match="same number of tokens"):
        C.activation_patching(demo, CLEAN, CLEAN + " cloud")
    with pytest.raises(ValueError, match="both predict"):
        C.activation_patching(demo, CLEAN, CLEAN)
    with pytest.raises(ValueError, match="unknown patching site"):
        C.activation_patching(demo, CLEAN, CORRUPT, site="heads")


# --------------------------------------------------------------------------- ablation

def test_zero_ablating_a_head_equals_zeroing_its_slice_by_hand(demo):
    layer, h = NAMED_HEADS["induction"][:2]
    op = f"layers.{layer}.self_attn.context"
    r = C.ablate(demo, COPY, [C.head(layer, h)], mode="zero")
    keep, _ = _head_keep(demo, layer, h)
    tr = _logits(demo, COPY, interventions=[patch(op, lambda v: v * mx.array(keep))],
                 capture=[op, f"layers.{layer}.self_attn.o_proj"])
    base = _logits(demo, COPY)
    top = int(mx.argmax(base.logits[0, -1]).item())
    p = mx.softmax(tr.logits[0, -1].astype(mx.float32), precise=True)[top].item()
    assert r.values[0] == pytest.approx(p, abs=1e-6)
    assert r.baseline == pytest.approx(mx.softmax(base.logits[0, -1], precise=True)[top].item(), abs=1e-6)
    # recomputation: o_proj of the ablated run is the zeroed context times W_o by hand
    ctx = np.array(tr.value(op))
    assert np.abs(ctx[..., keep == 0]).max() == 0 and np.abs(ctx[..., keep == 1]).max() > 0
    w = np.array(demo.op_tensors(f"layers.{layer}.self_attn.o_proj")[f"layers.{layer}.self_attn.o_proj.weight"]
                 .astype(mx.float32))
    np.testing.assert_allclose(np.array(tr.value(f"layers.{layer}.self_attn.o_proj")), ctx @ w.T, atol=1e-4)


def test_mean_and_resample_ablation_put_the_reference_values_in_the_slice(demo):
    layer, h = 1, 0
    op = f"layers.{layer}.self_attn.context"
    keep, _ = _head_keep(demo, layer, h)
    refs = ["mia red kite . tom blue cup . tom", "apple river | apple river stone"]
    ref_vals = _logits(demo, refs, capture=[op])
    v = np.array(ref_vals.value(op))
    valid = np.array(ref_vals.attention_mask).astype(bool) if ref_vals.attention_mask is not None else \
        np.ones(v.shape[:2], bool)
    mean = v[valid].mean(axis=0)  # over the real (unpadded) positions only
    clean = np.array(_logits(demo, COPY, capture=[op]).value(op))
    tr = _logits(demo, COPY, interventions=C.ablation(demo, [C.head(layer, h)], "mean", reference=refs),
                 capture=[op])
    got = np.array(tr.value(op))[0]
    np.testing.assert_allclose(got[:, keep == 0], np.broadcast_to(mean[keep == 0], got[:, keep == 0].shape), atol=1e-5)
    np.testing.assert_allclose(got[:, keep == 1], clean[0][:, keep == 1], atol=1e-6)  # other heads untouched
    # resample: the slice comes from the other prompt, position by position
    other = "river stone cloud tree apple | river stone cloud"
    assert len(demo.encode(other)) == len(demo.encode(COPY))
    ref_ctx = np.array(_logits(demo, other, capture=[op]).value(op))
    tr = _logits(demo, COPY, interventions=C.ablation(demo, [C.head(layer, h)], "resample", reference=other),
                 capture=[op])
    np.testing.assert_allclose(np.array(tr.value(op))[..., keep == 0], ref_ctx[..., keep == 0], atol=1e-6)
    with pytest.raises(ValueError, match="same length"):
        _logits(demo, COPY, interventions=C.ablation(demo, [C.head(layer, h)], "resample", reference="apple |"))


def test_ablation_groups_and_the_backup_effect(demo):
    """Zeroing both layer-1 induction heads: the copy survives (the post-attention norm scales
    the remaining heads up); mean ablation, which keeps the norm's input typical, breaks it."""
    both = (C.head(1, 0), C.head(1, 1))
    z = C.ablate(demo, COPY, [C.head(1, 0), both], mode="zero")
    m = C.ablate(demo, COPY, [C.head(1, 0), both], mode="mean")
    assert z.labels == ["L1H0", "L1H0+L1H1"] and z.per_example.shape == (2, 1)
    assert z.baseline > 0.99 and z.values[1] > 0.95
    assert m.values[1] < 0.5 < m.values[0]
    grid = C.ablate_heads(demo, COPY, mode="zero")
    assert grid.grid.shape == (4, 4) and grid.grid_rows[1] == "L1"
    np.testing.assert_allclose(grid.grid[1, 0], z.values[0], atol=1e-7)
    json.dumps(z.to_dict()), json.dumps(grid.to_dict())


def test_mlp_zero_ablation_removes_its_write(demo):
    tr = _logits(demo, COPY, interventions=C.ablation(demo, [C.mlp(2)]),
                 capture=["layers.2.post_feedforward_layernorm", "layers.2.ffn_residual", "layers.2.attn_residual"])
    assert float(mx.abs(tr.value("layers.2.post_feedforward_layernorm")).max().item()) == 0.0
    assert mx.array_equal(tr.value("layers.2.ffn_residual"), tr.value("layers.2.attn_residual"))


def test_ablation_errors_name_what_is_wrong(demo):
    with pytest.raises(ValueError, match="unknown ablation mode"):
        C.ablation(demo, [C.head(1, 0)], "shuffle")
    with pytest.raises(ValueError, match="head 4 out of range"):
        C.ablation(demo, [C.head(1, 4)])
    with pytest.raises(ValueError, match="no op 'layers.1.experts.switch_glu.down_proj'"):
        C.ablation(demo, [C.expert(1, 0)])
    with pytest.raises(ValueError, match="needs reference"):
        C.ablate(demo, COPY, [C.head(1, 0)], mode="resample")


def test_expert_ablation_changes_only_the_tokens_routed_to_it(moe):
    text = "anna red ball . tom blue cup . mia green hat . tom"
    L = moe.num_layers - 1  # the last layer: nothing downstream mixes positions
    names = [f"layers.{L}.router.top_k", f"layers.{L}.experts.combine"]
    base = _logits(moe, text, capture=names)
    idx = np.array(base.value(names[0]))[0]  # [T, k]
    counts = [(idx == e).any(-1).sum() for e in range(moe.config["num_experts"])]
    e = int(np.argmin([abs(c - idx.shape[0] / 2) for c in counts]))  # an expert some tokens use, not all
    routed = (idx == e).any(-1)
    assert 0 < routed.sum() < len(routed)
    for mode in ("zero", "mean"):
        tr = _logits(moe, text, interventions=C.ablation(moe, [C.expert(L, e)], mode, reference=text), capture=names)
        assert np.array_equal(np.array(tr.value(names[0]))[0], idx)  # the routing is the same
        diff = np.abs(np.array(tr.value(names[1])) - np.array(base.value(names[1])))[0].max(-1)
        assert (diff[~routed] == 0).all() and (diff[routed] > 0).all(), (mode, diff, routed)
        dl = np.abs(np.array(tr.logits) - np.array(base.logits))[0].max(-1)
        assert (dl[~routed] == 0).all() and (dl[routed] > 0).all()
    # zero ablation by hand: the combine without expert e's weighted output
    d = _logits(moe, text, capture=[f"layers.{L}.experts.switch_glu.down_proj", f"layers.{L}.router.weights"])
    dn, w = np.array(d.value(f"layers.{L}.experts.switch_glu.down_proj"))[0], np.array(d.value(f"layers.{L}.router.weights"))[0]
    want = ((w * (idx != e))[..., None] * dn).sum(-2)
    tr = _logits(moe, text, interventions=C.ablation(moe, [C.expert(L, e)]), capture=names)
    np.testing.assert_allclose(np.array(tr.value(names[1]))[0], want, atol=1e-5)
    with pytest.raises(ValueError, match="resample ablation of an expert"):
        C.ablation(moe, [C.expert(L, e)], "resample", reference=text)


# --------------------------------------------------------------------------- direct logit attribution

def test_dla_pieces_sum_to_the_lm_head_logit(demo):
    cloud, tree = demo.encode(" cloud")[-1], demo.encode(" tree")[-1]
    r = C.direct_logit_attribution(demo, COPY, answer=cloud, wrong=tree)
    assert r.labels[:4] == ["embed", "L0 attn", "L0 mlp", "L0 ple"] and len(r.labels) == 13
    assert r.residual_error < 1e-5
    assert r.total == pytest.approx(r.lm_head_value, abs=1e-4 * max(1, abs(r.lm_head_value)))
    tr = _logits(demo, COPY)
    lg = np.array(tr.logits[0, -1])
    assert r.logits_value == pytest.approx(lg[cloud] - lg[tree], abs=1e-5)  # soft-capped: not the sum
    assert abs(r.logits_value - r.total) > 0.01
    # each layer's heads sum to its attention piece (post-attention norm frozen)
    attn = np.array([r.values[r.labels.index(f"L{i} attn")] for i in range(4)])
    np.testing.assert_allclose(np.nansum(r.heads, axis=1), attn, atol=1e-4)
    np.testing.assert_allclose(r.layers.sum() + r.values[0], r.total, atol=1e-4)
    # the induction heads write the answer directly
    assert r.values[r.labels.index("L1 attn")] == max(r.values)
    json.dumps(r.to_dict())


def test_dla_of_the_embedding_by_hand(demo):
    """The embedding's share, computed from the checkpoint's tensors: the scaled token
    embedding, times every layer_scalar, through the final norm with its scale frozen at the
    full residual (weight / rms(x)), dotted with the answer's unembedding row."""
    r = C.direct_logit_attribution(demo, COPY)
    tr = _logits(demo, COPY, capture=["layers.3"])
    x = np.array(tr.value("layers.3"))[0, -1].astype(np.float64)
    E = np.array(demo.op_tensors("embed_tokens")["embed_tokens.weight"].astype(mx.float32)).astype(np.float64)
    e = E[demo.encode(COPY)[-1]] * np.float32(np.sqrt(128.0))
    for i in range(4):
        e = e * float(demo.op_tensors(f"layers.{i}")[f"layers.{i}.layer_scalar"].astype(mx.float32).item())
    g = np.array(demo.op_tensors("norm")["norm.weight"].astype(mx.float32)).astype(np.float64)
    want = (e * g / np.sqrt(np.mean(x * x) + 1e-6)) @ E[r.answer]
    assert r.values[0] == pytest.approx(want, rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_dla_identity_on_other_families(arch, tmp_path):
    model = workbench.load(zoo.build(arch, tmp_path / arch, dtype="float32"))
    r = C.direct_logit_attribution(model, [5, 17, 3, 42, 8, 99, 23], wrong=7)
    assert r.labels[0] == "embed" and r.labels[1:3] == ["L0 attn", "L0 mlp"]
    assert r.residual_error < 1e-5
    assert r.total == pytest.approx(r.lm_head_value, abs=1e-4 * max(1, abs(r.lm_head_value)))
    attn = np.array([v for lab, v in zip(r.labels, r.values) if lab.endswith("attn")])
    np.testing.assert_allclose(np.nansum(r.heads, axis=1), attn, atol=1e-4)


# --------------------------------------------------------------------------- induction heads

def test_induction_detection_ranks_the_named_heads_top(demo):
    pool = [demo.encode(" " + w)[-1] for w in corpus.WORDS]
    bar = demo.encode(" |")[-1]
    r = C.induction_scores(demo, seq_len=8, batch=16, pool=pool, sep=bar)
    layer, h, _ = NAMED_HEADS["induction"]
    top2 = {(l, hh) for l, hh, _ in r.top(2)}
    assert top2 == {(layer, h), (layer, h + 1)}  # the named head and its twin (docs/demo.md)
    assert r.scores[layer, h] > 0.9 and np.nanmax(r.scores[[0, 2]]) < 0.5
    pl, ph, _ = NAMED_HEADS["previous_token"]
    assert int(np.argmax(r.previous_token[pl])) == ph and r.previous_token[pl, ph] > 0.6
    # the sequences: <bos>, n distinct words, the bar, the same words
    ids = r.ids
    assert ids.shape == (16, 18) and (ids[:, 0] == 2).all() and (ids[:, 9] == bar).all()
    assert (ids[:, 1:9] == ids[:, 10:]).all() and all(len(set(row)) == 8 for row in ids[:, 1:9])
    json.dumps(r.to_dict())


def test_induction_score_is_the_attention_at_the_offset(demo):
    r = C.induction_scores(demo, seq_len=5, batch=3, seed=1)
    assert r.ids.shape == (3, 11) and not (set(r.ids[:, 1:].ravel()) & {0, 1, 2, 3})  # no special tokens
    tr = _logits(demo, mx.array(r.ids), capture=["layers.1.self_attn.softmax"], attention=[1])
    a = np.array(tr.value("layers.1.self_attn.softmax"))
    want = np.mean([a[b, 2, q, q - 4] for b in range(3) for q in range(6, 11)])
    assert r.scores[1, 2] == pytest.approx(want, abs=1e-6)


# --------------------------------------------------------------------------- figures

def test_figures(demo, tmp_path):
    figs = {
        "patch": P.patching_heatmap(C.activation_patching(demo, CLEAN, CORRUPT)),
        "heads": P.patching_heatmap(C.patch_heads(demo, CLEAN, CORRUPT), normalized=False),
        "ablate": P.ablation_plot(C.ablate(demo, COPY, [C.head(1, 0), (C.head(1, 0), C.head(1, 1))], mode="mean")),
        "grid": P.ablation_plot(C.ablate_heads(demo, COPY)),
        "dla": P.dla_plot(C.direct_logit_attribution(demo, COPY)),
        "induction": P.induction_plot(C.induction_scores(demo, seq_len=4, batch=2)),
    }
    texts = {k: [t.get_text() for ax in f.axes for t in ax.texts] for k, f in figs.items()}
    assert len(texts["patch"]) == 5 * 8 and "1.00" in texts["patch"]   # one number per cell
    assert len(texts["heads"]) == 16 and len(texts["grid"]) == 16 and len(texts["induction"]) == 32
    assert "L1H0+L1H1" in [t.get_text() for t in figs["ablate"].axes[0].get_yticklabels()]
    assert "lm_head" in figs["dla"].axes[0].get_title()
    for k, f in figs.items():
        p = save(f, str(tmp_path / f"{k}.png"))
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_study_freezes_the_post_attention_norm(demo):
    """The study's "norm frozen" condition: without an ablation it changes nothing; with
    one, the norm's output is weight * o_proj / rms(unablated o_proj), by hand."""
    from workbench.demo.study import frozen_norm

    ids = mx.array([demo.encode(COPY)])
    o, n = "layers.1.self_attn.o_proj", "layers.1.post_attention_layernorm"
    base = _logits(demo, ids, capture=[o])
    same = _logits(demo, ids, interventions=frozen_norm(demo, ids, 1e-6))
    np.testing.assert_allclose(np.array(same.logits), np.array(base.logits), atol=1e-5)
    ivs = C.ablation(demo, [C.head(1, 0), C.head(1, 1)]) + frozen_norm(demo, ids, 1e-6)
    tr = _logits(demo, ids, interventions=ivs, capture=[o, n])
    x0, x = np.array(base.value(o)), np.array(tr.value(o))
    g = np.array(demo.op_tensors(n)[f"{n}.weight"].astype(mx.float32))
    want = g * x / np.sqrt((x0 * x0).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(np.array(tr.value(n)), want, atol=1e-4)
    assert not np.allclose(np.array(tr.logits), np.array(base.logits), atol=1e-2)
