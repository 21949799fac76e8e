"""Exercises as ARENA does them: the learner's notebook asks, the package answers.

    from workbench.exercises import check, solution
    answer = None                    # your prediction
    check("03.2", answer)            # right / partly right: 2 of 3 ... / not quite: <the hint for this mistake>
    def rms_norm(x, weight, eps): ...
    check("04.4", rms_norm)          # runs your function on the trace's real input, compares with the op
    solution("03.2")                 # the worked solution, when you want it (no notebook cell calls it)

The expected answers, the mistake-specific hints and the solutions live here, keyed by
exercise id ("NN.k": notebook NN, exercise k), one module per notebook (tour, weights,
forward_pass, nan_hunt, buffer_aliasing, engine_diff, experts, generation, any_model,
playbook); core.py says how an answer is judged.  A learner notebook never contains an
answer: tests/test_exercises.py looks for each exercise's giveaways and solution lines in
every notebook's source and saved outputs.
"""
from __future__ import annotations

from workbench.exercises import (any_model, buffer_aliasing, engine_diff, experts, forward_pass,  # noqa: F401  (they register)
                                 generation, nan_hunt, playbook, tour, weights)
from workbench.exercises.core import EXERCISES, Exercise, Verdict

__all__ = ["check", "solution", "feedback", "EXERCISES", "Exercise", "Verdict"]


def _exercise(exercise_id: str) -> Exercise:
    try:
        return EXERCISES[str(exercise_id)]
    except KeyError:
        raise KeyError(f"no exercise {exercise_id!r}; the ids are {', '.join(sorted(EXERCISES))}") from None


def feedback(exercise_id: str, answer) -> Verdict:
    """The verdict on ``answer`` for exercise ``exercise_id`` (what :func:`check` prints)."""
    return _exercise(exercise_id).verdict(answer)


def check(exercise_id: str, answer) -> None:
    """Print ``right``, ``partly right: ...`` or ``not quite: <hint>`` for ``answer`` (a value,
    or for an "implement" exercise your function).  Never prints the expected answer, never
    raises on a wrong or malformed answer; returns nothing, so a notebook cell shows the
    verdict alone (:func:`feedback` returns it as a Verdict)."""
    print(feedback(exercise_id, answer).message)


def solution(exercise_id: str) -> None:
    """Print the worked solution of exercise ``exercise_id``: run it in a cell of your own
    when you want it (the notebooks never do, so Run All shows none)."""
    print(_exercise(exercise_id).solution)
