"""AttentionView in a real JupyterLab (headless Chromium): a notebook displays the view of a
known pattern and a StepDebugger stopped on a softmax; the test hovers cells and reads the
hover line ("query token → key token: p = ..."), switches the head in the page and checks
that the kernel's widget followed, and that the debugger's attention panel is the same view.

Same needs as tests/test_browser.py (Playwright, Chromium at /usr/bin/chromium), whose
server fixture and page scripts it reuses.  Screenshots go to test-artifacts/.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from test_browser import (CHROMIUM, CHROMIUM_ARGS, JS_EXEC, JS_NOTEBOOK_READY, JS_PROGRESS, JS_RUN_ALL,
                          _chromium_missing, _notebook, serve_lab)
from workbench.lab import REPO_ROOT

pytestmark = pytest.mark.browser

ARTIFACTS = REPO_ROOT / "test-artifacts"
TOKENS = ["<bos>", " the", " cat", " sat", " on", " the"]

CELLS = [
    '''import numpy as np
from workbench.widgets import AttentionView
rng = np.random.default_rng(0)
P = np.tril(rng.random((3, 6, 6)) + 0.01).astype(np.float32)
P /= P.sum(-1, keepdims=True)
TOKENS = %s
view = AttentionView(P, TOKENS, TOKENS, head=1, title="known pattern")
view.add_class("standalone")
view''' % json.dumps(TOKENS),
    '''import workbench
from workbench.demo.paths import DEMO
from workbench.widgets import StepDebugger
dbg = StepDebugger(workbench.trace(workbench.load(DEMO, dtype="float32"), "apple river stone | apple river",
                                   capture="full", attention="explicit"), head=2)
dbg.run_to("layers.1.self_attn.softmax")
dbg''',
    '''L = np.tril(rng.random((2, 100, 100)) + 0.01).astype(np.float32)
L /= L.sum(-1, keepdims=True)
long = AttentionView(L, [f"t{i}" for i in range(100)], [f"t{i}" for i in range(100)])
long.add_class("long")
long''',
]

def _expected_p(p: float) -> str:
    """The page's number format (JavaScript's toFixed(3), toExponential(1): "3.8e-5")."""
    if p == 0:
        return "0 (masked)"
    return f"{p:.3f}" if abs(p) >= 0.001 else re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{p:.1e}")


def _hover(page, root, i: int, j: int) -> str:
    """Hover cell (query i, key j) of the view under ``root``; the hover line's text."""
    canvas = page.locator(f"{root} canvas.wb-attn-cells").first
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    rows = page.locator(f"{root} .wb-attn-row").count()
    cols = page.locator(f"{root} .wb-attn-col").count()
    cw, ch = box["width"] / cols, box["height"] / rows
    canvas.hover(position={"x": (j + 0.5) * cw, "y": (i + 0.5) * ch})
    hover = page.locator(f"{root} .wb-attn-hover").first
    deadline = time.monotonic() + 10
    while hover.get_attribute("data-query") != str(i) or hover.get_attribute("data-key") != str(j):
        assert time.monotonic() < deadline, f"hovering ({i}, {j}) changed nothing: {hover.text_content()!r}"
        time.sleep(0.05)
    return hover.text_content()


def test_browser_attention_view_hover_and_head(tmp_path):
    assert _chromium_missing() is None, _chromium_missing()
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    P = np.tril(rng.random((3, 6, 6)) + 0.01).astype(np.float32)
    P /= P.sum(-1, keepdims=True)
    nbdir = tmp_path / "nb"
    nbdir.mkdir()
    (nbdir / "attention.ipynb").write_text(json.dumps(_notebook(CELLS)))
    (tmp_path / "lab").mkdir()
    with serve_lab(nbdir, tmp_path / "lab") as (base, token, root), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            console = []
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.goto(f"{base}/lab/tree/attention.ipynb?token={token}", wait_until="domcontentloaded")
            page.wait_for_function(JS_NOTEBOOK_READY, timeout=120_000, polling=250)
            page.evaluate(JS_RUN_ALL)
            deadline = time.monotonic() + 300
            while True:
                prog = page.evaluate(JS_PROGRESS)
                assert not prog["errors"], f"cells raised in the browser's kernel: {prog['errors']}"
                if prog["done"] == prog["cells"] and prog["kernel"] == "idle":
                    break
                assert time.monotonic() < deadline, f"notebook did not finish: {prog}"
                time.sleep(0.5)

            view = ".wb-attention-view.standalone"
            page.locator(f"{view} canvas.wb-attn-cells").first.wait_for(state="attached", timeout=60_000)
            labels = page.locator(f"{view} .wb-attn-row").all_text_contents()
            assert labels == [f"{i} {t}" for i, t in enumerate(TOKENS)], labels
            cols = page.locator(f"{view} .wb-attn-col").all_text_contents()
            assert cols == [f"{t} {j}" for j, t in enumerate(TOKENS)], cols
            assert page.locator(f"{view} select.wb-attn-head").input_value() == "1"
            # hover: query 4 (" on") -> key 2 (" cat") of head 1; then a masked cell
            assert _hover(page, view, 4, 2).startswith(f" on →  cat: p = {_expected_p(P[1, 4, 2])}")
            assert _hover(page, view, 1, 3).startswith(" the →  sat: p = 0 (masked)")
            page.locator(view).first.screenshot(path=str(ARTIFACTS / "browser_attention_view.png"))
            # the head selector in the page: the kernel's widget follows, the hover reads the new head
            page.locator(f"{view} select.wb-attn-head").select_option("2")
            deadline = time.monotonic() + 20
            while True:
                r = page.evaluate(JS_EXEC, "print(view.head)")
                assert r["err"] is None, r["err"]
                if r["out"].strip() == "2":
                    break
                assert time.monotonic() < deadline, f"the kernel's head stayed {r['out']!r}"
                time.sleep(0.1)
            text = _hover(page, view, 5, 0)
            assert text.startswith(f" the → <bos>: p = {_expected_p(P[2, 5, 0])}") and "head 2" in text, text

            # the debugger's attention panel is the same view, on the demo's softmax, head 2 as asked
            dv = ".wb-step-debugger .wb-attention-view"
            page.locator(f"{dv} canvas.wb-attn-cells").first.wait_for(state="attached", timeout=60_000)
            r = page.evaluate(JS_EXEC, "import json; print(json.dumps([dbg.attention.tokens_q, "
                                       "dbg.attention.values.tolist(), dbg.attention.head]))")
            assert r["err"] is None, r["err"]
            toks, vals, head = json.loads(r["out"])
            assert head == 2 and toks[1] == " apple"
            text = _hover(page, dv, 5, 1)
            assert text.startswith(f"{toks[5]} → {toks[1]}: p = {_expected_p(np.float32(vals[5][1]))}"), text
            page.locator(".wb-step-debugger").first.screenshot(path=str(ARTIFACTS / "browser_attention_debugger.png"))

            # 100 tokens: 10 px cells, the grid scrolls inside its box, the key labels stay on top
            lv = ".wb-attention-view.long"
            page.locator(f"{lv} canvas.wb-attn-cells").first.wait_for(state="attached", timeout=60_000)
            box = page.locator(f"{lv} .wb-attn-scroll").first
            box.scroll_into_view_if_needed()
            size = box.evaluate("e => [e.scrollHeight, e.clientHeight, e.querySelector('canvas').clientWidth]")
            assert size[0] > size[1] and size[2] == 1000, size
            box.evaluate("e => { e.scrollTop = e.scrollHeight; }")
            tops = box.evaluate("e => [e.getBoundingClientRect().top, "
                                "e.querySelector('.wb-attn-cols').getBoundingClientRect().top]")
            assert abs(tops[0] - tops[1]) <= 2, tops
            assert _hover(page, lv, 99, 42).startswith("t99 → t42: p = ")
            page.locator(lv).first.screenshot(path=str(ARTIFACTS / "browser_attention_long.png"))
            body = page.locator("body").inner_text()
            assert "Error displaying widget" not in body and "Error rendering output" not in body
            errors = [c for c in console if c.startswith("error") and "attn" in c.lower()]
            assert errors == [], errors
        finally:
            browser.close()


def test_browser_attention_view_drawn_unrun_from_saved_state(tmp_path, monkeypatch):
    """A notebook executed with its widget state saved (as workbench.notebook.build does) and
    opened without running: the AttentionView and the debugger's attention panel are drawn
    from the saved state, and hovering and picking a head work with no kernel behind them."""
    assert _chromium_missing() is None, _chromium_missing()
    import nbformat
    from nbclient import NotebookClient
    from playwright.sync_api import sync_playwright

    from workbench.lab import sha256, trust_notebooks

    nbdir = tmp_path / "nb"
    nbdir.mkdir()
    nb = nbformat.from_dict(_notebook(CELLS))
    NotebookClient(nb, timeout=300, kernel_name="python3", store_widget_state=True,
                   resources={"metadata": {"path": str(nbdir)}}).execute()
    nbformat.write(nb, str(nbdir / "saved.ipynb"))
    rng = np.random.default_rng(0)
    P = np.tril(rng.random((3, 6, 6)) + 0.01).astype(np.float32)
    P /= P.sum(-1, keepdims=True)
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))   # a trust database of our own
    (tmp_path / "lab").mkdir()
    with serve_lab(nbdir, tmp_path / "lab") as (base, token, root), sync_playwright() as pw:
        # (the lab trusts only what a manifest names with its hash: this test's own)
        manifest = tmp_path / "trusted.sha256"
        manifest.write_text(f"{sha256((Path(root) / 'saved.ipynb').read_bytes())}  saved.ipynb\n")
        assert trust_notebooks(root, manifest) == ["saved.ipynb"]
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/lab/tree/saved.ipynb?reset&token={token}", wait_until="domcontentloaded")
            page.wait_for_function(JS_NOTEBOOK_READY, timeout=120_000, polling=250)
            view = ".wb-attention-view.standalone"
            page.locator(f"{view} canvas.wb-attn-cells").first.wait_for(state="attached", timeout=60_000)
            assert _hover(page, view, 4, 2).startswith(f" on →  cat: p = {_expected_p(P[1, 4, 2])}")
            page.locator(f"{view} select.wb-attn-head").select_option("0")
            assert "head 0" in _hover(page, view, 3, 1)
            assert _hover(page, view, 3, 1).startswith(f" sat →  the: p = {_expected_p(P[0, 3, 1])}")
            dv = ".wb-step-debugger .wb-attention-view"
            page.locator(f"{dv} canvas.wb-attn-cells").first.wait_for(state="attached", timeout=60_000)
            assert "(query #5, key #2, head 2)" in _hover(page, dv, 5, 2)
            page.locator(".wb-step-debugger").first.screenshot(path=str(ARTIFACTS / "browser_attention_unrun.png"))
            r = page.evaluate(JS_EXEC, "print('view' in globals(), 'dbg' in globals())")
            assert r["err"] is None and r["out"].split() == ["False", "False"], r   # nothing ran in this kernel
            body = page.locator("body").inner_text()
            assert "Error displaying widget" not in body and "model not found" not in body
        finally:
            browser.close()
