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
# # 01 · A tour of the workbench
#
# The workbench lets you **see inside a transformer language model while it runs**: every
# intermediate value of the forward pass, op by op, with the numbers that matter when you
# port a model to your own engine — shapes, ranges, how close a value is to overflowing
# float16, where the first NaN appears and why.
#
# It runs on MLX, Apple's array library (on a Mac's GPU, or on the CPU anywhere), and is
# checked against mlx-lm, the MLX team's implementation of these models: our **logits** (the
# model's score for every possible next token) equal mlx-lm's. This tour takes a few minutes;
# run each cell in order (Shift-Enter). Each later notebook goes deep on one topic:
#
# | notebook | what you learn |
# |---|---|
# | 02 weights | is a checkpoint complete? *missing* vs *misnamed* tensors |
# | 03 forward pass | embeddings, norms, RoPE, attention, MLP, residual stream, logit lens |
# | 04 NaN hunt | a float16 overflow and a poisoned weight, found and explained |
# | 05 buffer aliasing | an engine bug that corrupts numbers silently, and the analyzer that finds it |
# | 06 engine diff | the first op where your engine departs from the reference |
# | 07 mixture of experts | the router, top-k experts, expert load |
# | 08 generation | the KV (key/value) cache, token by token |
# | 09 bring your own model | any mlx-lm architecture, and Gemma 4's vision and audio towers |
# | 10 engine NaN playbook | "my engine gives NaN": from the checkpoint to the faulty buffer |
#
# ## The demo model
#
# Everything runs offline on a small model that ships with the repository: the real Gemma 4
# architecture (Google's open model family: sliding-window and full attention layers,
# per-layer embeddings, all explained in notebook 03), shrunk to a few MB and trained for a
# few minutes on two tasks whose answers can be checked:
#
# * **copy**: `lamp river coin | lamp river coin .` — repeat a list of words seen once;
# * **recall**: `mia red kite . tom blue cup . anna green hat . tom` → ` blue cup .` — who has what

# %%
import workbench                      # first: on Linux, points MLX at a fast BLAS (matrix-multiply library)
import numpy as np
import mlx.core as mx
from IPython.display import display
# %matplotlib inline
np.random.seed(0); mx.random.seed(0)
np.set_printoptions(precision=4, suppress=True, linewidth=110)

from workbench.demo.paths import DEMO
from workbench.widgets import StepDebugger
from workbench import plots
# stored in bfloat16 (16-bit floats), computed in float32 here; attention="explicit": every layer's
# attention as three steps (scores, softmax, context) to look at -- by default it is one fused step
model = workbench.load(DEMO, dtype="float32", attention="explicit")
model

# %%
cfg = model.config
print({k: cfg[k] for k in ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"]})
print(cfg["layer_types"])

# %% [markdown]
# ## It works: greedy generation
#
# `workbench.generate` decodes greedily with a KV cache (notebook 08 opens it up). It stops
# after the end-of-text token `<eos>` (the checkpoint's `eos_token_id`; `past_eos=True`
# keeps going to `max_tokens`).

# %%
for prompt in ["apple river stone cloud | apple", "mia red kite . tom blue cup . anna green hat . tom"]:
    g = workbench.generate(model, prompt, max_tokens=6)
    print(f"{prompt!r} -> {g.text!r}")

# %% [markdown]
# ## The model as a program of named ops
#
# Inside the workbench a model's forward pass is a flat list of **ops**, each a small
# function of earlier values. An op that applies a checkpoint weight is named after that
# weight (`layers.0.self_attn.q_proj` applies `layers.0.self_attn.q_proj.weight`);
# `layers.{i}` is the residual stream after layer `i`; `logits` is the last op. Every tool —
# tracing, NaN hunting, the engine emulator, the diff, these widgets — is a view over this list.

# %%
prog = model.program
print(len(prog), "ops; the first 14:")
for op in prog.ops[:14]:
    print(" ", op.describe())

# %% [markdown]
# ## A trace: every value, by name
#
# `workbench.trace(model, text, capture="full")` prepares a run; `run()` executes it and
# keeps every op's output (`capture="stats"` keeps only statistics: cheaper on big models).

# %%
prompt = "apple river stone cloud tree | apple river stone"
tr = workbench.trace(model, prompt, capture="full")
tr.run()
print(tr)
tokens = [model.decode([i]) for i in tr.ids[0].tolist()]
print(tokens)
probs = mx.softmax(tr.logits[0, -1].astype(mx.float32), axis=-1)   # logits: [batch, position, vocab]
top = mx.argsort(-probs)[:3].tolist()
print("next token:", [(model.decode([t]), round(probs[t].item(), 3)) for t in top])

# %% [markdown]
# Any value, by op name, as an MLX array; and its statistics: `absmax` is the largest |x|,
# `nan` / `posinf` / `neginf` count the non-finite elements, `zero_frac` is the fraction of
# exact zeros, `headroom` is absmax over the largest finite value of the trace's dtype (how
# close to overflow), `masked` counts the attention scores filled in to hide future tokens
# (they are left out of the other statistics).

# %%
v = tr.value("layers.0.self_attn.softmax")
print(v.shape, "(batch, heads, query token, key token)")
s = tr.stats("layers.2")
print({k: (float(f"{x:.3g}") if isinstance(x, float) else x) for k, x in s.items()})

# %% [markdown]
# ## Step through it
#
# The `StepDebugger` drives a trace with buttons: **step** one op, **step over layer**, **run
# to** an op by name, run to the **next non-finite** value, **back**. It shows the current op
# with its input and output shapes, statistics, the fraction of float16's and bfloat16's
# range used (*headroom*), a heatmap of the value (tokens × channels), the attention pattern
# on attention ops (pick the head), and the residual-stream norm of each finished layer.
# Click **step** a few times, then try **run to** `layers.1.self_attn.softmax`.

# %%
debugger = StepDebugger(workbench.trace(model, prompt, capture="full"))
debugger.run_to("layers.0.self_attn.softmax")
debugger

# %% [markdown]
# The buttons are ordinary methods too (`debugger.step()`, `debugger.run_to(name)`, ...), and
# everything the widget shows is also available from the trace.
#
# ## Plots
#
# `workbench.plots` draws the common views as matplotlib figures, no widgets needed. The
# residual stream's size after each layer:

# %%
plots.residual_norm_plot(tr, tokens=tokens)

# %% [markdown]
# And one attention head's pattern: each row is a query token, each column a key token it
# may look at (only earlier ones: the model is causal). After the `|`, this head looks at the
# word that *followed* the current word the first time round — it is an **induction head**,
# the circuit that lets the model copy (notebook 03 explains and measures it). Before the `|`,
# with nothing to copy yet, it parks its attention on `<bos>` (the beginning-of-sequence token
# every prompt starts with), as idle heads do. `NAMED_HEADS` holds the heads measured when the
# demo model was built, as (layer, head, score).

# %%
from workbench.demo import NAMED_HEADS      # heads measured when the demo model was built
layer, head, score = NAMED_HEADS["induction"]
plots.attention_pattern(tr.value(f"layers.{layer}.self_attn.softmax"), head=head, tokens=tokens,
                        title=f"layers.{layer} head {head}: induction")

# %% [markdown]
# ## Checking a checkpoint, hunting a NaN
#
# Two one-liners you will use a lot (notebooks 02 and 04):

# %%
print(workbench.inspect(DEMO).ok)
from workbench.trace import hunt
print(hunt(model, prompt, dtype="float16"))

# %% [markdown]
# ## Exercises: predict, then check
#
# Write your answer in `answer` (or the function's body) and run the cell. `check` says
# *right*, *partly right* (and how much), or what to look at for the mistake you made; it
# never shows the answer. The "implement" exercises run your function on this model's real
# values and compare with the op's output. When you are done, or stuck, `solution("01.1")`
# in a cell of your own prints a worked solution (no cell of this notebook does).

# %%
from workbench.exercises import check, solution

# %% [markdown]
# **1.** Give the model one word less: `apple river stone cloud tree | apple river`. Which
# token will it predict next?

# %%
answer = None  # your prediction, a token with its leading space, e.g. " apple"
check("01.1", answer)

# %% [markdown]
# **2.** Trace the shorter prompt `apple river stone | apple`. What is the shape of
# `layers.2.self_attn.softmax`, as a tuple (batch, heads, query token, key token)?

# %%
answer = None  # your prediction: a tuple of four numbers
check("01.2", answer)

# %% [markdown]
# **3. Implement it.** Write the attention softmax: `scores` is one layer's
# `self_attn.scores` for our sequence, `[heads, query, key]`, with the future masked by a
# huge negative number. Return the weights, the same shape, each query's row summing to 1.
# `check` runs it on layer 2's real scores and compares with `layers.2.self_attn.softmax`.

# %%
def softmax(scores):
    """scores: a numpy float array of shape [heads, query, key]; return the same shape."""
    return None  # your code

check("01.3", softmax)

# %% [markdown]
# **4. Implement it.** From one position's logits (a vector of `vocab_size` scores), return
# the ids of the `k` most likely next tokens, most likely first. `check` runs it on the last
# position of `apple river stone cloud tree | apple`.

# %%
def top_tokens(logits, k):
    """logits: a numpy float array of shape [vocab]; k: an int; return a list of k token ids (ints)."""
    return None  # your code

check("01.4", top_tokens)

# %% [markdown]
# ## Next
#
# Learning how a transformer computes? Open **03 stepping through a forward pass** next,
# then 08 (generation), 07 (mixture of experts) and 04 (NaN hunt). Porting a model to your
# own engine? Go to **10**, the playbook for an engine that gives NaN, and from there to
# 02, 04, 05 and 06 as you need them. Every notebook runs top to bottom in a minute or two
# on a laptop CPU.
