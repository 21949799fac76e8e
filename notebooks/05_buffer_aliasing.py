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
# # 05 · Buffer aliasing: when an engine overwrites its own input
#
# A GPU inference engine (one written on Metal, Apple's GPU interface, or CUDA, NVIDIA's)
# does not run "the model"; it runs a long list of **dispatches**.
# Each dispatch launches one kernel (a matrix multiply, a norm, an attention) that reads
# some byte ranges of some GPU buffers and writes its result into another range. To save
# memory, engines **reuse** a small pool of scratch buffers: the buffer that held layer 0's
# attention output holds layer 1's once layer 0's is no longer needed.
#
# The classic bug: a kernel whose **output buffer is also one of its inputs**. A GPU
# kernel computes its output in tiles, in parallel; as soon as the first tiles are written,
# the input the remaining tiles still need is gone. The result is not an error message —
# it is slightly wrong numbers, or NaN, a few layers later. A real case: a Metal engine for
# Gemma produced NaN until its authors gave the attention output a scratch buffer of its own
# (they called it `attnH`). Nobody could *see* the aliasing; it was found by trial and error,
# by isolating buffers one at a time.
#
# This notebook reproduces that bug on purpose with the **engine emulator**, then finds it
# with the **hazard analyzer** — the same analyzer you can point at a schedule recorded from
# your own engine.

# %%
import workbench                      # first: on Linux, points MLX at a fast BLAS (matrix-multiply library)
import numpy as np
import mlx.core as mx
from IPython.display import display
# %matplotlib inline
np.random.seed(0); mx.random.seed(0)
np.set_printoptions(precision=4, suppress=True, linewidth=110)

import tempfile, pathlib, json
from workbench import zoo
from workbench.buffers import analyze, load_schedule, Emulator
from workbench.widgets import HazardTimeline
work = pathlib.Path(tempfile.mkdtemp())
model = workbench.load(zoo.build("gemma4_text", work / "g4", dtype="float32"))
ids = [1, 5, 9, 3, 7, 2, 11, 4]
model

# %% [markdown]
# ## An engine, emulated
#
# `Emulator(model, ids)` runs the model's op program the way an engine does: every value
# lives at a byte offset in a named buffer of a fixed pool, every op is a dispatch that reads
# its inputs' bytes and writes its output's bytes, and everything is recorded as a
# **schedule** (`workbench.schedule/1`, a JSON format an engine can emit too).
#
# The default **plan** gives each op *role* one scratch buffer, reused from layer to layer
# once the previous layer's value is dead — like a real engine. It is hazard-free, and the
# logits come out bit-for-bit equal to the reference.

# %%
emu = Emulator(model, ids)
plan = emu.plan()
print(plan)
print("\n".join(plan.table().splitlines()[12:22]))

# %%
good = emu.run(plan)
print(good.summary())
print(len(good.schedule.events), "events recorded")

# %% [markdown]
# ## The bug: attention's output projection writes over its own input
#
# In layer 1, `self_attn.context` (the attention result, heads concatenated) is the input of
# `self_attn.o_proj` (the output projection, a matrix multiply). Put `o_proj`'s output in
# the very bytes of its input — one line in the plan:

# %%
o_proj, context = "layers.1.self_attn.o_proj", "layers.1.self_attn.context"
bad = emu.run(plan.place(o_proj, like=context))
print(bad.summary())

# %% [markdown]
# The logits are wrong, and the emulator knows the first op whose bytes differ from the
# reference: `o_proj` itself. A matrix multiply computing its output tile by tile read rows
# of `context` that its own earlier tiles had already overwritten.
#
# In a real engine you do not have a reference to compare bytes with. What you *can* have
# is the schedule — and the analyzer needs nothing else:

# %%
hazards = analyze(bad.schedule)
for h in hazards:
    print(f"event {h.event} [{h.kind}] buffer {h.buffer!r} bytes {h.range}")
    print(h.message)

# %% [markdown]
# `alias-in-dispatch`: one dispatch reads and writes exactly the same bytes, and its kernel
# does not declare that pair safe in-place. (Element-wise kernels — an add, a scale — *are*
# safe in-place, because each output element depends only on the same input element; the
# schedule's `kernels` section declares such pairs, and the analyzer accepts them.)
#
# ## Seeing it
#
# `HazardTimeline` draws buffers (rows) against events (columns): a grey bar is a buffer's
# live range, blue ticks reads, orange writes, purple both, and red boxes hazards. Pick a
# hazard to see both dispatches' reads and writes, the overlapping bytes in red.

# %%
timeline = HazardTimeline(bad.schedule)
timeline

# %% [markdown]
# ## The fix: an output buffer of its own (`attnH`)
#
# Give `o_proj` an output buffer of its own — what the Metal engine's authors eventually did
# (we keep their name for it):

# %%
fixed = emu.run(plan.place(o_proj, like=context).place(o_proj, buffer="attnH"))
print(fixed.summary())

# %% [markdown]
# ## The other form: a value overwritten before its last reader
#
# Aliasing does not need one kernel reading and writing the same bytes. Here the attention
# output of layer 1 is written into the buffer holding the residual stream `layers.0` —
# which layer 1 still has to add back in (`attn_residual = layers.0 + attention`). Each
# dispatch on its own is fine; the *order* is not. The analyzer tracks which value was last
# written to every byte, and the schedule labels what each read expects:

# %%
stale = emu.run(plan.place(context, like="layers.0"))
print(stale.summary())
h = stale.hazards[0]
print(h.kind, "at event", h.event, "| earlier event:", h.other)
print(h.message)

# %% [markdown]
# ## Your engine's schedule
#
# The schedule is a plain JSON file. An engine emits one entry per dispatch while it encodes
# (buffer id, byte offset, size for every read and write; optionally the name of the tensor
# written or expected), plus barriers (points where the GPU waits for earlier dispatches to
# finish) and command-buffer commits. docs/schedule.md in the repository is the format and
# a short guide to emitting it from Metal or CUDA. Here is the faulty dispatch's entry:

# %%
path = work / "bad.schedule.json"
bad.schedule.save(path)
doc = json.loads(path.read_text())
print(doc["format"], doc["mode"], len(doc["events"]), "events")
i = bad.dispatch_of(o_proj)
print(json.dumps(doc["events"][i], indent=1))

# %% [markdown]
# The command line gives the same answer, with exit status 1 when hazards are found (so an
# automatic check — continuous integration — can run it on every engine build):

# %%
from workbench.cli import main as workbench_cli
print("exit status", workbench_cli(["hazards", str(path)]))

# %% [markdown]
# ## Command buffers
#
# GPU work is recorded into **command buffers** and submitted as a whole (**committed**);
# after that, nothing more may be recorded into the same buffer. The same analyzer checks
# this lifecycle. Another real crash: encoding a dispatch into a command buffer that was
# already committed. A three-event schedule is enough to show it (`cb` is the command buffer
# each event belongs to):

# %%
tiny = {"format": "workbench.schedule/1", "mode": "serial",
        "buffers": {"x": {"size": 64, "initialized": True}, "y": {"size": 64}},
        "events": [
            {"type": "dispatch", "name": "norm", "kernel": "rmsnorm", "cb": 0,
             "reads": [{"arg": "x", "buffer": "x", "offset": 0, "size": 64}],
             "writes": [{"arg": "out", "buffer": "y", "offset": 0, "size": 64}]},
            {"type": "commit", "cb": 0},
            {"type": "dispatch", "name": "late_add", "kernel": "add", "cb": 0,
             "reads": [{"arg": "a", "buffer": "y", "offset": 0, "size": 64}],
             "writes": [{"arg": "out", "buffer": "x", "offset": 0, "size": 64}]}]}
for h in analyze(tiny):
    print(h)

# %% [markdown]
# ## Exercises: predict, then check
#
# Write your answer in `answer` (or the function's body) and run the cell. `check` says
# *right*, *partly right* (and how much), or what to look at for the mistake you made; it
# never shows the answer. The "implement" exercises run your function on this model's real
# values and compare with the op's output. When you are done, or stuck, `solution("05.1")`
# in a cell of your own prints a worked solution (no cell of this notebook does).

# %%
from workbench.exercises import check, solution

# %% [markdown]
# **1.** In the three-event schedule above, move the `commit` to the end (after `late_add`).
# How many hazards will the analyzer report?

# %%
answer = None  # your prediction: a number
check("05.1", answer)

# %% [markdown]
# **2.** Write layer 1's `attn_residual` (`layers.0` + attention) in place, over `layers.0`
# itself: `plan.place("layers.1.attn_residual", like="layers.0")`. How many hazards, and are
# the logits exact? Answer as (hazards, exact).

# %%
answer = None  # your prediction, e.g. (1, False)
check("05.2", answer)

# %% [markdown]
# **3. Implement it.** Two accesses `{"buffer", "offset", "size"}` (as in a schedule's
# `reads` and `writes`): do their bytes overlap? `check` runs it on every write and the next
# dispatch's accesses in the broken schedule above, and on ranges that only touch.

# %%
def overlaps(a, b):
    """a, b: dicts {"buffer": str, "offset": int, "size": int}; return True or False."""
    return None  # your code

check("05.3", overlaps)

# %% [markdown]
# **4. Implement it.** Given a schedule's `events`, return the names of the dispatches
# encoded into a command buffer already committed (what the analyzer calls `cb-reuse`).
# `check` runs it on the three-event schedule and two variants with a second command buffer.

# %%
def late_dispatches(events):
    """events: a list of dicts, each with a "type" and a "name"; return a list of dispatch names (str)."""
    return None  # your code

check("05.4", late_dispatches)

# %% [markdown]
# **What to remember.** Buffer reuse bugs give plausible-looking wrong numbers, far from
# their cause. Record the schedule your engine actually encodes, and let the analyzer name
# the dispatch, the buffer and the bytes. Next: notebook 06 compares an engine's activations
# with the reference, op by op.
