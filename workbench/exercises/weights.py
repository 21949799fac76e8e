"""Notebook 02 (weights: missing vs misnamed): the exercises, their answers and their hints."""
from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np

from workbench.exercises.core import RIGHT, Exercise, fields, partly, register, unordered, value, wrong


@lru_cache(maxsize=None)
def _checkpoints() -> Path:
    from workbench import zoo

    work = Path(tempfile.mkdtemp())
    zoo.build("gemma4_text", work / "clean")
    zoo.build("gemma4_text", work / "poisoned", broken="nonfinite-values")
    return work


def _inspect(path, values=False):
    from workbench.checkpoint.inspect import inspect

    return inspect(path, values=values)


def _names(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "np") as f:
        return list(f.keys())


@lru_cache(maxsize=None)
def _renamed() -> Path:
    """A copy of the clean checkpoint with layers.0's k_proj renamed k_prj (notebook 02's converter)."""
    from workbench.notebook import planted

    def rename_k(ts):
        k = next(k for k in ts if k.endswith("layers.0.self_attn.k_proj.weight"))
        ts[k.replace("k_proj", "k_prj")] = ts.pop(k)
    return planted(_checkpoints() / "clean", _checkpoints() / "renamed_k", rename_k)


def _rename_case():
    work, renamed = _checkpoints(), _renamed()
    report = _inspect(renamed)
    want = (sorted(p.tensor for p in report.problems if p.code == "missing-tensor"),
            sorted(p.tensor for p in report.problems if p.code == "unexpected-tensor"))
    return (_names(work / "clean"), _names(renamed)), want


def _judge_rename(got, want, args):
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return wrong("return a pair (missing, unexpected)")
    got = (sorted(got[0]), sorted(got[1]))
    if got == want:
        return RIGHT
    if got == want[::-1]:
        return wrong("the lists are swapped: missing = required but not stored, unexpected = stored but not required")
    ok = [g == w for g, w in zip(got, want)]
    if any(ok):
        return partly(sum(ok), 2, "lists", f"the {'missing' if ok[0] else 'unexpected'} list is right; "
                      "the other is a set difference the other way round")
    return wrong("two set differences: required minus stored, and stored minus required")


def _poisoned_case():
    import mlx.core as mx

    from workbench.checkpoint.inspect import inspect

    work = _checkpoints()
    report = inspect(work / "poisoned", values=True)
    name = next(p.tensor for p in report.problems if p.code == "nonfinite-values")
    x = np.array(mx.load(str(work / "poisoned" / "model.safetensors"))[name].astype(mx.float32))
    return (x,), (int(np.isnan(x).sum()), int(np.isposinf(x).sum()), int(np.isneginf(x).sum()))


register(
    Exercise(
        "02.1", "predict", 'a list of problem codes, e.g. ["missing-tensor"]',
        unordered("problem codes", "nothing was lost: which two findings does a rename leave?",
                  mistakes=[(["missing-tensor"], "the old name is missing, and the new name is one the config does not know: a second finding")]),
        expected=lambda: sorted({p.code for p in _inspect(_renamed()).problems}),
        solution="""def rename_k(ts):
    k = next(k for k in ts if k.endswith("layers.0.self_attn.k_proj.weight"))
    ts[k.replace("k_proj", "k_prj")] = ts.pop(k)
renamed = workbench.inspect(planted(clean, work / "renamed", rename_k))
sorted(p.code for p in renamed.problems), diagnosis(renamed)
# the expected name is missing and the new one unexpected, each the other's suggestion: MISNAMED"""),
    Exercise(
        "02.2", "predict", "True or False",
        value("without values=True the inspector reads names, shapes and dtypes only",
              mistakes=[(False, "the NaN sits in the numbers: which of names, shapes and dtypes is wrong?")]),
        expected=lambda: _inspect(_checkpoints() / "poisoned").ok,
        solution="""names_only = workbench.inspect(work / "poisoned")
names_only.ok, names_only.problems
# True: the names, shapes and dtypes are right; a NaN in the numbers is invisible until
# values=True reads them. Check values once per downloaded or converted checkpoint."""),
    Exercise(
        "02.3", "implement", "a function missing_and_unexpected(required, stored) returning (missing, unexpected), two lists of names",
        _judge_rename, case=_rename_case,
        solution="""def missing_and_unexpected(required, stored):
    return sorted(set(required) - set(stored)), sorted(set(stored) - set(required))"""),
    Exercise(
        "02.4", "implement", "a function count_nonfinite(x) returning (NaN, +inf, -inf) counts",
        fields(("NaN count", "+inf count", "-inf count"),
               ("np.isnan", "np.isposinf", "np.isneginf"),
               mistakes=[(lambda e, a: (int(np.isnan(a[0]).sum()), int(np.isinf(a[0]).sum()), int(np.isinf(a[0]).sum())),
                          "np.isinf counts both signs: +inf and -inf need np.isposinf and np.isneginf")]),
        case=_poisoned_case, call=lambda fn, x: tuple(int(c) for c in fn(x)),
        solution="""def count_nonfinite(x):
    return int(np.isnan(x).sum()), int(np.isposinf(x).sum()), int(np.isneginf(x).sum())"""),
)
