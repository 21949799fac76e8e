# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · Mixture of experts: the router and the experts
#
# In a dense model every token goes through the same MLP. In a **mixture-of-experts** (MoE)
# layer there are several MLPs — the **experts** — and a small **router** picks, per token,
# the few experts that process it. The model holds many parameters but each token uses only a
# fraction of them (Gemma 4 26B-A4B: 26 billion parameters, about 4 billion active per token).
#
# Gemma 4's MoE layer keeps its dense MLP and adds the experts next to it (`h` is a token's
# vector in the residual stream, each name a norm or block of the layer as in notebook 03):
#
#     h1 = post_feedforward_layernorm_1( mlp(pre_feedforward_layernorm(h)) )           dense MLP
#     h2 = post_feedforward_layernorm_2( experts(pre_feedforward_layernorm_2(h)) )     routed experts
#     h  = h + post_feedforward_layernorm(h1 + h2)
#
# This notebook uses the demo's **experts** variant (`assets/demo-experts`, docs/demo.md): 4
# experts per layer, each token routed to the top 2, experts that specialise by task.
# Porting bugs here are subtle: a wrong expert order, a softmax over the wrong axis, a missing
# per-expert scale — the model still runs.

# %%
import workbench                      # first: on Linux, points MLX at a fast BLAS (matrix-multiply library)
import numpy as np
import mlx.core as mx
from IPython.display import display
# %matplotlib inline
np.random.seed(0); mx.random.seed(0)
np.set_printoptions(precision=4, suppress=True, linewidth=110)

from workbench.demo.paths import DEMO_EXPERTS
from workbench import plots
import matplotlib.pyplot as plt
model = workbench.load(DEMO_EXPERTS, dtype="float32")
cfg = model.config
print({k: cfg[k] for k in ["num_experts", "top_k_experts", "moe_intermediate_size", "num_hidden_layers"]})
print(workbench.inspect(DEMO_EXPERTS).to_dict()["moe"])

# %% [markdown]
# ## The router's ops
#
# For layer 0, the ops that decide and apply the routing (names as in docs/ops.md):

# %%
for op in model.program.ops:
    if op.layer == 0 and ("router" in op.name or "experts" in op.name):
        print(f"{op.name:40s} {op.kind}")

# %%
prompt = "mia red kite . tom blue cup . anna green hat . mia"
tr = workbench.trace(model, prompt, capture="full")
tr.run()
tokens = [model.decode([i]) for i in tr.ids[0].tolist()]
print("next token:", repr(model.decode([int(mx.argmax(tr.logits[0, -1]).item())])))

# %% [markdown]
# `router.proj` gives each token one score per expert; `router.top_k` keeps the indices of the
# two best; `router.weights` turns those two scores into mixing weights (a softmax over the
# chosen ones, times a learned per-expert scale). Token by token, in layer 0:

# %%
scores = np.array(tr.value("layers.0.router.proj")[0])
top = np.array(tr.value("layers.0.router.top_k")[0])
w = np.array(tr.value("layers.0.router.weights")[0])
for t in range(len(tokens)):
    print(f"{tokens[t]!r:10s} scores {np.round(scores[t], 2)}  -> experts {top[t].tolist()} weights {np.round(w[t], 3)}")

# %% [markdown]
# Check the routing by hand: the chosen experts are the highest-scoring ones, and the weights are
# a softmax over the chosen scores times the per-expert scale stored in the checkpoint:

# %%
best2 = np.sort(np.argsort(-scores, axis=-1)[:, :2], axis=-1)
print("top-2 by score:", np.array_equal(best2, np.sort(top, axis=-1)))
pes = np.array(model.weights("float32")["layers.0.router.per_expert_scale"])
chosen = np.take_along_axis(scores, top, axis=-1)
soft = np.exp(chosen - chosen.max(-1, keepdims=True)); soft /= soft.sum(-1, keepdims=True)
print("weights = softmax(chosen) x per_expert_scale:", np.allclose(w, soft * pes[top], atol=1e-4))

# %% [markdown]
# ## Expert load
#
# A router that sends every token to the same expert wastes the others (and, on a GPU, makes
# one expert's kernel the bottleneck). Count, per layer, how many token slots each expert
# receives over a batch of prompts:

# %% tags=["nbval-ignore-output"]
from workbench.demo import corpus
texts = [e.text for e in corpus.examples(16, seed=7)]
tb = workbench.trace(model, texts, capture=["layers.*.router.top_k"])
tb.run()
mask = np.array(tb.attention_mask) if tb.attention_mask is not None else np.ones(tb.ids.shape, bool)
E, L = cfg["num_experts"], model.num_layers
load = np.zeros((L, E), int)
for i in range(L):
    k = np.array(tb.value(f"layers.{i}.router.top_k"))      # [B, T, 2]
    load[i] = np.bincount(k[mask.astype(bool)].ravel(), minlength=E)
print("token slots per expert (rows: layers)\n", load)

# %%
print("every expert used in every layer:", bool((load > 0).all()), "| slots per layer:", load.sum(1).tolist())

# %%
fig, ax = plt.subplots(figsize=(7, 3))
for e in range(E):
    ax.bar(np.arange(L) + e * 0.2 - 0.3, load[:, e] / load.sum(1), width=0.2, label=f"expert {e}")
ax.axhline(1 / E, color="k", ls=":", lw=1, label="perfectly balanced")
ax.set_xticks(range(L)); ax.set_xlabel("layer"); ax.set_ylabel("share of token slots"); ax.set_title("expert load")
ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.25)); plt.show()

# %% [markdown]
# Over the two tasks together the load looks spread out. Split the count by task: the demo's
# corpus has two — **copy** (random words, a bar, the same words again) and **recall** (who
# has what, then one name asked again) — and this variant's experts were trained to
# specialise by task (docs/demo.md says how). The router never sees a task label, only the
# tokens. Per layer, the share of each task's token slots (`<bos>` left out) each expert
# receives over 20 held-out prompts per task (`workbench.demo.variants.routing_fractions`
# reads `layers.*.router.top_k`):

# %%
from workbench.demo import corpus, variants
exs = corpus.heldout(20)
frac = variants.routing_fractions(model, exs)          # task -> [layers, experts], rows sum to 1
E, L = cfg["num_experts"], model.num_layers
for t in corpus.TASKS:
    print(f"{t}: share of token slots per expert (rows: layers)\n{np.round(frac[t], 2)}")

# %%
fig, axes = plt.subplots(1, 2, figsize=(8, 2.8), sharey=True)
for ax, t in zip(axes, corpus.TASKS):
    for e in range(E):
        ax.bar(np.arange(L) + e * 0.2 - 0.3, frac[t][:, e], width=0.2, label=f"expert {e}")
    ax.axhline(1 / E, color="k", ls=":", lw=1)
    ax.set_xticks(range(L)); ax.set_xlabel("layer"); ax.set_title(f"{t} prompts")
axes[0].set_ylabel("share of token slots")
axes[1].legend(fontsize=7, loc="upper right"); plt.tight_layout(); plt.show()

# %% [markdown]
# Copy tokens go mostly to experts 0 and 1, recall tokens to experts 2 and 3, in every layer
# (the dotted line is a perfectly even share). The copy and recall prompts use different words
# (random nouns vs names, colours and objects), so the router can tell them apart from the
# token vectors alone. Such routing is *imbalanced* within a task by design; an engine that
# sizes every expert for an even share would be wrong for this model.
#
# ## The experts' share of the work
#
# How much does the expert block contribute next to the dense MLP? Compare the size of the two
# branches before they are summed (`post_feedforward_layernorm_1` and `_2`):

# %%
for i in range(L):
    d = np.linalg.norm(np.array(tr.value(f"layers.{i}.post_feedforward_layernorm_1")), axis=-1).mean()
    e = np.linalg.norm(np.array(tr.value(f"layers.{i}.post_feedforward_layernorm_2")), axis=-1).mean()
    print(f"layer {i}: dense branch {d:7.2f}   expert branch {e:7.2f}")

# %% [markdown]
# The dense branch is exactly zero: in this variant the dense MLP is switched off (its weights
# are zero) so that the experts carry all of the MLP's work — otherwise the dense MLP, which
# already solves both tasks, would make every expert dispensable.

# %% [markdown]
# ## Knock out an expert
#
# Interventions change an op's output as the trace runs. Give expert 0 a very low router score
# in every layer, so it is never chosen, and see whether the answer survives (here it does:
# the router sends the work to the next-best expert):

# %%
from workbench.trace import patch
def ban_expert_0(scores):
    return mx.concatenate([mx.full(scores[..., :1].shape, -1e4, scores.dtype), scores[..., 1:]], axis=-1)
t2 = workbench.trace(model, prompt, capture="stats", interventions=[patch("layers.*.router.proj", ban_expert_0)])
t2.run()
print("without expert 0:", repr(model.decode([int(mx.argmax(t2.logits[0, -1]).item())])))

# %% [markdown]
# Banning re-routes; **ablating** removes. `workbench.causal.ablation` builds interventions for
# that: `expert(layer, e)` zeroes expert `e`'s output for the tokens the router sent to it
# (other tokens untouched). Zero experts in every layer and measure held-out exact-match
# accuracy per task, one expert at a time and then each task's pair:

# %%
from workbench.causal.ablation import ablation, expert
base = variants.accuracy(model, exs)
print(f"{'ablated':>10s}  copy  recall")
print(f"{'nothing':>10s}  {base['copy']:.2f}  {base['recall']:.2f}")
drops = {}
for group in [(0,), (1,), (2,), (3,), (0, 1), (2, 3)]:
    ivs = ablation(model, [expert(i, e) for i in range(L) for e in group])
    acc = variants.accuracy(model, exs, ivs)
    drops[group] = {t: base[t] - acc[t] for t in corpus.TASKS}
    print(f"{'expert ' + '+'.join(map(str, group)):>10s}  {acc['copy']:.2f}  {acc['recall']:.2f}")

# %%
print("the copy pair (0+1) costs copy", round(drops[(0, 1)]["copy"], 2), "and recall", round(drops[(0, 1)]["recall"], 2))
print("the recall pair (2+3) costs recall", round(drops[(2, 3)]["recall"], 2), "and copy", round(drops[(2, 3)]["copy"], 2))

# %% [markdown]
# Knocking out **one** expert changes nothing: each task has two experts, top-2 routing sends
# every one of its tokens to both, and either one alone carries the task (like the backup
# heads of notebook 03). Knock out the task's **pair** and that task collapses while the other
# is untouched. Measured on 40 held-out examples per task (docs/demo.md): copy 100% → 25%
# without experts 0+1 (recall stays at 97.5%), recall 97.5% → 32.5% without experts 2+3
# (copy stays at 100%). The routing table and this ablation together are the evidence of
# specialisation: where the tokens go, and what breaks when that destination is gone.

# %% [markdown]
# ## Exercises: predict, then check
#
# Write your answer in `answer` (or the function's body) and run the cell. `check` says
# *right*, *partly right* (and how much), or what to look at for the mistake you made; it
# never shows the answer. The "implement" exercises run your function on this model's real
# values and compare with the op's output. When you are done, or stuck, `solution("07.1")`
# in a cell of your own prints a worked solution (no cell of this notebook does).

# %%
from workbench.exercises import check, solution

# %% [markdown]
# **1.** Here are *layer 2's* router scores for the last token, ` mia`. Which two experts
# will it go to (a list of expert numbers)?

# %%
print(np.round(np.array(tr.value("layers.2.router.proj"))[0, -1], 2))
answer = None  # your prediction, e.g. [0, 3]
check("07.1", answer)

# %% [markdown]
# **2.** In the expert-load count, each layer's token slots add up to a multiple of the number
# of real (not padded) tokens in the batch. Which multiple?

# %%
answer = None  # your prediction: a number
check("07.2", answer)

# %% [markdown]
# **3.** With expert 0 banned by the intervention above, how many token slots of our prompt go
# to expert 0 in layer 0, and how many experts does each token still get? Answer as
# (slots of expert 0, experts per token).

# %%
answer = None  # your prediction, e.g. (3, 1)
check("07.3", answer)

# %% [markdown]
# **4. Implement it.** The router's top-k: from `scores` (`[tokens, experts]`) return, per
# token, the indices of the `k` experts it goes to (`[tokens, k]`, any order within a row).
# `check` compares with `layers.0.router.top_k`.

# %%
def route(scores, k):
    return None  # your code

check("07.4", route)

# %% [markdown]
# **5. Implement it.** The layer's expert output: `outs` holds, for each token, the outputs of
# its `k` chosen experts (`[tokens, k, hidden]`) and `weights` their router weights
# (`[tokens, k]`). Return `[tokens, hidden]`. `check` compares with `layers.0.experts.combine`.

# %%
def combine(outs, weights):
    return None  # your code

check("07.5", combine)

# %% [markdown]
# **What to remember.** An MoE layer is a router (scores → top-k → weights) plus experts; every
# one of those steps is an op you can check by hand. When porting, compare `router.top_k` and
# `router.weights` first: if they differ, nothing after them can match. Next: 08, generation.
