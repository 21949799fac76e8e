"""The exercises' checker, ``workbench.notebook.check``: right or a hint, a bool, never an
exception; and every notebook 01-08 ends with exercises whose solutions call it."""
from __future__ import annotations

import re

import numpy as np
import pytest

from workbench import notebook
from workbench.lab import NOTEBOOKS
from workbench.notebook import check


def test_right_prints_right(capsys):
    assert check(3, 3) is True
    assert capsys.readouterr().out == "right\n"
    assert check(" Cloud ", "cloud") is True
    assert check((1, 2), [1, 2]) is True
    assert check(np.array([[1, 2]]), [[1, 2]]) is True
    assert check(0.98, 0.991, tol=0.02) is True
    assert check(np.int64(4), 4) and check(True, np.bool_(True))
    assert check({"a": 1, "b": "x"}, {"b": "X", "a": 1})


def test_wrong_gives_the_hint_not_the_answer(capsys):
    assert check(2, 3, why="count the cached positions") is False
    out = capsys.readouterr().out
    assert out == "not quite: count the cached positions\n"
    assert check(0.5, 0.991, tol=0.02, why="look at L1H2") is False
    assert "0.991" not in capsys.readouterr().out
    assert check(0.5, 0.991, tol=0.02, why="look at L1H2", show=True) is False
    assert "0.991" in capsys.readouterr().out


@pytest.mark.parametrize("answer, expected", [
    ("3", 3), (3, "3"), ((1, 2), (1, 2, 3)), ([1, 2], 1), (1, True), (True, 1), ({"a": 1}, {"a": 1, "b": 2}),
    (object(), 1.0), ([[1, 2]], [1, 2]), (float("nan"), 1.0), (np.array([1.0, np.nan]), [1.0, 2.0]),
])
def test_malformed_or_wrong_answers_never_raise(answer, expected, capsys):
    assert check(answer, expected, why="hint") is False
    assert capsys.readouterr().out == "not quite: hint\n"


def test_no_prediction_yet(capsys):
    assert check(None, 1) is False
    assert "no prediction yet" in capsys.readouterr().out


def test_nan_matches_nan():
    assert check(float("nan"), float("nan")) is True


@pytest.mark.parametrize("py", [p for p in notebook.sources(NOTEBOOKS) if "01" <= p.stem[:2] <= "08"],
                         ids=lambda p: p.stem)
def test_notebook_ends_with_exercises(py):
    """2-4 exercises before "What to remember" (or the end): each a code cell with the
    reader's ``answer = None`` and a call of check, followed by its solution, a code cell
    tagged ``solution`` (folded away) that calls check on the computed answer."""
    nb = notebook.read_source(py)
    kinds = []
    for c in nb.cells:
        src, tags = c["source"], c.get("metadata", {}).get("tags", [])
        if c["cell_type"] == "code" and re.search(r"^answer = None  # your prediction", src, flags=re.M):
            assert "check(answer" in src, f"{py.name}: an exercise cell that does not check the answer"
            kinds.append("exercise")
        elif c["cell_type"] == "code" and "solution" in tags:
            assert re.search(r"^check\(", src, flags=re.M), f"{py.name}: a solution cell that does not call check"
            assert c["metadata"].get("jupyter", {}).get("source_hidden"), f"{py.name}: a solution not folded away"
            kinds.append("solution")
        elif c["cell_type"] == "markdown" and re.search(r"What to remember|^## Next", c["source"], flags=re.M):
            kinds.append("end")
    exercises = kinds.count("exercise")
    assert 2 <= exercises <= 4, f"{py.name}: {exercises} exercises"
    body = kinds[:kinds.index("end")] if "end" in kinds else kinds
    assert body[-2 * exercises:] == ["exercise", "solution"] * exercises, \
        f"{py.name}: the exercises, each followed by its solution, come last before 'What to remember': {kinds}"
