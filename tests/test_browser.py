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

from workbench.lab import NOTEBOOKS, REPO_ROOT, free_port, lab_argv

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
    argv = lab_argv(root, port=port, token=token, open_browser=False,
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
