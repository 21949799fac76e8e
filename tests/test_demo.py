"""The embedded demo model (assets/demo, demo-4bit, demo-moe): layout, loading through
workbench.load, expected completions, held-out eval threshold, quantized copy, MoE,
the named attention heads, and the `workbench demo` command."""
from __future__ import annotations

import json

import workbench  # noqa: F401  (fast BLAS before mlx.core)

import mlx.core as mx
import numpy as np
import pytest

from workbench.cli import main as cli_main
from workbench.demo import corpus, paths
from workbench.demo.evaluate import THRESHOLD, evaluate
from workbench.demo.loading import load_demo, load_mlx_lm
from workbench.demo.tokenizer import EOS_ID
from workbench.trace import Run

@pytest.fixture(scope="module")
def demo():
    return load_demo(paths.DEMO)


@pytest.fixture(scope="module")
def demo_ref():
    return load_demo(paths.DEMO, loader="mlx-lm")


def test_assets_are_a_small_standard_gemma4_checkpoint():
    cfg = json.loads((paths.DEMO / "config.json").read_text())
    assert cfg["model_type"] == "gemma4_text"
    assert cfg["num_hidden_layers"] >= 4
    assert {"sliding_attention", "full_attention"} == set(cfg["layer_types"])
    assert cfg["hidden_size_per_layer_input"] > 0
    for d in (paths.DEMO, paths.DEMO_4BIT, paths.DEMO_MOE):
        for f in ("config.json", "model.safetensors", "tokenizer.json"):
            assert (d / f).is_file(), d / f
    total = sum(f.stat().st_size for d in (paths.DEMO, paths.DEMO_4BIT, paths.DEMO_MOE) for f in d.iterdir())
    assert total < 10e6, f"assets/ demo checkpoints take {total / 1e6:.1f} MB"
    # standard MLX layout: prefixed names, bfloat16, per-layer embeddings present
    w = mx.load(str(paths.DEMO / "model.safetensors"))
    assert "model.embed_tokens_per_layer.weight" in w
    assert "model.layers.0.self_attn.q_proj.weight" in w
    assert w["model.embed_tokens.weight"].dtype == mx.bfloat16


def test_tokenizer_is_reproducible():
    from workbench.demo.tokenizer import train_tokenizer

    tok = train_tokenizer(corpus.tokenizer_text(), vocab_size=640)
    shipped = json.loads((paths.DEMO / "tokenizer.json").read_text())
    assert json.loads(tok.to_str()) == shipped


def test_loads_through_workbench_load_like_mlx_lm(demo, demo_ref):
    assert demo.loader == "workbench.load"
    ids = mx.array([demo.tokenizer.encode(e.text).ids for e in corpus.heldout(4)[:1]])
    ours = demo.forward(ids).astype(mx.float32)
    ref = demo_ref.forward(ids).astype(mx.float32)
    assert ours.shape == ref.shape
    # both compute in bfloat16: agree to bf16 rounding, and on every argmax
    assert float(mx.max(mx.abs(ours - ref))) < 0.25
    assert mx.array_equal(mx.argmax(ours, -1), mx.argmax(ref, -1))


@pytest.mark.parametrize("prompt,expected", [
    ("apple river stone cloud tree |", " apple river stone cloud tree ."),
    ("king moon fox bread sea ship owl |", " king moon fox bread sea ship owl ."),
    ("anna red ball . tom blue cup . mia green hat . tom", " blue cup ."),
    ("leo gold kite . ivy pink drum . sam white sock . zoe black bell . emma gray fish . ivy", " pink drum ."),
    ("apple river stone cloud tree | stone", " cloud tree ."),
])
def test_generates_expected_completions(demo, prompt, expected):
    ids = demo.tokenizer.encode(prompt).ids
    out = demo.generate(ids, 16)
    assert demo.tokenizer.decode(out) == expected


def test_eval_passes_threshold(demo):
    res = evaluate(demo.forward, demo.tokenizer)
    assert set(res.n) == set(corpus.TASKS) and all(n == 100 for n in res.n.values())
    assert res.passed, res.to_dict()
    assert min(res.accuracy.values()) >= THRESHOLD


def test_eval_can_fail():
    """The eval is not a rubber stamp: a model that always says <eos> scores 0."""
    from workbench.demo.tokenizer import train_tokenizer

    tok = train_tokenizer(corpus.tokenizer_text(), vocab_size=640)

    def forward(ids):
        logits = mx.zeros((*ids.shape, tok.get_vocab_size()))
        return logits + (mx.arange(tok.get_vocab_size()) == EOS_ID)

    res = evaluate(forward, tok, corpus.heldout(5))
    assert res.overall == 0.0 and not res.passed
    assert len(res.failures) == 10


def test_4bit_copy_inspects_clean_and_stays_close(demo):
    cfg = json.loads((paths.DEMO_4BIT / "config.json").read_text())
    assert cfg["quantization"]["bits"] == 4 and cfg["quantization"].get("mode", "affine") == "affine"
    rep = workbench.inspect(paths.DEMO_4BIT)
    assert rep.ok, rep.to_dict()
    q = load_demo(paths.DEMO_4BIT)
    exs = corpus.heldout(5)
    agree = total = 0
    for e in exs:
        ids = mx.array([demo.tokenizer.encode(e.text).ids])
        a = demo.forward(ids).astype(mx.float32)
        b = q.forward(ids).astype(mx.float32)
        pa, pb = mx.softmax(a, -1), mx.softmax(b, -1)
        # where the full model is sure (the determined tokens), the 4-bit copy picks the same;
        # elsewhere (a random next word) the argmax is a coin toss between near-equal words
        sure = mx.max(pa, -1) > 0.5
        agree += int(mx.sum((mx.argmax(a, -1) == mx.argmax(b, -1)) & sure))
        total += int(mx.sum(sure))
        # total variation between next-token distributions stays small
        assert float(mx.max(0.5 * mx.sum(mx.abs(pa - pb), -1))) < 0.35
    assert total > 50 and agree / total >= 0.95
    # the eval in float32 compute (bfloat16 quantized matmuls are ~10x slower on CPU)
    q32 = load_demo(paths.DEMO_4BIT, dtype="float32")
    res = evaluate(q32.forward, q32.tokenizer)
    assert res.passed, res.to_dict()


def test_4bit_loads_in_mlx_lm_like_workbench():
    q = load_demo(paths.DEMO_4BIT)
    ref, _ = load_mlx_lm(paths.DEMO_4BIT)
    ids = mx.array([q.tokenizer.encode("apple river stone | apple river").ids])
    a, b = q.forward(ids).astype(mx.float32), ref(ids).astype(mx.float32)
    assert mx.array_equal(mx.argmax(a, -1), mx.argmax(b, -1))
    assert float(mx.max(mx.abs(a - b))) < 0.25


def test_moe_variant_loads_and_matches_mlx_lm():
    cfg = json.loads((paths.DEMO_MOE / "config.json").read_text())
    assert cfg["enable_moe_block"] and cfg["num_experts"] > cfg["top_k_experts"] >= 1
    # float32 compute on both sides (mlx's CPU gather_mm runs float32 only)
    m = load_demo(paths.DEMO_MOE, dtype="float32")
    ref = load_demo(paths.DEMO_MOE, loader="mlx-lm", dtype="float32")
    ids = mx.array([m.tokenizer.encode(corpus.heldout(1)[1].text).ids])
    a, b = m.forward(ids), ref.forward(ids)
    assert mx.array_equal(mx.argmax(a, -1), mx.argmax(b, -1))
    assert float(mx.max(mx.abs(a - b))) < 1e-3
    assert workbench.inspect(paths.DEMO_MOE).ok
    res = evaluate(m.forward, m.tokenizer, corpus.heldout(25))
    assert res.passed, res.to_dict()


def test_cli_demo_generates(capsys):
    assert cli_main(["demo", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["path"] == str(paths.DEMO) and out["loader"] == "workbench.load"
    assert out["completion"] == " river stone cloud tree ."


def test_cli_demo_eval(capsys):
    assert cli_main(["demo", "--eval", "--n", "15", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["eval"]["passed"] and out["eval"]["overall"] >= THRESHOLD
    assert out["eval"]["n"] == {"copy": 15, "recall": 15}


def test_cli_demo_bad_path(tmp_path, capsys):
    assert cli_main(["demo", "--path", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nowhere" in err[0]
    (tmp_path / "config.json").write_text("{not json")
    assert cli_main(["demo", "--path", str(tmp_path)]) == 2
    assert "config.json" in capsys.readouterr().err


def test_named_heads_hold_their_scores(demo):
    """The heads named in docs/demo.md (workbench.demo.NAMED_HEADS) are the best of their
    kind (layer 1 heads 0 and 1 are near twins) and keep their measured scores (by hand, from mlx-lm's attention)."""
    from workbench.demo import NAMED_HEADS
    from workbench.demo.heads import head_scores

    scores = head_scores(demo.mlx_lm_model, demo.tokenizer, n=30)
    for kind, (layer, head, score) in NAMED_HEADS.items():
        s = scores[kind]
        assert s[layer, head] >= s.max() - 0.05, (kind, np.round(s, 2))  # the best (near-ties allowed)
        assert s[layer, head] >= score - 0.05, (kind, s[layer, head])
    assert NAMED_HEADS["induction"][2] > 0.9 and NAMED_HEADS["previous_token"][2] > 0.5


def test_tracer_attention_matches_hand_computed_pattern(demo):
    """The tracer's captured softmax for the induction head equals softmax(q k^T) computed
    by hand from mlx-lm, and shows the induction stripe."""
    from workbench.demo import NAMED_HEADS
    from workbench.demo.heads import attention_patterns

    layer, head, _ = NAMED_HEADS["induction"]
    prompt = "apple river stone cloud tree | apple river stone"
    ids = demo.tokenizer.encode(prompt).ids
    ref = attention_patterns(demo.mlx_lm_model, ids)[layer, head]
    tr = workbench.trace(demo.model, ids, capture=[f"layers.{layer}.self_attn.softmax"], run=Run(attention=[layer]))
    tr.run()
    got = np.array(tr.value(f"layers.{layer}.self_attn.softmax").astype(mx.float32))[0, head]
    assert got.shape == ref.shape == (len(ids), len(ids))
    np.testing.assert_allclose(got, ref, atol=0.05)
    # second "apple" (position 7) looks at "river" (position 2), "river" (8) at "stone" (3)
    assert got[7].argmax() == 2 and got[8].argmax() == 3 and got[7, 2] > 0.5


def test_recall_fails_exactly_beyond_the_sliding_window(demo):
    """The induction head sits in a sliding-window layer (16 tokens): recall works when the
    asked fact is within the window and not beyond it -- the explainable 4% of misses."""
    from workbench.demo import NAMED_HEADS

    assert demo.config["sliding_window"] == 16 and demo.config["layer_types"][NAMED_HEADS["induction"][0]] == "sliding_attention"
    near = corpus.Example("recall", "anna red ball . tom blue cup . mia green hat . sam pink kite . tom",
                          " blue cup .")
    far = corpus.Example("recall", "tom blue cup . anna red ball . mia green hat . sam pink kite . zoe gold bell . tom",
                         " blue cup .")
    assert evaluate(demo.forward, demo.tokenizer, [near]).overall == 1.0
    assert evaluate(demo.forward, demo.tokenizer, [far]).overall == 0.0



def test_mlx_lm_load_and_generate():
    """The shipped checkpoints load with mlx-lm's own `load` (tokenizer included)."""
    from mlx_lm import generate, load

    for p in (paths.DEMO, paths.DEMO_4BIT):
        model, tok = load(str(p))
        out = generate(model, tok, "apple river stone cloud tree | apple", max_tokens=6, verbose=False)
        assert out.strip() == "river stone cloud tree .", (p, out)


def test_ablating_the_induction_heads_breaks_copy_and_eval_exits_1(tmp_path, capsys):
    """Zeroing the named induction heads' output (their o_proj columns in layer 1) in a copy
    of the checkpoint breaks copying: `workbench demo --eval` reports it, exit status 1."""
    import shutil

    from workbench.demo import NAMED_HEADS

    layer, head, _ = NAMED_HEADS["induction"]
    dst = tmp_path / "ablated"
    shutil.copytree(paths.DEMO, dst)
    w = mx.load(str(dst / "model.safetensors"))
    name = f"model.layers.{layer}.self_attn.o_proj.weight"
    hd = json.loads((dst / "config.json").read_text())["head_dim"]
    keep = mx.ones((w[name].shape[1],))
    keep[head * hd:(head + 2) * hd] = 0  # the named head and its near twin (head + 1)
    w[name] = (w[name] * keep).astype(w[name].dtype)
    mx.save_safetensors(str(dst / "model.safetensors"), w, metadata={"format": "mlx"})
    assert cli_main(["demo", "--path", str(dst), "--eval", "--n", "15", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert not out["eval"]["passed"] and out["eval"]["accuracy"]["copy"] < 0.5
    assert mx.load(str(paths.DEMO / "model.safetensors"))[name].abs().sum().item() > 0  # original untouched
