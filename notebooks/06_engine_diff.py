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
# # 06 · Engine diff: where does my engine go wrong?
#
# You ported a model to your own engine (Metal, CUDA, C++...). It runs, but the text it
# generates is garbage, or just a bit worse than it should be. Comparing the final logits tells
# you *that* something is wrong. The engine diff tells you **where**: it matches your engine's
# intermediate tensors to the reference's ops and reports the **first op, in execution order,
# whose error is beyond tolerance** — after that op everything is wrong anyway.
#
# The recipe:
#
# 1. make your engine write the tensors it computes (any names) to a `.safetensors` file, an
#    `.npz` (numpy's archive of arrays) or a folder of `.npy` files (one numpy array each),
#    for a fixed list of token ids;
# 2. write a small rules file mapping your names to ours (regular expressions);
# 3. `workbench diff MODEL engine.npz --ids ... --map rules.json`.
#
# Here the "engine" is simulated: the demo model's own op program with one op swapped for a
# subtly wrong one — exactly the kind of bug a port contains.

# %%
import workbench                      # first: on Linux, points MLX at a fast BLAS (matrix-multiply library)
import numpy as np
import mlx.core as mx
from IPython.display import display
# %matplotlib inline
np.random.seed(0); mx.random.seed(0)
np.set_printoptions(precision=4, suppress=True, linewidth=110)

import dataclasses, tempfile, pathlib, json
import mlx.nn as nn
from workbench.demo.paths import DEMO
from workbench.program import Program, execute
from workbench import plots
from workbench.diff import compare
from workbench.widgets import DiffView
work = pathlib.Path(tempfile.mkdtemp())
model = workbench.load(DEMO, attention="explicit")   # the engine dumps its scores and softmax: so do we
prompt = "apple river stone cloud tree | apple river stone"
ids = model.encode(prompt)
print(len(ids), "tokens:", ids)

# %% [markdown]
# ## A ported engine with a classic bug
#
# Gemma's MLP uses GELU as its gate activation; Llama's uses SiLU. Porting from a Llama engine,
# it is easy to keep SiLU. The two functions look alike — GELU(x) = x·Φ(x) with Φ the normal
# distribution's cumulative distribution function (Gemma uses a tanh approximation), SiLU(x) = x·sigmoid(x); both ≈ x for
# large x, ≈ 0 for very negative x — so the model still produces *plausible* output. Since
# the model is a program —
# a list of ops — our "engine" is that list with the activation op replaced, run in bfloat16
# like a real GPU engine:

# %%
def engine_program(program, bug=True):
    ops = []
    for op in program.ops:
        if bug and op.name.endswith(".mlp.act"):
            op = dataclasses.replace(op, fn=lambda ctx, gate, up: nn.silu(gate) * up)   # should be gelu_approx
        ops.append(op)
    return Program(ops, program.inputs)

def run_engine(bug):
    vals = execute(engine_program(model.program, bug), model.context("bfloat16"),
                   model.feeds(mx.array([ids])), keep=lambda n: True)
    return {k: np.array(v.astype(mx.float32))[0] for k, v in vals.items() if k in model.program.names}

buggy = run_engine(bug=True)
print("engine's next token:", repr(model.decode([int(buggy["logits"][-1].argmax())])))

# %% [markdown]
# ## The engine's dump
#
# Engines name their tensors their own way and do not dump everything. Ours writes, in the
# style of llama.cpp (a widely used C++ engine: `blk.N.attn_norm`, `ffn_out`, `l_out` for
# the layer's output...), a few tensors per layer (without the batch dimension) — plus one
# tensor that has no counterpart in the reference:

# %%
NAMES = {"attn_norm": "input_layernorm", "attn_out": "self_attn.o_proj", "ffn_inp": "attn_residual",
         "ffn_act": "mlp.act", "ffn_out": "mlp.down_proj", "l_out": ""}

def write_dump(values, path):
    out = {"tok_embd": values["embed_scale"], "result_output": values["logits"]}
    for i in range(model.num_layers):
        for theirs, ours in NAMES.items():
            out[f"blk.{i}.{theirs}"] = values[f"layers.{i}" + (f".{ours}" if ours else "")]
    out["blk.0.kq_scaled"] = values["layers.0.self_attn.scores"]   # an engine-only tensor
    np.savez(path, **out)
    return sorted(out)

names = write_dump(buggy, work / "engine.npz")
print(len(names), "tensors:", names[:8], "...")

# %% [markdown]
# ## Rules: engine names → our op names
#
# A list of `[regex, replacement]` pairs, applied in order. Our op names are documented in
# docs/ops.md.

# %%
rules = [[r"^tok_embd$", "embed_scale"], [r"^result_output$", "logits"],
         [r"^blk\.(\d+)\.l_out$", r"layers.\1"]] + \
        [[rf"^blk\.(\d+)\.{theirs}$", rf"layers.\1.{ours}"] for theirs, ours in NAMES.items() if ours]
(work / "rules.json").write_text(json.dumps(rules, indent=1))
print((work / "rules.json").read_text()[:300])

# %% [markdown]
# ## The diff
#
# `compare` runs our reference on the same ids, captures exactly the ops the engine dumped,
# reconciles layouts (here: the missing batch dimension) and computes, per op, the cosine
# similarity (`cosine`: 1 when the two tensors point the same way), the normalised mean
# squared error (`nmse`: the mean squared error divided by the reference's variance) and the largest absolute error
# (`max_abs`). `#` is the op's position in the program. `local nmse` is measured only where
# the engine also dumped the op's inputs: our op applied to *the engine's own inputs*,
# compared with the engine's output — that error is the op's own, not inherited from
# upstream (`-`: the inputs were not dumped). `non-finite` counts the NaN and ±Inf values in
# the op's two tensors (blank: none); where there are any, the metrics above read `nan`
# rather than a reassuring number.

# %% tags=["nbval-ignore-output"]
report = compare(model, work / "engine.npz", ids=ids, rules=work / "rules.json", dtype="float32")
print(report.summary(max_ops=12))

# %%
fd, fl = report.first_divergence, report.first_local_divergence
print("first divergence:", fd.op, "| its inputs:", report.first_divergence_dict()["inputs"])
print(f"first op wrong on the engine's own inputs: {fl.op} ({fl.ratio:.0f} x its {fl.precision} rounding; "
      f"recomputed: {', '.join(fl.recomputed)})")

# %% [markdown]
# The first divergence is an MLP activation (`mlp.act`). Its inputs (`gate_proj`, `up_proj`)
# were not dumped, so the diff recomputed them from the nearest tensors the engine did dump
# (`ffn_inp`, the residual after attention) through our program, and fed that to our
# activation: the engine's output is far from it. Everything before it — norms, attention
# outputs, residual adds — matched within bfloat16's rounding.
#
# Look closely, though: the *first* layer's activation is computed with the same wrong
# function. Its values are small, where SiLU and GELU differ little, so its error stayed under
# the default tolerance (NMSE ≤ 0.01) — but not under its own **rounding budget**: fed the
# engine's own inputs, it lands over a hundred times further from the exact op than an honest
# bfloat16 activation does, so the diff names it as the first op wrong on its own inputs
# (section "Rounding or a bug?" below). The error curve shows the whole run: a floor of
# bfloat16 rounding noise, then a spike at every layer's activation, carried on by the
# residual stream; the black dashes are each op's local error, the gray band its budget.

# %%
plots.error_curve(report)

# %% [markdown]
# The same numbers in text: each layer's activation, against the default limit.

# %%
print("default limit: NMSE <= 0.01")
for o in report.ops:
    if o.op.endswith("mlp.act"):
        print(f"{o.op:18} NMSE {o.nmse:.2e}")

# %% [markdown]
# The `DiffView` widget is the same curve with controls: pick the metrics, pick an op to see
# its numbers, the layout reconciliation and the status of the ops it reads.

# %%
view = DiffView(report)
view

# %% [markdown]
# ## The fixed engine
#
# With GELU restored, the only differences left are bfloat16 rounding: no divergence, and the
# unmatched names are still listed (nothing is skipped silently).

# %%
write_dump(run_engine(bug=False), work / "engine_fixed.npz")
fixed = compare(model, work / "engine_fixed.npz", ids=ids, rules=rules, dtype="float32")
print(fixed.first_divergence, "|", fixed.compared, "ops compared")
print("engine tensors matching no op:", fixed.unmatched_engine, "-> closest:", fixed.suggestions)
print("every op within 1e-3 NMSE of the reference:", max(o.nmse for o in fixed.ops) < 1e-3)

# %% [markdown]
# ## Tolerance and the noise floor
#
# The default tolerance (cosine ≥ 0.995, NMSE ≤ 0.01) on the error against the reference lets
# a bfloat16 engine pass on small models while catching the usual bugs — but, as we just saw,
# it can miss a bug where values are small; the local rounding budget caught it. The error
# against the reference has a per-op limit too: `noise_floor="bfloat16"` runs our reference in
# bfloat16 *as well* and holds each op to a multiple (10×) of the error our own bfloat16 run
# has at that op (a second forward, for ops whose inputs were not dumped at all). It also
# finds the bug where it first happens, in layer 0:

# %%
strict = compare(model, work / "engine.npz", ids=ids, rules=rules, noise_floor="bfloat16")
print("first divergence with a noise floor:", strict.first_divergence.op)

# %% [markdown]
# ## On the command line
#
# `workbench dump` writes our reference activations (for your own tools); `workbench diff`
# compares. Exit status 1 when a divergence is found.

# %% tags=["nbval-ignore-output"]
from workbench.cli import main as workbench_cli
ids_arg = ",".join(map(str, ids))
status = workbench_cli(["diff", str(DEMO), str(work / "engine.npz"), "--ids", ids_arg,
                        "--map", str(work / "rules.json"), "--dtype", "float32"])

# %%
print("exit status", status)

# %% [markdown]
# ## A real engine: transformers, with a planted bug
#
# Real engines name and lay out their tensors their own way: transformers by module path
# (`model.layers.0.input_layernorm`, queries `[B, T, H, d]`), llama.cpp by GGML names
# (`attn_norm-0`, `Qcur-0`, shapes innermost first). The diff knows both (`--engine
# transformers`, `--engine llama.cpp`: `workbench/diff/engines/`, data files), so no rules file
# is needed. To get a dump from a transformers model:
#
# ```python
# from workbench.diff import torch_hooks        # imports torch only here
# with torch_hooks(hf_model) as rec:             # every module's output, RoPE's in and out
#     hf_model(torch.tensor([ids]))
# rec.save("engine.safetensors", ids=ids)
# ```
#
# Below, a dump written that way (by `scripts/make_engine_dumps.py`, committed in
# `tests/data/engines/`): transformers' own Gemma 3, tiny, where every RMSNorm scales by `w`
# instead of Gemma's `(1 + w)` — a bug ports really have. Its checkpoint is rebuilt from
# `tests/data/archs/gemma3_text`. No `--map`: the dump says it comes from transformers.

# %%
import sys
REPO = pathlib.Path(workbench.__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "data"))
from make_arch_refs import HERE as ARCHS, write_checkpoint
gemma = write_checkpoint(work / "gemma3_text", ARCHS / "gemma3_text")
real = compare(str(gemma), REPO / "tests" / "data" / "engines" / "gemma3_norm_w.safetensors")
print("engine:", real.engine, "| first divergence:", real.first_divergence.op,
      "| engine name:", real.first_divergence.engine_name)
print("pattern:", real.pattern["pattern"], "-", real.pattern["text"])

# %% [markdown]
# The first op reported is the first norm, where the bug enters, and the pattern reads the
# kind of bug from the values: the engine's output is ours times `w / (1 + w)`, channel by
# channel. The other planted bugs of `tests/test_diff_engines.py` (a wrong rope theta, an
# attention scale, a logit softcap, a matmul accumulated in bfloat16, a decode step's position
# off by one) are each found at their own op the same way; a decode step (one token through the
# engine's KV cache) is compared with our full forward's row at that position.

# %% [markdown]
# ## Rounding or a bug? Each op against its own rounding
#
# An engine in bfloat16 is never equal to a float32 reference: every op rounds. The fixed
# limits above (NMSE ≤ 0.01) are sized for that, so they let small real bugs through, and an
# engine in float32, off by ~10⁻¹⁴ when right, would hide a bug a million times its rounding.
# So each op with dumped inputs is recomputed on **the engine's own inputs** twice: exactly
# (in a finer format), and honestly at the engine's precision (inputs and weights rounded to
# it). How far the honest recompute lands is that op's **rounding budget**; an op whose engine
# output is more than 16× its budget away is a finding — whatever the fixed limits say. The
# precision is read from the values (a bfloat16 engine's values all fit bfloat16); a dump's
# metadata or `--engine-dtype` can say it instead.
#
# Two transformers engines in bfloat16 on a tiny Llama, dumped as plain hooks dump them
# (`tests/data/engines/precision`): one right, one whose layer-1 input norm uses eps 0.1
# instead of 10⁻⁶ — wrong by a little.

# %%
precision_dumps = REPO / "tests" / "data" / "engines" / "precision"
llama = write_checkpoint(work / "llama", ARCHS / "llama")
right = compare(str(llama), precision_dumps / "llama_bf16_clean.safetensors")
wrong = compare(str(llama), precision_dumps / "llama_bf16_rms_eps.safetensors")
print(right.engine_precision.text())
for name, r in (("right", right), ("wrong", wrong)):
    worst = max((o for o in r.ops if o.ratio is not None), key=lambda o: o.ratio)
    print(f"{name:5}: {r.outcome:13} | first divergence: {r.first_divergence} | largest ratio "
          f"{worst.ratio:.3g} x budget, at {worst.op}")
o = wrong["layers.1.input_layernorm"]
print(f"the wrong norm: NMSE against the reference {o.nmse:.2g} (fixed limit 0.01), "
      f"{o.ratio:.0f} x its {o.precision} rounding on the engine's own inputs")

# %% [markdown]
# The right engine's worst op sits at about its own rounding (a ratio near 1). The wrong one
# passes every fixed limit — no first divergence — but at `layers.1.input_layernorm` its
# output is two hundred times further from the exact op than an honest bfloat16 norm lands:
# the bug is named where it enters. The curve draws each op's local error (black dashes)
# against its budget band (gray: from the budget up to 16×), the op beyond it marked:

# %%
plots.error_curve(wrong)

# %% [markdown]
# ## Exercises: predict, then check
#
# Write your answer in `answer` (or the function's body) and run the cell. `check` says
# *right*, *partly right* (and how much), or what to look at for the mistake you made; it
# never shows the answer. The "implement" exercises run your function on this model's real
# values and compare with the op's output. When you are done, or stuck, `solution("06.1")`
# in a cell of your own prints a worked solution (no cell of this notebook does).

# %%
from workbench.exercises import check, solution

# %% [markdown]
# **1.** A subtler engine: only *layer 2's* activation uses SiLU, every other layer is right.
# Does the diff with the default tolerance find a divergence? (True or False)

# %%
answer = None  # your prediction: True or False
check("06.1", answer)

# %% [markdown]
# **2.** The same engine, compared with `noise_floor="bfloat16"`. Which op is the first
# divergence?

# %%
answer = None  # your prediction: an op name
check("06.2", answer)

# %% [markdown]
# **3. Implement it.** The diff's NMSE (normalised mean squared error) between a reference
# tensor and an engine's, as defined under "The diff" above. `check` runs it on a few ops'
# values against the diff's own numbers.

# %%
def nmse(ref, got):
    """ref, got: numpy float32 arrays of the same shape (one op's values); return a float."""
    return None  # your code

check("06.3", nmse)

# %% [markdown]
# **4. Implement it.** The diff's cosine similarity between the two tensors, flattened.

# %%
def cosine(ref, got):
    """ref, got: numpy float32 arrays of the same shape (one op's values); return a float."""
    return None  # your code

check("06.4", cosine)

# %% [markdown]
# **What to remember.** Dump a handful of tensors per layer, map the names once, and let the
# diff find the first op that departs from the reference; then dump that op's inputs too. Next:
# 07, models whose MLP is a team of experts.
