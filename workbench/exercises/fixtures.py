"""The models and traces the exercises are checked against: the notebooks' own, rebuilt
here (once per process) so the checker never needs the learner's variables."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

COPY_PROMPT = "apple river stone cloud tree | apple river stone"    # notebooks 01, 03, 06
RECALL_PROMPT = "mia red kite . tom blue cup . anna green hat . mia"  # notebooks 04, 07, 10
GEN_PROMPT = "apple river stone cloud tree | apple"                  # notebook 08


@lru_cache(maxsize=None)
def demo(explicit: bool = True):
    from workbench.demo.paths import DEMO
    from workbench.models import load

    return load(DEMO, dtype="float32", attention="explicit" if explicit else None)


@lru_cache(maxsize=None)
def experts():
    from workbench.demo.paths import DEMO_EXPERTS
    from workbench.models import load

    return load(DEMO_EXPERTS, dtype="float32")


@lru_cache(maxsize=None)
def trace(prompt: str = COPY_PROMPT, which: str = "demo"):
    """A full trace of ``prompt`` on the demo model (``which="experts"``: the MoE demo)."""
    from workbench.trace import trace as run

    tr = run(experts() if which == "experts" else demo(), prompt, capture="full")
    tr.run()
    return tr


@lru_cache(maxsize=None)
def injected(where: str, what: float, index: tuple, prompt: str = RECALL_PROMPT):
    """A full trace of the demo model with ``what`` written into op ``where`` at ``index``."""
    from workbench.trace import inject, trace as run

    tr = run(demo(), prompt, capture="full", interventions=[inject(where, what, index=index)])
    tr.run()
    return tr


def v(tr, name: str) -> np.ndarray:
    """An op's output for the trace's one sequence, as float64 numpy."""
    return np.array(tr.value(name)[0], dtype=np.float64)


def weight(model, name: str) -> np.ndarray:
    return np.array(model.weights("float32")[name], dtype=np.float64)
