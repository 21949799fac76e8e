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
import matplotlib
from IPython.display import display
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
