"""The two teaching variants of the demo model (workbench/demo/variants.py, docs/demo.md):
assets/demo-experts (experts that specialise by task) and assets/demo-kv (KV-shared
layers, an 8-token sliding window).  Every claim docs/demo.md makes about them is checked
here on the committed checkpoints (nothing is retrained)."""
from __future__ import annotations

import json

import workbench  # noqa: F401  (fast BLAS before mlx.core)

import numpy as np
import pytest

from workbench.cli import main as cli_main
from workbench.demo import corpus, paths, variants

N = 30  # held-out examples per task


@pytest.fixture(scope="module")
def experts():
    return workbench.load(paths.DEMO_EXPERTS, dtype="float32")


@pytest.fixture(scope="module")
def kv():
    return workbench.load(paths.DEMO_KV, dtype="float32")


@pytest.fixture(scope="module")
def expert_study(experts):
    return variants.expert_study(experts, N)


@pytest.fixture(scope="module")
def window_study(kv):
    return variants.window_study(kv, 0)


def test_variants_are_small_named_checkpoints_that_inspect_clean():
    for name in ("experts", "kv"):
        d = paths.VARIANTS[name]
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f.name for f in d.iterdir()}
        size = sum(f.stat().st_size for f in d.iterdir())
        assert size < 5e6, f"{d}: {size / 1e6:.1f} MB"
        rep = workbench.inspect(d)
        assert rep.ok, (name, rep.to_dict())
    total = sum(f.stat().st_size for f in paths.ASSETS.rglob("*") if f.is_file())
    assert total < 30e6, f"assets/ holds {total / 1e6:.1f} MB"
    cfg = json.loads((paths.DEMO_EXPERTS / "config.json").read_text())
    assert cfg["enable_moe_block"] and cfg["num_experts"] == 4 and cfg["top_k_experts"] == 2
    cfg = json.loads((paths.DEMO_KV / "config.json").read_text())
    assert cfg["num_kv_shared_layers"] == 2 and cfg["sliding_window"] == 8
    assert cfg["layer_types"] == variants.KV_LAYER_TYPES


def test_experts_variant_solves_the_tasks(expert_study):
    assert min(expert_study["accuracy"].values()) >= 0.9, expert_study["accuracy"]


def test_routing_differs_by_task(expert_study):
    """Copy tokens go mostly to experts 0-1, recall tokens to experts 2-3, in every layer:
    the router tells the task from the text alone."""
    r = {t: np.array(v) for t, v in expert_study["routing"].items()}  # task -> [layers, experts]
    copy_share = r["copy"][:, list(variants.TASK_EXPERTS["copy"])].sum(1)
    recall_share = r["recall"][:, list(variants.TASK_EXPERTS["recall"])].sum(1)
    assert (copy_share > 0.75).all() and (recall_share > 0.75).all(), (copy_share, recall_share)
    # the same experts' share differs between the tasks by a wide margin
    assert (np.abs(r["copy"] - r["recall"]).max(axis=1) > 0.3).all()


def test_ablating_a_tasks_experts_hurts_that_task_only(expert_study):
    """Zeroing a task's pair of experts in every layer breaks that task and leaves the other
    as it was; one expert alone is redundant (its twin carries the task), as documented."""
    base = expert_study["accuracy"]
    for task, pair in variants.TASK_EXPERTS.items():
        other = next(t for t in corpus.TASKS if t != task)
        acc = expert_study["ablated"]["+".join(map(str, pair))]
        assert base[task] - acc[task] >= 0.5, (task, base, acc)
        assert base[other] - acc[other] <= 0.05, (task, base, acc)
        for k in pair:
            one = expert_study["ablated"][str(k)]
            assert all(base[t] - one[t] <= 0.1 for t in corpus.TASKS), (k, base, one)


def test_sliding_layers_see_nothing_beyond_the_window_full_layers_do(window_study):
    """On a 22-token prompt with an 8-token window: every sliding layer (KV-shared layer 4
    included) puts zero attention beyond the window, each full layer (KV-shared layer 5
    included) puts a large share there (``<bos>`` left out)."""
    s = window_study
    assert s["prompt_tokens"] >= s["window"] + 12  # the prompt is well beyond the window
    for i, (t, m) in enumerate(zip(s["layer_types"], s["beyond_window_mass"])):
        if t == "sliding_attention":
            assert m < 1e-6, (i, m)
        else:
            assert m > 0.3, (i, m)


def test_kv_shared_layers_read_the_earlier_layers_cache(kv):
    """Layer 4 (sliding) attends over layer 2's keys, layer 5 (full) over layer 3's."""
    for layer, source in ((4, 2), (5, 3)):
        inputs = " ".join(kv.program[f"layers.{layer}.self_attn.context"].inputs)
        assert f"layers.{source}." in inputs and f"layers.{layer}.self_attn.k" not in inputs, inputs
        assert f"layers.{layer}.self_attn.k_proj" not in kv.program.names


@pytest.mark.parametrize("name", ["experts", "kv"])
def test_cli_demo_loads_the_variant_by_name(name, capsys):
    assert cli_main(["demo", "--model", name, "--dtype", "float32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["path"] == str(paths.VARIANTS[name]) and out["variants"][name] == out["path"]
    assert out["completion_ids"] and out["model_type"] == "gemma4_text"


def test_accuracy_in_one_cached_batch_scores_as_the_evaluator_does(experts):
    """variants.accuracy decodes every example in one padded batch with the KV cache; the
    evaluator (workbench.demo.evaluate) re-runs whole prompts per group of equal lengths:
    the same verdicts, with and without an ablation that changes them."""
    from workbench.causal.ablation import ablation, expert
    from workbench.causal.common import logits3, prompt, run
    from workbench.demo.evaluate import evaluate

    exs = corpus.heldout(6)
    ivs = ablation(experts, [expert(i, e) for i in range(experts.num_layers) for e in (0, 1)])
    for iv in (None, ivs):
        def forward(ids):
            return logits3(run(experts, prompt(experts, ids.tolist()), interventions=iv, dtype="float32"))
        want = {t: round(a, 4) for t, a in evaluate(forward, experts.tokenizer, exs).accuracy.items()}
        assert variants.accuracy(experts, exs, iv) == want
    assert variants.accuracy(experts, exs)["copy"] > variants.accuracy(experts, exs, ivs)["copy"]
