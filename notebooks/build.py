"""Build (and execute) the workbench notebooks from this one Python file.

    python notebooks/build.py                 # rebuild and execute every notebook
    python notebooks/build.py 03 04           # only these (by number or file name)
    python notebooks/build.py --no-execute    # write the cells only (no outputs)

Every notebook's source lives here as plain strings (no jupytext), so a change is a diff
to review and the notebooks are regenerated, executed in a fresh kernel of this
environment (cwd notebooks/, PYTHONHASHSEED=0, seeded RNGs) and saved WITH their outputs
and widget state.  tests/test_notebooks.py then runs nbval against those outputs.

Cell tags: ``nbval-ignore-output`` for cells whose output legitimately varies (timings,
progress); everything else is compared.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat as nbf

NB_DIR = Path(__file__).resolve().parent
IGNORE = "nbval-ignore-output"

#: file name -> function returning the cells (filled in by the @notebook decorator below)
NOTEBOOKS: dict[str, object] = {}


def notebook(name: str):
    def deco(fn):
        NOTEBOOKS[name] = fn
        return fn
    return deco


def md(text: str):
    return nbf.v4.new_markdown_cell(_dedent(text))


def code(src: str, *tags: str):
    c = nbf.v4.new_code_cell(_dedent(src))
    if tags:
        c.metadata["tags"] = list(tags)
    return c


def _dedent(s: str) -> str:
    import textwrap
    return textwrap.dedent(s).strip("\n")


SETUP = """\
import workbench                      # first: puts MLX on a fast BLAS
import numpy as np
import mlx.core as mx
from IPython.display import display
%matplotlib inline
np.random.seed(0); mx.random.seed(0)
np.set_printoptions(precision=4, suppress=True, linewidth=110)
"""


# ===================================================================================== notebooks
# (each function returns the cells of one notebook; see the sections below)

@notebook("02_weights.ipynb")
def nb02():
    return [
        md("""
        # 02 · Weights: is this checkpoint complete and sound?

        A language-model checkpoint is two things: a **config** (`config.json`: how many layers,
        how wide, which attention type where) and **tensors** (`*.safetensors`: named arrays of
        numbers). An inference engine matches the names to the places they belong in the
        network. When the names do not match what the engine expects, the symptom is almost
        always the same — *"layer 34 weights missing, please re-download"* — but the cause is
        one of two very different things:

        * the tensor really is **missing** (a bad download, a broken conversion), or
        * the tensor is there under **another name**, and the engine's loader matched names wrongly.

        Re-downloading fixes the first and wastes a day on the second. `workbench.inspect` tells
        them apart in a second, from the checkpoint's headers alone, without loading any weights.

        Everything here runs on tiny checkpoints written on the fly by `workbench.zoo` (same
        layout and names as real Gemma 4 checkpoints, random numbers, a few hundred KB).
        """),
        code(SETUP + """
import tempfile, pathlib
from workbench import zoo
from workbench.widgets import WeightBrowser
work = pathlib.Path(tempfile.mkdtemp())
"""),
        md("""
        ## A healthy checkpoint

        `zoo.build` writes a small Gemma-4-shaped model: 6 layers, hidden size 64, in the MLX
        name layout (`model.layers.N...`). Let us look at what is on disk.
        """),
        code("""
clean = zoo.build("gemma4_text", work / "clean")
for f in sorted(clean.iterdir()):
    print(f"{f.name:28s} {f.stat().st_size:>9,d} bytes")
"""),
        md("""
        A `.safetensors` file is an 8-byte length, a JSON **header** (every tensor's name, dtype,
        shape and byte range), then the raw bytes. Reading the header is enough to check names,
        shapes and dtypes against the config — that is why inspection takes milliseconds even on a
        60 GB model. Here is a piece of the header, read by hand:
        """),
        code("""
import json, struct
raw = (clean / "model.safetensors").read_bytes()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
for name in ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"]:
    print(name, header[name])
"""),
        md("""
        `workbench.inspect` knows, from `config.json`, which tensors a Gemma 4 model of this
        shape must have, with which shapes — including the architecture's quirks (some layers
        use *sliding-window* attention and others *full* attention with different head sizes;
        the last layers may *share* keys and values with earlier ones and then have no `k_proj`).
        The report's grid shows every layer × every tensor kind:
        `✓` present, `·` not needed in this layer, `✗` missing, `!` present but wrong.
        """),
        code("""
report = workbench.inspect(clean)
print(report)
"""),
        md("""
        `report.ok` is what a script checks; `report.problems` is the list of findings, each with
        a stable `code`; `report.to_dict()` is the same as `workbench inspect PATH --json`.
        """),
        code("""
report.ok, report.problems, sorted(report.to_dict())
"""),
        md("""
        ## Missing, or misnamed?

        Now two broken copies. In the first, a layer's `q_proj` was really lost. In the second,
        nothing was lost: a conversion script wrote layer 1's `mlp.down_proj` as `mlp.down_prj`.
        An engine that looks tensors up by exact name fails *the same way* on both.
        """),
        code("""
missing = workbench.inspect(zoo.build("gemma4_text", work / "missing", broken="missing-tensor"))
misnamed = workbench.inspect(zoo.build("gemma4_text", work / "misnamed", broken="misnamed"))
for label, r in [("missing", missing), ("misnamed", misnamed)]:
    print(f"--- {label}: ok={r.ok}")
    for p in r.problems:
        print(f"  {p.code:18s} {p.tensor}\\n  {'':18s} suggestion: {p.suggestion}")
"""),
        md("""
        The difference is in the problem list:

        * **missing**: one `missing-tensor`, and no suggestion — nothing in the file resembles
          the expected name. Re-downloading (or re-converting) is the right fix.
        * **misnamed**: a `missing-tensor` *and* an `unexpected-tensor`, each pointing at the
          other as its `suggestion`. The bytes are there; the fix is a rename in the converter or
          a mapping in the engine's loader. Nothing needs downloading.

        The rule a script can apply:
        """),
        code("""
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
"""),
        md("""
        ## Values: NaN hiding in a weight

        Names and shapes can be perfect while the numbers are not. `values=True` streams through
        every tensor (chunk by chunk, so memory stays small) and counts NaN, +Inf and −Inf
        element by element. This copy has non-finite values written into a norm weight — the
        kind of damage that later shows up as "NaN from layer 3 on" in the forward pass
        (notebook 04 hunts it from the other end).
        """),
        code("""
poisoned = workbench.inspect(zoo.build("gemma4_text", work / "poisoned", broken="nonfinite-values"), values=True)
for p in poisoned.problems:
    print(p.code, "|", p.message)
"""),
        md("""
        ## Browsing the weights

        `WeightBrowser` is a view over the same report: pick a component, a layer, a tensor. Tensors
        with problems are marked (`✗` missing, `!` wrong) and the browser opens on the first
        problem. Each tensor shows its file and byte offset, its statistics, and a histogram of its
        values. Below, a heatmap of one statistic for every layer × tensor: a layer unlike its
        neighbours stands out. (Widgets need a live kernel; run the notebook to use them.)
        """),
        code("""
misnamed_v = workbench.inspect(work / "misnamed", values=True)
browser = WeightBrowser(misnamed_v)
browser
"""),
        md("""
        The browser's state is also plain Python, which is handy in scripts and tests:
        """),
        code("""
print(browser.tensor.value)
print([o["text"] for o in browser.detail.outputs if o["output_type"] == "stream"][0])
"""),
        md("""
        ## Quantized checkpoints

        Quantized weights are stored packed: 4-bit values eight to a `uint32`, plus per-group
        **scales** (and, for *affine* quantization, **biases**). `mxfp4`, `mxfp8` and `nvfp4`
        have scales only. The inspector infers the mode, bits and group size of every module
        from the shapes and checks them against the config's `quantization` block — a common
        porting bug is reading a "with biases" checkpoint as "without", or the reverse.
        """),
        code("""
for q in ["affine4", "mxfp4"]:
    r = workbench.inspect(zoo.build("gemma4_text", work / q, quant=q))
    print(q, "->", r.ok, r.to_dict()["quantization"])
"""),
        md("""
        ## On the command line

        Every check above is also one command, with `--json` for tools. Exit status 0 means
        sound, 1 means problems found, 2 means the path is not a checkpoint at all.
        """),
        code("""
from workbench.cli import main as workbench_cli
status = workbench_cli(["inspect", str(work / "misnamed"), "--json"])
print("exit status", status)
"""),
        md("""
        **What to remember.** "Missing weights" is a claim to check, not a fact: compare the
        checkpoint's names against what its config requires, and look for the nearest name before
        re-downloading anything. Next: notebook 03 runs a model op by op.
        """),
    ]


@notebook("05_buffer_aliasing.ipynb")
def nb05():
    return [
        md("""
        # 05 · Buffer aliasing: the `attnH` story

        A GPU inference engine does not run "the model"; it runs a long list of **dispatches**.
        Each dispatch launches one kernel (a matrix multiply, a norm, an attention) that reads
        some byte ranges of some GPU buffers and writes its result into another range. To save
        memory, engines **reuse** a small pool of scratch buffers: the buffer that held layer 0's
        attention output holds layer 1's once layer 0's is no longer needed.

        The classic bug: a kernel whose **output buffer is also one of its inputs**. A GPU
        kernel computes its output in tiles, in parallel; as soon as the first tiles are written,
        the input the remaining tiles still need is gone. The result is not an error message —
        it is slightly wrong numbers, or NaN, a few layers later. In the reports this project
        grew from, a Metal engine produced NaN until the attention output got its own scratch
        buffer, `attnH` ("buffer isolation"). Nobody could *see* the aliasing; they found it by
        trial and error.

        This notebook reproduces that bug on purpose with the **engine emulator**, then finds it
        with the **hazard analyzer** — the same analyzer you can point at a schedule recorded from
        your own engine.
        """),
        code(SETUP + """
import tempfile, pathlib, json
from workbench import zoo
from workbench.buffers import analyze, load_schedule, Emulator
from workbench.widgets import HazardTimeline
work = pathlib.Path(tempfile.mkdtemp())
model = workbench.load(zoo.build("gemma4_text", work / "g4", dtype="float32"))
ids = [1, 5, 9, 3, 7, 2, 11, 4]
model
"""),
        md("""
        ## An engine, emulated

        `Emulator(model, ids)` runs the model's op program the way an engine does: every value
        lives at a byte offset in a named buffer of a fixed pool, every op is a dispatch that reads
        its inputs' bytes and writes its output's bytes, and everything is recorded as a
        **schedule** (`workbench.schedule/1`, a JSON format an engine can emit too).

        The default **plan** gives each op *role* one scratch buffer, reused from layer to layer
        once the previous layer's value is dead — like a real engine. It is hazard-free, and the
        logits come out bit-for-bit equal to the reference.
        """),
        code("""
emu = Emulator(model, ids)
plan = emu.plan()
print(plan)
print("\\n".join(plan.table().splitlines()[12:22]))
"""),
        code("""
good = emu.run(plan)
print(good.summary())
print(len(good.schedule.events), "events recorded")
"""),
        md("""
        ## The bug: attention's output projection writes over its own input

        In layer 1, `self_attn.context` (the attention result, heads concatenated) is the input of
        `self_attn.o_proj` (the output projection, a matrix multiply). Put `o_proj`'s output in
        the very bytes of its input — one line in the plan:
        """),
        code("""
o_proj, context = "layers.1.self_attn.o_proj", "layers.1.self_attn.context"
bad = emu.run(plan.place(o_proj, like=context))
print(bad.summary())
"""),
        md("""
        The logits are wrong, and the emulator knows the first op whose bytes differ from the
        reference: `o_proj` itself. A matrix multiply computing its output tile by tile read rows
        of `context` that its own earlier tiles had already overwritten.

        In a real engine you do not have a reference to compare bytes with. What you *can* have
        is the schedule — and the analyzer needs nothing else:
        """),
        code("""
hazards = analyze(bad.schedule)
for h in hazards:
    print(f"event {h.event} [{h.kind}] buffer {h.buffer!r} bytes {h.range}")
    print(h.message)
"""),
        md("""
        `alias-in-dispatch`: one dispatch reads and writes exactly the same bytes, and its kernel
        does not declare that pair safe in-place. (Element-wise kernels — an add, a scale — *are*
        safe in-place, because each output element depends only on the same input element; the
        schedule's `kernels` section declares such pairs, and the analyzer accepts them.)

        ## Seeing it

        `HazardTimeline` draws buffers (rows) against events (columns): a grey bar is a buffer's
        live range, blue ticks reads, orange writes, purple both, and red boxes hazards. Pick a
        hazard to see both dispatches' reads and writes, the overlapping bytes in red.
        """),
        code("""
timeline = HazardTimeline(bad.schedule)
timeline
"""),
        md("""
        ## The fix: a separate `attnH` buffer

        Give `o_proj` an output buffer of its own — exactly what the engine's authors eventually did:
        """),
        code("""
fixed = emu.run(plan.place(o_proj, like=context).place(o_proj, buffer="attnH"))
print(fixed.summary())
"""),
        md("""
        ## The other form: a value overwritten before its last reader

        Aliasing does not need one kernel reading and writing the same bytes. Here the attention
        output of layer 1 is written into the buffer holding the residual stream `layers.0` —
        which layer 1 still has to add back in (`attn_residual = layers.0 + attention`). Each
        dispatch on its own is fine; the *order* is not. The analyzer tracks which value was last
        written to every byte, and the schedule labels what each read expects:
        """),
        code("""
stale = emu.run(plan.place(context, like="layers.0"))
print(stale.summary())
h = stale.hazards[0]
print(h.kind, "at event", h.event, "| earlier event:", h.other)
print(h.message)
"""),
        md("""
        ## Your engine's schedule

        The schedule is a plain JSON file. An engine emits one entry per dispatch while it encodes
        (buffer id, byte offset, size for every read and write; optionally the name of the tensor
        written or expected), plus barriers and command-buffer commits. docs/schedule.md is the
        format and a short guide to emitting it from Metal or CUDA. Here is what two events look like:
        """),
        code("""
path = work / "bad.schedule.json"
bad.schedule.save(path)
doc = json.loads(path.read_text())
print(doc["format"], doc["mode"], len(doc["events"]), "events")
i = bad.dispatch_of(o_proj)
print(json.dumps(doc["events"][i], indent=1))
"""),
        md("""
        The command line gives the same answer, with exit status 1 when hazards are found (so a CI
        job can run it on every engine build):
        """),
        code("""
from workbench.cli import main as workbench_cli
print("exit status", workbench_cli(["hazards", str(path)]))
"""),
        md("""
        ## Command buffers

        The same analyzer checks the command-buffer lifecycle. Another crash from the reports:
        encoding a dispatch into a command buffer that was already committed. A four-event
        schedule is enough to show it:
        """),
        code("""
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
"""),
        md("""
        **What to remember.** Buffer reuse bugs give plausible-looking wrong numbers, far from
        their cause. Record the schedule your engine actually encodes, and let the analyzer name
        the dispatch, the buffer and the bytes. Next: notebook 06 compares an engine's activations
        with the reference, op by op.
        """),
    ]


@notebook("01_tour.ipynb")
def nb01():
    return [
        md("""
        # 01 · A tour of the workbench

        The workbench lets you **see inside a transformer language model while it runs**: every
        intermediate value of the forward pass, op by op, with the numbers that matter when you
        port a model to your own engine — shapes, ranges, how close a value is to overflowing
        float16, where the first NaN appears and why.

        It runs on MLX (on a Mac's GPU, or on the CPU anywhere) and is proven against mlx-lm, the
        reference implementation: our logits equal mlx-lm's. This tour takes a few minutes; each
        later notebook goes deep on one topic:

        | notebook | what you learn |
        |---|---|
        | 02 weights | is a checkpoint complete? *missing* vs *misnamed* tensors |
        | 03 forward pass | embeddings, norms, RoPE, attention, MLP, residual stream, logit lens |
        | 04 NaN hunt | an fp16 overflow and a poisoned weight, found and explained |
        | 05 buffer aliasing | an engine bug that corrupts numbers silently, and the analyzer that finds it |
        | 06 engine diff | the first op where your engine departs from the reference |
        | 07 mixture of experts | the router, top-k experts, expert load |
        | 08 generation | the KV cache, token by token |

        ## The demo model

        Everything runs offline on a small model that ships with the repository: a real Gemma 4
        architecture (sliding-window and full attention layers, per-layer embeddings), a few MB,
        trained for a few minutes on two tasks whose answers can be checked:

        * **copy**: `lamp river coin | lamp river coin .` — repeat a list of words seen once;
        * **recall**: `mia red kite . tom blue cup . anna green hat . tom` → ` blue cup .` — who has what
        """),
        code(SETUP + """
from workbench.demo.paths import DEMO
from workbench.widgets import StepDebugger
from workbench import plots
model = workbench.load(DEMO, dtype="float32")   # stored in bfloat16, computed in float32 here
model
"""),
        code("""
cfg = model.config
print({k: cfg[k] for k in ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"]})
print(cfg["layer_types"])
"""),
        md("""
        ## It works: greedy generation

        `workbench.generate` decodes greedily with a KV cache (notebook 08 opens it up).
        """),
        code("""
for prompt in ["apple river stone cloud | apple", "mia red kite . tom blue cup . anna green hat . tom"]:
    g = workbench.generate(model, prompt, max_tokens=6)
    print(f"{prompt!r} -> {g.text!r}")
"""),
        md("""
        ## The model as a program of named ops

        Inside the workbench a model's forward pass is a flat list of **ops**, each a small
        function of earlier values. An op that applies a checkpoint weight is named after that
        weight (`layers.0.self_attn.q_proj` applies `layers.0.self_attn.q_proj.weight`);
        `layers.{i}` is the residual stream after layer `i`; `logits` is the last op. Every tool —
        tracing, NaN hunting, the engine emulator, the diff, these widgets — is a view over this list.
        """),
        code("""
prog = model.program
print(len(prog), "ops; the first 14:")
for op in prog.ops[:14]:
    print(" ", op.describe())
"""),
        md("""
        ## A trace: every value, by name

        `workbench.trace(model, text, capture="full")` prepares a run; `run()` executes it and
        keeps every op's output (`capture="stats"` keeps only statistics: cheaper on big models).
        """),
        code("""
prompt = "apple river stone cloud tree | apple river stone"
tr = workbench.trace(model, prompt, capture="full")
tr.run()
print(tr)
tokens = [model.decode([i]) for i in tr.ids[0].tolist()]
print(tokens)
probs = mx.softmax(tr.logits[-1].astype(mx.float32), axis=-1)
top = mx.argsort(-probs)[:3].tolist()
print("next token:", [(model.decode([t]), round(probs[t].item(), 3)) for t in top])
"""),
        md("""
        Any value, by op name, as an MLX array; and its statistics:
        """),
        code("""
v = tr.value("layers.0.self_attn.softmax")
print(v.shape, "(batch, heads, query token, key token)")
s = tr.stats("layers.2")
print({k: (float(f"{x:.3g}") if isinstance(x, float) else x) for k, x in s.items()})
"""),
        md("""
        ## Step through it

        The `StepDebugger` drives a trace with buttons: **step** one op, **step over layer**, **run
        to** an op by name, run to the **next non-finite** value, **back**. It shows the current op
        with its input and output shapes, statistics, the fraction of float16's and bfloat16's
        range used (*headroom*), a heatmap of the value (tokens × channels), the attention pattern
        on attention ops (pick the head), and the residual-stream norm of each finished layer.
        Click **step** a few times, then try **run to** `layers.1.self_attn.softmax`.
        """),
        code("""
debugger = StepDebugger(workbench.trace(model, prompt, capture="full"))
debugger.run_to("layers.0.self_attn.softmax")
debugger
"""),
        md("""
        The buttons are ordinary methods too (`debugger.step()`, `debugger.run_to(name)`, ...), and
        everything the widget shows is also available from the trace.

        ## Plots

        `workbench.plots` draws the common views as matplotlib figures, no widgets needed. The
        residual stream's size after each layer:
        """),
        code("""
plots.residual_norm_plot(tr, tokens=tokens)
"""),
        md("""
        And one attention head's pattern: each row is a query token, each column a key token it
        may look at (only earlier ones: the model is causal). After the `|`, this head looks at the
        word that *followed* the current word the first time round — it is an **induction head**,
        the circuit that lets the model copy (notebook 03 explains it). Before the `|`, with nothing
        to copy yet, it parks its attention on `<bos>`, as idle heads do.
        """),
        code("""
from workbench.demo import NAMED_HEADS      # measured heads of the demo model (docs/demo.md)
layer, head, score = NAMED_HEADS["induction"]
plots.attention_pattern(tr.value(f"layers.{layer}.self_attn.softmax"), head=head, tokens=tokens,
                        title=f"layers.{layer} head {head}: induction")
"""),
        md("""
        ## Checking a checkpoint, hunting a NaN

        Two one-liners you will use a lot (notebooks 02 and 04):
        """),
        code("""
print(workbench.inspect(DEMO).ok)
from workbench.trace import hunt
print(hunt(model, prompt, dtype="float16"))
"""),
        md("""
        ## Next

        Open **03 stepping through a forward pass** to learn what each op does, or jump to the
        topic you need. Every notebook runs top to bottom in a minute or two on a laptop CPU.
        """),
    ]


@notebook("03_forward_pass.ipynb")
def nb03():
    return [
        md("""
        # 03 · Stepping through a forward pass

        A language model turns a list of tokens into, for every position, a score for every
        possible next token. In between sits a stack of identical **layers**, each reading and
        adding to a running vector per token — the **residual stream**. This notebook walks through
        one forward pass of the demo model (a Gemma 4 architecture) op by op, and checks each
        step's arithmetic by hand with numpy, so nothing is magic:

        1. tokens and **embeddings**
        2. **RMS norm**
        3. **attention**: queries, keys, values, **RoPE**, scores, softmax, the heads' outputs
        4. the **MLP** (a gated feed-forward network)
        5. the **residual stream**, layer after layer
        6. the **logit lens**: what each layer would predict if it were the last
        """),
        code(SETUP + """
from workbench.demo.paths import DEMO
from workbench import plots
from workbench.widgets import StepDebugger
model = workbench.load(DEMO, dtype="float32")
prompt = "apple river stone cloud tree | apple river stone"
tr = workbench.trace(model, prompt, capture="full")
tr.run()
v = lambda name: np.array(tr.value(name)[0])   # an op's output for our one sequence, as numpy
cfg = model.config
D = cfg["hidden_size"]
"""),
        md("""
        ## 1 · Tokens and embeddings

        The tokenizer cuts the text into **tokens** (here: whole words, a separator `|`, and a
        beginning-of-sequence marker) and gives each an integer id.
        """),
        code("""
ids = tr.ids[0].tolist()
tokens = [model.decode([i]) for i in ids]
print(list(zip(ids, tokens)))
"""),
        md("""
        `embed_tokens` looks each id up in a table of learned vectors, one row per vocabulary entry.
        Gemma then multiplies by √D (`embed_scale`), so the embeddings start at a size comparable to
        what the layers add later.
        """),
        code("""
table = np.array(model.weights("float32")["embed_tokens.weight"])
print("table", table.shape, "-> embed_tokens", v("embed_tokens").shape)
print("row lookup:", np.array_equal(v("embed_tokens"), table[ids]))
print("x sqrt(D):", np.allclose(v("embed_scale"), v("embed_tokens") * np.sqrt(D), rtol=1e-2))
"""),
        md("""
        Gemma 4 adds a second, smaller embedding per layer (**per-layer embeddings**, `per_layer_inputs`:
        one small vector per token *per layer*), fed into each layer at its end. It lets small models
        carry token identity deep into the network cheaply.
        """),
        code("""
print(v("per_layer_inputs").shape, "= (tokens, layers, size per layer)")
"""),
        md("""
        ## 2 · RMS norm

        Each layer starts by normalising every token's vector: divide by its root mean square, then
        multiply by a learned weight per channel. Without it, the vectors' size would drift layer
        after layer. Check `layers.0.input_layernorm` by hand:
        """),
        code("""
x = v("embed_scale")  # the residual stream entering layer 0
w = np.array(model.weights("float32")["layers.0.input_layernorm.weight"])
eps = cfg.get("rms_norm_eps", 1e-6)
by_hand = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w
print("by hand == input_layernorm:", np.allclose(by_hand, v("layers.0.input_layernorm"), atol=1e-5))
print("RMS of each token before:", np.sqrt((x ** 2).mean(-1)).round(2))
"""),
        md("""
        ## 3 · Attention

        Attention is how a token gathers information from earlier tokens. For each **head**:

        * `q_proj`, `k_proj`, `v_proj` project each token's normed vector into a **query** (what am I
          looking for?), a **key** (what do I contain?) and a **value** (what do I hand over?);
        * `q_heads` splits them into heads; Gemma normalises queries and keys (`q_norm`, `k_norm`);
        * **RoPE** rotates queries and keys by an angle proportional to the token's position, so
          that the dot product of a query and a key depends on how far apart they are;
        * `scores` = query · key for every pair (query token, earlier key token); later tokens are
          masked out: a token cannot look at the future;
        * `softmax` turns each row of scores into weights that sum to 1;
        * `context` = the weighted sum of the values; `o_proj` mixes the heads back into one vector.
        """),
        code("""
for name in ["layers.0.self_attn.q_proj", "layers.0.self_attn.q_heads", "layers.0.self_attn.q_rope",
             "layers.0.self_attn.k_rope", "layers.0.self_attn.scores", "layers.0.self_attn.softmax",
             "layers.0.self_attn.context", "layers.0.self_attn.o_proj"]:
    print(f"{name:30s} {tr.step_info(name).output_shape}")
"""),
        md("""
        **RoPE is a rotation**: it turns pairs of channels by a position-dependent angle, so it never
        changes a vector's length. Position 0 is not rotated at all.
        """),
        code("""
q, qr = v("layers.0.self_attn.q_norm"), v("layers.0.self_attn.q_rope")   # (heads, tokens, head_dim)
print("lengths kept:", np.allclose(np.linalg.norm(q, axis=-1), np.linalg.norm(qr, axis=-1), rtol=1e-4))
print("position 0 unchanged:", np.allclose(q[:, 0], qr[:, 0], atol=1e-5))
print("position 5 rotated:", not np.allclose(q[:, 5], qr[:, 5], atol=1e-3))
"""),
        md("""
        **Softmax** rows are probability distributions over the earlier tokens; everything above the
        diagonal (the future) is exactly zero:
        """),
        code("""
p = v("layers.0.self_attn.softmax")         # (heads, query, key)
print("rows sum to 1:", np.allclose(p.sum(-1), 1, atol=1e-5))
print("future is zero:", float(np.triu(p, k=1).max()) == 0.0)
"""),
        md("""
        Gemma 4 has two kinds of attention layers: **sliding-window** attention (a token sees only the
        last few tokens: cheap, local) and **full** attention (sees everything), with different head
        sizes and RoPE settings. This model has three sliding layers, then one full layer:
        """),
        code("""
for i, kind in enumerate(cfg["layer_types"]):
    print(i, kind, "q_rope", tr.step_info(f"layers.{i}.self_attn.q_rope").output_shape)
"""),
        md("""
        ### Heads with a job

        Trained heads specialise. In the copy task the model must continue `apple river stone cloud
        tree | apple river stone` with ` cloud`. Two kinds of heads do it together:

        * a **previous-token head** attends from each token to the one just before it, copying into
          each token's vector "the word before me was ...";
        * an **induction head** then attends, from the current word (`stone`), to the earlier token
          whose *previous* word was `stone` — that is `cloud`, the answer — and copies it.

        Which heads are they? Measure instead of guessing: on 20 fresh copy prompts
        (6 random words, the bar, the same 6 words), average each head's attention from every token
        to the previous one, and from each repeated word to the word that followed its first
        occurrence.
        """),
        code("""
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
print("previous-token score (rows: layers, columns: heads)\\n", prev_score.round(2))
print("induction score\\n", ind_score.round(2))
INDUCTION = tuple(int(x) for x in np.unravel_index(ind_score.argmax(), ind_score.shape))
# the previous-token head the induction head relies on must run before it: an earlier layer
earlier = prev_score[:INDUCTION[0]]
PREV = tuple(int(x) for x in np.unravel_index(earlier.argmax(), earlier.shape))
print("induction head (layer, head):", INDUCTION, "| previous-token head before it:", PREV)
"""),
        md("""
        Layer 1 holds the induction heads — two of them, near twins scoring almost the same
        (docs/demo.md, measuring on more texts, names head 0; here head 1 edges ahead). An
        induction head can only use what earlier layers wrote into the residual stream, so the
        previous-token head it relies on must sit in an *earlier* layer: we take the best one there
        (later layers have previous-token-like heads too, doing other jobs). Their patterns on our
        prompt: the previous-token head is a stripe just below the diagonal; the induction head,
        after the `|`, is a stripe shifted to the word *after* each word's first occurrence.
        """),
        code("""
for role, (layer, head) in {"previous-token": PREV, "induction": INDUCTION}.items():
    display(plots.attention_pattern(v(f"layers.{layer}.self_attn.softmax")[None], head=head, tokens=tokens,
                                    title=f"{role} head: layers.{layer} head {head}"))
"""),
        md("""
        ## 4 · The MLP

        After attention, each token is processed on its own by a two-layer network with a **gate**:
        `gate_proj` and `up_proj` widen the vector, `act` = GELU(gate) × up lets the gate switch
        channels on and off, `down_proj` narrows it back to D.
        """),
        code("""
g, u, a = v("layers.0.mlp.gate_proj"), v("layers.0.mlp.up_proj"), v("layers.0.mlp.act")
gelu = lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
print(g.shape, "->", v("layers.0.mlp.down_proj").shape)
print("act = gelu(gate) * up:", np.allclose(a, gelu(g) * u, atol=1e-5))
print(f"fraction of gate channels GELU switches (almost) off: {(np.abs(gelu(g)) < 1e-2).mean():.0%}")
"""),
        md("""
        ## 5 · The residual stream

        Nothing in a layer *replaces* the token's vector: attention's output and the MLP's output are
        **added** to it (after their own norms). `layers.{i}` is the stream after layer `i`. Gemma 4
        then multiplies the whole stream by a learned per-layer number, `layer_scalar`: in this model
        layer 0's is about 0.2, which is why the norm drops after layer 0 before growing again as
        later layers write into the stream:
        """),
        code("""
print("attn_residual = stream + normed attention:",
      np.allclose(v("layers.0.attn_residual"), v("embed_scale") + v("layers.0.post_attention_layernorm"), atol=1e-4))
print("layer_scalar:", [round(float(np.array(model.weights("float32")[f"layers.{i}.layer_scalar"]).ravel()[0]), 2)
                         for i in range(model.num_layers)])
plots.residual_norm_plot(tr, tokens=tokens)
"""),
        md("""
        ## 6 · The logit lens

        At the end, `norm` and `lm_head` turn the last stream vector into a score per vocabulary
        token. The **logit lens** applies that same ending to the stream after *every* layer: what
        would the model say if it stopped here? Read the table bottom-up. After layer 0 each
        position's best guess is its own token: the stream still mostly holds the token's embedding,
        and the embedding table is also the output table (Gemma ties them). After layer 1 — the layer
        of the induction head — every position already predicts the right next word; the later
        layers only make it surer.
        """),
        code("""
lens = plots.logit_lens(tr, positions=list(range(len(ids) - 4, len(ids))))
plots.logit_lens_plot(lens)
"""),
        md("""
        ## Explore

        The debugger below holds the same forward pass. Step through it, jump to any op with
        **run to** (try `layers.2.self_attn.softmax` and change the head), and watch the heatmaps.
        """),
        code("""
dbg = StepDebugger(workbench.trace(model, prompt, capture="full"))
dbg.step_layer()
dbg
"""),
        md("""
        **What to remember.** A transformer is a residual stream that layers read from and add
        to; attention moves information *between* tokens, the MLP transforms each token on its own;
        every one of those ops is a named value you can look at and check. Next: 04, when those
        values turn into NaN.
        """),
    ]


@notebook("04_nan_hunt.ipynb")
def nb04():
    return [
        md("""
        # 04 · NaN hunt

        "The output is all NaN" is the most common and least informative symptom of a broken port.
        A NaN (not-a-number) or an infinity, once it appears, spreads: every op that reads it
        produces more, and attention mixes it into every later token. So by the time you see it in
        the logits, almost every value is non-finite, and the only one that matters is the
        **first**. The workbench finds that first op and says **why** it went non-finite:

        | cause | meaning |
        |---|---|
        | `overflow` | inputs and weights finite; the result passes the dtype's largest value (float16: 65504) |
        | `invalid` | inputs finite, the result NaN: inf − inf, 0/0, sqrt of a negative... |
        | `nonfinite-weight` | a weight (or scale/bias) of this op is NaN/Inf, or too large for the dtype |
        | `nonfinite-input` | a program input is already non-finite |
        | `injected` | you put it there on purpose (interventions, for teaching) |

        Two real cases follow: an **fp16 overflow** and a **poisoned weight**.
        """),
        code(SETUP + """
import shutil, tempfile, pathlib
from workbench.demo.paths import DEMO
from workbench.trace import hunt, inject
from workbench.widgets import StepDebugger
from workbench import plots
work = pathlib.Path(tempfile.mkdtemp())
prompt = "mia red kite . tom blue cup . anna green hat . mia"

def planted(name, change):
    \"\"\"A copy of the demo checkpoint with change(tensors) applied (the original is untouched).\"\"\"
    dst = work / name
    shutil.copytree(DEMO, dst)
    f = dst / "model.safetensors"
    tensors, meta = mx.load(str(f), return_metadata=True)
    change(tensors)
    mx.save_safetensors(str(f), tensors, metadata=meta)
    return dst
"""),
        md("""
        ## Floating-point ranges

        | dtype | largest finite value | digits |
        |---|---|---|
        | float32 | 3.4 × 10³⁸ | ~7 |
        | bfloat16 | 3.4 × 10³⁸ | ~2–3 |
        | float16 | **65 504** | ~3 |

        Gemma models were trained in bfloat16, which has float32's range. Some of their activations
        are larger than 65 504 — harmless in bfloat16, **infinite in float16**. Engines that pick
        float16 for speed (common on Apple GPUs) hit this first.

        ## Case 1 · an fp16 overflow

        Our small demo model has modest activations, so we make it behave like a big Gemma: we scale
        layer 1's MLP weights up (a model can carry such weights; the norm after the MLP absorbs the
        size). The MLP's activation is gate × up, so scaling both by `s` scales it by about `s²`; we
        pick `s` to bring its largest value to about twice float16's limit.
        """),
        code("""
base = workbench.trace(workbench.load(DEMO), prompt, capture="stats", dtype="float32")
base.run()
act_max = base.stats("layers.1.mlp.act")["absmax"]
s = float(f"{np.sqrt(2 * 65504 / act_max):.2g}")   # two significant digits are plenty
print(f"layers.1.mlp.act absmax {act_max:.3g} -> scale gate_proj and up_proj by {s:g}")

def big_mlp(ts):
    for k in [k for k in ts if k.endswith(("layers.1.mlp.gate_proj.weight", "layers.1.mlp.up_proj.weight"))]:
        ts[k] = (ts[k].astype(mx.float32) * s).astype(ts[k].dtype)
loud = workbench.load(planted("loud", big_mlp))
t32 = workbench.trace(loud, prompt, capture="stats", dtype="float32")
t32.run()
print("float32 first non-finite:", t32.first_nonfinite())
print("closest to float32's limit:")
for name, h in t32.headroom(top=4):
    print(f"  {name:32s} {h:.3g} of float32's range")
"""),
        md("""
        Headroom is always relative to the dtype the trace runs in. Translate it to float16:
        anything above 1.0 will overflow.
        """),
        code("""
for name, _ in t32.headroom(top=4):
    print(f"  {name:32s} absmax {t32.stats(name)['absmax']:>9.3g} = {t32.stats(name)['absmax'] / 65504:.2f} x float16 max")
"""),
        md("""
        Now the same forward pass in float16. `hunt` runs it with statistics on every op and stops at
        the first non-finite one:
        """),
        code("""
result = hunt(loud, prompt, dtype="float16")
f = result.finding
print(f)
""", IGNORE),
        code("""
print(f.op, "|", f.cause, "| +inf:", f.posinf > 0, "| -inf:", f.neginf > 0)
"""),
        md("""
        The hunt recomputed that op in float32 from the very same inputs: finite there, so the cause
        is **overflow** — not a bug in the op, not a bad weight, just float16's range. It also lists
        the ops closest to overflow *before* it (the warning signs), and each input's and weight's
        range:
        """),
        code("""
print(f"float32 absmax of the op: {f.float32_absmax:.3g}")
print("closest to overflow before it:", [(n, round(h, 3)) for n, h in f.closest_before])
for d in f.inputs:
    print("input ", d["name"], f"absmax {d['absmax']:.3g}")
"""),
        md("""
        The usual fixes: run that block in bfloat16 or float32, or clamp as Gemma 3's reference does
        for its residual adds. bfloat16 has the range, so the same pass is clean:
        """),
        code("""
print("bfloat16:", hunt(loud, prompt, dtype="bfloat16").finding)
"""),
        md("""
        In the debugger, **next non-finite** runs to the same op and explains it in the log; its fp16
        headroom bar reads *overflow*. Click **back**: its inputs, `gate_proj` and `up_proj`, used only
        about 1% of float16's range — a product of two moderate numbers can overflow in one step,
        which is why the hunt checks every op rather than watching a few.
        """),
        code("""
dbg = StepDebugger(workbench.trace(loud, prompt, capture="full", dtype="float16"))
dbg.next_nonfinite()
dbg
"""),
        md("""
        ## Case 2 · a poisoned weight

        A different failure: one element of one weight matrix is NaN (a bad conversion, a corrupted
        download, an uninitialised buffer in the converter). Every forward pass is NaN, in every dtype.
        """),
        code("""
def poison(ts):
    k = next(k for k in ts if k.endswith("layers.2.mlp.down_proj.weight"))
    w = np.array(ts[k].astype(mx.float32))
    w[7, 3] = np.nan
    ts[k] = mx.array(w).astype(ts[k].dtype)
bad = workbench.load(planted("poisoned", poison))
r = hunt(bad, prompt, dtype="float32")
print(r.finding)
print([(d["name"], d["nan"]) for d in r.finding.weights])
"""),
        md("""
        Cause `nonfinite-weight`, with the tensor's name. The same NaN is visible without running
        anything, from the weights alone (notebook 02):
        """),
        code("""
report = workbench.inspect(work / "poisoned", values=True)
print([(p.code, p.tensor) for p in report.problems])
"""),
        md("""
        ## How NaN spreads

        Why is the *first* NaN the only one worth looking at? Put one single NaN into one value of
        the residual stream — token 3, channel 0, after layer 0 — and count the non-finite elements
        of the following ops:
        """),
        code("""
model = workbench.load(DEMO)
t = workbench.trace(model, prompt, capture="stats", interventions=[inject("layers.0", float("nan"), index=(0, 3, 0))])
t.run()
T = t.ids.shape[1]
for name in ["layers.0", "layers.1.input_layernorm", "layers.1.self_attn.k_proj", "layers.1.self_attn.scores",
             "layers.1.self_attn.softmax", "layers.1", "layers.3", "logits"]:
    s = t.stats(name); shape = t.step_info(name).output_shape
    print(f"{name:28s} {s['nan']:>7d} NaN of {int(np.prod(shape)):>7d}")
print(t.first_nonfinite())
"""),
        md("""
        One NaN in one token's vector: the next norm makes that token's whole vector NaN; its key
        makes the attention scores of every *later* query NaN (the softmax rows that include it).
        You might expect the *earlier* tokens to stay clean — the model is causal, they never
        attend to token 3. They do not stay clean: attention's weighted sum multiplies token 3's
        value by a weight of exactly 0 for them, and **0 × NaN = NaN**. One layer later the whole
        residual stream is NaN. (Engines that skip masked positions instead of multiplying by 0
        behave differently here — one more reason to compare with the first NaN, never the last.)
        The hunt still names `layers.0` and says `injected`.

        ## On the command line

        `workbench hunt PATH --prompt TEXT --dtype float16 --json` does the same; exit status 1
        when a non-finite value is found, 0 when clean.
        """),
        code("""
from workbench.cli import main as workbench_cli
status = workbench_cli(["hunt", str(work / "loud"), "--prompt", prompt, "--dtype", "float16"])
""", IGNORE),
        code("""
print("exit status", status)
"""),
        md("""
        **What to remember.** Look for the first non-finite op, not the last; ask whether it is the
        op's arithmetic (overflow, invalid), its weights, or its inputs; and watch headroom before
        choosing float16. Next: 05, numbers corrupted by the engine's own buffers.
        """),
    ]


@notebook("06_engine_diff.ipynb")
def nb06():
    return [
        md("""
        # 06 · Engine diff: where does my engine go wrong?

        You ported a model to your own engine (Metal, CUDA, C++...). It runs, but the text it
        generates is garbage, or just a bit worse than it should be. Comparing the final logits tells
        you *that* something is wrong. The engine diff tells you **where**: it matches your engine's
        intermediate tensors to the reference's ops and reports the **first op, in execution order,
        whose error is beyond tolerance** — after that op everything is wrong anyway.

        The recipe:

        1. make your engine write the tensors it computes (any names) to a `.safetensors`, `.npz`
           or a folder of `.npy` files, for a fixed list of token ids;
        2. write a small rules file mapping your names to ours (regular expressions);
        3. `workbench diff MODEL engine.npz --ids ... --map rules.json`.

        Here the "engine" is simulated: the demo model's own op program with one op swapped for a
        subtly wrong one — exactly the kind of bug a port contains.
        """),
        code(SETUP + """
import dataclasses, tempfile, pathlib, json
import mlx.nn as nn
from workbench.demo.paths import DEMO
from workbench.program import Program, execute
from workbench import plots
from workbench.diff import compare
from workbench.widgets import DiffView
work = pathlib.Path(tempfile.mkdtemp())
model = workbench.load(DEMO)
prompt = "apple river stone cloud tree | apple river stone"
ids = model.encode(prompt)
print(len(ids), "tokens:", ids)
"""),
        md("""
        ## A ported engine with a classic bug

        Gemma's MLP uses GELU as its gate activation; Llama's uses SiLU. Porting from a Llama engine,
        it is easy to keep SiLU. The two functions look alike (both ≈ x for large x, ≈ 0 for very
        negative x), so the model still produces *plausible* output. Since the model is a program —
        a list of ops — our "engine" is that list with the activation op replaced, run in bfloat16
        like a real GPU engine:
        """),
        code("""
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
"""),
        md("""
        ## The engine's dump

        Engines name their tensors their own way and do not dump everything. Ours writes, llama.cpp
        style, a few tensors per layer (without the batch dimension) — plus one tensor that has no
        counterpart in the reference:
        """),
        code("""
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
"""),
        md("""
        ## Rules: engine names → our op names

        A list of `[regex, replacement]` pairs, applied in order. Our op names are documented in
        docs/ops.md.
        """),
        code("""
rules = [[r"^tok_embd$", "embed_scale"], [r"^result_output$", "logits"],
         [r"^blk\\.(\\d+)\\.l_out$", r"layers.\\1"]] + \\
        [[rf"^blk\\.(\\d+)\\.{theirs}$", rf"layers.\\1.{ours}"] for theirs, ours in NAMES.items() if ours]
(work / "rules.json").write_text(json.dumps(rules, indent=1))
print((work / "rules.json").read_text()[:300])
"""),
        md("""
        ## The diff

        `compare` runs our reference on the same ids, captures exactly the ops the engine dumped,
        reconciles layouts (here: the missing batch dimension) and computes, per op, the cosine
        similarity, the normalised mean squared error (NMSE: error energy / signal energy) and the
        largest absolute error.
        """),
        code("""
report = compare(model, work / "engine.npz", ids=ids, rules=work / "rules.json", dtype="float32")
print(report.summary(max_ops=12))
""", IGNORE),
        code("""
fd = report.first_divergence
print("first divergence:", fd.op, "| its inputs:", report.first_divergence_dict()["inputs"])
"""),
        md("""
        The first divergence is an MLP activation (`mlp.act`), and its inputs (`gate_proj`,
        `up_proj`) were not dumped, so the report cannot yet say whether they were fine: the next
        step would be to dump them too. Everything before it — norms, attention outputs, residual
        adds — matched within bfloat16's rounding.

        Look closely, though: the *first* layer's activation is computed with the same wrong
        function, yet it passed. Its values are small, where SiLU and GELU differ little, so its
        error stayed under the default tolerance (NMSE ≤ 0.01). The error curve shows the whole run:
        a floor of bfloat16 rounding noise, then a spike at every layer's activation, carried on by
        the residual stream.
        """),
        code("""
plots.error_curve(report)
"""),
        md("""
        The `DiffView` widget is the same curve with controls: pick the metrics, pick an op to see
        its numbers, the layout reconciliation and the status of the ops it reads.
        """),
        code("""
view = DiffView(report)
view
"""),
        md("""
        ## The fixed engine

        With GELU restored, the only differences left are bfloat16 rounding: no divergence, and the
        unmatched names are still listed (nothing is skipped silently).
        """),
        code("""
write_dump(run_engine(bug=False), work / "engine_fixed.npz")
fixed = compare(model, work / "engine_fixed.npz", ids=ids, rules=rules, dtype="float32")
print(fixed.first_divergence, "|", fixed.compared, "ops compared")
print("engine tensors matching no op:", fixed.unmatched_engine, "-> closest:", fixed.suggestions)
print("every op within 1e-3 NMSE of the reference:", max(o.nmse for o in fixed.ops) < 1e-3)
"""),
        md("""
        ## Tolerance and the noise floor

        The default tolerance (cosine ≥ 0.995, NMSE ≤ 0.01) lets a bfloat16 engine pass on small
        models while catching the usual bugs — but, as we just saw, it can miss a bug where values
        are small. `noise_floor="bfloat16"` runs our reference in bfloat16 *too* and holds each op to
        a multiple (10×) of the error our own bfloat16 run has at that op: a much tighter, per-op
        limit. It finds the bug where it first happens, in layer 0:
        """),
        code("""
strict = compare(model, work / "engine.npz", ids=ids, rules=rules, noise_floor="bfloat16")
print("first divergence with a noise floor:", strict.first_divergence.op)
"""),
        md("""
        ## On the command line

        `workbench dump` writes our reference activations (for your own tools); `workbench diff`
        compares. Exit status 1 when a divergence is found.
        """),
        code("""
from workbench.cli import main as workbench_cli
ids_arg = ",".join(map(str, ids))
status = workbench_cli(["diff", str(DEMO), str(work / "engine.npz"), "--ids", ids_arg,
                        "--map", str(work / "rules.json"), "--dtype", "float32"])
""", IGNORE),
        code("""
print("exit status", status)
"""),
        md("""
        **What to remember.** Dump a handful of tensors per layer, map the names once, and let the
        diff find the first op that departs from the reference; then dump that op's inputs too. Next:
        07, models whose MLP is a team of experts.
        """),
    ]


@notebook("07_mixture_of_experts.ipynb")
def nb07():
    return [
        md("""
        # 07 · Mixture of experts: the router and the experts

        In a dense model every token goes through the same MLP. In a **mixture-of-experts** (MoE)
        layer there are several MLPs — the **experts** — and a small **router** picks, per token,
        the few experts that process it. The model holds many parameters but each token uses only a
        fraction of them (Gemma 4 26B-A4B: 26 B parameters, ~4 B active per token).

        Gemma 4's MoE layer keeps its dense MLP and adds the experts next to it:

            h1 = post_feedforward_layernorm_1( mlp(pre_feedforward_layernorm(h)) )           dense MLP
            h2 = post_feedforward_layernorm_2( experts(pre_feedforward_layernorm_2(h)) )     routed experts
            h  = h + post_feedforward_layernorm(h1 + h2)

        The demo's MoE variant has 4 experts per layer and routes each token to the top 2.
        Porting bugs here are subtle: a wrong expert order, a softmax over the wrong axis, a missing
        per-expert scale — the model still runs.
        """),
        code(SETUP + """
from workbench.demo.paths import DEMO_MOE
from workbench import plots
import matplotlib.pyplot as plt
model = workbench.load(DEMO_MOE, dtype="float32")
cfg = model.config
print({k: cfg[k] for k in ["num_experts", "top_k_experts", "moe_intermediate_size", "num_hidden_layers"]})
print(workbench.inspect(DEMO_MOE).to_dict()["moe"])
"""),
        md("""
        ## The router's ops

        For layer 0, the ops that decide and apply the routing (names as in docs/ops.md):
        """),
        code("""
for op in model.program.ops:
    if op.layer == 0 and ("router" in op.name or "experts" in op.name):
        print(f"{op.name:40s} {op.kind}")
"""),
        code("""
prompt = "mia red kite . tom blue cup . anna green hat . mia"
tr = workbench.trace(model, prompt, capture="full")
tr.run()
tokens = [model.decode([i]) for i in tr.ids[0].tolist()]
print("next token:", repr(model.decode([int(mx.argmax(tr.logits[-1]).item())])))
"""),
        md("""
        `router.proj` gives each token one score per expert; `router.top_k` keeps the indices of the
        two best; `router.weights` turns those two scores into mixing weights (a softmax over the
        chosen ones, times a learned per-expert scale). Token by token, in layer 0:
        """),
        code("""
scores = np.array(tr.value("layers.0.router.proj")[0])
top = np.array(tr.value("layers.0.router.top_k")[0])
w = np.array(tr.value("layers.0.router.weights")[0])
for t in range(len(tokens)):
    print(f"{tokens[t]!r:10s} scores {np.round(scores[t], 2)}  -> experts {top[t].tolist()} weights {np.round(w[t], 3)}")
"""),
        md("""
        Check the routing by hand: the chosen experts are the highest-scoring ones, and the weights are
        a softmax over the chosen scores times the per-expert scale stored in the checkpoint:
        """),
        code("""
best2 = np.sort(np.argsort(-scores, axis=-1)[:, :2], axis=-1)
print("top-2 by score:", np.array_equal(best2, np.sort(top, axis=-1)))
pes = np.array(model.weights("float32")["layers.0.router.per_expert_scale"])
chosen = np.take_along_axis(scores, top, axis=-1)
soft = np.exp(chosen - chosen.max(-1, keepdims=True)); soft /= soft.sum(-1, keepdims=True)
print("weights = softmax(chosen) x per_expert_scale:", np.allclose(w, soft * pes[top], atol=1e-4))
"""),
        md("""
        ## Expert load

        A router that sends every token to the same expert wastes the others (and, on a GPU, makes
        one expert's kernel the bottleneck). Count, per layer, how many token slots each expert
        receives over a batch of prompts:
        """),
        code("""
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
print("token slots per expert (rows: layers)\\n", load)
""", IGNORE),
        code("""
print("every expert used in every layer:", bool((load > 0).all()), "| slots per layer:", load.sum(1).tolist())
"""),
        code("""
fig, ax = plt.subplots(figsize=(7, 3))
for e in range(E):
    ax.bar(np.arange(L) + e * 0.2 - 0.3, load[:, e] / load.sum(1), width=0.2, label=f"expert {e}")
ax.axhline(1 / E, color="k", ls=":", lw=1, label="perfectly balanced")
ax.set_xticks(range(L)); ax.set_xlabel("layer"); ax.set_ylabel("share of token slots"); ax.set_title("expert load")
ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.25)); plt.show()
"""),
        md("""
        The router spreads the work, though not evenly: some experts get twice the share of others.
        Engines that run experts as separate kernels must size them for the busiest one.

        ## The experts' share of the work

        How much does the expert block contribute next to the dense MLP? Compare the size of the two
        branches before they are summed (`post_feedforward_layernorm_1` and `_2`):
        """),
        code("""
for i in range(L):
    d = np.linalg.norm(np.array(tr.value(f"layers.{i}.post_feedforward_layernorm_1")), axis=-1).mean()
    e = np.linalg.norm(np.array(tr.value(f"layers.{i}.post_feedforward_layernorm_2")), axis=-1).mean()
    print(f"layer {i}: dense branch {d:7.2f}   expert branch {e:7.2f}")
"""),
        md("""
        In this small model the experts add a correction about a tenth the size of the dense
        branch: it was *upcycled* from the dense demo model (the expert branch started scaled down)
        and trained only briefly. In a model trained as MoE from the start the balance is different —
        which is exactly what this kind of measurement is for.
        """),
        md("""
        ## Knock out an expert

        Interventions change an op's output as the trace runs. Give expert 0 a very low router score
        in every layer, so it is never chosen, and see whether the answer survives (here it does:
        the dense MLP still carries most of the work):
        """),
        code("""
from workbench.trace import patch
def ban_expert_0(scores):
    return mx.concatenate([mx.full(scores[..., :1].shape, -1e4, scores.dtype), scores[..., 1:]], axis=-1)
t2 = workbench.trace(model, prompt, capture="stats", interventions=[patch("layers.*.router.proj", ban_expert_0)])
t2.run()
print("without expert 0:", repr(model.decode([int(mx.argmax(t2.logits[-1]).item())])))
"""),
        md("""
        **What to remember.** An MoE layer is a router (scores → top-k → weights) plus experts; every
        one of those steps is an op you can check by hand. When porting, compare `router.top_k` and
        `router.weights` first: if they differ, nothing after them can match. Next: 08, generation.
        """),
    ]


@notebook("08_generation_kv_cache.ipynb")
def nb08():
    return [
        md("""
        # 08 · Generation with a KV cache

        A language model predicts one token at a time. To write a sentence, generation loops:
        run the model on the text so far, pick the next token (here: the most likely one —
        **greedy** decoding), append it, repeat.

        Running the whole text again for every new token repeats almost all the work: in a causal
        model, earlier tokens never look at later ones, so their **keys and values** — the vectors
        attention reads — never change. The **KV cache** keeps them: the first forward pass (the
        **prefill**) runs on the whole prompt and stores every layer's keys and values; each later
        forward runs on **one** new token, appends its key and value, and attends over the cache.

        Cache bugs are a classic of engine ports (wrong positions for RoPE, off-by-one lengths,
        a cache shared between layers that should not share it). Here we look inside one generation
        and prove that the cached forward passes give the same numbers as recomputing everything.
        """),
        code(SETUP + """
from workbench.demo.paths import DEMO
from workbench import plots
model = workbench.load(DEMO, dtype="float32")
prompt = "apple river stone cloud tree | apple"
g = workbench.generate(model, prompt, max_tokens=6, capture="full")
print(repr(prompt), "->", repr(g.text))
print(g)
"""),
        md("""
        `g.traces` holds one full trace per forward pass: `traces[0]` is the prefill, `traces[k]`
        produced token `k`. Look at the shapes of layer 0's queries, cached keys and attention
        scores in each:
        """),
        code("""
for k, t in enumerate(g.traces):
    q = t.step_info("layers.0.self_attn.q_rope").output_shape
    kc = t.step_info("layers.0.self_attn.k_cache").output_shape
    sc = t.step_info("layers.0.self_attn.scores").output_shape
    print(f"forward {k}: input {tuple(t.ids.shape)}  queries {q}  cached keys {kc}  scores {sc}")
"""),
        md("""
        The prefill runs all prompt tokens at once (queries for every position). Each later forward
        has a **single** query — the new token — but its scores span every position so far: the
        cache grows by one key per step (the third dimension of `cached keys`).

        Note `rope_offset`: the new token must be rotated by its *true position* in the text, not
        by 0. Forgetting that is one of the most common cache bugs.
        """),
        code("""
print([int(np.array(t.value("rope_offset"))[0]) for t in g.traces])
"""),
        md("""
        ## Proof: cached = recomputed

        For every generated token, run the whole text so far *without* a cache and compare the
        last position's logits with the cached forward's:
        """),
        code("""
prompt_ids = g.prompt_ids[0].tolist()
for k, t in enumerate(g.traces):
    full = workbench.trace(model, prompt_ids + g.tokens[:k], capture=None)
    full.run()
    a, b = np.array(t.logits[-1]), np.array(full.logits[-1])
    print(f"token {k}: equal within 1e-4: {np.abs(a - b).max() < 1e-4}   same argmax: {a.argmax() == b.argmax()}")
"""),
        md("""
        Equal up to float32 rounding (the sums are done in a different order).

        ## What the new token looks at

        In the copy task, the model continues the second half by looking back at the first half.
        The induction head's attention row for each generated token shows where it looked — the word
        *after* the previous occurrence of the current word:
        """),
        code("""
from workbench.demo import NAMED_HEADS      # measured heads of the demo model (docs/demo.md)
layer, head, score = NAMED_HEADS["induction"]
all_tokens = [model.decode([i]) for i in prompt_ids + g.tokens]
for k, t in enumerate(g.traces[1:], start=1):
    row = np.array(t.value(f"layers.{layer}.self_attn.softmax"))[0, head, -1]   # [positions so far]
    pos = int(row.argmax())
    cur = all_tokens[len(prompt_ids) + k - 1]
    print(f"current {cur!r:9s} looks at position {pos:2d} {all_tokens[pos]!r:9s} (weight {row[pos]:.2f}) -> predicts {model.decode([g.tokens[k]])!r}")
"""),
        md("""
        ## Sliding windows and shared caches

        Gemma 4's sliding-window layers only attend to the last `sliding_window` positions: their
        mask (`attn_mask_sliding`) hides older cache entries. Its last layers may also **share** the
        cache of an earlier layer of the same type instead of computing their own keys and values
        (`num_kv_shared_layers`): such layers have no `k_proj`, and their attention reads the other
        layer's `k_cache`.
        """),
        code("""
cfg = model.config
print("sliding_window:", cfg.get("sliding_window"), "| kv-shared layers:", cfg.get("num_kv_shared_layers"))
for i in range(model.num_layers):
    scores = model.program[f"layers.{i}.self_attn.scores"]
    print(f"layer {i} ({cfg['layer_types'][i]}): scores read {', '.join(scores.inputs)}")
"""),
        md("""
        ## Watching values across tokens

        `g.stats(op)` gives an op's statistics in every forward pass — a quick way to see a value
        drift as generation goes on (in a broken engine: growing until it overflows).
        """),
        code("""
for name in ["layers.0", f"layers.{model.num_layers - 1}", "logits"]:
    print(f"{name:10s}", [float(f"{s['absmax']:.3g}") for s in g.stats(name)])
print("first non-finite in any forward:", g.first_nonfinite())
"""),
        md("""
        ## Why bother: the cost

        With the cache each new token costs one token's worth of compute; without it, the whole text
        again. Timing both on this tiny model (your numbers will differ):
        """),
        code("""
import time
def timed(f):
    t0 = time.perf_counter(); f(); return time.perf_counter() - t0
long_prompt = " ".join(["apple river stone cloud tree bird moon sun star rain |"] * 4)
n = 16
with_cache = timed(lambda: workbench.generate(model, long_prompt, max_tokens=n, capture=None))
def no_cache():
    ids = model.encode(long_prompt)
    for _ in range(n):
        t = workbench.trace(model, ids, capture=None); t.run()
        ids = ids + [int(mx.argmax(t.logits[-1]).item())]
without = timed(no_cache)
print(f"{n} tokens: with cache {with_cache:.2f} s, without {without:.2f} s")
""", IGNORE),
        md("""
        **What to remember.** Generation = prefill + one-token forwards over a growing cache; the
        cached numbers must equal a full recomputation, with each new token rotated at its true
        position. When an engine's first generated token is right and the next ones are wrong, look
        at the cache.
        """),
    ]


# @@CONTENT@@


# =====================================================================================
def make(name: str):
    nb = nbf.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.cells = list(NOTEBOOKS[name]())
    for i, c in enumerate(nb.cells):
        c["id"] = f"{Path(name).stem[:2]}-{i:03d}"  # stable cell ids: clean diffs
    return nb


def execute(nb, name: str, timeout: int = 900):
    from nbclient import NotebookClient

    os.environ["PYTHONHASHSEED"] = "0"
    os.environ.pop("MPLBACKEND", None)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                            resources={"metadata": {"path": str(NB_DIR)}})
    client.execute()
    errors = [(i, o) for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    if errors:
        i, o = errors[0]
        raise SystemExit(f"{name}: cell {i} raised {o['ename']}: {o['evalue']}")
    for c in nb.cells:  # timestamps differ on every run: keep the committed file stable
        c.metadata.pop("execution", None)
    return nb


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", nargs="*", help="notebook numbers or names (default: all)")
    ap.add_argument("--no-execute", action="store_true")
    args = ap.parse_args(argv)
    names = sorted(NOTEBOOKS)
    if args.which:
        names = [n for n in names if any(n == w or n.startswith(w) for w in args.which)]
        if not names:
            raise SystemExit(f"no notebook matches {args.which}; have {sorted(NOTEBOOKS)}")
    for name in names:
        t0 = time.perf_counter()
        nb = make(name)
        if not args.no_execute:
            nb = execute(nb, name)
        nbf.write(nb, str(NB_DIR / name))
        print(f"{name}: {len(nb.cells)} cells, {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(NB_DIR))
    sys.exit(main())
