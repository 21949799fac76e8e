"""The demo's backup heads, measured: ``python -m workbench.demo.study [--n 50] [--json]``.

Layer 1 of the demo holds two near-twin induction heads (H0, H1; docs/demo.md).  Knock
them out and see whether the model still copies, on held-out copy and recall examples:

* ``zero`` -- their outputs set to 0.  Gemma's ``post_attention_layernorm`` then rescales
  what is left of the layer's attention output (the other heads) back to its usual size;
* ``mean`` -- their outputs set to their mean over the examples (the norm's input keeps
  a typical size, so nothing is scaled up);
* ``zero, norm frozen`` -- zeroed, with the post-attention norm's scale frozen at its
  unablated value (the rescaling undone).

Per condition and task: the demo's exact-match accuracy (greedy, as ``workbench demo
--eval``) and the mean probability of the answer tokens under teacher forcing (for copy
also by the number of words to copy); and p(" cloud") after ``PROMPT``.  On a busy
machine set ``OPENBLAS_NUM_THREADS=1`` (BLAS threads fighting over cores made it 60x slower).
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict

import mlx.core as mx
import numpy as np

from workbench.causal.ablation import ablation, head
from workbench.causal.common import Prompt, logits3, next_token_prob, run
from workbench.demo import corpus, paths
from workbench.demo.evaluate import EOS_ID, evaluate
from workbench.models import load
from workbench.trace import patch

LAYER = 1


def frozen_norm(model, ids, eps: float) -> list:
    """Interventions keeping ``layers.1.post_attention_layernorm``'s scale at its unablated value."""
    o = f"layers.{LAYER}.self_attn.o_proj"
    clean = run(model, Prompt(ids, None), capture=[o]).value(o).astype(mx.float32)
    rms_clean = mx.sqrt(mx.mean(clean * clean, axis=-1, keepdims=True) + eps)
    seen = {}

    def remember(v):
        seen["o"] = v
        return v

    def refreeze(v):
        x = seen["o"].astype(mx.float32)
        return (v * (mx.sqrt(mx.mean(x * x, axis=-1, keepdims=True) + eps) / rms_clean)).astype(v.dtype)
    return [patch(o, remember), patch(f"layers.{LAYER}.post_attention_layernorm", refreeze)]


def conditions(model, heads_: tuple[int, ...], reference) -> dict:
    sites = [head(LAYER, h) for h in heads_]
    name = "+".join(f"L{LAYER}H{h}" for h in heads_)
    eps = model.program[f"layers.{LAYER}.post_attention_layernorm"].attrs["eps"]
    zero, mean = ablation(model, sites, "zero"), ablation(model, sites, "mean", reference=reference)
    return {f"zero {name}": lambda ids: zero, f"mean {name}": lambda ids: mean,
            f"zero {name}, norm frozen": lambda ids: zero + frozen_norm(model, ids, eps)}


PROMPT = "apple river stone cloud tree | apple river stone"  # -> " cloud"


def measure(model, n: int = 50) -> dict:
    """{condition: {task: {accuracy, p_answer[, p_by_words]}, "prompt": p(" cloud") on PROMPT}}."""
    tok = model.tokenizer
    exs = corpus.heldout(n)
    reference = [e.prompt for e in exs]
    conds = {"none": lambda ids: []}
    for hs in ((0,), (0, 1), (0, 1, 2), (0, 1, 3), (0, 1, 2, 3)):
        conds.update(conditions(model, hs, reference))
    groups = defaultdict(list)
    for e in exs:
        p, a = tok.encode(e.prompt).ids, tok.encode(e.answer, add_special_tokens=False).ids + [EOS_ID]
        groups[(len(p), len(a))].append((e, p + a))
    one = mx.array([tok.encode(PROMPT).ids])
    cloud = tok.encode(" cloud", add_special_tokens=False).ids[-1]
    out = {}
    for label, make in conds.items():
        def forward(ids, make=make):
            return logits3(run(model, Prompt(ids, None), interventions=make(ids)))
        acc = evaluate(forward, tok, exs).accuracy
        probs, by_words = defaultdict(list), defaultdict(list)
        for (lp, la), items in groups.items():
            ids = np.array([full for _, full in items])
            vals = next_token_prob(ids, range(lp - 1, lp + la - 1))(forward(mx.array(ids)))
            for (e, _), v in zip(items, vals):
                probs[e.task].append(float(v))
                if e.task == "copy":
                    by_words[len(e.prompt.split("|")[0].split())].append(float(v))
        row = {t: {"accuracy": round(acc[t], 3), "p_answer": round(float(np.mean(probs[t])), 3)} for t in corpus.TASKS}
        row["copy"]["p_by_words"] = {k: round(float(np.mean(v)), 3) for k, v in sorted(by_words.items())}
        row["prompt"] = round(float(mx.softmax(forward(one)[0, -1], precise=True)[cloud].item()), 4)
        out[label] = row
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.demo.study", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50, help="held-out examples per task")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = measure(load(paths.DEMO), args.n)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    words = sorted(res["none"]["copy"]["p_by_words"])
    print(f"{'condition':38s}" + "".join(f"{t + ' acc':>12s}{t + ' p':>10s}" for t in corpus.TASKS)
          + f"{'prompt p':>10s}   copy p by number of words {words}")
    for label, r in res.items():
        print(f"{label:38s}" + "".join(f"{r[t]['accuracy']:12.2f}{r[t]['p_answer']:10.3f}" for t in corpus.TASKS)
              + f"{r['prompt']:10.3f}   " + " ".join(f"{r['copy']['p_by_words'].get(w, float('nan')):.2f}" for w in words))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
