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
# The demo's MoE variant has 4 experts per layer and routes each token to the top 2.
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

from workbench.demo.paths import DEMO_MOE
from workbench import plots
import matplotlib.pyplot as plt
model = workbench.load(DEMO_MOE, dtype="float32")
cfg = model.config
print({k: cfg[k] for k in ["num_experts", "top_k_experts", "moe_intermediate_size", "num_hidden_layers"]})
print(workbench.inspect(DEMO_MOE).to_dict()["moe"])

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
print("next token:", repr(model.decode([int(mx.argmax(tr.logits[-1]).item())])))

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
# The router spreads the work, though not evenly: some experts get twice the share of others.
# Engines that run experts as separate kernels must size them for the busiest one.
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
# In this small model the experts add a correction about a tenth the size of the dense
# branch: it was *upcycled* from the dense demo model (built from the dense model's weights,
# its new expert branch starting scaled down) and trained only briefly. In a model trained as MoE from the start the balance is different —
# which is exactly what this kind of measurement is for.

# %% [markdown]
# ## Knock out an expert
#
# Interventions change an op's output as the trace runs. Give expert 0 a very low router score
# in every layer, so it is never chosen, and see whether the answer survives (here it does:
# the dense MLP still carries most of the work):

# %%
from workbench.trace import patch
def ban_expert_0(scores):
    return mx.concatenate([mx.full(scores[..., :1].shape, -1e4, scores.dtype), scores[..., 1:]], axis=-1)
t2 = workbench.trace(model, prompt, capture="stats", interventions=[patch("layers.*.router.proj", ban_expert_0)])
t2.run()
print("without expert 0:", repr(model.decode([int(mx.argmax(t2.logits[-1]).item())])))

# %% [markdown]
# **What to remember.** An MoE layer is a router (scores → top-k → weights) plus experts; every
# one of those steps is an op you can check by hand. When porting, compare `router.top_k` and
# `router.weights` first: if they differ, nothing after them can match. Next: 08, generation.
