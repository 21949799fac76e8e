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
# # 10 · "My engine gives NaN on Gemma 4": the engineer's playbook
#
# You ported Gemma 4 to your own inference engine — Metal (Apple's GPU interface) or CUDA
# (NVIDIA's). It runs without an error, and every logit (the scores the model gives each
# vocabulary entry for the next token) is NaN ("not a number", the IEEE float value that
# `0/0` or `∞ − ∞` produce, and that every later operation passes on).
#
# This notebook walks the whole path from that symptom to the line to change, with the
# workbench's command-line tools in the order an engineer would use them. Each step rules
# something out:
#
# | step | command | question it answers |
# |---|---|---|
# | 1 | `workbench inspect` | is the checkpoint sound: every tensor present, the right shape, finite? |
# | 2 | `workbench hunt` | does the *reference* forward pass stay finite on the same tokens? |
# | 3 | `workbench dump` + `workbench diff` | where does my engine first part from the reference, and where are the bad values? |
# | 4 | `workbench hazards` | which dispatch overwrites which buffer, at which bytes? |
# | 5 | the fix, then 3 and 4 again | clean? |
#
# Every command prints readable text (and JSON with `--json`) and exits with status 0
# when it found nothing, 1 when it found a problem, 2 when its input is unusable. Each has
# a Python equivalent, shown next to it.
#
# **The engine.** We cannot ship your engine, so we emulate one. A GPU engine runs a model
# as a list of **dispatches** — each launches one kernel (a matrix multiply, a norm, the
# attention scores) that reads byte ranges of some GPU buffers and writes its result into
# another. To save memory it reuses a small pool of **scratch buffers**. The emulator
# (`workbench.buffers.Emulator`) does exactly that with the model's *op program* (the list
# of named operations the model is made of, `layers.0.self_attn.q_proj`, ...): a **plan**
# says in which buffer, at which byte offset, each value lives; each op is a dispatch that
# reads its inputs' bytes and writes its output's bytes; a kernel whose output overlaps
# one of its inputs computes tile by tile, as on a GPU. Scratch memory starts as `0xFF`
# bytes, which read as NaN. Everything is recorded as a **schedule**, the JSON log of
# dispatches that `workbench hazards` reads (your engine can write the same log).
#
# The bug planted below is modelled on a real port: a Metal engine for Gemma produced NaN
# because one attention kernel's output buffer was also one of its inputs; its authors
# found it by trial and error, isolating buffers one at a time, and fixed it by giving the
# attention output scratch buffers of its own.

# %%
import workbench                      # first: on Linux, points MLX at a fast BLAS (matrix-multiply library)
import numpy as np
import mlx.core as mx
from IPython.display import display
# %matplotlib inline
np.random.seed(0); mx.random.seed(0)
np.set_printoptions(precision=4, suppress=True, linewidth=110)

import os, sys, tempfile, pathlib
import matplotlib.pyplot as plt
from workbench.demo.paths import DEMO
from workbench.buffers import Emulator, analyze, load_schedule
from workbench.diff import compare, dump
from workbench.trace import hunt
# `!workbench ...` cells run this environment's command-line tool
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
work = pathlib.Path(tempfile.mkdtemp())   # the files we write; `!cd {work} && ...` runs a command there
demo_dir = os.path.relpath(DEMO)          # the checkpoint, relative to this folder

model = workbench.load(DEMO, attention="explicit")   # the engine's scores and softmax are steps here too
prompt = "mia red kite . tom blue cup . anna green hat . mia"
ids = model.encode(prompt)
IDS = ",".join(map(str, ids))          # the same token ids for every command
print(model)
print(len(ids), "tokens:", IDS)

# %% [markdown]
# The checkpoint is the workbench's **demo model**: a small trained Gemma 4 (`gemma4_text`):
# 4 layers — three *sliding-window* attention layers (each token sees the last 16 tokens)
# and one *full* attention layer —, hidden size 128, 4 query heads sharing 2 key/value
# heads (GQA, grouped-query attention), weights stored in bfloat16 (a 16-bit float with
# float32's range and about 3 significant digits). Asked to continue the prompt above, it
# recalls the colour that went with "mia": " red".
#
# ## The symptom
#
# Here is the engine. Its memory plan starts from the emulator's default (one scratch buffer
# per kind of value, reused from layer to layer once the previous layer's value is dead) and
# adds one memory-saving idea of its author: *the attention-score kernel is the last reader
# of the keys `k_cache`, so let it write the scores into the keys' buffer.* Pretend you
# have not read this cell: the point is to find the mistake with the tools.

# %%
emu = Emulator(model, ids)                        # the engine, for these token ids
plan = emu.plan()                                 # the default plan: hazard-free
engine_plan = plan
for layer in range(4):
    engine_plan = engine_plan.place(f"layers.{layer}.self_attn.scores", like=f"layers.{layer}.self_attn.k_cache")

run = emu.run(engine_plan)
logits = run.logits[0, -1]                        # the next-token logits
print(f"NaN logits: {int(np.isnan(run.logits).sum())} of {run.logits.size}")
print("engine's next token:", repr(model.decode([int(np.argmax(logits))])))

# %% [markdown]
# Every logit is NaN (and `argmax` over NaN picks token 0, the padding token `<pad>`). Now
# the playbook.
#
# ## 1 · Is the checkpoint sound? `workbench inspect`
#
# NaN from a port is often a *loading* problem: a tensor missing or misnamed (so the engine
# multiplies by uninitialised memory), stored transposed, or quantized differently from what
# the config says. `inspect` checks every tensor against what the config implies, and
# `--values` also scans every value for NaN and Inf (infinity); `--no-progress` leaves the
# progress bar out of this page.

# %%
# !workbench inspect {demo_dir} --values --no-progress; echo "exit status: $?"

# %% [markdown]
# The grid has one row per group of identical layers and one column per tensor kind:
# `q k v o` the query, key, value and output projections of attention; `qn kn` the query
# and key norms; `gate up down` the three MLP (feed-forward) projections; `in` the input
# norm, `pa` the post-attention norm, `pf` / `pff` the pre- and post-feed-forward norms;
# `plg plp pln` Gemma 4's per-layer-input gate, projection and norm; `ls` the layer scalar.
# All present (✓), no NaN or Inf: **the weights are not the problem.** In Python:

# %%
checkpoint_report = workbench.inspect(DEMO, values=True)
print("ok:", checkpoint_report.ok, "| problems:", checkpoint_report.problems)

# %% [markdown]
# ## 2 · Is the model itself finite? `workbench hunt`
#
# Some models *do* overflow: Gemma's activations can exceed float16's largest value
# (65 504), and then the reference goes to Inf too. `hunt` runs the reference forward pass
# (our op program, checked against mlx-lm) on the same tokens, in the checkpoint's dtype,
# and reports the first op whose output holds NaN or Inf and why. It also lists the ops
# closest to overflow, as a fraction of the dtype's largest value.

# %%
# !workbench hunt {demo_dir} --ids {IDS}; echo "exit status: $?"

# %%
h = hunt(model, ids)
print(h, "| found:", h.found)
print("reference's next token:", repr(model.decode([int(np.argmax(emu.reference["logits"][0, -1]))])))

# %% [markdown]
# Clean, with a huge margin (the largest activation is ~10⁻³⁷ of bfloat16's range): **the
# model is not the problem; the engine is.** Two hypotheses are gone in two commands.
#
# ## 3 · Where does the engine go wrong? `workbench dump` + `workbench diff`
#
# The diff compares the engine's intermediate tensors with the reference's, op by op, and
# names the **first divergence** — after it, everything is wrong anyway. It needs:
#
# * the engine's tensors for the same token ids, under any names, in a `.safetensors`
#   file, an `.npz` (numpy's archive of arrays) or a folder of `.npy` files. Copy each
#   op's output to the host **right after its dispatch** (a debug build that waits for the
#   GPU after every dispatch): a buffer reused later would otherwise show what overwrote it;
# * names: this engine already names its tensors, and its dispatches in the schedule of
#   step 4, with the workbench's op names (`layers.0.self_attn.scores`), so the two line up
#   with no work; an engine with names of its own (`blk.0.attn_scores`) adds
#   `--map rules.json`, a list of `[regex, replacement]` pairs;
# * the reference: `workbench dump` writes its activations once, with the token ids in the
#   file, so later diffs need no ids and no second reference run.
#
# The emulator gives each op's output as its dispatch wrote it — our engine's debug dump:

# %%
engine_dump = work / "engine.npz"
np.savez(engine_dump, **run.outputs)            # {op name: float32 array}
print(len(run.outputs), "engine tensors, e.g.", list(run.outputs)[20:23])

# %%
# !cd {work} && workbench dump {DEMO} --ids {IDS} --out ref.safetensors

# %%
# !cd {work} && workbench diff ref.safetensors engine.npz; echo "exit status: $?"

# %% [markdown]
# How to read it:
#
# * **first divergence: `layers.0.self_attn.scores`**, op #22 (ops are numbered in
#   execution order from 0): the attention scores of layer 0, `q · k` for every query
#   token, key token and head, with masked positions filled. Everything before it matches
#   bit for bit.
# * **267 elements non-finite in the engine, finite in the reference.** The headline
#   metrics (cosine similarity, NMSE — the mean squared error divided by the reference's
#   variance — and the largest absolute error) are `nan` beside them, never a clean-looking
#   number; the line below gives them over the elements finite in both: cosine 1, NMSE 0.
#   The engine's arithmetic is *exact* wherever it produced a number.
# * **engine precision: bfloat16**, read from the engine's values: each op fed the
#   engine's own inputs is held to bfloat16's rounding at that op (its *budget*), so a
#   small arithmetic bug is named where it enters even when the errors stay small
#   (notebook 06, "Rounding or a bug?").
# * **where:** tokens 0–13 (all 14) × channels `0-5, 14-26, 28-31, 42-52` (34 of 56). The
#   scores have shape `[1, heads, query token, key token]`; the diff takes the query token
#   as the token axis, and channel = head × 14 + key position. So: keys 0–5 for head 0,
#   keys 0–12 for head 1, 0–3 for head 2, 0–10 for head 3.
# * **the pattern, `staircase`:** per query token (and head) the bad values are a run of
#   *leading* keys that never shrinks from one token to the next. The diff names the shape
#   of the bad values and says what it points to: a `staircase`, a `block` of tokens ×
#   channels or aligned `tiles` are what memory leaves, and get a pointer to
#   `workbench hazards` (the `tile` flag in the JSON); `everywhere` (every element),
#   `columns` (the same channels at every token: a weight row) and `scattered` (lone
#   elements: overflow) do not.
# * **its inputs** `q_rope` (the queries after RoPE, the rotary position embedding) and
#   `k_cache` (the keys) were fine when the engine dumped them, and the verdict says so:
#   fed the engine's own inputs, our op does not reproduce its output — look at this op.
# * the `non-finite` column shows the NaN spreading: the softmax, then every op after.
#
# The same in Python, where the report is data:

# %%
ref = dump(model, ids=ids)            # `workbench dump` in Python (in memory; out=PATH writes the file too)
report = compare(ref, engine_dump)    # `workbench diff`: a dump path, a Reference, or the checkpoint + ids
fd = report.first_divergence
print(fd.op, "| non-finite:", fd.nonfinite["count"], fd.nonfinite_engine, "| tokens", fd.nonfinite["rows"],
      "x channels", fd.nonfinite["channels"], "| pattern:", fd.nonfinite["pattern"],
      "| points to hazards (tile):", fd.nonfinite["tile"])
print(report.verdict())

# %% [markdown]
# Of the 267, 264 are NaN and 3 are infinities (`nonfinite_engine`). Draw them on the heads'
# score maps (query token down, key token across; the grey upper triangle is the causal
# mask — a token never sees later tokens):

# %%
ref_scores = emu.reference["layers.0.self_attn.scores"][0]
eng_scores = run.outputs["layers.0.self_attn.scores"][0]
fig, axes = plt.subplots(1, 4, figsize=(11, 3), sharey=True)
for head, ax in enumerate(axes):
    bad = ~np.isfinite(eng_scores[head])
    img = np.where(ref_scores[head] < -1e30, 0.5, bad.astype(float))
    ax.imshow(img, cmap="Greys", vmin=0, vmax=1.2)
    ax.set_title(f"head {head}: {int(bad.sum())} non-finite")
    ax.set_xlabel("key token")
axes[0].set_ylabel("query token")
fig.suptitle("layer 0 attention scores: NaN or ±inf (black), masked (grey), fine (white)")
fig.tight_layout()

# %% [markdown]
# The staircase the diff named: in every row the bad values sit at the **leading keys**,
# and there are more of them the later the row is computed (rows run top to bottom, head
# after head): query 1 of head 0 has key 0 bad, query 13 keys 0–5; head 1, computed after
# head 0, is worse. The keys are being eaten front to back *while the kernel runs* — yet
# the keys the engine dumped right after writing them are correct, and every score that is
# a number is exact. Arithmetic does not look like that; something overwrote the keys'
# bytes while the score kernel was still reading them. That is a memory question, and the
# diff's pointer leads to the tool that answers memory questions.
#
# (Had the whole tensor been NaN, the diff would have said `everywhere` and sent you to the
# op's weights and inputs first: a NaN in a weight reaches every output element of many
# ops, so the shape alone would prove nothing about memory.)
#
# ## 4 · Which dispatch, which buffer, which bytes? `workbench hazards`
#
# The schedule is the engine's own log of what it encoded: per dispatch, the buffer, byte
# offset and size of every read and write. Your engine writes it while encoding (a few
# lines in the encoder; docs/schedule.md in the repository has the format and Metal/CUDA
# snippets); the emulator records it for us:

# %%
schedule = work / "engine.schedule.json"
run.schedule.save(schedule)
# !cd {work} && workbench hazards engine.schedule.json --max 1; echo "exit status: $?"

# %% [markdown]
# Four hazards, one per layer, all alike (`--max 1` prints the first; the Python below lists
# all four): **dispatch 22, `layers.0.self_attn.scores`, reads its input `in1` (the keys,
# `k_cache`) at bytes [0, 1792) of buffer `self_attn.k_cache` and writes its output at
# [0, 1568) of the same buffer.**
# `partial-overlap` means a read and a write of one dispatch overlap without being the same
# range, so element *k* of the output lands on another element of the input: no kernel can
# do that safely. (A serial schedule has no barriers, so event 22 is the 23rd dispatch: op
# #22 of the diff.)
#
# Why NaN, rather than merely wrong numbers? A GPU kernel computes its output in tiles.
# Once the first tiles of scores land in the keys' bytes, later tiles read *scores* as
# keys — including the mask fill, bfloat16's lowest finite value −3.39·10³⁸, which the score
# op writes at masked positions so that they vanish in the softmax. A dot product of a
# query with such a "key" overflows to +∞ and −∞ at once, and ∞ − ∞ = NaN (where it
# overflows one way only, the score is ±∞: the 3 infinities). With 2 key
# heads for 4 query heads (GQA), head 1 still needs the keys head 0's scores have already
# overwritten: "the kernel is the last reader of K" was true *after* the kernel, not
# *during* it.
#
# In Python, `analyze` returns the hazards as data:

# %%
hazards = analyze(load_schedule(schedule))
for hz in hazards:
    print(f"event {hz.event:3d}  {hz.kind}  buffer {hz.buffer!r}  bytes {hz.range}  "
          f"({run.schedule.events[hz.event].name})")

# %% [markdown]
# ## 5 · The fix: a scratch buffer of its own
#
# Give the scores their own scratch buffer (here `attn_scores`: 4 heads × 14 × 14 scores ×
# 2 bytes = 1568 bytes, reused by every layer), then run steps 3 and 4 again:

# %%
fixed_plan = engine_plan
for layer in range(4):
    fixed_plan = fixed_plan.place(f"layers.{layer}.self_attn.scores", buffer="attn_scores")
fixed = emu.run(fixed_plan)
print(fixed.summary())
print("engine's next token:", repr(model.decode([int(np.argmax(fixed.logits[0, -1]))])))

np.savez(work / "fixed.npz", **fixed.outputs)
fixed.schedule.save(work / "fixed.schedule.json")

# %%
# !cd {work} && workbench diff ref.safetensors fixed.npz > fixed_diff.txt; echo "exit status: $?"; head -n 1 fixed_diff.txt
# !cd {work} && workbench hazards fixed.schedule.json; echo "exit status: $?"

# %%
fixed_report = compare(work / "ref.safetensors", work / "fixed.npz")
print("first divergence:", fixed_report.first_divergence, "| hazards:", analyze(fixed.schedule),
      "| logits bit-identical to the reference:", fixed.exact)

# %% [markdown]
# No divergence in any of the 143 ops, no hazard, and the logits are bit for bit the
# reference's: the engine recalls " red" again.
#
# (A real engine at long context would not materialise the scores at all — a fused
# attention kernel keeps them in on-chip memory — but the rule is the same for every
# scratch buffer: a kernel's output must not land on bytes any of its inputs still
# occupies, unless the kernel is element-wise and declared in-place.)

# %% [markdown]
# ## 6 · Your own engine: tap it, diff it, read its hazards
#
# The emulator stood in for your engine. A real engine writes the same two files from its
# host code with the **tap**, `tap/workbench_tap.h` in the repository: one C header (C++,
# Objective-C and Swift use it too, through its module map) with which the engine adds each
# tensor to a dump right after its dispatch (`wbt_dump_add`) and records each dispatch's
# byte ranges as it encodes (`wbt_sched_dispatch`). `tests/engine_c/engine.c` is such an
# engine: a few hundred lines of C that run this demo model in float32 on the CPU, name
# their tensors their own way (`blk1.att_o_proj`, not `layers.1.self_attn.o_proj`) and carry
# the seed reports' bugs behind flags. Build it with the system's C compiler and run it
# with `--bug alias`: layer 1's output projection writes its result over its own input,
# the attention output, in the buffer the engine calls `attnH`.

# %%
repo = pathlib.Path(DEMO).parents[1]        # the repository: the tap and the engine's source
# !cc -std=c99 -O2 -I{repo}/tap -o {work}/engine {repo}/tests/engine_c/engine.c -lm; echo "built: $?"
# !cd {work} && ./engine {DEMO} --ids {IDS} --bug alias --dump c.safetensors --schedule c.schedule.json; echo "exit status: $?"

# %% [markdown]
# Its names are its own, and nobody wrote a rule: with no `--map`, the diff sees that few of
# the names are ours and matches them **by value** — each engine tensor against our ops of
# a compatible shape (heads merged or split, a batch axis, transposed), in program order —
# and learns a rule per name pattern (`^blk(\d+)\.att_o_proj$ -> layers.\1.self_attn.o_proj`),
# so the layers behind the bug follow the rule the layers before it taught. The dump says
# the engine computes in float32 (the tap writes `workbench.engine_dtype`) and carries the
# token ids, so the reference runs in float32 too and needs no `--ids`:

# %%
# !cd {work} && workbench diff {DEMO} c.safetensors --dtype float32 > c_diff.txt; echo "exit status: $?"; head -n 1 c_diff.txt; grep -A1 "^first divergence" c_diff.txt
# !cd {work} && workbench hazards c.schedule.json; echo "exit status: $?"

# %% [markdown]
# Both tools name the same place from two sides. The diff: the first op that is off is
# `layers.1.self_attn.o_proj` — the engine's `blk1.att_o_proj` —, its input (the attention
# context) is still right, and our op fed the engine's own input does not reproduce its
# output: look at this op. The schedule: dispatch `blk1.att_o_proj` reads and writes the same
# bytes of `attnH`, `alias-in-dispatch`, and the fix is the seed reports' own: a scratch
# buffer of its own. Without the flag, both are clean:

# %%
# !cd {work} && ./engine {DEMO} --ids {IDS} --dump ok.safetensors --schedule ok.schedule.json
# !cd {work} && workbench diff {DEMO} ok.safetensors --dtype float32 --write-map engine-map.json | grep "^no divergence"
# !cd {work} && workbench hazards ok.schedule.json; echo "exit status: $?"

# %% [markdown]
# `--write-map` kept the proposal as a rules file (`engine-map.json`, yours to read and
# edit): pass it with `--map` from now on, also on runs where the engine is wrong from its
# very first op — there nothing matches by value, and the diff says so rather than guess.

# %% [markdown]
# ## Exercises: predict, then check
#
# Write your answer in `answer` (or the function's body) and run the cell. `check` says
# *right*, *partly right* (and how much), or what to look at for the mistake you made; it
# never shows the answer. The "implement" exercises run your function on this model's real
# values and compare with the op's output. When you are done, or stuck, `solution("10.1")`
# in a cell of your own prints a worked solution (no cell of this notebook does).

# %%
from workbench.exercises import check, solution

# %% [markdown]
# **1.** Put layer 0's scores over the *queries* instead (`like="layers.0.self_attn.q_rope"`),
# in the default plan. Predict: are the logits still exact, and which kind of hazard does `analyze`
# report? Answer as (exact, hazard kind).

# %%
answer = None  # your prediction, e.g. (False, "raw")
check("10.1", answer)

# %% [markdown]
# **2. A missing barrier.** Engines on Metal often encode *concurrently*: dispatches between
# two memory barriers may run at the same time, so a dispatch that reads what another one of
# the same stretch writes needs a barrier between them. `emu.run(plan, mode="concurrent",
# skip_barriers=["layers.3.self_attn.o_proj"])` runs the correct plan with the barrier
# before layer 3's attention output projection forgotten: `o_proj` reads the attention
# context (`self_attn.context`) before the dispatch computing it has landed. Hint: layer 3
# is Gemma 4's full-attention layer, with heads of 64 dimensions instead of 32, so its
# context is twice as wide as layers 0–2's, which used the same reused buffer. Predict:
# which tokens of `layers.3.self_attn.o_proj` come out NaN (the first and the last), which
# pattern does the diff name, and which hazard kind does the analyzer report?

# %%
answer = None  # your prediction: (first NaN token, last NaN token, pattern, hazard kind)
check("10.2", answer)

# %% [markdown]
# **3.** Put layer 0's scores over the *values* (`like="layers.0.self_attn.v_cache"`): the
# score kernel does not read V, but the next-but-one dispatch does. Predict: which op is the
# first divergence, is it NaN there, and which hazard kind does the analyzer report?

# %%
answer = None  # your prediction: (op, NaN there, hazard kind)
check("10.3", answer)

# %% [markdown]
# **4. Implement it.** From an op's value `[tokens, channels]`, return the runs of token rows
# that hold a NaN, each as `[first, last]` (what the diff's `where` line reports). `check`
# runs it on the first divergence of the missing-barrier run.

# %%
def nan_rows(x):
    """x: a numpy float array [tokens, channels]; return a list of [first, last] pairs of ints."""
    return None  # your code

check("10.4", nan_rows)

# %% [markdown]
# **5. Implement it.** Given the op names in order and the engine's values by name, return
# the first op whose value holds a NaN or an infinity. `check` runs it on the scores-over-values
# run of exercise 3.

# %%
def first_nan_op(names, values):
    """names: a list of op names (str) in order; values: a dict name -> numpy array; return one name."""
    return None  # your code

check("10.5", first_nan_op)

# %% [markdown]
# ## What to remember
#
# * Rule out the cheap hypotheses first, one command each: `inspect --values` (the
#   checkpoint), `hunt` (the reference on the same tokens). When both are clean, the bug is
#   in the engine.
# * Dump the engine's tensors right after each dispatch, `dump` the reference once, and let
#   `diff` name the first divergence. NaN is a finding in every metric; the `where` line
#   says which tokens × channels hold it and names its shape, which is evidence: inputs
#   fine, the finite part exact, a staircase of NaN spreading through the keys as the
#   kernel advances → memory, not arithmetic (the diff then points to `hazards`; NaN
#   `everywhere` points to weights and inputs first).
# * Record the schedule your engine encodes; `hazards` names the dispatch, the buffer and
#   the bytes. A kernel's output must never land on bytes one of its inputs occupies
#   (unless it is element-wise and declared in-place), and a value must not be overwritten
#   before its last reader.
# * A schedule the hazard check flags is wrong, whatever one input's diff says: fix it.
#
# Back to notebook 05 for the aliasing kinds in depth, or 06 for diffing finite-but-wrong
# engines (activation functions, RoPE, masks).
