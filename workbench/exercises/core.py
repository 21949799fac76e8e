"""What an exercise is, how an answer is judged, and the registry the notebooks check against.

An :class:`Exercise` holds what the learner's notebook must not: the expected answer (or
how to compute it from the demo model), the hints for the mistakes people make, and the
worked solution.  Two kinds:

* ``predict``: the learner writes a value (a token, a shape, a list of experts);
  ``expected()`` computes or states the right one;
* ``implement``: the learner writes a function (an RMS norm, a softmax, a router);
  ``case()`` gives the arguments taken from a real trace and the op's real output, and the
  checker calls the learner's function on those arguments.

A judge turns (answer, expected, arguments) into a :class:`Verdict`: right, partly right
("2 of 3 experts right"), or wrong with the hint for *this* mistake.  The judges here are
the shared ones: :func:`value`, :func:`unordered`, :func:`ordered`, :func:`fields`,
:func:`array`.  A hint names what to look at; it never states the answer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

EXERCISES: dict[str, "Exercise"] = {}


@dataclass(frozen=True)
class Verdict:
    ok: bool
    message: str            # what check prints: "right", "partly right: ...", "not quite: ..."
    score: tuple[int, int] | None = None   # (right, of) when partial credit is named


RIGHT = Verdict(True, "right")
NOTHING_YET = Verdict(False, "your function returns nothing yet: write its body, then run the cell again")


def wrong(hint: str) -> Verdict:
    return Verdict(False, f"not quite: {hint}")


def partly(k: int, n: int, noun: str, hint: str) -> Verdict:
    return Verdict(False, f"partly right: {k} of {n} {noun} right; {hint}", (k, n))


@dataclass(frozen=True)
class Exercise:
    id: str                       # "03.2": notebook 03, exercise 2
    kind: str                     # "predict" or "implement"
    form: str                     # what an answer looks like, e.g. "a tuple of four numbers"
    judge: Callable[..., Verdict]   # (answer, expected, args) -> Verdict
    solution: str                 # the worked solution, printed by solution(id)
    expected: Callable[[], Any] | None = None    # predict: the right answer
    case: Callable[[], tuple] | None = None      # implement: (args, the op's real output)
    giveaways: tuple[str, ...] = field(default=())   # text that would give the answer away on the page
    call: Callable | None = None  # implement: (function, args) -> what is judged; default function(*args)

    def verdict(self, answer) -> Verdict:
        """The verdict on ``answer`` (a value, or for ``implement`` a function); never raises."""
        if answer is None:
            return Verdict(False, f"no answer yet: write {self.form}, then run the cell again")
        if self.kind == "implement":
            return self._run(answer)
        try:
            return self.judge(answer, self.expected(), None)
        except Exception:   # an answer of an unexpected kind is just not right
            return wrong(f"the answer should be {self.form}")

    def _run(self, fn) -> Verdict:
        if not callable(fn):
            return wrong(f"pass your function itself ({self.form}), without calling it")
        args, want = self.case()
        fresh = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]
        returned = []

        def learner(*a, **k):   # the learner's function, recording what each call returns
            out = fn(*a, **k)
            returned.append(out is None)
            return out
        try:
            with np.errstate(all="ignore"):   # the cases feed NaN and inf on purpose: no warnings on the page
                got = self.call(learner, *fresh) if self.call else learner(*fresh)
        except Exception as e:
            if returned and all(returned):   # a stub: every call returned None, then the checker tripped on it
                return NOTHING_YET
            return wrong(f"your function raised {type(e).__name__}: {e}")   # the whole message: it names the type
        if got is None or (returned and all(returned)):
            return NOTHING_YET
        try:
            return self.judge(got, want, args)
        except Exception:
            return wrong(f"your function should return {self.form}")


def register(*exercises: Exercise) -> None:
    for ex in exercises:
        if ex.id in EXERCISES:
            raise ValueError(f"exercise {ex.id} is defined twice")
        EXERCISES[ex.id] = ex


# ------------------------------------------------------------------ comparing values

def same(answer, expected, tol=None) -> bool:
    """Whether ``answer`` matches ``expected``: numbers within ``tol`` (absolute; exact when
    None), strings ignoring case and surrounding spaces, sequences and dicts element-wise."""
    if isinstance(expected, dict):
        return (isinstance(answer, dict) and answer.keys() == expected.keys()
                and all(same(answer[k], expected[k], tol) for k in expected))
    if isinstance(expected, str):
        return isinstance(answer, str) and answer.strip().lower() == expected.strip().lower()
    if isinstance(expected, (bool, np.bool_)) or isinstance(answer, (bool, np.bool_)):
        both = isinstance(answer, (bool, np.bool_)) and isinstance(expected, (bool, np.bool_))
        return both and bool(answer) == bool(expected)
    if isinstance(expected, (list, tuple, np.ndarray)):
        if not isinstance(answer, (list, tuple, np.ndarray)) or np.shape(answer) != np.shape(expected):
            return False
        a, e = np.asarray(answer, dtype=object).ravel(), np.asarray(expected, dtype=object).ravel()
        return all(same(x, y, tol) for x, y in zip(a, e))
    if isinstance(expected, (int, float, np.integer, np.floating)):
        if not isinstance(answer, (int, float, np.integer, np.floating)):
            return False
        if np.isnan(expected) or np.isnan(answer):
            return bool(np.isnan(expected) and np.isnan(answer))
        return float(answer) == float(expected) if tol is None else abs(float(answer) - float(expected)) <= tol
    return answer == expected


def _mistake(answer, expected, args, mistakes) -> str | None:
    """The hint of the first known mistake ``answer`` makes: each mistake is (what, hint),
    ``what`` a wrong value or a function (expected, args) -> the wrong value."""
    for what, hint in mistakes:
        bad = what(expected, args) if callable(what) else what
        if bad is not None and same(answer, bad):
            return hint
    return None


# ------------------------------------------------------------------ judges: (answer, expected, args) -> Verdict

def value(hint: str, mistakes=(), tol=None) -> Callable[..., Verdict]:
    """One value: right, a known mistake's hint, or ``hint``."""
    def judge(answer, expected, args):
        if same(answer, expected, tol):
            return RIGHT
        return wrong(_mistake(answer, expected, args, mistakes) or hint)
    return judge


def _norm(x):
    return x.strip().lower() if isinstance(x, str) else (int(x) if isinstance(x, (int, np.integer)) else x)


def unordered(noun: str, hint: str, mistakes=()) -> Callable[..., Verdict]:
    """A collection whose order does not matter (a set of experts): right in any order;
    otherwise how many of them are right, and ``hint``."""
    def judge(answer, expected, args):
        if isinstance(answer, (str, bytes)) or not hasattr(answer, "__iter__"):
            return wrong(f"give a list of {noun}")
        got, want = [_norm(a) for a in np.asarray(answer, dtype=object).ravel()], [_norm(e) for e in expected]
        if sorted(map(repr, got)) == sorted(map(repr, want)):
            return RIGHT
        known = _mistake(answer, expected, args, mistakes)
        if known:
            return wrong(known)
        k = len(set(map(repr, got)) & set(map(repr, want)))
        if len(got) != len(want):
            extra = f"you gave {len(got)} {noun}, the answer has {len(want)}"
            return partly(k, len(want), noun, f"{extra}; {hint}") if k else wrong(f"{extra}; {hint}")
        return partly(k, len(want), noun, hint) if k else wrong(hint)
    return judge


def ordered(noun: str, hint: str, order_hint: str, mistakes=()) -> Callable[..., Verdict]:
    """A sequence whose order matters: the right items in the wrong order get ``order_hint``;
    otherwise how many sit in the right place, and ``hint``."""
    def judge(answer, expected, args):
        if isinstance(answer, (str, bytes)) or not hasattr(answer, "__iter__"):
            return wrong(f"give a list of {noun}")
        got, want = [_norm(a) for a in np.asarray(answer, dtype=object).ravel()], [_norm(e) for e in expected]
        if got == want:
            return RIGHT
        known = _mistake(answer, expected, args, mistakes)
        if known:
            return wrong(known)
        if sorted(map(repr, got)) == sorted(map(repr, want)):
            return wrong(f"the right {noun}, in the wrong order: {order_hint}")
        k = sum(g == w for g, w in zip(got, want))
        return partly(k, len(want), f"{noun} in the right place", hint) if k else wrong(hint)
    return judge


def fields(names: tuple[str, ...], hints: tuple[str, ...], swapped: str | None = None,
           mistakes=()) -> Callable[..., Verdict]:
    """A tuple of named parts ((op, cause), (hazards, exact)): which parts are right, and
    the hint of each wrong one; the right parts in the wrong order get ``swapped``."""
    def judge(answer, expected, args):
        if not isinstance(answer, (tuple, list)):
            return wrong(f"give a tuple of {len(expected)}: ({', '.join(names)})")
        if same(tuple(answer), tuple(expected)):
            return RIGHT
        known = _mistake(tuple(answer), tuple(expected), args, mistakes)
        if known:
            return wrong(known)
        if len(answer) != len(expected):
            return wrong(f"give a tuple of {len(expected)}: ({', '.join(names)})")
        if swapped and len(expected) == 2 and same(tuple(answer)[::-1], tuple(expected)):
            return wrong(swapped)
        ok = [same(a, e) for a, e in zip(answer, expected)]
        bad = [f"the {n}: {h}" for n, h, good in zip(names, hints, ok) if not good]
        right = [n for n, good in zip(names, ok) if good]
        if right:
            return partly(len(right), len(names), "parts", f"the {' and '.join(right)} right; " + "; ".join(bad))
        return wrong("; ".join(bad))
    return judge


def array(rows: str, hint: str, mistakes=(), rtol=1e-4, atol=1e-5) -> Callable[..., Verdict]:
    """A function's array output against the op's real output: the shape, then a known
    mistake (each (function of the arguments -> its wrong output, hint)), then how many of
    the leading-axis ``rows`` (tokens, heads) match."""
    def close(a, b):
        return np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)

    def judge(got, want, args):
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            return wrong(f"your function returned shape {got.shape}; the trace's op has shape {want.shape}")
        if close(got, want):
            return RIGHT
        for fn, why in mistakes:
            try:
                with np.errstate(all="ignore"):
                    bad = np.asarray(fn(*args), dtype=np.float64)
            except Exception:   # a mistake that cannot be made with these arguments
                continue
            if bad.shape == want.shape and close(got, bad):
                return wrong(why)
        n = want.shape[0]
        k = sum(close(got[i], want[i]) for i in range(n))
        return partly(k, n, rows, hint) if k else wrong(hint)
    return judge

