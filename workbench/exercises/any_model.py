"""Notebook 09 (bring your own model): the exercises, their answers and their hints."""
from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path

from workbench.exercises.core import Exercise, RIGHT, partly, register, value, wrong

PROMPT = "the cat sat on the mat"


@lru_cache(maxsize=None)
def _phi3_f16():
    from workbench.models import load
    from workbench.trace import trace
    from workbench.zoo import reference as zoo_ref

    path = zoo_ref.build("phi3", Path(tempfile.mkdtemp()) / "phi3")
    return trace(load(path), PROMPT, dtype="float16")


@lru_cache(maxsize=None)
def _towers_first() -> str:
    """Notebook 09's multimodal Gemma 4 trace (an image and a clip): embed_audio before layers.0?"""
    import numpy as np

    from workbench.models import load
    from workbench.trace import trace
    from workbench.zoo.multimodal import build_gemma4

    mm = load(build_gemma4(Path(tempfile.mkdtemp()) / "gemma4"), granularity="module")
    image = (np.indices((16, 16)).sum(0) * 8 % 256).astype(np.uint8)[..., None].repeat(3, -1)
    clip = (0.3 * np.sin(2 * np.pi * 440 * np.arange(3200) / 16000)).astype(np.float32)
    tm = trace(mm, [5, 6, 7], images=[image], audio=[clip])
    tm.run()
    return "before" if tm.ops.index("embed_audio") < tm.ops.index("layers.0") else "after"


def _steps():
    t = _phi3_f16()
    t.first_nonfinite()          # runs it (statistics on)
    return t.steps


def _layer_case():
    names = [s.name for s in _steps()]
    return (names,), [s.layer for s in _steps()]


def _judge_layers(got, want, args):
    if got == want:
        return RIGHT
    if [None if g is None else str(g) for g in got] == [None if w is None else str(w) for w in want]:
        return wrong("return the layer as an int (int(...)), not the text")
    if all(g is not None for g in got):
        return wrong("steps outside the layers (embed_tokens, norm, lm_head, logits) have no layer: return None for them")
    k = sum(g == w for g, w in zip(got, want))
    return partly(k, len(want), "steps", "the layer is the number after 'layers.' at the start of the name")


def _largest_case():
    absmax = {s.name: float(s.stats["absmax"]) for s in _steps() if s.stats}
    return (absmax,), max(absmax, key=absmax.get)


register(
    Exercise(
        "09.1", "predict", '"before" or "after"',
        value("which needs the other's output: the towers' embeddings, or the language model's layers?",
              mistakes=[("after", "the language model's layers read the merged sequence: can they run before the towers produce it?")]),
        expected=_towers_first,
        solution="""tm.ops.index("embed_audio") < tm.ops.index("layers.0")
# the towers run first, then the language model on the merged sequence"""),
    Exercise(
        "09.2", "predict", "True or False",
        value("compare the float32 trace's largest absmax with float16's limit, 65504",
              mistakes=[(False, "the overflow was planted in the loud copy: how does the original's largest absmax compare with 65504?")]),
        expected=lambda: _phi3_f16().first_nonfinite() is None,
        solution="""t16 = workbench.trace(workbench.load(phi3), "the cat sat on the mat", dtype="float16")
t16.first_nonfinite() is None, t16.headroom(top=1)"""),
    Exercise(
        "09.3", "implement", "a function layer_of(name) returning the layer number (an int), or None",
        _judge_layers, case=_layer_case, call=lambda fn, names: [fn(n) for n in names],
        solution="""def layer_of(name):
    parts = name.split(".")
    return int(parts[1].split("#")[0]) if parts[0] == "layers" and len(parts) > 1 else None"""),
    Exercise(
        "09.4", "implement", "a function largest(absmax) returning a step name, from a dict step name -> absmax",
        value("the step whose absmax is largest is the one closest to float16's limit",
              mistakes=[(lambda e, a: min(a[0], key=a[0].get), "that is the *smallest* absmax: the one nearest the limit has the largest"),
                        (lambda e, a: max(a[0].values()), "return the step's name, not its absmax")]),
        case=_largest_case,
        solution="""def largest(absmax):
    return max(absmax, key=absmax.get)"""),
)
