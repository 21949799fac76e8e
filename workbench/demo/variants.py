"""Two demo variants that show what notebooks 07 and 08 teach (see docs/demo.md).

* ``assets/demo-experts`` (``--variant experts``): a mixture-of-experts model whose
  experts **specialise by task**.  Built from the dense demo model: its attention and
  embeddings are kept, its dense MLP is switched off (all-zero weights, so the routed
  experts carry all of the MLP's work), and 4 experts per layer (top-2 routing) start as
  quarters of the dense MLP (expert e = hidden units 96e .. 96e+95).  Trained on the
  copy / recall mixture with a small *task hint* added to the loss: the router's
  probability mass on experts 0-1 for the tokens of copy examples and on experts 2-3 for
  recall examples (as domain-expert models such as DEMix assign experts to domains).  At
  run time the router gets no task label: it has to tell the task from the text.

* ``assets/demo-kv`` (``--variant kv``): **KV-shared layers and a short sliding window**.
  Six layers ``S S S F S F`` (S: sliding window of 8 tokens, F: full attention); the last
  two are KV-shared (``num_kv_shared_layers`` 2: layer 4 reads layer 2's keys and values,
  layer 5 reads layer 3's).  Built from the dense demo model (layers 0-3 copied, layers 4
  and 5 start as copies of 2 and 3) and trained on the same corpus with the window at 8,
  so a recall answer 11-19 tokens back can only be found by the full-attention layers.

``python -m workbench.demo.variants --variant experts`` (or ``kv``) trains and writes one;
``--measure`` prints the numbers docs/demo.md quotes (:func:`expert_study`,
:func:`window_study`).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from workbench.demo import corpus
from workbench.models import load
from workbench.trace.entry import trace

#: expert variant: config keys added to the dense demo's config, and which experts the
#: task hint points each task at
EXPERT_KEYS = {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 96}
TASK_EXPERTS = {"copy": (0, 1), "recall": (2, 3)}
HINT_WEIGHT = 0.1
#: kv variant: layer types, KV-shared layers, sliding window
KV_LAYER_TYPES = ["sliding_attention"] * 3 + ["full_attention", "sliding_attention", "full_attention"]
KV_SHARED, KV_WINDOW = 2, 8
#: training steps and peak learning rate of both variants
STEPS, LR = 100, 3e-3


def _dense(src: Path):
    from workbench.demo.loading import load_mlx_lm

    dense, cfg = load_mlx_lm(src)
    cfg = {k: v for k, v in cfg.items() if k not in ("quantization", "quantization_config")}
    return {k: v.astype(mx.float32) for k, v in tree_flatten(dense.parameters())}, cfg


def _fill(model, weights: dict) -> None:
    new = dict(tree_flatten(model.parameters()))
    for k, v in weights.items():
        if k not in new or new[k].shape != v.shape:
            raise ValueError(f"variant: weight {k} {tuple(v.shape)} has no place in the new model")
        new[k] = v
    model.update(tree_unflatten(list(new.items())))


def build_experts(src: Path):
    """The expert variant before training (see the module docstring)."""
    from workbench.demo.train import build_model

    dense_w, cfg = _dense(src)
    cfg.update(EXPERT_KEYS)
    model = build_model(cfg)
    E, m = cfg["num_experts"], cfg["moe_intermediate_size"]
    if E * m != cfg["intermediate_size"]:
        raise ValueError("build_experts: the experts must split the dense MLP exactly")
    w = dict(dense_w)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        gate, up, down = (dense_w[p + f"mlp.{n}_proj.weight"] for n in ("gate", "up", "down"))
        w[p + "experts.switch_glu.gate_proj.weight"] = mx.stack([gate[e * m:(e + 1) * m] for e in range(E)])
        w[p + "experts.switch_glu.up_proj.weight"] = mx.stack([up[e * m:(e + 1) * m] for e in range(E)])
        w[p + "experts.switch_glu.down_proj.weight"] = mx.stack([down[:, e * m:(e + 1) * m] for e in range(E)])
        w[p + "pre_feedforward_layernorm_2.weight"] = dense_w[p + "pre_feedforward_layernorm.weight"]
        for n in ("gate", "up", "down"):  # the dense MLP off: zero is a fixed point of training
            w[p + f"mlp.{n}_proj.weight"] = mx.zeros_like(dense_w[p + f"mlp.{n}_proj.weight"])
    _fill(model, w)
    return model, cfg


def build_kv(src: Path):
    """The KV-shared, short-window variant before training (see the module docstring)."""
    from workbench.demo.train import build_model

    dense_w, cfg = _dense(src)
    cfg.update(num_hidden_layers=len(KV_LAYER_TYPES), layer_types=list(KV_LAYER_TYPES),
               num_kv_shared_layers=KV_SHARED, sliding_window=KV_WINDOW)
    model = build_model(cfg)
    have = dict(tree_flatten(model.parameters()))
    w = {k: v for k, v in dense_w.items() if not k.startswith("model.per_layer_model_projection")
         and not k.startswith("model.embed_tokens_per_layer")}
    # per-layer embeddings: [V, L*P] and [L*P, D]; the new layers start as copies of 2 and 3
    P = cfg["hidden_size_per_layer_input"]
    src_layer = [0, 1, 2, 3, 2, 3]
    ept = dense_w["model.embed_tokens_per_layer.weight"]
    w["model.embed_tokens_per_layer.weight"] = mx.concatenate([ept[:, j * P:(j + 1) * P] for j in src_layer], axis=1)
    proj = dense_w["model.per_layer_model_projection.weight"]
    w["model.per_layer_model_projection.weight"] = mx.concatenate([proj[j * P:(j + 1) * P] for j in src_layer], axis=0)
    for new, old in ((4, 2), (5, 3)):
        for k, v in dense_w.items():
            if k.startswith(f"model.layers.{old}."):
                nk = k.replace(f"model.layers.{old}.", f"model.layers.{new}.", 1)
                if nk in have:  # a KV-shared layer has no k_proj / v_proj / k_norm
                    w[nk] = v
    _fill(model, w)
    return model, cfg


# --------------------------------------------------------------------------- training

def _hint_loss(model, ids, w, task_mask):
    """Next-token loss + HINT_WEIGHT x (-log router mass on the example's task experts)."""
    from mlx_lm.models import gemma4_text

    from workbench.demo.train import loss_fn

    probs = []
    router_call = gemma4_text.Router.__call__

    def recording(self, x):
        xn = mx.fast.rms_norm(x, self.scale * self._root_size, self.eps)
        probs.append(mx.softmax(self.proj(xn).astype(mx.float32), axis=-1))
        return router_call(self, x)
    gemma4_text.Router.__call__ = recording
    try:
        lm = loss_fn(model, ids, w)
    finally:
        gemma4_text.Router.__call__ = router_call
    valid = (ids[:, :-1] != 0).astype(mx.float32) * (mx.arange(ids.shape[1] - 1) > 0)  # not <pad>, not <bos>
    hint = sum(-(mx.log((p * task_mask[:, None, :]).sum(-1) + 1e-6) * valid).sum() / valid.sum() for p in probs)
    return lm + HINT_WEIGHT * hint / len(probs)


def _task_masks(exs, n_experts: int) -> np.ndarray:
    m = np.zeros((len(exs), n_experts), np.float32)
    for i, e in enumerate(exs):
        m[i, list(TASK_EXPERTS[e.task])] = 1.0
    return m


def train_variant(variant: str, out: Path, src: Path, steps: int = STEPS, lr: float = LR, seed: int = 0,
                  n_examples: int = 20000) -> None:
    from tokenizers import Tokenizer

    from workbench.demo.train import ANSWER_WEIGHT, encode_examples, save_checkpoint, train

    t0 = time.time()
    mx.random.seed(seed + 3)
    model, cfg = (build_experts if variant == "experts" else build_kv)(src)
    model.train()
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    exs = corpus.examples(n_examples, seed=corpus.TRAIN_SEED + 3 + seed)
    data = encode_examples(tok, exs, answer_weight=ANSWER_WEIGHT)
    n = sum(v.size for _, v in tree_flatten(model.parameters()))
    print(f"{variant}: {n / 1e6:.2f}M parameters, {len(exs)} training examples, {steps} steps", flush=True)
    if variant == "experts":
        train(model, (*data, _task_masks(exs, cfg["num_experts"])), steps, 32, lr, seed=seed + 3, warmup=20,
              loss=_hint_loss)
    else:
        train(model, data, steps, 32, lr, seed=seed + 3, warmup=20)
    save_checkpoint(out, model, cfg, tok)
    print(f"wrote {out} in {time.time() - t0:.0f}s", flush=True)


# --------------------------------------------------------------------------- measurements

def _batches(model, exs):
    """Held-out examples grouped by prompt length: (task list, ids [B, T])."""
    groups: dict[int, list] = {}
    for e in exs:
        ids = model.encode(e.prompt)
        groups.setdefault(len(ids), []).append((e, ids))
    return [([e.task for e, _ in g], [ids for _, ids in g]) for _, g in sorted(groups.items())]


def routing_fractions(model, exs) -> dict[str, np.ndarray]:
    """task -> [layers, experts]: the share of the task's prompt-token slots (``<bos>``
    excluded) the router sends to each expert."""
    E, L = model.config["num_experts"], model.num_layers
    counts = {t: np.zeros((L, E)) for t in corpus.TASKS}
    for tasks, ids in _batches(model, exs):
        tr = trace(model, ids, capture=[f"layers.{i}.router.top_k" for i in range(L)], dtype="float32")
        tr.run()
        for i in range(L):
            k = np.array(tr.value(f"layers.{i}.router.top_k"))[:, 1:]  # [B, T-1, top_k]
            for b, t in enumerate(tasks):
                counts[t][i] += np.bincount(k[b].ravel(), minlength=E)
    return {t: c / c.sum(axis=1, keepdims=True) for t, c in counts.items()}


def accuracy(model, exs, interventions=None) -> dict[str, float]:
    """Held-out exact-match accuracy per task, as workbench.demo.evaluate scores it (greedy,
    the answer and ``<eos>``), every forward a trace with ``interventions`` applied.

    Every example decodes in one left-padded, masked batch with the KV cache
    (``workbench.generate``, past ``<eos>``), for as many tokens as the longest answer; an
    example is scored on its first ``len(answer)`` tokens (greedy tokens do not depend on
    later ones): a forward of one token per decoded token, instead of a whole-prompt
    forward per token per group of equal prompt and answer lengths."""
    from workbench.demo.tokenizer import EOS_ID
    from workbench.trace.generate import generate

    tok = model.tokenizer
    want = [tok.encode(e.answer, add_special_tokens=False).ids + [EOS_ID] for e in exs]
    g = generate(model, [list(tok.encode(e.prompt).ids) for e in exs], max_tokens=max(map(len, want)),
                 capture=None, dtype="float32", interventions=interventions, past_eos=True)
    n: dict[str, int] = {}
    right: dict[str, int] = {}
    for e, x, a in zip(exs, g.tokens, want):
        n[e.task] = n.get(e.task, 0) + 1
        right[e.task] = right.get(e.task, 0) + int(x[:len(a)] == a)
    return {t: round(right[t] / n[t], 4) for t in n}


def expert_study(model, n_per_task: int = 40) -> dict:
    """Routing fractions per task, and per-task accuracy with expert e zero-ablated in
    every layer (workbench.causal.ablation), e = 0 .. E-1, then each task's pair of
    experts together; ``ablated`` is keyed "0", "1", ..., "0+1", "2+3"."""
    from workbench.causal.ablation import ablation, expert

    exs = corpus.heldout(n_per_task)
    out = {"routing": {t: f.round(4).tolist() for t, f in routing_fractions(model, exs).items()},
           "accuracy": accuracy(model, exs), "ablated": {}}
    groups = [(e,) for e in range(model.config["num_experts"])] + list(TASK_EXPERTS.values())
    for g in groups:
        ivs = ablation(model, [expert(i, e) for i in range(model.num_layers) for e in g])
        out["ablated"]["+".join(map(str, g))] = accuracy(model, exs, ivs)
    return out


#: far recall prompt of notebook 08: tom's colour is 19 tokens before the question
FAR_RECALL = "tom blue cup . anna red ball . mia green hat . sam pink kite . zoe gold bell . tom"
FAR_ANSWER_POS = 2  # "blue" (position 0 is <bos>)


def window_study(model, n_per_task: int = 40) -> dict:
    """On :data:`FAR_RECALL`'s last token, per layer: the attention mass beyond the sliding
    window (mean over heads, ``<bos>`` left out) and the best head's weight on the answer
    ("blue", 19 tokens back); with ``n_per_task``, held-out accuracy with and without the
    full layers' heads."""
    from workbench.causal.ablation import ablation, head

    cfg = model.config
    W = cfg["sliding_window"]
    tr = trace(model, FAR_RECALL, capture="full", dtype="float32", run={"attention": "explicit"})
    tr.run()
    T = len(tr.ids[0])
    mass, on_answer = [], []
    for i in range(model.num_layers):
        p = np.array(tr.value(f"layers.{i}.self_attn.softmax"))[0, :, -1]  # [H, T]
        mass.append(float(p[:, 1:T - W].sum(-1).mean()))  # <bos> (position 0) left out: a sink
        on_answer.append(float(p[:, FAR_ANSWER_POS].max()))
    full = [i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention"]
    H = cfg["num_attention_heads"]
    out = {"window": W, "prompt_tokens": T, "beyond_window_mass": [round(m, 4) for m in mass],
           "answer_weight_best_head": [round(m, 4) for m in on_answer],
           "layer_types": cfg["layer_types"], "next_token": model.decode([int(mx.argmax(tr.logits[0, -1]).item())])}
    if n_per_task:  # held-out accuracy, and with every head of the full layers zeroed
        exs = corpus.heldout(n_per_task)
        out["accuracy"] = accuracy(model, exs)
        out["full_layers_ablated"] = accuracy(model, exs, ablation(model, [head(i, h) for i in full for h in range(H)]))
    return out


def main(argv=None) -> int:
    from workbench.demo import paths

    p = argparse.ArgumentParser(prog="python -m workbench.demo.variants", description=__doc__.splitlines()[0])
    p.add_argument("--variant", choices=("experts", "kv"), required=True)
    p.add_argument("--measure", action="store_true", help="measure the shipped variant instead of training it")
    p.add_argument("--out", type=Path, default=None, help="output directory (default assets/demo-experts, -kv)")
    p.add_argument("--source", type=Path, default=None, help="the dense demo model (default assets/demo)")
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--n", type=int, default=40, help="--measure: held-out examples per task")
    args = p.parse_args(argv)
    out = args.out or {"experts": paths.DEMO_EXPERTS, "kv": paths.DEMO_KV}[args.variant]
    if args.measure:
        model = load(out, dtype="float32")
        res = (expert_study if args.variant == "experts" else window_study)(model, args.n)
        print(json.dumps(res, indent=1))
        return 0
    train_variant(args.variant, out, args.source or paths.DEMO, steps=args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
