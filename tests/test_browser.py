"""The real-browser test: JupyterLab on 127.0.0.1, Debian's Chromium driven by Playwright.

Opens notebooks/01_tour.ipynb in JupyterLab, runs every cell in the browser's kernel,
clicks the StepDebugger's step button and checks that the view changed (the current-op
line and the Output widget).  Screenshots are kept under test-artifacts/ (gitignored).

Needs: the ``playwright`` Python package (pip; its bundled browsers are NOT used, never
run ``playwright install``) and a Chromium binary at /usr/bin/chromium (``apt-get install
chromium``; scripts/test.sh installs both).  Override the binary with WORKBENCH_CHROMIUM.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from workbench.lab import NOTEBOOKS, REPO_ROOT, free_port, lab_argv, lab_env

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("WORKBENCH_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = REPO_ROOT / "test-artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-default-apps"]
RUN_TIMEOUT_S = 420  # running notebook 01 in the browser's kernel, 2 slow cores


@contextlib.contextmanager
def serve_lab(notebook_dir: Path, tmp: Path):
    """JupyterLab serving a fresh copy of ``notebook_dir``, isolated from user config."""
    root = tmp / "root"
    shutil.copytree(notebook_dir, root, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    port, token = free_port(), "workbench-browser-test"
    env = dict(os.environ)
    for var, sub in [("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_RUNTIME_DIR", "runtime"),
                     ("IPYTHONDIR", "ipython"), ("JUPYTERLAB_SETTINGS_DIR", "settings")]:
        (tmp / sub).mkdir()
        env[var] = str(tmp / sub)
    env.pop("MPLBACKEND", None)
    # no "official Jupyter news?" toast over the page, no update check (no network)
    notif = tmp / "settings" / "@jupyterlab" / "apputils-extension"
    notif.mkdir(parents=True)
    (notif / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    (tmp / "workspaces").mkdir()
    env = lab_env(token, env)  # the token by environment, never on the command line
    argv = lab_argv(root, port=port, open_browser=False,
                    workspaces_dir=tmp / "workspaces", expose_app=True, default_notebook=None)
    log = open(tmp / "jupyter.log", "w")
    proc = subprocess.Popen(argv, cwd=str(root), env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{(tmp / 'jupyter.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("jupyter lab did not answer within 90 s:\n" + (tmp / "jupyter.log").read_text()[-3000:])
            time.sleep(0.3)
        yield base, token, root
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


# JavaScript run in the page (window.jupyterapp exists thanks to --expose-app-in-browser)
JS_NOTEBOOK_READY = """() => {
  const app = window.jupyterapp;
  if (!app) return false;
  const w = app.shell.currentWidget;
  return !!(w && w.content && w.content.widgets && w.sessionContext && w.sessionContext.session
            && w.sessionContext.session.kernel && w.context && w.context.isReady);
}"""
JS_RUN_ALL = """async () => {
  const app = window.jupyterapp;
  await app.commands.execute('notebook:run-all-cells');
  return true;
}"""
JS_PROGRESS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const cells = w.content.widgets.filter(c => c.model.type === 'code');
  const done = cells.filter(c => c.model.executionCount !== null).length;
  const errors = [];
  for (const c of cells) {
    for (const o of c.model.outputs.toJSON()) {
      if (o.output_type === 'error') errors.push(o.ename + ': ' + o.evalue);
    }
  }
  return {cells: cells.length, done: done, errors: errors,
          kernel: w.sessionContext.session.kernel.status};
}"""


def _chromium_missing():
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    return None


def test_browser_tour_step_debugger(tmp_path):
    # The browser test is part of the suite: a missing browser is a failure, not a skip.
    assert _chromium_missing() is None, _chromium_missing()
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    assert (NOTEBOOKS / "01_tour.ipynb").exists()
    with serve_lab(NOTEBOOKS, tmp_path) as (base, token, root), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            console = []
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.goto(f"{base}/lab/tree/01_tour.ipynb?token={token}", wait_until="domcontentloaded")
            page.wait_for_function(JS_NOTEBOOK_READY, timeout=120_000, polling=250)
            page.evaluate(JS_RUN_ALL)
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while True:
                prog = page.evaluate(JS_PROGRESS)
                assert not prog["errors"], f"cells raised in the browser's kernel: {prog['errors']}"
                if prog["done"] == prog["cells"] and prog["kernel"] == "idle":
                    break
                assert time.monotonic() < deadline, f"notebook did not finish in {RUN_TIMEOUT_S} s: {prog}"
                time.sleep(0.5)
            assert prog["cells"] > 3

            dbg = page.locator(".wb-step-debugger").first
            dbg.wait_for(state="visible", timeout=60_000)
            dbg.scroll_into_view_if_needed()
            current = dbg.locator(".wb-current").first
            before = current.inner_text()
            out = dbg.locator(".jupyter-widgets.widget-output").first
            out_before = out.inner_text()
            page.screenshot(path=str(ARTIFACTS / "browser_01_before_step.png"))

            dbg.locator("button.wb-step").first.click()
            page.wait_for_function(
                "([sel, old]) => { const e = document.querySelector(sel); return e && e.innerText !== old; }",
                arg=[".wb-step-debugger .wb-current", before], timeout=30_000, polling=100)
            after = current.inner_text()
            assert after != before
            page.wait_for_function(
                "([sel, old]) => { const e = document.querySelector(sel); return e && e.innerText !== old; }",
                arg=[".wb-step-debugger .jupyter-widgets.widget-output", out_before], timeout=30_000, polling=100)
            dbg.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "browser_01_after_step.png"))
            dbg.screenshot(path=str(ARTIFACTS / "browser_01_step_debugger.png"))
            # no widget failed to render anywhere in the notebook
            body = page.locator("body").inner_text()
            assert "Error displaying widget" not in body
            assert "Error rendering output" not in body
            (ARTIFACTS / "browser_01.json").write_text(json.dumps(
                {"before": before, "after": after, "console_errors": [c for c in console if c.startswith("error")]}, indent=1))
        finally:
            browser.close()


# --------------------------------------------------------------------------- every widget, clicked
# A notebook (written here, not one of notebooks/) builds the four widgets; then seeded random
# click sequences drive every control of each.  After each click the test waits until the
# widget has handled it (its error area's ``data-actions`` counter), reads the widget's data
# object from the kernel, and checks that the view shows exactly that state, that the state
# is what the click should have produced, and that the kernel raised nothing.  The view is
# read as textContent: JupyterLab does not lay out cells outside the viewport, so innerText
# would be empty there.

CLICK_SEED = 12
CLICK_SEQUENCES = 10  # random debugger sequences, after the named ones
CLICK_TIMEOUT_MS = 60_000

WIDGET_CELLS = [
    '''import json
from pathlib import Path
import numpy as np
import workbench
from workbench import zoo
from workbench.buffers import Emulator
from workbench.demo.paths import DEMO
from workbench.diff import compare_arrays
from workbench.trace import inject
from workbench.widgets import DiffView, HazardTimeline, StepDebugger, WeightBrowser

model = workbench.load(DEMO, dtype="float32", attention="explicit")  # softmax steps to run to
PROMPT = "apple river stone cloud tree | apple river stone"
BAD = "layers.1.mlp.down_proj"  # a NaN planted here, so "next non-finite" has something to find


def make_trace(capture="full"):
    return workbench.trace(model, PROMPT, capture=capture, interventions=[inject(BAD, float("nan"), index=5)])


ref = make_trace("stats")
ref.run()
PROGRAM = {"ops": list(ref.ops), "layers": [op.layer for op in model.program.ops],
           "nonfinite": [s.index for s in ref.steps if s.nonfinite]}
dbg = StepDebugger(make_trace())
dbg''',
    '''wb = WeightBrowser(workbench.inspect(zoo.build("gemma4_text", Path("zoo") / "misnamed", broken="misnamed"),
                                     values=True))
wb''',
    '''emu = Emulator(model, model.encode(PROMPT))
plan = emu.plan().place("layers.1.self_attn.o_proj", like="layers.1.self_attn.context")
ht = HazardTimeline(emu.run(plan.place("layers.2.mlp.down_proj", like="layers.2.mlp.act")).schedule)
ht''',
    '''clean = workbench.trace(model, PROMPT, capture="full")
clean.run()
order = [n for n in clean.ops if n == "embed_scale" or n.endswith((".self_attn.o_proj", ".mlp.down_proj"))
         or (n.startswith("layers.") and n.count(".") == 1)]
ours = {n: np.array(clean.value(n)) for n in order}
engine = {n: v.copy() for n, v in ours.items()}
engine["layers.2.mlp.down_proj"] *= 1.5  # the engine's bug
dv = DiffView(compare_arrays(ours, engine, order=order))
dv''',
    '''def wb_state():
    """What the four widgets' data objects say now (JSON), read by the browser test."""
    tr = dbg.trace
    steps = tr.steps
    last = steps[-1] if steps else None
    log = "".join(o.get("text", "") for o in dbg.output.outputs).rstrip("\\n").split("\\n")
    h = ht.selected
    return json.dumps({
        "debugger": {"position": tr.position, "n": len(tr.ops), "done": tr.done,
                     "index": None if last is None else last.index, "name": None if last is None else last.name,
                     "log": log[-1], "error": dbg.actions.error},
        "weights": {"tensor": wb.tensor.value, "layer": wb.layer.value, "stat": wb.stat.value,
                    "error": wb.actions.error},
        "hazards": {"picked": ht.picker.value, "kind": None if h is None else h.kind,
                    "window": list(ht.window.value), "error": ht.actions.error},
        "diff": {"op": dv.op.value, "metrics": list(dv.metrics.value),
                 "first": dv.report.first_divergence.op, "error": dv.actions.error}})''',
]


def _notebook(cells) -> dict:
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [],
                       "source": src} for i, src in enumerate(cells)]}


JS_WATCH_KERNEL_ERRORS = """() => {
  const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  window.__wbKernelErrors = [];
  k.iopubMessage.connect((_, msg) => {
    if (msg.header.msg_type === 'error') window.__wbKernelErrors.push(msg.content.ename + ': ' + msg.content.evalue);
  });
  return true;
}"""
JS_EXEC = """async (code) => {
  const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  const fut = k.requestExecute({code: code, silent: false, store_history: false});
  let out = '', err = null;
  fut.onIOPub = (msg) => {
    if (msg.header.msg_type === 'stream') out += msg.content.text;
    if (msg.header.msg_type === 'error') err = msg.content.ename + ': ' + msg.content.evalue;
  };
  await fut.done;
  return {out: out, err: err};
}"""
JS_ACTIONS = """(root) => {
  const e = document.querySelector(root + ' .wb-error [data-actions]');
  return e ? Number(e.dataset.actions) : -1;
}"""
JS_DEBUGGER_VIEW = """() => {
  const r = document.querySelector('.wb-step-debugger');
  const q = (s) => r.querySelector(s);
  const log = q('.wb-log').textContent.trim().split('\\n');
  const bar = q('.wb-progress .progress-bar');
  const dis = {};
  for (const c of ['wb-start', 'wb-back', 'wb-step', 'wb-step-layer', 'wb-next-nonfinite', 'wb-run-end', 'wb-run-to'])
    dis[c] = q('button.' + c).disabled;
  return {header: q('.wb-current').textContent, log: log[log.length - 1], disabled: dis,
          hint: q('.wb-target-hint').textContent,
          progress: bar ? parseFloat(bar.style.width) : null,
          error: q('.wb-error').textContent.trim()};
}"""
JS_SELECTED = """(sel) => {
  const s = document.querySelector(sel + ' select');
  return Array.from(s.selectedOptions).map(o => o.textContent.replace(/\u00a0/g, ' '));  // labels use nbsp
}"""
JS_TEXT = """(sel) => { const e = document.querySelector(sel); return e ? e.textContent : null; }"""


class _Lab:
    """The page, the kernel behind it, and the waiting."""

    def __init__(self, page):
        self.page = page

    def state(self) -> dict:
        r = self.page.evaluate(JS_EXEC, "print(wb_state())")
        assert r["err"] is None, f"reading the state raised in the kernel: {r['err']}"
        return json.loads(r["out"])

    def kernel_errors(self) -> list:
        return self.page.evaluate("() => window.__wbKernelErrors")

    def handled(self, root: str, do) -> None:
        """Do one interaction with the widget under ``root`` and wait until it was handled."""
        n = self.page.evaluate(JS_ACTIONS, root)
        assert n >= 0, f"no error area in {root}"
        do()
        self.page.wait_for_function(f"([root, n]) => ({JS_ACTIONS})(root) > n", arg=[root, n],
                                    timeout=CLICK_TIMEOUT_MS, polling=50)

    def until(self, what: str, fn, check, timeout_s: float = 20.0):
        """Poll ``fn()`` until ``check(value)`` holds; fail naming ``what`` with the last value."""
        end = time.monotonic() + timeout_s
        while True:
            v = fn()
            if check(v):
                return v
            if time.monotonic() > end:
                raise AssertionError(f"{what}: the view never matched; last seen {v!r}")
            time.sleep(0.05)


def _expected_position(kind: str, pos: int, prog: dict, target: int | None = None) -> int:
    """Where the trace must be after a click (ops run), from the program alone."""
    ops, n = prog["ops"], len(prog["ops"])
    if kind == "back":
        return max(pos - 1, 0)
    if kind == "start":
        return 0
    if kind == "typo":
        return pos
    if pos >= n:
        return pos
    if kind == "step":
        return pos + 1
    if kind == "end":
        return n
    if kind == "run-to":
        return target + 1 if target >= pos else pos
    if kind == "layer":  # through the last op of the run of one layer's ops that op pos is in
        layers = prog["layers"]
        return next((j for j in range(pos, n - 1) if layers[j] != layers[j + 1]), n - 1) + 1
    if kind == "nonfinite":
        return next((j + 1 for j in prog["nonfinite"] if j >= pos), n)
    raise ValueError(kind)


def _check_debugger(lab: _Lab, want_pos: int, label: str, hint: str = "") -> None:
    st = lab.state()["debugger"]
    assert st["error"] is None, f"{label}: the widget shows an error: {st['error']}"
    assert st["position"] == want_pos, f"{label}: the trace is at {st['position']}, expected {want_pos}"
    n = st["n"]

    def matches(v):
        h = v["header"]
        if st["index"] is None:
            ok = h.startswith("ready") and f"0 of {n} ops run" in h
        else:
            ok = h.startswith(f"op #{st['index']}: {st['name']} ") and f"{st['position']} of {n} ops run" in h
        return (ok and v["log"] == st["log"] and v["error"] == "" and hint in v["hint"]
                and v["disabled"]["wb-back"] == v["disabled"]["wb-start"] == (st["position"] == 0)
                and all(v["disabled"][c] == st["done"]
                        for c in ("wb-step", "wb-step-layer", "wb-next-nonfinite", "wb-run-end", "wb-run-to"))
                and v["progress"] is not None and abs(v["progress"] - 100 * st["position"] / n) < 0.5)

    lab.until(f"{label} (debugger at op #{st['index']} {st['name']}, {st['position']} run)",
              lambda: lab.page.evaluate(JS_DEBUGGER_VIEW), matches)
    assert lab.kernel_errors() == [], f"{label}: the kernel raised {lab.kernel_errors()}"


def _drive_debugger(lab: _Lab, rng, prog: dict) -> int:
    page, root = lab.page, ".wb-step-debugger"
    buttons = {"start": "wb-start", "back": "wb-back", "step": "wb-step", "layer": "wb-step-layer", "nonfinite": "wb-next-nonfinite",
               "end": "wb-run-end"}
    n, clicks = len(prog["ops"]), 0
    pos = lab.state()["debugger"]["position"]

    def click(kind, target=None):
        nonlocal pos, clicks
        want = _expected_position(kind, pos, prog, target)
        hint = ""
        if kind == "typo":  # a name one letter off: nothing runs, the closest name is suggested
            name = prog["ops"][target]
            typo = name[:-2] + name[-1]
            if typo in prog["ops"]:  # (a typo that is another op's name would run there)
                typo = name + "_"
            page.locator(f"{root} .wb-target input").fill(typo)
            lab.handled(root, lambda: page.locator(f"{root} button.wb-run-to").click())
            label, hint = f"run to the typo {typo}", name
        elif kind == "run-to":
            name = prog["ops"][target]
            page.locator(f"{root} .wb-target input").fill(name)
            lab.handled(root, lambda: page.locator(f"{root} button.wb-run-to").click())
            label = f"run to {name}"
        else:
            lab.handled(root, lambda: page.locator(f"{root} button.{buttons[kind]}").click())
            label = kind
        clicks += 1
        _check_debugger(lab, want, f"click {clicks} ({label}, from {pos} run)", hint)
        pos = want

    def restart():
        nonlocal pos
        r = page.evaluate(JS_EXEC, "dbg.trace.reset(); dbg.refresh()")
        assert r["err"] is None, r["err"]
        pos = 0
        _check_debugger(lab, 0, "after reset")

    softmax0 = prog["ops"].index("layers.0.self_attn.softmax")
    # the issue's sequences: a multi-op run by a button, then "next non-finite" / "run to end"
    named = [[("run-to", softmax0), ("nonfinite", None), ("nonfinite", None), ("back", None)],
             [("step", None), ("step", None), ("step", None), ("layer", None), ("end", None), ("back", None)],
             [("layer", None), ("layer", None), ("run-to", prog["ops"].index("layers.2")), ("nonfinite", None),
              ("end", None)],
             [("step", None), ("back", None)],  # back at the start: "back" is disabled there (checked)
             [("typo", prog["ops"].index("layers.2.self_attn.softmax")), ("layer", None), ("layer", None),
              ("typo", prog["ops"].index("layers.1.mlp.down_proj")), ("start", None), ("end", None),
              ("start", None)]]
    for seq in named:
        restart()
        for kind, target in seq:
            click(kind, target)
    for _ in range(CLICK_SEQUENCES):
        restart()
        for _ in range(int(rng.integers(3, 9))):
            if pos >= n:
                kinds = ["back"]
            else:
                kinds = ["step", "step", "layer", "nonfinite", "end", "run-to", "run-to", "typo"] + (
                    ["back"] * 2 + ["start"] if pos else [])
            kind = kinds[int(rng.integers(len(kinds)))]
            target = int(rng.integers(0, n)) if kind in ("run-to", "typo") else None
            click(kind, target)
    return clicks


def _pick(lab: _Lab, root: str, sel: str, index) -> None:
    loc = lab.page.locator(f"{root} {sel} select")
    lab.handled(root, lambda: loc.select_option(index=index))


def _drive_weights(lab: _Lab, rng) -> int:
    root, page, clicks = ".wb-weight-browser", lab.page, 0
    for _ in range(14):
        what = ["layer", "tensor", "tensor", "stat"][int(rng.integers(4))]
        sel = {"layer": ".wb-weights-layer", "tensor": ".wb-weights-tensor", "stat": ".wb-weights-stat"}[what]
        opts = [o.replace("\xa0", " ") for o in page.locator(f"{root} {sel} select option").all_text_contents()]
        cur = page.evaluate(JS_SELECTED, f"{root} {sel}")
        choices = [i for i, o in enumerate(opts) if [o] != cur]
        if not choices:
            continue
        _pick(lab, root, sel, choices[int(rng.integers(len(choices)))])
        clicks += 1
        st = lab.state()["weights"]
        assert st["error"] is None, f"WeightBrowser {what}: {st['error']}"
        lab.until(f"WeightBrowser after picking a {what} ({st})",
                  lambda: (page.evaluate(JS_SELECTED, f"{root} .wb-weights-tensor"),
                           page.evaluate(JS_TEXT, f"{root} .wb-weights-detail"),
                           page.evaluate(JS_TEXT, f"{root} .wb-weights-grid"),
                           page.evaluate(JS_TEXT, f"{root} .wb-error")),
                  lambda v: (len(v[0]) == 1 and v[0][0][2:] == st["tensor"] and v[1] is not None
                             and v[1].startswith(st["tensor"]) and f"{st['stat']} per layer and tensor" in v[2]
                             and v[3].strip() == ""))
        assert lab.kernel_errors() == []
    return clicks


def _drive_hazards(lab: _Lab, rng) -> int:
    root, page, clicks = ".wb-hazard-timeline", lab.page, 0
    n_haz = len(page.locator(f"{root} .wb-hazard-picker select option").all_text_contents())
    r = page.evaluate(JS_EXEC, "print(len(ht.schedule.events))")
    n_events = int(r["out"])
    assert n_haz >= 2 and n_events > 40
    for k in range(10):
        if k % 2 == 0:
            cur = lab.state()["hazards"]["picked"]
            _pick(lab, root, ".wb-hazard-picker", (cur + 1 + int(rng.integers(n_haz - 1))) % n_haz)
        else:  # move one end of the window with the keyboard (the slider's handles take arrow keys)
            before = lab.state()["hazards"]["window"]
            lo, hi = before
            moves = [m for m, ok in [((0, "ArrowLeft"), lo > 0), ((0, "ArrowRight"), lo < hi),
                                     ((1, "ArrowLeft"), hi > lo), ((1, "ArrowRight"), hi < n_events - 1)] if ok]
            which, key = moves[int(rng.integers(len(moves)))]
            handle = page.locator(f"{root} .wb-hazard-window .noUi-handle").nth(which)
            lab.handled(root, lambda: (handle.focus(), handle.press(key)))
            step = 1 if key == "ArrowRight" else -1
            assert lab.state()["hazards"]["window"] == [lo + step * (which == 0), hi + step * (which == 1)]
        clicks += 1
        st = lab.state()["hazards"]
        assert st["error"] is None, st["error"]
        lo, hi = st["window"]
        lab.until(f"HazardTimeline ({st})",
                  lambda: (page.evaluate(JS_SELECTED, f"{root} .wb-hazard-picker"),
                           page.evaluate(JS_TEXT, f"{root} .wb-hazard-detail"),
                           page.evaluate(JS_TEXT, f"{root} .wb-hazard-chart"),
                           page.evaluate(JS_TEXT, f"{root} .wb-error")),
                  lambda v: (len(v[0]) == 1 and v[0][0].startswith(f"{st['picked']}: {st['kind']} ")
                             and f"[{st['kind']}]" in v[1] and v[2].startswith(f"event {lo}event {hi}")
                             and v[3].strip() == ""))
        assert lab.kernel_errors() == []
    return clicks


def _drive_diff(lab: _Lab, rng) -> int:
    root, page, clicks = ".wb-diff-view", lab.page, 0
    n_ops = len(page.locator(f"{root} .wb-diff-op select option").all_text_contents())
    for k in range(12):
        st0 = lab.state()["diff"]
        what = ["op", "op", "metrics", "first"][k % 4]
        if what == "first" and st0["op"] == st0["first"]:
            what = "op"
        if what == "op":
            cur = page.evaluate(JS_SELECTED, f"{root} .wb-diff-op")
            opts = [o.replace("\xa0", " ") for o in page.locator(f"{root} .wb-diff-op select option").all_text_contents()]
            choices = [i for i in range(n_ops) if [opts[i]] != cur]
            _pick(lab, root, ".wb-diff-op", choices[int(rng.integers(len(choices)))])
        elif what == "metrics":
            names = ["nmse", "1-cosine", "max_abs", "max_rel", "local-nmse"]  # (workbench.widgets.diffview.METRICS)
            pick = sorted(rng.choice(len(names), size=int(rng.integers(1, 4)), replace=False).tolist())
            cur = lab.state()["diff"]["metrics"]
            if [names[i] for i in pick] == cur:
                pick = [i for i in range(len(names)) if names[i] not in cur][:1] or [0]
            _pick(lab, root, ".wb-diff-metrics", pick)
        else:
            lab.handled(root, lambda: page.locator(f"{root} button.wb-diff-first").click())
        clicks += 1
        st = lab.state()["diff"]
        assert st["error"] is None, st["error"]
        if what == "first":
            assert st["op"] == st["first"]
        lab.until(f"DiffView after {what} ({st})",
                  lambda: (page.evaluate(JS_SELECTED, f"{root} .wb-diff-op"),
                           page.evaluate(JS_SELECTED, f"{root} .wb-diff-metrics"),
                           page.evaluate(JS_TEXT, f"{root} .wb-diff-detail"),
                           page.locator(f"{root} .wb-diff-plot img").count(),
                           page.evaluate(JS_TEXT, f"{root} .wb-error")),
                  lambda v: (len(v[0]) == 1 and f" {st['op']} [" in v[0][0] and v[1] == st["metrics"]
                             and v[2] is not None and v[2].startswith(f"{st['op']} (engine") and v[3] == 1
                             and v[4].strip() == ""))
        assert lab.kernel_errors() == []
    return clicks


def test_browser_every_widget_through_click_sequences(tmp_path):
    """Every control of StepDebugger, WeightBrowser, HazardTimeline and DiffView, clicked in a
    real JupyterLab (whose widget messages reach the kernel on a subshell thread), through
    seeded random sequences; the view equals the data object's state after every click."""
    assert _chromium_missing() is None, _chromium_missing()
    import numpy as np
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    nbdir = tmp_path / "nb"
    nbdir.mkdir()
    (nbdir / "widgets.ipynb").write_text(json.dumps(_notebook(WIDGET_CELLS)))
    rng = np.random.default_rng(CLICK_SEED)
    t0 = time.monotonic()
    (tmp_path / "lab").mkdir()
    with serve_lab(nbdir, tmp_path / "lab") as (base, token, root), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/lab/tree/widgets.ipynb?token={token}", wait_until="domcontentloaded")
            page.wait_for_function(JS_NOTEBOOK_READY, timeout=120_000, polling=250)
            page.evaluate(JS_WATCH_KERNEL_ERRORS)
            page.evaluate(JS_RUN_ALL)
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while True:
                prog = page.evaluate(JS_PROGRESS)
                assert not prog["errors"], f"cells raised in the browser's kernel: {prog['errors']}"
                if prog["done"] == prog["cells"] and prog["kernel"] == "idle":
                    break
                assert time.monotonic() < deadline, f"notebook did not finish in {RUN_TIMEOUT_S} s: {prog}"
                time.sleep(0.5)
            for cls in ("wb-step-debugger", "wb-weight-browser", "wb-hazard-timeline", "wb-diff-view"):
                page.locator(f".{cls}").first.wait_for(state="attached", timeout=60_000)
            lab = _Lab(page)
            r = page.evaluate(JS_EXEC, "print(json.dumps(PROGRAM))")
            assert r["err"] is None, r["err"]
            program = json.loads(r["out"])
            assert program["nonfinite"] and program["nonfinite"][0] == program["ops"].index("layers.1.mlp.down_proj")
            counts, seconds = {}, {"notebook": round(time.monotonic() - t0, 1)}
            for name, drive in [("debugger", lambda: _drive_debugger(lab, rng, program)),
                                ("weights", lambda: _drive_weights(lab, rng)),
                                ("hazards", lambda: _drive_hazards(lab, rng)), ("diff", lambda: _drive_diff(lab, rng))]:
                t1 = time.monotonic()
                counts[name] = drive()
                seconds[name] = round(time.monotonic() - t1, 1)
            page.locator(".wb-step-debugger").first.screenshot(path=str(ARTIFACTS / "browser_clicks_debugger.png"))
            assert lab.kernel_errors() == []
            assert counts["debugger"] >= 40 and min(counts.values()) >= 8, counts
            (ARTIFACTS / "browser_clicks.json").write_text(json.dumps(
                {"clicks": counts, "seconds": seconds}, indent=1))
        finally:
            browser.close()
    log = (tmp_path / "lab" / "jupyter.log").read_text()
    assert "Traceback" not in log and "There is no Stream" not in log, log[-3000:]
