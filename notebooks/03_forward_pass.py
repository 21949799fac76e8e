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
# # 03 · Stepping through a forward pass
#
# A language model turns a list of tokens into, for every position, a score for every
# possible next token. In between sits a stack of identical **layers**, each reading and
# adding to a running vector per token — the **residual stream**. This notebook walks through
# one forward pass of the demo model (a Gemma 4 architecture) op by op, and checks each
# step's arithmetic by hand with numpy, so nothing is magic:
#
# 1. tokens and **embeddings**
# 2. **RMS norm** (root-mean-square normalisation)
# 3. **attention**: queries, keys, values, **RoPE** (rotary position embedding), scores,
#    softmax, the heads' outputs
# 4. the **MLP** (multi-layer perceptron: here a gated feed-forward network)
# 5. the **residual stream**, layer after layer
# 6. the **logit lens**: what each layer would predict if it were the last (a *logit* is
#    the model's raw score for one vocabulary token, before softmax turns scores into
#    probabilities)
#
# Below, `v(name)` is an op's output as a numpy array and `D` the model's width (the length
# of every token's vector in the residual stream).

# %%
import workbench                      # first: on Linux, points MLX at a fast BLAS (matrix-multiply library)
import numpy as np
import mlx.core as mx
from IPython.display import display
# %matplotlib inline
np.random.seed(0); mx.random.seed(0)
np.set_printoptions(precision=4, suppress=True, linewidth=110)

from workbench.demo.paths import DEMO
from workbench import plots
from workbench.widgets import StepDebugger
model = workbench.load(DEMO, dtype="float32", attention="explicit")   # scores and softmax as steps
prompt = "apple river stone cloud tree | apple river stone"
tr = workbench.trace(model, prompt, capture="full")
tr.run()
v = lambda name: np.array(tr.value(name)[0])   # an op's output for our one sequence, as numpy
cfg = model.config
D = cfg["hidden_size"]                          # the model's width

# %% [markdown]
# ## 1 · Tokens and embeddings
#
# The tokenizer cuts the text into **tokens** (here: whole words, a separator `|`, and a
# beginning-of-sequence marker) and gives each an integer id.

# %%
ids = tr.ids[0].tolist()
tokens = [model.decode([i]) for i in ids]
print(list(zip(ids, tokens)))

# %% [markdown]
# `embed_tokens` looks each id up in a table of learned vectors, one row per vocabulary entry.
# Gemma then multiplies by √D (`embed_scale`), so the embeddings start at a size comparable to
# what the layers add later.

# %%
table = np.array(model.weights("float32")["embed_tokens.weight"])
print("table", table.shape, "-> embed_tokens", v("embed_tokens").shape)
print("row lookup:", np.array_equal(v("embed_tokens"), table[ids]))
print("x sqrt(D):", np.allclose(v("embed_scale"), v("embed_tokens") * np.sqrt(D), rtol=1e-2))

# %% [markdown]
# Gemma 4 adds a second, smaller embedding per layer (**per-layer embeddings**, `per_layer_inputs`:
# one small vector per token *per layer*), fed into each layer at its end. It lets small models
# carry token identity deep into the network cheaply.

# %%
print(v("per_layer_inputs").shape, "= (tokens, layers, size per layer)")

# %% [markdown]
# ## 2 · RMS norm
#
# Each layer starts by normalising every token's vector: divide by its root mean square, then
# multiply by a learned weight per channel. Without it, the vectors' size would drift layer
# after layer. Check `layers.0.input_layernorm` by hand:

# %%
x = v("embed_scale")  # the residual stream entering layer 0
w = np.array(model.weights("float32")["layers.0.input_layernorm.weight"])
eps = cfg.get("rms_norm_eps", 1e-6)   # a tiny constant: never divide by zero
by_hand = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w
print("by hand == input_layernorm:", np.allclose(by_hand, v("layers.0.input_layernorm"), atol=1e-5))
print("RMS of each token before:", np.sqrt((x ** 2).mean(-1)).round(2))

# %% [markdown]
# ## 3 · Attention
#
# Attention is how a token gathers information from earlier tokens. For each **head**:
#
# * `q_proj`, `k_proj`, `v_proj` project each token's normed vector into a **query** (what am I
#   looking for?), a **key** (what do I contain?) and a **value** (what do I hand over?);
# * `q_heads` splits them into heads; Gemma normalises queries and keys (`q_norm`, `k_norm`);
# * **RoPE** rotates queries and keys by an angle proportional to the token's position, so
#   that the dot product of a query and a key depends on how far apart they are;
# * `scores` = query · key for every pair (query token, earlier key token); later tokens are
#   masked out: a token cannot look at the future;
# * `softmax` turns each row of scores into weights that sum to 1;
# * `context` = the weighted sum of the values; `o_proj` mixes the heads back into one vector.

# %%
for name in ["layers.0.self_attn.q_proj", "layers.0.self_attn.q_heads", "layers.0.self_attn.q_rope",
             "layers.0.self_attn.k_rope", "layers.0.self_attn.scores", "layers.0.self_attn.softmax",
             "layers.0.self_attn.context", "layers.0.self_attn.o_proj"]:
    print(f"{name:30s} {tr.step_info(name).output_shape}")

# %% [markdown]
# **RoPE is a rotation**: it turns pairs of channels by a position-dependent angle, so it never
# changes a vector's length. Position 0 is not rotated at all.

# %%
q, qr = v("layers.0.self_attn.q_norm"), v("layers.0.self_attn.q_rope")   # (heads, tokens, head_dim)
print("lengths kept:", np.allclose(np.linalg.norm(q, axis=-1), np.linalg.norm(qr, axis=-1), rtol=1e-4))
print("position 0 unchanged:", np.allclose(q[:, 0], qr[:, 0], atol=1e-5))
print("position 5 rotated:", not np.allclose(q[:, 5], qr[:, 5], atol=1e-3))

# %% [markdown]
# **Softmax** rows are probability distributions over the earlier tokens; everything above the
# diagonal (the future) is exactly zero:

# %%
p = v("layers.0.self_attn.softmax")         # (heads, query, key)
print("rows sum to 1:", np.allclose(p.sum(-1), 1, atol=1e-5))
print("future is zero:", float(np.triu(p, k=1).max()) == 0.0)

# %% [markdown]
# Gemma 4 has two kinds of attention layers: **sliding-window** attention (a token sees only the
# last few tokens: cheap, local) and **full** attention (sees everything), with different head
# sizes and RoPE settings. This model has three sliding layers, then one full layer:

# %%
for i, kind in enumerate(cfg["layer_types"]):
    print(i, kind)
print("head_dim (sliding layers):", cfg["head_dim"], "| global_head_dim (full attention):", cfg["global_head_dim"])

# %% [markdown]
# ### Heads with a job
#
# Trained heads specialise. In the copy task the model must continue `apple river stone cloud
# tree | apple river stone` with ` cloud`. Two kinds of heads do it together:
#
# * a **previous-token head** attends from each token to the one just before it, copying into
#   each token's vector "the word before me was ...";
# * an **induction head** then attends, from the current word (`stone`), to the earlier token
#   whose *previous* word was `stone` — that is `cloud`, the answer — and copies it.
#
# Which heads are they? Measure instead of guessing: on 20 fresh copy prompts
# (6 random words, the bar, the same 6 words), average each head's attention from every token
# to the previous one, and from each repeated word to the word that followed its first
# occurrence.

# %%
import random
from workbench.demo import corpus
rng = random.Random(0)
L, H = model.num_layers, cfg["num_attention_heads"]
prev_score, ind_score = np.zeros((L, H)), np.zeros((L, H))
for _ in range(20):
    words = rng.sample(corpus.WORDS, 6)
    t = workbench.trace(model, " ".join(words) + " | " + " ".join(words), capture=["layers.*.self_attn.softmax"])
    t.run()
    T = t.ids.shape[1]                     # <bos> w1..w6 | w1..w6: 14 tokens
    q = np.arange(8, 13)                   # the repeated w1..w5 (positions 8..12)
    for l in range(L):
        p = np.array(t.value(f"layers.{l}.self_attn.softmax"))[0]           # (heads, query, key)
        prev_score[l] += p[:, np.arange(1, T), np.arange(T - 1)].mean(-1) / 20
        ind_score[l] += p[:, q, q - 6].mean(-1) / 20                        # -> the word after w_i's first occurrence
print("previous-token score (rows: layers, columns: heads)\n", prev_score.round(2))
print("induction score\n", ind_score.round(2))
INDUCTION = tuple(int(x) for x in np.unravel_index(ind_score.argmax(), ind_score.shape))
# the previous-token head the induction head relies on must run before it: an earlier layer
earlier = prev_score[:INDUCTION[0]]
PREV = tuple(int(x) for x in np.unravel_index(earlier.argmax(), earlier.shape))
print("induction head (layer, head):", INDUCTION, "| previous-token head before it:", PREV)

# %% [markdown]
# Layer 1 holds the induction heads — two of them, near twins scoring almost the same
# (the measurement made when the demo model was built, on more texts, ranks head 0 first:
# `workbench.demo.NAMED_HEADS`, used in notebooks 01 and 08; on these 20 prompts head 1
# edges ahead). An
# induction head can only use what earlier layers wrote into the residual stream, so the
# previous-token head it relies on must sit in an *earlier* layer: we take the best one there
# (later layers have previous-token-like heads too, doing other jobs). Their patterns on our
# prompt: the previous-token head is a stripe just below the diagonal; the induction head,
# after the `|`, is a stripe shifted to the word *after* each word's first occurrence.

# %%
for role, (layer, head) in {"previous-token": PREV, "induction": INDUCTION}.items():
    display(plots.attention_pattern(v(f"layers.{layer}.self_attn.softmax")[None], head=head, tokens=tokens,
                                    title=f"{role} head: layers.{layer} head {head}"))

# %% [markdown]
# ## 4 · The MLP
#
# After attention, each token is processed on its own by a two-layer network with a **gate**:
# `gate_proj` and `up_proj` widen the vector, `act` = GELU(gate) × up lets the gate switch
# channels on and off, `down_proj` narrows it back to D. GELU (Gaussian error linear unit)
# is a smooth version of ReLU, max(0, x): about x for large x, about 0 for very negative x;
# Gemma uses its tanh approximation (you write it in exercise 4).

# %%
g, u, a = v("layers.0.mlp.gate_proj"), v("layers.0.mlp.up_proj"), v("layers.0.mlp.act")
print(g.shape, "->", v("layers.0.mlp.down_proj").shape)
print(f"fraction of act's channels the gate switches (almost) off: {(np.abs(a) < 1e-2).mean():.0%}")

# %% [markdown]
# ## 5 · The residual stream
#
# Nothing in a layer *replaces* the token's vector: attention's output and the MLP's output are
# **added** to it (after their own norms). `layers.{i}` is the stream after layer `i`. Gemma 4
# then multiplies the whole stream by a learned per-layer number, `layer_scalar`: in this model
# layer 0's is about 0.2, which is why the norm drops after layer 0 before growing again as
# later layers write into the stream:

# %%
print("attn_residual = stream + normed attention:",
      np.allclose(v("layers.0.attn_residual"), v("embed_scale") + v("layers.0.post_attention_layernorm"), atol=1e-4))
print("layer_scalar:", [round(float(np.array(model.weights("float32")[f"layers.{i}.layer_scalar"]).ravel()[0]), 2)
                         for i in range(model.num_layers)])
plots.residual_norm_plot(tr, tokens=tokens)

# %% [markdown]
# ## 6 · The logit lens
#
# At the end, `norm` and `lm_head` turn the last stream vector into a score per vocabulary
# token. The **logit lens** applies that same ending to the stream after *every* layer: what
# would the model say if it stopped here? Read the table bottom-up. After layer 0 each
# position's best guess is its own token: the stream still mostly holds the token's embedding,
# and the embedding table is also the output table (Gemma ties them). After layer 1 — the layer
# of the induction head — every position already predicts the right next word; the later
# layers only make it surer.

# %%
lens = plots.logit_lens(tr, positions=list(range(len(ids) - 4, len(ids))))
plots.logit_lens_plot(lens)

# %% [markdown]
# ## Explore
#
# The debugger below holds the same forward pass. Step through it, jump to any op with
# **run to** (try `layers.2.self_attn.softmax` and change the head), and watch the heatmaps.

# %%
dbg = StepDebugger(workbench.trace(model, prompt, capture="full"))
dbg.step_layer()
dbg

# %% [markdown]
# ## 7 · Seeing is not proving: ablation and patching
#
# An attention pattern shows where a head *looks*; it does not prove the head *matters*.
# To prove it, change the head and watch the answer. `workbench.causal` (docs/causal.md)
# does it with the trace's interventions:
#
# * **zero ablation** sets a head's output (its slice of `self_attn.context`, before
#   `o_proj` mixes the heads) to zero;
# * **mean ablation** sets it to its *mean* output over many other prompts — a typical
#   message with nothing about this prompt in it;
# * **activation patching** runs a *corrupted* prompt but copies in one head's output from
#   a *clean* run: if the answer comes back, that head carries the difference.
#
# The measure is the probability of ` cloud`, the unablated model's answer (the demo's
# layer-1 heads are named L1H0 .. L1H3: layer 1, head 0 .. 3).

# %%
from workbench import causal as C
from workbench.plots import causal as P
pairs = (C.head(1, 0), C.head(1, 1))
zero = C.ablate(model, prompt, [C.head(1, 0), pairs, pairs + (C.head(1, 2),), pairs + (C.head(1, 3),)], mode="zero")
print(f"no ablation: p(' cloud') = {zero.baseline:.3f}")
for label, value in zip(zero.labels, zero.values):
    print(f"zero {label:18s} {value:.3f}")
P.ablation_plot(zero)

# %% [markdown]
# Zeroing **both** induction heads, L1H0 and L1H1, barely moves the answer. That is not a
# sign the heads were never needed: L1H2 is a **backup head**. It scores lower as an
# induction head (the table above), but when the main ones are gone it does the job — zero
# it as well and the answer collapses, while zeroing L1H3 instead changes nothing. Part of
# the rescue is mechanical too: the post-attention RMS norm rescales what is left, so the
# remaining heads' writes grow when two are silenced. Backup heads are common in trained
# models (the "name mover" backups in GPT-2's indirect-object circuit are the classic case):
# **one ablation that changes nothing does not show a component is unused.**
#
# Patching asks the converse. Clean `... tree | stone` continues with ` cloud`, corrupted
# `... tree | cloud` with ` tree`; the grid shows, for each head, how much of the clean
# answer (1 = all of it, 0 = none; the metric is the logit difference between the two
# answers) comes back when only that head's output is taken from the clean run:

# %%
clean, corrupted = "apple river stone cloud tree | stone", "apple river stone cloud tree | cloud"
patched = C.patch_heads(model, clean, corrupted)
print("effect (rows: layers, columns: heads)\n", np.round(patched.effect, 2))
P.patching_heatmap(patched)

# %% [markdown]
# Layer 1's heads carry the difference, each a part of it: no single head is the whole
# circuit, which is what the backup behaviour above predicts.

# %% [markdown]
# ## Exercises: predict, then check
#
# Write your answer in `answer` (or the function's body) and run the cell. `check` says
# *right*, *partly right* (and how much), or what to look at for the mistake you made; it
# never shows the answer. The "implement" exercises run your function on this model's real
# values and compare with the op's output. When you are done, or stuck, `solution("03.1")`
# in a cell of your own prints a worked solution (no cell of this notebook does).

# %%
from workbench.exercises import check, solution

# %% [markdown]
# **1.** Mean ablation replaces both induction heads' outputs with their average over 100
# held-out demo prompts (`corpus.heldout(50)` gives 50 examples per task; `C.ablate` takes
# their `.prompt` strings as `reference=`) instead of zero. Will p(' cloud') be **higher** or
# **lower** than with zero ablation (0.99 above)?

# %%
answer = None  # your prediction: "higher" or "lower"
check("03.1", answer)

# %% [markdown]
# **2.** Which op of layer 1 (a name starting with `layers.1.`) has the largest `absmax`
# on our prompt? (`tr.stats(name)["absmax"]`: the largest finite |value| of the op's output;
# attention scores' masked entries are not counted.) Hint: think about which outputs are not
# normalised.

# %%
answer = None  # your prediction: an op name, e.g. "layers.1.self_attn.q_proj"
check("03.2", answer)

# %% [markdown]
# **3.** Predict the shape of `layers.3.self_attn.q_rope` (the full-attention layer), as a
# tuple (batch, heads, tokens, head dimension). The config (`cfg`) has what you need.

# %%
answer = None  # your prediction: a tuple
check("03.3", answer)

# %% [markdown]
# **4. Implement it.** Write the MLP's gated activation: from `gate` and `up` (each
# `[tokens, intermediate_size]`), return what `layers.1.mlp.act` holds. Gemma's activation is
# GELU in its tanh approximation. `check` runs it on layer 1's real `gate_proj` and `up_proj`.

# %%
def mlp_act(gate, up):
    """gate, up: numpy float arrays of shape [tokens, intermediate_size]; return one of that shape."""
    return None  # your code

check("03.4", mlp_act)

# %% [markdown]
# **5. Implement it.** Write attention's weighted sum: `p` is a layer's softmax,
# `[heads, query, key]`, and `v` its values, `[key/value heads, key, head_dim]` (4 query heads
# share 2 key/value heads). Return the context, `[tokens, heads x head_dim]`, the heads side
# by side. `check` compares with `layers.1.self_attn.context`.

# %%
def attend(p, v):
    """p: a numpy float array [heads, query, key]; v: [kv_heads, key, head_dim]; return [query, heads x head_dim]."""
    return None  # your code

check("03.5", attend)

# %% [markdown]
# **What to remember.** A transformer is a residual stream that layers read from and add
# to; attention moves information *between* tokens, the MLP transforms each token on its own;
# every one of those ops is a named value you can look at and check. Next: 04, when those
# values turn into NaN.
