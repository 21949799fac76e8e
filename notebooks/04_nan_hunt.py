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
# # 04 · NaN hunt
#
# "The output is all NaN" is the most common and least informative symptom of a broken port.
# A NaN (not-a-number) or an infinity, once it appears, spreads: every op that reads it
# produces more, and attention mixes it into every later token. So by the time you see it in
# the logits, almost every value is non-finite, and the only one that matters is the
# **first**. The workbench finds that first op and says **why** it went non-finite:
#
# | cause | meaning |
# |---|---|
# | `overflow` | inputs and weights finite; the result passes the dtype's largest value (float16: 65504) |
# | `invalid` | inputs finite, the result NaN: inf − inf, 0/0, sqrt of a negative... |
# | `nonfinite-weight` | a weight (or scale/bias) of this op is NaN/Inf, or too large for the dtype |
# | `nonfinite-input` | a program input is already non-finite |
# | `injected` | you put it there on purpose (interventions, for teaching) |
#
# Two real cases follow: an **fp16 overflow** (fp16 = float16, the 16-bit float format many
# GPU engines use) and a **poisoned weight**. Both are planted in copies of the demo model
# with `workbench.notebook.planted(source, copy, change)`, which applies `change` to the
# copy's tensors and never touches the original.

# %%
import workbench                      # first: on Linux, points MLX at a fast BLAS (matrix-multiply library)
import numpy as np
import mlx.core as mx
from IPython.display import display
# %matplotlib inline
np.random.seed(0); mx.random.seed(0)
np.set_printoptions(precision=4, suppress=True, linewidth=110)

import tempfile, pathlib
from workbench.demo.paths import DEMO
from workbench.notebook import planted
from workbench.trace import hunt, inject
from workbench.widgets import StepDebugger
from workbench import plots
work = pathlib.Path(tempfile.mkdtemp())
prompt = "mia red kite . tom blue cup . anna green hat . mia"

# %% [markdown]
# ## Floating-point ranges
#
# | dtype | largest finite value | digits |
# |---|---|---|
# | float32 | 3.4 × 10³⁸ | ~7 |
# | bfloat16 | 3.4 × 10³⁸ | ~2–3 |
# | float16 | **65 504** | ~3 |
#
# Gemma models were trained in bfloat16, which has float32's range. Some of their activations
# are larger than 65 504 — harmless in bfloat16, **infinite in float16**. Engines that pick
# float16 for speed (common on Apple GPUs) hit this first.
#
# ## Case 1 · an fp16 overflow
#
# Our small demo model has modest activations, so we make it behave like a big Gemma: we scale
# layer 1's MLP weights up (a model can carry such weights; the norm after the MLP absorbs the
# size). The MLP's activation is gate × up, so scaling both by `s` scales it by about `s²`; we
# pick `s` to bring its largest value to about twice float16's limit. Two words used below:
# an op's **absmax** is its largest absolute value, and its **headroom** is that absmax divided
# by the largest finite value of the dtype the trace runs in (1.0 or more: overflow).

# %%
base = workbench.trace(workbench.load(DEMO), prompt, capture="stats", dtype="float32")
base.run()
act_max = base.stats("layers.1.mlp.act")["absmax"]
s = float(f"{np.sqrt(2 * 65504 / act_max):.2g}")   # two significant digits are plenty
print(f"layers.1.mlp.act absmax {act_max:.3g} -> scale gate_proj and up_proj by {s:g}")

def big_mlp(ts):
    for k in [k for k in ts if k.endswith(("layers.1.mlp.gate_proj.weight", "layers.1.mlp.up_proj.weight"))]:
        ts[k] = (ts[k].astype(mx.float32) * s).astype(ts[k].dtype)
loud = workbench.load(planted(DEMO, work / "loud", big_mlp))
t32 = workbench.trace(loud, prompt, capture="stats", dtype="float32")
t32.run()
print("float32 first non-finite:", t32.first_nonfinite())
print("closest to float32's limit:")
for name, h in t32.headroom(top=4):
    print(f"  {name:32s} {h:.3g} of float32's range")

# %% [markdown]
# Headroom is always relative to the dtype the trace runs in. Translate it to float16:
# anything above 1.0 will overflow.

# %%
for name, _ in t32.headroom(top=4):
    print(f"  {name:32s} absmax {t32.stats(name)['absmax']:>9.3g} = {t32.stats(name)['absmax'] / 65504:.2f} x float16 max")

# %% [markdown]
# Now the same forward pass in float16. `hunt` runs it with statistics on every op and stops at
# the first non-finite one:

# %% tags=["nbval-ignore-output"]
result = hunt(loud, prompt, dtype="float16")
f = result.finding
print(f)

# %%
print(f.op, "|", f.cause, "| +inf:", f.posinf > 0, "| -inf:", f.neginf > 0)

# %% [markdown]
# The hunt recomputed that op in float32 from the very same inputs: finite there, so the cause
# is **overflow** — not a bug in the op, not a bad weight, just float16's range. It also lists
# the ops closest to overflow *before* it (the warning signs), and each input's and weight's
# range:

# %%
print(f"float32 absmax of the op: {f.float32_absmax:.3g}")
print("closest to overflow before it:", [(n, round(h, 3)) for n, h in f.closest_before])
for d in f.inputs:
    print("input ", d["name"], f"absmax {d['absmax']:.3g}")

# %% [markdown]
# The usual fixes: run that block in bfloat16 or float32, or clamp as Gemma 3's reference does
# for its residual adds. bfloat16 has the range, so the same pass is clean:

# %%
print("bfloat16:", hunt(loud, prompt, dtype="bfloat16").finding)

# %% [markdown]
# In the debugger, **next non-finite** runs to the same op and explains it in the log; its fp16
# headroom bar reads *overflow*. Click **back**: its inputs, `gate_proj` and `up_proj`, used only
# about 1% of float16's range — a product of two moderate numbers can overflow in one step,
# which is why the hunt checks every op rather than watching a few.

# %%
dbg = StepDebugger(workbench.trace(loud, prompt, capture="full", dtype="float16"))
dbg.next_nonfinite()
dbg

# %% [markdown]
# ## Case 2 · a poisoned weight
#
# A different failure: one element of one weight matrix is NaN (a bad conversion, a corrupted
# download, an uninitialised buffer in the converter). Every forward pass is NaN, in every dtype.

# %%
def poison(ts):
    k = next(k for k in ts if k.endswith("layers.2.mlp.down_proj.weight"))
    w = np.array(ts[k].astype(mx.float32))
    w[7, 3] = np.nan
    ts[k] = mx.array(w).astype(ts[k].dtype)
bad = workbench.load(planted(DEMO, work / "poisoned", poison))
r = hunt(bad, prompt, dtype="float32")
print(r.finding)
print([(d["name"], d["nan"]) for d in r.finding.weights])

# %% [markdown]
# Cause `nonfinite-weight`, with the tensor's name. The same NaN is visible without running
# anything, from the weights alone (notebook 02):

# %%
report = workbench.inspect(work / "poisoned", values=True)
print([(p.code, p.tensor) for p in report.problems])

# %% [markdown]
# ## How NaN spreads
#
# Why is the *first* NaN the only one worth looking at? Put one single NaN into one value of
# the residual stream — token 3, channel 0, after layer 0 — and count the non-finite elements
# of the following ops:

# %%
model = workbench.load(DEMO, attention="explicit")   # scores and softmax as steps, to see the NaN spread
t = workbench.trace(model, prompt, capture="stats", interventions=[inject("layers.0", float("nan"), index=(0, 3, 0))])
t.run()
T = t.ids.shape[1]
for name in ["layers.0", "layers.1.self_attn.k_proj", "layers.1.self_attn.scores",
             "layers.1.self_attn.softmax", "layers.1", "layers.3", "logits"]:
    s = t.stats(name); shape = t.step_info(name).output_shape
    print(f"{name:28s} {s['nan']:>7d} NaN of {int(np.prod(shape)):>7d}")
print(t.first_nonfinite())

# %% [markdown]
# One NaN in one token's vector (how far the next norm spreads it is exercise 2): its key
# makes the attention scores of every *later* query NaN (the softmax rows that include it).
# You might expect the *earlier* tokens to stay clean — the model is causal, they never
# attend to token 3. They do not stay clean: attention's weighted sum multiplies token 3's
# value by a weight of exactly 0 for them, and **0 × NaN = NaN**. One layer later the whole
# residual stream is NaN. (Engines that skip masked positions instead of multiplying by 0
# behave differently here — one more reason to compare with the first NaN, never the last.)
# The hunt still names `layers.0` and says `injected`.
#
# ## On the command line
#
# `workbench hunt PATH --prompt TEXT --dtype float16 --json` does the same; exit status 1
# when a non-finite value is found, 0 when clean.

# %% tags=["nbval-ignore-output"]
from workbench.cli import main as workbench_cli
status = workbench_cli(["hunt", str(work / "loud"), "--prompt", prompt, "--dtype", "float16"])

# %%
print("exit status", status)

# %% [markdown]
# ## Exercises: predict, then check
#
# Write your answer in `answer` (or the function's body) and run the cell. `check` says
# *right*, *partly right* (and how much), or what to look at for the mistake you made; it
# never shows the answer. The "implement" exercises run your function on this model's real
# values and compare with the op's output. When you are done, or stuck, `solution("04.1")`
# in a cell of your own prints a worked solution (no cell of this notebook does).

# %%
from workbench.exercises import check, solution

# %% [markdown]
# **1.** Hunt the *poisoned* model (NaN in `layers.2.mlp.down_proj.weight`) in float16
# instead of float32. Which op and which cause will the hunt give?

# %%
answer = None  # your prediction: (op name, cause), e.g. ("layers.1.mlp.act", "overflow")
check("04.1", answer)

# %% [markdown]
# **2.** In "How NaN spreads", one NaN went into token 3, channel 0 of `layers.0`. How many
# NaN elements does `layers.1.input_layernorm` hold? (The model's width is
# `model.config["hidden_size"]`.)

# %%
answer = None  # your prediction: a number
check("04.2", answer)

# %% [markdown]
# **3.** Inject `+inf` instead of NaN at the same place. How many NaN does
# `layers.1.input_layernorm` hold now?

# %%
answer = None  # your prediction: a number
check("04.3", answer)

# %% [markdown]
# **4. Implement it.** Write the RMS norm, `x` being `[tokens, hidden_size]`. `check` runs it
# on the input of `layers.1.input_layernorm` *with the `+inf` of exercise 3 in it*, and
# compares NaN for NaN: your norm must spread a non-finite value exactly as the model's does.

# %%
def rms_norm(x, weight, eps):
    """x: a numpy float array [tokens, hidden_size]; weight: [hidden_size]; eps: a float; return x's shape."""
    return None  # your code

check("04.4", rms_norm)

# %% [markdown]
# **5. Implement it.** Given the op names in execution order and a dict name -> value, return
# the first op whose value holds a NaN or an infinity (what `tr.first_nonfinite()` finds).
# `check` runs it on a trace with `+inf` injected into `layers.1.mlp.act`.

# %%
def first_nonfinite(names, values):
    """names: a list of op names (str) in order; values: a dict name -> numpy array; return one name."""
    return None  # your code

check("04.5", first_nonfinite)

# %% [markdown]
# **What to remember.** Look for the first non-finite op, not the last; ask whether it is the
# op's arithmetic (overflow, invalid), its weights, or its inputs; and watch headroom before
# choosing float16. Next: 05, numbers corrupted by the engine's own buffers.
