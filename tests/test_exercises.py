"""The exercises (workbench.exercises): the learner's notebook asks, the package answers.

* every exercise, driven through the checker with a wrong, a partly right (or a known
  mistake) and a right answer, gives three different verdicts, and only the right one is
  right; no verdict states the expected answer;
* no learner notebook holds an answer: no solution cell, no expected value in a check call,
  no exercise's giveaway or solution line in its source or saved outputs;
* every notebook checks each of its exercises, two of them at least "implement it".
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from workbench import notebook
from workbench.exercises import EXERCISES, check, feedback, solution
from workbench.exercises.core import same
from workbench.lab import NOTEBOOKS

SOURCES = {p.stem[:2]: p for p in notebook.sources(NOTEBOOKS)}
CHECK_CALL = re.compile(r"""^check\("(\d\d\.\d+)", (\w+)\)$""", flags=re.M)


def solved(ex):
    """The right answer: the expected value, or the function the worked solution defines."""
    if ex.kind == "predict":
        return ex.expected()
    ns = {"np": np}
    exec(ex.solution, ns)
    return next(v for k, v in reversed(ns.items()) if callable(v) and k not in ("np", "__builtins__"))


def _bump(x):
    """A value near ``x`` but not it."""
    if isinstance(x, (bool, np.bool_)):
        return not x
    if isinstance(x, (int, np.integer)):
        return int(x) + 1
    if isinstance(x, (float, np.floating)):
        return float(x) * 2 + 1
    if isinstance(x, str):
        return x + "x"
    return None


def _wrong_first(fn, spoil=_bump):
    """``fn``, but wrong on its first call (the exercises that call it once per case)."""
    calls = []

    def f(*a):
        calls.append(1)
        out = fn(*a)
        return (-1 if out is None else spoil(out)) if len(calls) == 1 else out
    return f


def _last_row_off(fn):
    def f(*a):
        out = np.array(fn(*a), dtype=np.float64)
        out[-1] = out[-1] + 1.0
        return out
    return f


# a second answer per exercise: partly right where partial credit exists, else a known mistake
SECOND = {
    "01.1": " river", "03.1": "higher", "03.2": "layers.1.mlp.act", "04.2": 1, "04.3": 0, "05.1": 1,
    "06.1": True, "06.2": "logits", "07.2": 4, "08.1": lambda e: e - 1, "08.2": lambda e: e + 1,
    "09.1": "after", "09.2": False, "02.2": False,
    "01.4": lambda sol: (lambda logits, k: sol(logits, k)[::-1]),                      # right tokens, wrong order
    "02.3": lambda sol: (lambda req, st: (sol(req, st)[0], [])),                        # one list of two right
    "02.4": lambda sol: (lambda x: (*sol(x)[:2], 0)),                                   # two counts of three
    "04.5": lambda sol: (lambda names, values: next(n for n in names if np.isnan(values[n]).any())),
    "05.4": lambda sol: (lambda events: [e["name"] for i, e in enumerate(events) if e["type"] == "dispatch"
                                         and any(c["type"] == "commit" for c in events[:i])]),
    "07.4": lambda sol: (lambda s, k: np.concatenate([sol(s, k)[:-1], (sol(s, k)[-1:] + 1) % s.shape[-1]])),
    "08.3": lambda sol: (lambda p, n: sol(p, n)[:-1] + [sol(p, n)[-1] + 1]),
    "09.4": lambda sol: (lambda absmax: min(absmax, key=absmax.get)),
    "10.4": lambda sol: (lambda x: [[int(i), int(i)] for i in np.flatnonzero(np.isnan(x).any(-1))]),
    "10.5": lambda sol: (lambda names, values: next(n for n in names if np.abs(np.nan_to_num(values[n])).max() > 1e30)),
}
PER_CALL = {"05.3", "06.3", "06.4", "08.4", "09.3"}   # the checker calls the function once per case


def second_answer(ex, right):
    s = SECOND.get(ex.id)
    if ex.kind == "predict":
        if s is not None:
            return s(right) if callable(s) else s
        assert isinstance(right, (list, tuple)) and len(right) >= 2, f"{ex.id}: give it a second answer in SECOND"
        return type(right)([_bump(right[0]), *right[1:]])          # one part of several wrong
    if s is not None:
        return s(right)
    if ex.id in PER_CALL:
        return _wrong_first(right)
    return _last_row_off(right)


def _far(x):
    """A value of the kind of ``x``, far from it (no mistake anyone makes)."""
    if isinstance(x, (bool, np.bool_)):
        return "maybe"
    if isinstance(x, (int, float, np.integer, np.floating)):
        return x + 1000
    return "qqq"


def wrong_answer(ex, right):
    if ex.kind == "implement":
        return lambda *a: "not an answer"
    if isinstance(right, (list, tuple)):
        return type(right)(_far(x) for x in right)
    return _far(right)


@pytest.mark.parametrize("eid", sorted(EXERCISES))
def test_wrong_partial_right_give_different_feedback(eid):
    ex = EXERCISES[eid]
    right = solved(ex)
    r, p, w = feedback(eid, right), feedback(eid, second_answer(ex, right)), feedback(eid, wrong_answer(ex, right))
    assert r.ok and r.message == "right", (eid, r)
    assert not p.ok and not w.ok, (eid, p, w)
    assert len({r.message, p.message, w.message}) == 3, (eid, r.message, p.message, w.message)
    if ex.kind == "predict" and isinstance(right, (tuple, list)):
        for v in (p, w):
            assert repr(tuple(right)) not in v.message and repr(list(right)) not in v.message, (eid, v.message)
    if p.score is not None:   # partial credit is named: "k of n ..."
        k, n = p.score
        assert 0 < k < n and f"{k} of {n}" in p.message


def test_order_does_not_matter_where_it_should_and_does_where_it_should():
    experts = feedback("07.1", list(reversed(EXERCISES["07.1"].expected())))
    assert experts.ok                                   # descending or ascending: both right
    top = solved(EXERCISES["01.4"])
    swapped = feedback("01.4", lambda logits, k: top(logits, k)[::-1])
    assert not swapped.ok and "wrong order" in swapped.message
    pair = EXERCISES["07.3"].expected()
    assert "wrong order" in feedback("07.3", pair[::-1]).message


def test_check_prints_and_returns_the_verdict(capsys):
    assert check("05.2", EXERCISES["05.2"].expected()) is None   # a cell shows the verdict alone
    assert capsys.readouterr().out == "right\n"
    check("05.2", None)
    assert "no answer yet" in capsys.readouterr().out
    check("03.4", lambda gate, up: None)
    assert "returns nothing yet" in capsys.readouterr().out
    solution("03.4")
    assert "def mlp_act" in capsys.readouterr().out
    with pytest.raises(KeyError, match="no exercise"):
        check("99.9", 1)


@pytest.mark.parametrize("answer", ["3", object(), [[1, 2]], float("nan"), {"a": 1}, (1,), b"x"])
def test_malformed_answers_never_raise(answer):
    for eid, ex in EXERCISES.items():
        if ex.kind == "predict":
            assert feedback(eid, answer).ok is False
    assert feedback("03.5", lambda p, v: 1 / 0).message.startswith("not quite: your function raised ZeroDivisionError")


def test_same_compares_by_kind():
    assert same(" Cloud ", "cloud") and same((1, 2), [1, 2]) and same(np.int64(4), 4)
    assert same(0.98, 0.991, tol=0.02) and not same(0.5, 0.991, tol=0.02)
    assert not same(1, True) and not same("3", 3) and same(float("nan"), float("nan"))


# ------------------------------------------------------------------ the learner notebooks hold no answer

def _page(py) -> str:
    """What a learner sees: the source and every saved output of the executed notebook."""
    nb = json.loads(py.with_suffix(".ipynb").read_text())
    out = [py.read_text()]
    for c in nb["cells"]:
        out.append("".join(c["source"]))
        for o in c.get("outputs", []):
            out.append("".join(o.get("text", "")))
            for v in o.get("data", {}).values():
                out.append(v if isinstance(v, str) else "".join(v) if isinstance(v, list) else json.dumps(v))
    return "\n".join(out)


def _solution_lines(ex) -> list[str]:
    return [ln.strip() for ln in ex.solution.splitlines()
            if len(ln.strip()) > 30 and not ln.strip().startswith(("#", "def ", "from ", "import "))]


@pytest.mark.parametrize("nn", sorted(SOURCES))
def test_learner_notebook_holds_no_answer(nn):
    py = SOURCES[nn]
    nb = json.loads(py.with_suffix(".ipynb").read_text())
    tagged = [i for i, c in enumerate(nb["cells"]) if "solution" in c.get("metadata", {}).get("tags", [])]
    assert not tagged, f"{py.name}: solution cells {tagged}"
    source = py.read_text()
    calls = [ln for ln in source.splitlines() if ln.startswith("check(")]
    assert calls and all(CHECK_CALL.match(ln) for ln in calls), \
        f"{py.name}: every check call is check(\"NN.k\", answer), nothing else: {calls}"
    page = _page(py)
    for eid, ex in EXERCISES.items():
        if not eid.startswith(nn + "."):
            continue
        for text in ex.giveaways:
            assert text not in page, f"{py.name} gives away exercise {eid}: {text!r}"
        for line in _solution_lines(ex):
            assert line not in page, f"{py.name} shows exercise {eid}'s solution: {line!r}"
        if ex.kind == "predict":
            right = ex.expected()
            if isinstance(right, tuple) and len(right) >= 2:   # a shape, an (op, cause) ...: never printed whole
                assert repr(right) not in page, f"{py.name} prints exercise {eid}'s answer {right!r}"


@pytest.mark.parametrize("nn", sorted(SOURCES))
def test_every_exercise_is_checked_two_implemented(nn):
    """Each notebook checks exactly its registered exercises, after an "## Exercises" heading
    and before "What to remember" / "Next"; two of them at least are "implement it"."""
    src = SOURCES[nn].read_text()
    called = [m.group(1) for m in CHECK_CALL.finditer(src)]
    mine = sorted(e for e in EXERCISES if e.startswith(nn + "."))
    assert sorted(called) == mine, (called, mine)
    assert sum(EXERCISES[e].kind == "implement" for e in mine) >= 2
    heading = src.index("## Exercises")
    end = min([src.index(m, heading) for m in ("What to remember", "## Next") if m in src[heading:]] or [len(src)])
    assert all(heading < src.index(f'check("{e}"') < end for e in mine)


STUB_LINE = "your function returns nothing yet: write its body, then run the cell again"


def _ellipsis_stub(*a):
    ...


@pytest.mark.parametrize("eid", sorted(e for e, ex in EXERCISES.items() if ex.kind == "implement"))
def test_an_unwritten_function_gets_nothing_yet_and_no_rule(eid):
    """A stub (``return None`` or a body of ``...``) gets one line, whatever the checker does
    with its output: no "partly right", no TypeError about NoneType, no rule stated."""
    for stub in (lambda *a: None, _ellipsis_stub):
        assert feedback(eid, stub).message == STUB_LINE, eid


@pytest.mark.parametrize("nn", sorted(SOURCES))
def test_saved_stub_outputs_say_nothing_yet(nn):
    nb = json.loads(SOURCES[nn].with_suffix(".ipynb").read_text())
    for c in nb["cells"]:
        m = CHECK_CALL.search("".join(c["source"]))
        if c["cell_type"] != "code" or not m or EXERCISES[m.group(1)].kind != "implement":
            continue
        text = "".join("".join(o.get("text", "")) for o in c.get("outputs", []))
        assert text.strip() == STUB_LINE, (m.group(1), text)


def test_an_exception_message_is_never_cut_short():
    long = "x" * 500 + " the end names the type: NoneType"
    def raises(*a):
        raise TypeError(long)
    assert long in feedback("01.4", raises).message


def test_nmse_is_defined_as_the_checker_judges_it():
    source = SOURCES["06"].read_text()
    assert "energy" not in source and "divided by the reference's variance" in " ".join(source.split())
    first_hint = feedback("06.3", lambda ref, got: 12345.0).message
    assert "variance" not in first_hint and "mean square" not in first_hint


def test_a_wrong_gate_activation_is_named_as_such():
    msg = feedback("03.4", lambda gate, up: np.maximum(gate, 0) * up).message
    assert "activation is wrong" in msg and "GELU" in msg


def test_a_token_without_its_leading_space_counts_and_says_so():
    right = EXERCISES["01.1"].expected()
    v = feedback("01.1", right.strip())
    assert v.ok and "leading space" in v.message and right.strip() not in v.message
    assert feedback("01.1", right).message == "right"
