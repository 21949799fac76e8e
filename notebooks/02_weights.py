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
# # 02 · Weights: is this checkpoint complete and sound?
#
# A language-model checkpoint is two things: a **config** (`config.json`: how many layers,
# how wide, which attention type where) and **tensors** (`*.safetensors`: named arrays of
# numbers). An inference engine matches the names to the places they belong in the
# network. When the names do not match what the engine expects, the symptom is almost
# always the same — *"layer 34 weights missing, please re-download"* — but the cause is
# one of two very different things:
#
# * the tensor really is **missing** (a bad download, a broken conversion), or
# * the tensor is there under **another name**, and the engine's loader matched names wrongly.
#
# Re-downloading fixes the first and wastes a day on the second. `workbench.inspect` tells
# them apart in a second, from the checkpoint's headers alone, without loading any weights.
#
# Everything here runs on tiny checkpoints written on the fly by `workbench.zoo` (same
# layout and names as real checkpoints of Gemma 4, Google's open model family, but random
# numbers and a few hundred KB).

# %%
import workbench                      # first: on Linux, points MLX at a fast BLAS (matrix-multiply library)
import numpy as np
import mlx.core as mx
from IPython.display import display
# %matplotlib inline
np.random.seed(0); mx.random.seed(0)
np.set_printoptions(precision=4, suppress=True, linewidth=110)

import tempfile, pathlib
from workbench import zoo
from workbench.widgets import WeightBrowser
work = pathlib.Path(tempfile.mkdtemp())

# %% [markdown]
# ## A healthy checkpoint
#
# `zoo.build` writes a small Gemma-4-shaped model: 6 layers, hidden size 64, with tensor
# names as MLX conversions of a text-only model write them (`model.layers.N...`; original
# Hugging Face files of the multimodal Gemma use `model.language_model.layers.N...`, and the
# inspector reads both). Let us look at what is on disk.

# %%
clean = zoo.build("gemma4_text", work / "clean")
for f in sorted(clean.iterdir()):
    print(f"{f.name:28s} {f.stat().st_size:>9,d} bytes")

# %% [markdown]
# A `.safetensors` file is an 8-byte length, a JSON **header** (every tensor's name, dtype,
# shape and byte range), then the raw bytes. Reading the header is enough to check names,
# shapes and dtypes against the config — that is why inspection takes milliseconds even on a
# 60 GB model. Here is a piece of the header, read by hand (`BF16` is bfloat16, a 16-bit
# float; `data_offsets` is the tensor's byte range after the header):

# %%
import json, struct
raw = (clean / "model.safetensors").read_bytes()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
for name in ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"]:
    print(name, header[name])

# %% [markdown]
# `workbench.inspect` knows, from `config.json`, which tensors a Gemma 4 model of this
# shape must have, with which shapes — including the architecture's quirks (some layers
# use *sliding-window* attention and others *full* attention with different head sizes;
# the last layers may *share* keys and values with earlier ones and then have no `k_proj`).
# The report's grid shows every layer × every tensor kind:
# `✓` present, `·` not needed in this layer, `✗` missing, `!` present but wrong.
# Its column headers are short names for the tensors of one layer (`layers.N.<tensor>`):
#
# | column | tensor | what it is |
# |---|---|---|
# | `q` `k` `v` `o` | `self_attn.{q,k,v,o}_proj` | attention's query, key, value and output projections |
# | `qn` `kn` | `self_attn.q_norm`, `self_attn.k_norm` | the norms applied to queries and keys |
# | `gate` `up` `down` | `mlp.{gate,up,down}_proj` | the MLP's (feed-forward network's) three matrices |
# | `in` | `input_layernorm` | the norm before attention |
# | `pa` | `post_attention_layernorm` | the norm after attention |
# | `pf` | `pre_feedforward_layernorm` | the norm before the MLP |
# | `pff` | `post_feedforward_layernorm` | the norm after the MLP |
# | `plg` | `per_layer_input_gate` | per-layer embeddings: the gate that mixes them in |
# | `plp` | `per_layer_projection` | per-layer embeddings: the projection back to the stream |
# | `pln` | `post_per_layer_input_norm` | per-layer embeddings: the norm after them |
# | `ls` | `layer_scalar` | one learned number scaling the layer's output |
#
# Mixture-of-experts models (notebook 07) add `rt` (`router`), `exp` (`experts`), `pf2`,
# `pff1` and `pff2` (the norms around the expert branch). Here layers 4–5 show `·` under
# `k`, `v` and `kn`: this config has `num_kv_shared_layers: 2`, so the last two layers reuse
# the keys and values of an earlier layer and own no key/value weights.

# %%
report = workbench.inspect(clean)
print(report)

# %% [markdown]
# `report.ok` is what a script checks; `report.problems` is the list of findings, each with
# a stable `code`; `report.to_dict()` is the same as `workbench inspect PATH --json`.

# %%
report.ok, report.problems, sorted(report.to_dict())

# %% [markdown]
# ## Missing, or misnamed?
#
# Now two broken copies. In the first, a layer's `q_proj` was really lost. In the second,
# nothing was lost: a conversion script wrote layer 1's `mlp.down_proj` as `mlp.down_prj`.
# An engine that looks tensors up by exact name fails *the same way* on both.

# %%
missing = workbench.inspect(zoo.build("gemma4_text", work / "missing", broken="missing-tensor"))
misnamed = workbench.inspect(zoo.build("gemma4_text", work / "misnamed", broken="misnamed"))
for label, r in [("missing", missing), ("misnamed", misnamed)]:
    print(f"--- {label}: ok={r.ok}")
    for p in r.problems:
        print(f"  {p.code:18s} {p.tensor}\n  {'':18s} suggestion: {p.suggestion}")

# %% [markdown]
# The difference is in the problem list:
#
# * **missing**: one `missing-tensor`, and no suggestion — nothing in the file resembles
#   the expected name. Re-downloading (or re-converting) is the right fix.
# * **misnamed**: a `missing-tensor` *and* an `unexpected-tensor`, each pointing at the
#   other as its `suggestion`. The bytes are there; the fix is a rename in the converter or
#   a mapping in the engine's loader. Nothing needs downloading.
#
# The rule a script can apply:

# %%
def diagnosis(report):
    unexpected = {p.tensor for p in report.problems if p.code == "unexpected-tensor"}
    out = []
    for p in report.problems:
        if p.code == "missing-tensor":
            if p.suggestion in unexpected:
                out.append(f"MISNAMED: {p.tensor} is stored as {p.suggestion}")
            else:
                out.append(f"MISSING:  {p.tensor}")
    return out

print(diagnosis(missing))
print(diagnosis(misnamed))

# %% [markdown]
# ## Values: NaN hiding in a weight
#
# Names and shapes can be perfect while the numbers are not. `values=True` streams through
# every tensor (chunk by chunk, so memory stays small) and counts NaN, +Inf and −Inf
# element by element. This copy has non-finite values written into a norm weight — the
# kind of damage that later shows up as "NaN from layer 3 on" in the forward pass
# (notebook 04 hunts it from the other end).

# %%
poisoned = workbench.inspect(zoo.build("gemma4_text", work / "poisoned", broken="nonfinite-values"), values=True)
for p in poisoned.problems:
    print(p.code, "|", p.message)

# %% [markdown]
# ## Browsing the weights
#
# `WeightBrowser` is a view over the same report: pick a component, a layer, a tensor. Tensors
# with problems are marked (`✗` missing, `!` wrong) and the browser opens on the first
# problem. Each tensor shows its file and byte offset, its statistics, and a histogram of its
# values. Below, a heatmap of one statistic for every layer × tensor: a layer unlike its
# neighbours stands out. (Before you run the notebook you see the view as it was saved;
# run the notebook to click through it.)

# %%
misnamed_v = workbench.inspect(work / "misnamed", values=True)
browser = WeightBrowser(misnamed_v)
browser

# %% [markdown]
# The browser's state is also plain Python, which is handy in scripts and tests:

# %%
print(browser.tensor.value)
print([o["text"] for o in browser.detail.outputs if o["output_type"] == "stream"][0])

# %% [markdown]
# ## Quantized checkpoints
#
# Quantized weights are stored packed: 4-bit values eight to a `uint32`, plus one
# **scale** per group of consecutive values (and, for *affine* quantization — integer values
# times a scale plus an offset — a **bias** per group too). The microscaling formats have
# scales only: `mxfp4` (4-bit floats, one shared power-of-two scale per 32 values), `mxfp8`
# (8-bit floats, the same), `nvfp4` (NVIDIA's 4-bit floats, one scale per 16 values).
# `affine4` below is affine with 4 bits. The inspector infers the mode, bits and group size of every module
# from the shapes and checks them against the config's `quantization` block — a common
# porting bug is reading a "with biases" checkpoint as "without", or the reverse.

# %%
for q in ["affine4", "mxfp4"]:
    r = workbench.inspect(zoo.build("gemma4_text", work / q, quant=q))
    print(q, "->", r.ok, r.to_dict()["quantization"])

# %% [markdown]
# ## On the command line
#
# Every check above is also one command, with `--json` for tools. Exit status 0 means
# sound, 1 means problems found, 2 means the path is not a checkpoint at all.

# %%
from workbench.cli import main as workbench_cli
status = workbench_cli(["inspect", str(work / "misnamed"), "--json"])
print("exit status", status)

# %% [markdown]
# ## Exercises: predict, then check
#
# Write your answer in `answer` (or the function's body) and run the cell. `check` says
# *right*, *partly right* (and how much), or what to look at for the mistake you made; it
# never shows the answer. The "implement" exercises run your function on this model's real
# values and compare with the op's output. When you are done, or stuck, `solution("02.1")`
# in a cell of your own prints a worked solution (no cell of this notebook does).

# %%
from workbench.exercises import check, solution

# %% [markdown]
# **1.** A converter renames `layers.0.self_attn.k_proj.weight` to `...k_prj.weight`. Which
# problem codes will `inspect` report (a list)?

# %%
answer = None  # your prediction, e.g. ["missing-tensor"]
check("02.1", answer)

# %% [markdown]
# **2.** Inspect the poisoned copy from above *without* `values=True`. Is `report.ok` True
# or False?

# %%
answer = None  # your prediction: True or False
check("02.2", answer)

# %% [markdown]
# **3. Implement it.** Given the names a config requires and the names a checkpoint stores,
# return `(missing, unexpected)`: the two lists of names `inspect` reports. `check` runs it on
# the clean checkpoint's names and a renamed copy's, against `inspect`'s findings.

# %%
def missing_and_unexpected(required, stored):
    """required, stored: lists of tensor names (str); return (missing, unexpected), two lists of names."""
    return None  # your code

check("02.3", missing_and_unexpected)

# %% [markdown]
# **4. Implement it.** Count a tensor's non-finite values: return `(NaN, +inf, -inf)`.
# `check` runs it on the poisoned tensor that `inspect(..., values=True)` flags.

# %%
def count_nonfinite(x):
    """x: a numpy float array; return (NaN count, +inf count, -inf count), three ints."""
    return None  # your code

check("02.4", count_nonfinite)

# %% [markdown]
# **What to remember.** "Missing weights" is a claim to check, not a fact: compare the
# checkpoint's names against what its config requires, and look for the nearest name before
# re-downloading anything. Next: notebook 03 runs a model op by op.
