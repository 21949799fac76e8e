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
# # 09 · Bring your own model: any architecture, and Gemma 4's vision and audio towers
#
# Notebooks 01–08 step through *op programs*: our own, line-by-line descriptions of four
# model families (Gemma 4 and Gemma 3 text, Qwen 3, Llama), where every matmul, norm and
# softmax is a step. Your model may be none of these. The workbench then opens it through
# its **reference implementation** — mlx-lm for text models (well over a hundred
# architectures), mlx-vlm for models with vision or audio towers — and records every
# **module call** as a step. You will learn:
#
# 1. how `workbench.load` picks the granularity, and what a module-level step is;
# 2. what this granularity cannot open (fused kernels), and how that shows;
# 3. how to find a planted NaN (not-a-number) weight and a float16 overflow in a model we
#    never described by hand;
# 4. how to trace Gemma 4 on an image and an audio clip, towers included, and find a NaN in
#    the audio tower.
#
# Everything runs offline on tiny random checkpoints written by `workbench.zoo` (random
# weights: the predictions are meaningless, the mechanics are real). Point the same calls
# at your own checkpoint directory.

# %%
import workbench                      # first: on Linux, points MLX at a fast BLAS (matrix-multiply library)
import numpy as np
import mlx.core as mx
# %matplotlib inline
np.random.seed(0); mx.random.seed(0)
np.set_printoptions(precision=4, suppress=True, linewidth=110)

import tempfile, pathlib
from workbench.zoo import reference as zoo_ref
from workbench.zoo.multimodal import build_gemma4
from workbench.notebook import planted
from workbench.trace import hunt
from workbench.widgets import StepDebugger
work = pathlib.Path(tempfile.mkdtemp())

# %% [markdown]
# ## 1 · A model with no op program
#
# Mixtral is a mixture-of-experts (MoE) model: each layer's MLP is replaced by several
# "expert" MLPs and a router that sends each token to two of them. We have no op program
# for it, so `workbench.load` opens it with mlx-lm's own `Model` class and instruments it.

# %%
path = zoo_ref.build("mixtral", work / "mixtral")     # or: path = "/path/to/your/checkpoint"
model = workbench.load(path)
print(model)
print("granularity:", model.granularity, "| built by:", model.library)

# %% [markdown]
# A **step** is one module call, named by the module's path in the checkpoint (the
# `model.` prefix stripped, as everywhere in the workbench). Children finish before their
# parent: `layers.0.self_attn.o_proj` comes before `layers.0.self_attn`, which comes before
# `layers.0` — the residual stream after layer 0, exactly as in op programs. The last step
# is `logits`. A module called twice in one forward gets `#2`: mlx-lm applies the same
# RoPE (rotary position embedding) module to the queries, then to the keys.

# %%
t = workbench.trace(model, "the cat sat on the mat", capture="stats")
t.run()
print(len(t.ops), "steps; layer 0:")
for s in t.steps:
    if s.layer == 0:
        print(f"  {s.index:3d}  {s.name:38s} {s.kind:16s} {str(list(s.output_shape)):14s} absmax {s.stats['absmax']:.3g}")

# %% [markdown]
# ## 2 · What a module-level step cannot open
#
# Code *between* module calls is not a step: the fused attention kernel
# (`mx.fast.scaled_dot_product_attention`, which never materialises the attention
# scores), residual adds, reshapes, activation functions called as plain functions. Its
# result shows up as the next module's input. `t.inputs(name)` labels each input with the
# step that produced it — or says it was computed between steps:

# %%
print(t.note)
for label, v in t.inputs("layers.0.self_attn.o_proj"):
    print(f"o_proj input: {label:36s} shape {list(v.shape)}")
for label, v in t.inputs("layers.0.post_attention_layernorm"):
    print(f"post_attention_layernorm input: {label:36s} shape {list(v.shape)}")

# %% [markdown]
# So `o_proj`'s input is the attention output (computed by the fused kernel, not a step),
# and the post-attention norm reads the residual sum `x + attention` (an add between
# steps). When you need the scores and the softmax, use an op program with explicit attention
# (`workbench.load(path, attention="explicit")`, notebook 03) — or
# compare against the module view: where the two granularities share a name
# (`layers.1.self_attn.q_proj`, `layers.1`, `logits`) their values agree.
#
# The debugger works on this trace unchanged: **step**, **step over layer**, **run to**,
# **next non-finite**, **back**.

# %%
dbg = StepDebugger(workbench.trace(model, "the cat sat on the mat", capture="full"))
dbg.run_to("layers.0.block_sparse_moe")
dbg

# %% [markdown]
# ## 3 · A planted NaN weight, and a float16 overflow
#
# We copy the checkpoint and poison one element of layer 1's second expert projection
# (`w2`, as mixtral names its down projection), the way a broken conversion would. The
# hunt runs the forward with statistics of every step and stops at the first step whose
# output holds a NaN or an infinity, then says why: here the module's own parameter is
# NaN (**nonfinite-weight**).

# %%
W = "model.layers.1.block_sparse_moe.switch_mlp.down_proj.weight"
def poison(ts):
    w = ts[W]
    ts[W] = mx.where(mx.arange(w.size).reshape(w.shape) == 7, mx.array(float("nan"), w.dtype), w)
bad = workbench.load(planted(path, work / "mixtral_nan", poison))
f = hunt(bad, "the cat sat on the mat").finding
print(f.op, "|", f.cause)
print(f.detail)

# %% [markdown]
# An **overflow** is the other common cause: float16's largest finite value is 65 504,
# and an activation that is harmless in bfloat16 or float32 becomes infinite. (MLX's CPU
# kernel for mixture-of-experts matmuls computes in float32 only, so this part uses a
# dense architecture, Phi-3.) We scale layer 1's attention output projection so its
# result passes 65 504. In float32 the forward is clean; in float16 the hunt stops at that
# module, recomputes it on float32 copies of its recorded inputs with float32 weights,
# finds it finite there, and calls it **overflow**:

# %%
phi3 = zoo_ref.build("phi3", work / "phi3")
clean = workbench.trace(workbench.load(phi3), "the cat sat on the mat", dtype="float32")
clean.run()
scale = float(f"{2 * 65504 / clean.stats('layers.1.self_attn.o_proj')['absmax']:.2g}")   # to twice float16's limit
print(f"scaling layer 1's o_proj weight by {scale:g}")
O = "model.layers.1.self_attn.o_proj.weight"
def loud(ts):
    ts[O] = ts[O] * scale
big = workbench.load(planted(phi3, work / "phi3_loud", loud))
print("float32:", hunt(big, "the cat sat on the mat", dtype="float32").finding)
f16 = hunt(big, "the cat sat on the mat", dtype="float16").finding
print("float16:", f16.op, "|", f16.cause, f"| float32 absmax {f16.float32_absmax:.3g}")

# %% [markdown]
# ## 4 · Gemma 4 on an image and an audio clip
#
# Gemma 4 checkpoints carry a vision tower and (E2B, E4B) an audio tower. Their outputs
# are projected into the language model's width (`embed_vision`, `embed_audio`) and
# replace placeholder tokens in the prompt. `workbench.trace(model, text, images=[...],
# audio=[...])` preprocesses images (arrays or PNG/JPEG files) and audio (16 kHz
# waveforms or WAV files) with mlx-vlm's own Gemma 4 processor, puts the placeholder
# tokens before the text, and records the towers as steps of their own, then the language
# model on the merged sequence. (Our op program covers Gemma 4's language model only, so
# a multimodal trace asks for `granularity="module"`.)

# %%
g4 = build_gemma4(work / "gemma4")
mm = workbench.load(g4, granularity="module")
image = (np.indices((16, 16)).sum(0) * 8 % 256).astype(np.uint8)[..., None].repeat(3, -1)   # a 16 x 16 pattern
clip = (0.3 * np.sin(2 * np.pi * 440 * np.arange(3200) / 16000)).astype(np.float32)      # 0.2 s of 440 Hz
tm = workbench.trace(mm, [5, 6, 7], images=[image], audio=[clip])
tm.run()
towers = [s for s in tm.steps if s.name.split(".")[0] in ("vision_tower", "embed_vision", "audio_tower", "embed_audio")]
print(f"{len(tm.ops)} steps, {len(towers)} in the towers and projectors; prompt of {tm.ids.shape[1]} tokens")
for name in ("vision_tower", "embed_vision", "audio_tower", "embed_audio", "layers.0", "logits"):
    s = tm.step_info(name)
    print(f"  {name:14s} {str(list(s.output_shape)):14s} absmax {s.stats['absmax']:.3g}")

# %% [markdown]
# The original engine's reports from this kind of port mention NaN in the audio forward.
# Here is how the workbench localises one: a NaN planted in one weight of the audio
# tower's second conformer block is found at exactly that module, and a text-only prompt
# (which never runs the tower) stays clean.

# %%
AW = "audio_tower.layers.1.feed_forward1.ffw_layer_1.linear.weight"
nan_g4 = workbench.load(build_gemma4(work / "gemma4_nan", nan_at=AW), granularity="module")
fa = workbench.trace(nan_g4, [5, 6, 7], audio=[clip]).first_nonfinite()
print(fa.op, "|", fa.cause)
print("text only:", workbench.trace(nan_g4, [5, 6, 7]).first_nonfinite())

# %% [markdown]
# ## Exercises: predict, then check
#
# Write your answer in `answer` (or the function's body) and run the cell. `check` says
# *right*, *partly right* (and how much), or what to look at for the mistake you made; it
# never shows the answer. The "implement" exercises run your function on this model's real
# values and compare with the op's output. When you are done, or stuck, `solution("09.1")`
# in a cell of your own prints a worked solution (no cell of this notebook does).

# %%
from workbench.exercises import check, solution

# %% [markdown]
# **1.** In the Gemma 4 trace above, does `embed_audio` come **before** or **after**
# `layers.0`?

# %%
answer = None  # your prediction: "before" or "after"
check("09.1", answer)

# %% [markdown]
# **2.** Trace the Phi-3 checkpoint at float16 *without* the planted overflow. Is it clean
# (no non-finite step)?

# %%
answer = None  # your prediction: True or False
check("09.2", answer)

# %% [markdown]
# **3. Implement it.** From a step's name (`layers.3.self_attn.rope#2`, `embed_tokens`), return
# its layer number, or None outside the layers. `check` runs it on every step of a Phi-3
# trace and compares with `step.layer`.

# %%
def layer_of(name):
    """name: a step name (str); return an int, or None."""
    return None  # your code

check("09.3", layer_of)

# %% [markdown]
# **4. Implement it.** From a dict step name -> absmax, return the step closest to
# float16's limit. `check` runs it on the float16 Phi-3 trace's statistics.

# %%
def largest(absmax):
    """absmax: a dict step name (str) -> float; return one step name."""
    return None  # your code

check("09.4", largest)

# %% [markdown]
# ## What to remember
#
# * `workbench.load(path)` opens any architecture mlx-lm or mlx-vlm builds; module calls
#   are the steps, named by module path, with `layers.{i}` and `logits` as everywhere.
# * Fused kernels and code between modules are not opened: their results are the next
#   module's inputs (`t.inputs`). Use an op program to see inside attention.
# * The hunt's causes — nonfinite-weight, overflow, nonfinite-input — work at this
#   granularity too, towers included.
#
# Next: notebook 04 for the hunt in depth, 06 for comparing your engine's activations
# against these reference values.
