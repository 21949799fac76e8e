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
# # 08 · Generation with a KV cache
#
# A language model predicts one token at a time. To write a sentence, generation loops:
# run the model on the text so far, pick the next token (here: the most likely one —
# **greedy** decoding), append it, repeat.
#
# Running the whole text again for every new token repeats almost all the work: in a causal
# model, earlier tokens never look at later ones, so their **keys and values** — the vectors
# attention reads — never change. The **KV cache** (K for keys, V for values) keeps them:
# the first forward pass (the
# **prefill**) runs on the whole prompt and stores every layer's keys and values; each later
# forward runs on **one** new token, appends its key and value, and attends over the cache.
#
# Cache bugs are a classic of engine ports (wrong positions for RoPE — the rotary position
# embedding that turns queries and keys by an angle set by the token's position, notebook 03 —
# off-by-one lengths,
# a cache shared between layers that should not share it). Here we look inside one generation
# and prove that the cached forward passes give the same numbers as recomputing everything.

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
model = workbench.load(DEMO, dtype="float32", attention="explicit")   # scores and softmax as steps
prompt = "apple river stone cloud tree | apple"
g = workbench.generate(model, prompt, max_tokens=6, capture="full")
print(repr(prompt), "->", repr(g.text))
print(g)

# %% [markdown]
# `g.traces` holds one full trace per forward pass: `traces[0]` is the prefill, `traces[k]`
# produced token `k`. Look at the shapes of layer 0's queries, cached keys and attention
# scores in each:

# %%
for k, t in enumerate(g.traces):
    q = t.step_info("layers.0.self_attn.q_rope").output_shape
    kc = t.step_info("layers.0.self_attn.k_cache").output_shape
    sc = t.step_info("layers.0.self_attn.scores").output_shape
    print(f"forward {k}: input {tuple(t.ids.shape)}  queries {q}  cached keys {kc}  scores {sc}")

# %% [markdown]
# The prefill runs all prompt tokens at once (queries for every position). Each later forward
# has a **single** query — the new token — but its scores span every position so far: the
# cache grows by one key per step (the third dimension of `cached keys`).
#
# Note `rope_offset`, the position of the forward's first token: the new token must be
# rotated by its *true position* in the text, not by 0. Forgetting that is one of the most
# common cache bugs.

# %%
print([int(np.array(t.value("rope_offset"))[0]) for t in g.traces])

# %% [markdown]
# ## Proof: cached = recomputed
#
# For every generated token, run the whole text so far *without* a cache and compare the
# last position's logits with the cached forward's:

# %%
prompt_ids = g.prompt_ids[0].tolist()
for k, t in enumerate(g.traces):
    full = workbench.trace(model, prompt_ids + g.tokens[:k], capture=None)
    full.run()
    a, b = np.array(t.logits[0, -1]), np.array(full.logits[0, -1])
    print(f"token {k}: equal within 1e-4: {np.abs(a - b).max() < 1e-4}   same argmax: {a.argmax() == b.argmax()}")

# %% [markdown]
# Equal up to float32 rounding (the sums are done in a different order).
#
# ## The same proof per layer, as a check: `cache_check`
#
# `workbench.cache_check(model, ids)` (on the command line: `workbench cache-check PATH
# --prompt TEXT`) does this for one prompt of T tokens, layer by layer: a prefill of the
# first T-1 tokens and a decode of the last one through the cache, against one forward over
# all T. It compares the residual stream after every layer (`layers.{i}`) and the `logits`
# at the last position and names the **first** one that differs beyond its dtype's
# tolerance (relative: float32 1e-4, float16 1e-2, bfloat16 3.125e-2). A bug enters at one
# layer and everything after it inherits it, so the first layer is where to look.

# %%
r = workbench.cache_check(model, prompt)
print("consistent:", r.consistent, "| first beyond tolerance:", r.first, "| cache:", r.cache)
print("every layer within 1e-5:", all(row["rel"] < 1e-5 for row in r.rows), [row["name"] for row in r.rows])
print("TF32:", r.tf32["note"])

# %% [markdown]
# Now plant the classic bug: an off-by-one position in the decode (the new token is rotated
# for position T instead of T-1). `WORKBENCH_CACHE_PLANT=position` is a testing aid that does
# exactly that inside the check:

# %%
import os
os.environ["WORKBENCH_CACHE_PLANT"] = "position"
try:
    bad = workbench.cache_check(model, prompt)
finally:
    del os.environ["WORKBENCH_CACHE_PLANT"]
print("consistent:", bad.consistent, "| first beyond tolerance:", bad.first)
for row in bad.rows:
    print(f"  {row['name']:9s} {'ok ' if row['ok'] else 'BAD'}  relative difference {row['rel']:.2f}")

# %% [markdown]
# The position enters at the first attention, so `layers.0` is already off, far beyond
# rounding. On CUDA in float32 the report also says whether **TF32** (MLX's default
# reduced-precision float32 matmuls there) could explain a small difference; on the CPU it
# does not apply.
#
# ## What the new token looks at
#
# In the copy task, the model continues the second half by looking back at the first half.
# The induction head's attention row for each generated token shows where it looked — the word
# *after* the previous occurrence of the current word:

# %%
from workbench.demo import NAMED_HEADS      # heads measured when the demo model was built (notebook 03)
layer, head, score = NAMED_HEADS["induction"]
all_tokens = [model.decode([i]) for i in prompt_ids + g.tokens]
for k, t in enumerate(g.traces[1:], start=1):
    row = np.array(t.value(f"layers.{layer}.self_attn.softmax"))[0, head, -1]   # [positions so far]
    pos = int(row.argmax())
    cur = all_tokens[len(prompt_ids) + k - 1]
    print(f"current {cur!r:9s} looks at position {pos:2d} {all_tokens[pos]!r:9s} (weight {row[pos]:.2f}) -> predicts {model.decode([g.tokens[k]])!r}")

# %% [markdown]
# ## Sliding windows and shared caches
#
# Gemma 4's sliding-window layers only attend to the last `sliding_window` positions: their
# mask (`attn_mask_sliding`) hides older cache entries. Its last layers may also **share** the
# cache of an earlier layer of the same type instead of computing their own keys and values
# (`num_kv_shared_layers`): such layers have no `k_proj`, and their attention reads the other
# layer's `k_cache`.
#
# The demo model above has neither in view (its window, 16 tokens, is longer than these
# prompts, and no layer shares a cache), so this section loads the **kv variant**
# (`assets/demo-kv`, docs/demo.md): six layers, sliding (S) or full (F) `S S S F S F`, a
# window of 8 tokens, and the last two layers KV-shared.

# %%
from workbench.demo.paths import DEMO_KV
kv = workbench.load(DEMO_KV, dtype="float32", attention="explicit")
kcfg = kv.config
W = kcfg["sliding_window"]
print("sliding_window:", W, "| kv-shared layers:", kcfg["num_kv_shared_layers"])
for i in range(kv.num_layers):
    scores = kv.program[f"layers.{i}.self_attn.scores"]
    print(f"layer {i} ({kcfg['layer_types'][i]:17s}): scores read {', '.join(scores.inputs)}")

# %% [markdown]
# Layers 4 and 5 compute no keys of their own: layer 4 (sliding) reads layer 2's cache,
# layer 5 (full) reads layer 3's. Now a prompt longer than the window: five who-has-what
# entries, then the first name asked again. Tom's colour is 19 tokens before the question,
# well beyond the 8-token window. Generate the answer and, in the first forward pass (the
# prefill), measure each layer's attention mass from the last token to positions beyond the
# window (averaged over heads):

# %%
from workbench.demo.variants import FAR_RECALL
gk = workbench.generate(kv, FAR_RECALL, max_tokens=4, capture=["layers.*.self_attn.softmax"])
print(repr(FAR_RECALL), "->", repr(gk.text))
p0 = gk.traces[0]
T = len(p0.ids[0])
beyond = []
for i in range(kv.num_layers):
    a = np.array(p0.value(f"layers.{i}.self_attn.softmax"))[0, :, -1]     # [heads, T]
    beyond.append(a[:, 1:T - W].sum(-1).mean())                      # <bos> left out (a sink)
    print(f"layer {i} ({kcfg['layer_types'][i]:17s}) attention mass beyond the window: {beyond[-1]:.3f}")

# %%
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(6, 2.5))
ax.bar(range(kv.num_layers), beyond, color=["C0" if t == "sliding_attention" else "C3" for t in kcfg["layer_types"]])
ax.set_xticks(range(kv.num_layers), [f"{i} {t[0].upper()}" for i, t in enumerate(kcfg["layer_types"])])
ax.set_xlabel("layer (S sliding, F full)"); ax.set_ylabel("mass beyond window")
ax.set_title(f"last token of a {T}-token prompt, window {W}"); plt.show()

# %% [markdown]
# The sliding layers, KV-shared layer 4 included, put exactly zero weight beyond the window:
# the mask forbids it. The full-attention layers put about half of their weight there
# (measured in docs/demo.md: 0.49 in layer 3, 0.46 in the KV-shared layer 5), so only they
# can carry information from the start of this prompt to its end.
#
# Whether the model *uses* that reach is a separate question, and here the answer is no:
# this variant was fine-tuned for only 100 steps, and its full layers spread their weight
# over the early entries instead of finding tom's (the best head puts at most 0.0002 on
# `blue`), so the completion above is a guess. Its held-out accuracy is 58% on copy and 60%
# on recall (docs/demo.md). An engine whose sliding mask is wrong (too wide, or applied to
# the full layers) changes exactly these numbers: compare each layer's mass beyond the window
# with the reference's.

# %% [markdown]
# ## Watching values across tokens
#
# `g.stats(op)` gives an op's statistics in every forward pass — a quick way to see a value
# drift as generation goes on (in a broken engine: growing until it overflows).

# %%
for name in ["layers.0", f"layers.{model.num_layers - 1}", "logits"]:
    print(f"{name:10s}", [float(f"{s['absmax']:.3g}") for s in g.stats(name)])
print("first non-finite in any forward:", g.first_nonfinite())

# %% [markdown]
# ## Why bother: the cost
#
# With the cache each new token costs one token's worth of compute; without it, the whole text
# again. Timing both on this tiny model (your numbers will differ):

# %% tags=["nbval-ignore-output"]
import time
def timed(f):
    t0 = time.perf_counter(); f(); return time.perf_counter() - t0
long_prompt = " ".join(["apple river stone cloud tree bird moon sun star rain |"] * 4)
n = 16
with_cache = timed(lambda: workbench.generate(model, long_prompt, max_tokens=n, capture=None, past_eos=True))
def no_cache():
    ids = model.encode(long_prompt)
    for _ in range(n):
        t = workbench.trace(model, ids, capture=None); t.run()
        ids = ids + [int(mx.argmax(t.logits[0, -1]).item())]
without = timed(no_cache)
print(f"{n} tokens: with cache {with_cache:.2f} s, without {without:.2f} s")

# %% [markdown]
# ## Exercises: predict, then check
#
# Write your answer in `answer` (or the function's body) and run the cell. `check` says
# *right*, *partly right* (and how much), or what to look at for the mistake you made; it
# never shows the answer. The "implement" exercises run your function on this model's real
# values and compare with the op's output. When you are done, or stuck, `solution("08.1")`
# in a cell of your own prints a worked solution (no cell of this notebook does).

# %%
from workbench.exercises import check, solution

# %% [markdown]
# **1.** Generate 40 tokens from the same prompt, going on past `<eos>`
# (`workbench.generate(model, prompt, max_tokens=40, past_eos=True)`: without `past_eos=True`
# generation stops at `<eos>`, after 6 forwards). How many positions does the
# *full-attention* layer's cache, `layers.3.self_attn.k_cache`, hold in forward 30
# (`g.traces[30]`, the forward that produces generated token 30)?

# %%
answer = None  # your prediction: a number
check("08.1", answer)

# %% [markdown]
# **2.** Which `rope_offset` does forward 30 use?

# %%
answer = None  # your prediction: a number
check("08.2", answer)

# %% [markdown]
# **3. Implement it.** Return the `rope_offset` of every forward of a generation: the
# prefill, then one forward per generated token. `check` compares with the traces of a
# 6-token generation from our prompt.

# %%
def rope_offsets(prompt_len, forwards):
    """prompt_len, forwards: ints; return a list of ints, one per forward."""
    return None  # your code

check("08.3", rope_offsets)

# %% [markdown]
# **4. Implement it.** Greedy decoding: from one forward's logits (`[positions, vocab]`),
# return the id of the token it generates. `check` runs it on every forward of that
# generation and compares with the tokens it produced.

# %%
def greedy(logits):
    """logits: a numpy float array of shape [positions, vocab]; return a token id (an int)."""
    return None  # your code

check("08.4", greedy)

# %% [markdown]
# **What to remember.** Generation = prefill + one-token forwards over a growing cache; the
# cached numbers must equal a full recomputation, with each new token rotated at its true
# position. When an engine's first generated token is right and the next ones are wrong, look
# at the cache.
