"""A reader opens a committed notebook in JupyterLab and does not run it: every widget
view (StepDebugger, WeightBrowser, HazardTimeline, DiffView) is drawn from the widget
state saved in the notebook, not shown as its text repr (``StepDebugger(children=...``).

JupyterLab draws widget views only for *trusted* notebooks; `workbench lab` trusts the
curated ones (workbench.lab.trust_notebooks).  So the test first opens notebook 01 as a
fresh clone is, untrusted, and sees the repr (the failure readers met), then trusts the
notebooks as `workbench lab` does and opens every notebook with views.  Nothing runs: the
kernel starts idle and no cell gets an execution count in the browser.

Same needs as tests/test_browser.py (Playwright, Chromium at /usr/bin/chromium), whose
server fixture it reuses; its own Jupyter data directory (the trust database) is fresh.
"""
from __future__ import annotations

import html
import json
import re
import time
import urllib.request
from pathlib import Path

import pytest

from test_browser import CHROMIUM, CHROMIUM_ARGS, JS_NOTEBOOK_READY, serve_lab
from workbench.lab import NOTEBOOKS, REPO_ROOT, trust_notebooks
from workbench.widgets.saved import UNRUN

pytestmark = pytest.mark.browser

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
ARTIFACTS = REPO_ROOT / "test-artifacts"

# the code cells whose outputs hold a widget view, and what the page shows there
JS_VIEW_CELLS = """() => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  const out = [];
  nb.widgets.forEach((c, i) => {
    if (c.model.type === 'code' && c.model.outputs.toJSON().some(o => o.data && o.data['%s'])) out.push(i);
  });
  return out;
}""" % WIDGET_VIEW
JS_SHOW_CELL = """async (i) => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  nb.activeCellIndex = i;
  await nb.scrollToItem(i, 'start');
  return true;
}"""
JS_CELL_OUTPUT = """(i) => {
  const panel = window.jupyterapp.shell.currentWidget;
  const cell = panel.content.widgets[i];
  const area = cell.node.querySelector('.jp-OutputArea');
  return {text: area ? area.innerText : '',
          widgets: cell.node.querySelectorAll('.jupyter-widgets').length};
}"""


def views_of(name: str) -> list[dict]:
    """From the committed notebook: each widget view's top class (``wb-...``) and the
    ``wb-*`` HTML children's text as saved, in output order."""
    nb = json.loads((NOTEBOOKS / name).read_text())
    state = nb["metadata"].get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    views = []
    for c in nb["cells"]:
        for o in c.get("outputs", []):
            if WIDGET_VIEW not in o.get("data", {}):
                continue
            top = state[o["data"][WIDGET_VIEW]["model_id"]]["state"]
            cls = [k for k in top.get("_dom_classes", []) if k.startswith("wb-")]
            views.append({"class": cls[0] if cls else None, "texts": _saved_texts(state, top)})
    return views


def _saved_texts(state: dict, top: dict) -> list[str]:
    """Plain text of the visible HTML widgets below ``top``, in document order (what the
    view shows without a kernel)."""
    def hidden(m):
        ref = re.fullmatch(r"IPY_MODEL_([0-9a-f]{32})", str(m.get("layout", "")))
        lay = state[ref.group(1)]["state"] if ref and ref.group(1) in state else {}
        return lay.get("display") == "none" or lay.get("visibility") == "hidden"

    texts = []

    def walk(m):
        for ref in re.findall(r"IPY_MODEL_([0-9a-f]{32})", json.dumps(m.get("children", []))):
            child = state[ref]
            if hidden(child["state"]):
                continue
            value = child["state"].get("value")
            if child["model_name"] == "HTMLModel" and value:
                value = re.sub(r"(?s)<(style|script|title)\b.*?</\1>", " ", value)   # not shown as text
                t = _norm(html.unescape(re.sub(r"<[^>]+>", " ", value)))
                if len(t) > 12:
                    texts.append(t)
            walk(child["state"])

    walk(top)
    return texts


def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip()


def _squash(s: str) -> str:   # tags stripped by hand and the browser's innerText space text differently
    return re.sub(r"\s+", "", s)


def _open(page, base, token, name) -> list[int]:
    """Open ``name`` alone (``reset``: no tab restored from the last page) and wait until its
    outputs are loaded; returns the indices of the cells holding widget views."""
    page.goto(f"{base}/lab/tree/{name}?reset&token={token}", wait_until="domcontentloaded")
    page.wait_for_function(JS_NOTEBOOK_READY, timeout=120_000, polling=250)
    page.wait_for_function("(name) => window.jupyterapp.shell.currentWidget.context.path === name",
                           arg=name, timeout=60_000, polling=250)
    want = len(views_of(name))
    page.wait_for_function(f"() => ({JS_VIEW_CELLS})().length === {want}", timeout=60_000, polling=250)
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status"
                           " === 'idle'", timeout=60_000, polling=250)   # as a reader finds it: settled
    return page.evaluate(JS_VIEW_CELLS)


def _cell_output(page, i, want_widgets: bool, texts=()):
    """What cell ``i`` shows once it is drawn (with widgets or not, and holding ``texts``)."""
    page.evaluate(JS_SHOW_CELL, i)
    deadline = time.monotonic() + 60
    while True:
        got = page.evaluate(JS_CELL_OUTPUT, i)
        if (got["widgets"] > 0) == want_widgets and got["text"].strip() \
                and all(t in _squash(got["text"]) for t in texts):
            return got
        if "Error displaying widget" in got["text"]:
            return got
        if time.monotonic() > deadline:
            return got
        time.sleep(0.3)


def _views_drawn(page, base, token, name) -> list[str]:
    """Open ``name`` and check each widget view against the saved state; the problems found."""
    problems = []
    cells = _open(page, base, token, name)
    for i, view in zip(cells, views_of(name)):
        expect = [_squash(t)[:32] for t in view["texts"][:3]]   # the saved HTML children, as text
        got = _cell_output(page, i, want_widgets=True, texts=expect)
        where = f"{name} cell {i} ({view['class']})"
        if got["widgets"] <= 3 or "Error displaying widget" in got["text"]:
            problems.append(f"{where}: no widget drawn: {got['text'][:200]!r}")
            continue
        if "(children=" in got["text"]:
            problems.append(f"{where} shows its repr")
        if view["class"] and page.locator(f".{view['class']}").count() < 1:
            problems.append(f"{where}: no .{view['class']} element")
        problems += [f"{where}: saved text {t!r} not shown" for t in expect if t not in _squash(got["text"])]
        # a view with no kernel behind it says so, its buttons disabled (workbench.widgets.saved)
        if not any(UNRUN in t for t in view["texts"]) or _squash(UNRUN) not in _squash(got["text"]):
            problems.append(f"{where}: does not say {UNRUN!r}")
        enabled = page.evaluate("(i) => Array.from(window.jupyterapp.shell.currentWidget.content.widgets[i].node"
                                ".querySelectorAll('button.jupyter-button')).filter(b => !b.disabled).length", i)
        if enabled:
            problems.append(f"{where}: {enabled} buttons enabled without a kernel")
    return problems


def _shut_down_kernels(base, token):
    """One idle kernel per opened notebook would pile up on a small machine."""
    def call(method, path):
        req = urllib.request.Request(f"{base}{path}", method=method, headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"null")
    for k in call("GET", "/api/kernels"):
        call("DELETE", f"/api/kernels/{k['id']}")


def test_committed_notebooks_show_their_views_unrun(tmp_path, monkeypatch):
    assert Path(CHROMIUM).exists(), f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    from playwright.sync_api import sync_playwright

    with_views = [n for n in sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) if views_of(n)]
    assert "01_tour.ipynb" in with_views and len(with_views) >= 5, with_views
    ARTIFACTS.mkdir(exist_ok=True)
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))   # a trust database of our own
    reopened = []
    with serve_lab(NOTEBOOKS, tmp_path) as (base, token, root), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})

            # untrusted, as a fresh clone: JupyterLab falls back to the text repr
            first = _open(page, base, token, "01_tour.ipynb")[0]
            got = _cell_output(page, first, want_widgets=False)
            assert got["widgets"] == 0 and f"StepDebugger: {UNRUN}" in got["text"], got   # the text form says so
            _shut_down_kernels(base, token)

            # trusted, as `workbench lab` does it: every view drawn from its saved state
            assert sorted(trust_notebooks(root)) == sorted(p.name for p in root.glob("*.ipynb"))
            for name in with_views:
                problems = _views_drawn(page, base, token, name)
                if problems and all("model not found" in p for p in problems):
                    # jupyterlab_widgets 3.0 race: the kernel's "connected" event marks the widget
                    # manager restored before the notebook's saved state is loaded, and a view drawn
                    # in between stays "model not found" until the notebook is opened again (seen
                    # under load on 2 cores).  Not about the saved state: open it once more.
                    reopened.append(name)
                    _shut_down_kernels(base, token)
                    problems = _views_drawn(page, base, token, name)
                assert not problems, problems
                if name == "01_tour.ipynb":
                    page.locator(".wb-step-debugger").first.screenshot(
                        path=str(ARTIFACTS / "static_01_step_debugger.png"))
                _shut_down_kernels(base, token)
        finally:
            browser.close()
    (ARTIFACTS / "browser_static.json").write_text(json.dumps({"notebooks": with_views, "reopened": reopened}))
