"""The exercises in a real browser: notebook 01 opened in JupyterLab (Debian's Chromium,
Playwright), Run All, then the learner's moves.

* After Run All the page shows no solution and no expected answer (each exercise's
  giveaways and solution lines, from workbench.exercises, are absent from the page's text),
  and every exercise cell says "no answer yet" or "returns nothing yet".
* A representative set of exercises (predictions with named parts, order-insensitive and
  swapped pairs; order-sensitive and array "implement it", one of them fed NaN and inf) is answered in its own cell, edited in the browser, with a
  wrong, a partly right and a right answer: three different verdicts, the last "right".
  The right answers are computed in the kernel (the expected value, or the worked
  solution's function), never typed here.

Same needs as tests/test_browser.py, whose server and page helpers it reuses.
"""
from __future__ import annotations

import json
import time

import pytest

from test_browser import (ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, JS_NOTEBOOK_READY, JS_PROGRESS, JS_RUN_ALL, RUN_TIMEOUT_S,
                          _chromium_missing, serve_lab)
from workbench.exercises import EXERCISES
from workbench.lab import NOTEBOOKS

pytestmark = pytest.mark.browser

NOTEBOOK = "01_tour.ipynb"
JS_CELLS = """() => window.jupyterapp.shell.currentWidget.content.widgets.map(
  c => ({type: c.model.type, source: c.model.sharedModel.getSource(), count: c.model.executionCount,
         out: c.model.type !== 'code' ? '' :
              c.model.outputs.toJSON().map(o => o.text || (o.data && o.data['text/plain']) || '').join('')}))"""
JS_RUN_CELL = """async ([i, code]) => {
  const app = window.jupyterapp, nb = app.shell.currentWidget.content;
  nb.widgets[i].model.sharedModel.setSource(code);
  nb.activeCellIndex = i;
  await app.commands.execute('notebook:run-cell');
  return true;
}"""

# (exercise, the cell's code for a wrong, a partly right and a right answer); `ex` is its Exercise
ANSWERS = {
    "01.2": ["check('01.2', (2, 8, 3, 3))",
             "check('01.2', (1, 4, 3, 3))",
             "check('01.2', ex.expected())"],
    "01.4": ["check('01.4', lambda logits, k: [0] * k)",
             "check('01.4', lambda logits, k: right(logits, k)[::-1])",
             "check('01.4', right)"],
    "01.3": ["check('01.3', lambda s: s * 0)",
             "check('01.3', lambda s: np.concatenate([right(s)[:-1], right(s)[-1:] + 1]))",
             "check('01.3', right)"],
    # the checker needs none of the notebook's variables: other notebooks' exercises, in the same kernel
    "07.1": ["check('07.1', [9, 8])",
             "check('07.1', [ex.expected()[0], 9])",
             "check('07.1', ex.expected()[::-1])"],                                # any order is right
    "07.3": ["check('07.3', (5, 5))",
             "check('07.3', tuple(ex.expected())[::-1])",                         # the right pair, swapped
             "check('07.3', ex.expected())"],
    "04.4": ["check('04.4', lambda x, w, eps: x)",
             "check('04.4', lambda x, w, eps: x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps))",   # no weight
             "check('04.4', right)"],
}
JS_NEW_CELL = """async () => {
  const app = window.jupyterapp, nb = app.shell.currentWidget.content;
  nb.activeCellIndex = nb.widgets.length - 1;
  await app.commands.execute('notebook:insert-cell-below');
  return nb.widgets.length - 1;
}"""
SETUP = """import numpy as np
from workbench.exercises import EXERCISES, check
ex = EXERCISES[{eid!r}]
ns = {{'np': np}}
exec(ex.solution, ns) if ex.kind == 'implement' else None
right = [v for k, v in ns.items() if callable(v) and k != 'np'][-1] if ex.kind == 'implement' else None
"""


def _wait_idle(page, what: str) -> dict:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        prog = page.evaluate(JS_PROGRESS)
        assert not prog["errors"], f"{what}: cells raised in the browser's kernel: {prog['errors']}"
        if prog["done"] == prog["cells"] and prog["kernel"] == "idle":
            return prog
        assert time.monotonic() < deadline, f"{what} did not finish in {RUN_TIMEOUT_S} s: {prog}"
        time.sleep(0.3)


def _run(page, i: int, code: str) -> str:
    before = page.evaluate(JS_CELLS)[i]["count"]
    page.evaluate(JS_RUN_CELL, [i, code])
    deadline = time.monotonic() + 120
    while True:
        cell = page.evaluate(JS_CELLS)[i]
        if cell["count"] not in (None, before) and page.evaluate(JS_PROGRESS)["kernel"] == "idle":
            return cell["out"].strip()
        assert time.monotonic() < deadline, f"cell {i} did not run: {cell}"
        time.sleep(0.2)


def test_browser_exercises_run_all_hides_answers_and_feedback_differs(tmp_path):
    assert _chromium_missing() is None, _chromium_missing()
    from playwright.sync_api import sync_playwright

    mine = {e: ex for e, ex in EXERCISES.items() if e.startswith(NOTEBOOK[:2] + ".")}
    with serve_lab(NOTEBOOKS, tmp_path) as (base, token, root), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/lab/tree/{NOTEBOOK}?token={token}", wait_until="domcontentloaded")
            page.wait_for_function(JS_NOTEBOOK_READY, timeout=120_000, polling=250)
            page.evaluate(JS_RUN_ALL)
            _wait_idle(page, NOTEBOOK)

            cells = page.evaluate(JS_CELLS)
            shown = "\n".join(c["source"] + "\n" + c["out"] for c in cells)
            for eid, ex in mine.items():
                for text in ex.giveaways:
                    assert text not in shown, f"Run All shows exercise {eid}'s answer {text!r}"
                for line in ex.solution.splitlines():
                    line = line.strip()
                    if len(line) > 30 and not line.startswith(("#", "def ", "from ", "import ")):
                        assert line not in shown, f"Run All shows exercise {eid}'s solution: {line!r}"
            exercise_cells = [c for c in cells if c["type"] == "code" and c["source"].rstrip().endswith(")")
                              and "check(\"" in c["source"]]
            assert len(exercise_cells) == len(mine)
            assert all(("no answer yet" in c["out"]) or ("returns nothing yet" in c["out"]) for c in exercise_cells), \
                [c["out"] for c in exercise_cells]

            seen = {}
            last = page.evaluate(JS_NEW_CELL)   # the learner's own code cell, at the end, rewritten each time
            assert page.evaluate(JS_CELLS)[last]["type"] == "code"
            for eid, codes in ANSWERS.items():
                _run(page, last, SETUP.format(eid=eid))
                verdicts = seen[eid] = [_run(page, last, code) for code in codes]
                assert verdicts[2] == "right", (eid, verdicts)
                assert verdicts[0].startswith("not quite") and not verdicts[1].startswith("right"), (eid, verdicts)
                assert len(set(verdicts)) == 3, (eid, verdicts)
            _wait_idle(page, "the answers")
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "browser_exercises.json").write_text(json.dumps(seen, indent=1))
        finally:
            browser.close()
